"""Metadata commits under contention: N writer processes, the log in the store vs PostgreSQL.

Each writer is a process with a node id of its own, on one shared local-directory store (data
objects always go there, fsynced). It appends a small batch and calls ``flush()`` in a loop:
every flush uploads one data object and commits one metadata entry, so the writers race for
the log's next entry all the time. Two backends of the log:

- ``store``: the object-store log in the same directory (conditional create = an fsynced
  file linked with O_EXCL);
- ``postgres``: PostgreSQL (a throw-away server from the machine's binaries,
  `s3stream.testing.postgres`, with fsync on, so both logs are durable), or ``--postgres-url``.

Per run it prints commits/s over all writers, the slowest writer's commits ÷ the fastest's
(1.0 = fair), flush latency p50/p99/max over all flushes, lost races, and errors; the JSON goes
to bench/results/metadata.json (or --out). WALs are in memory: only the flush path is measured.

    .venv/bin/python bench/metadata_bench.py [--seconds 10] [--writers 1,2,4,8,16]
        [--backends store,postgres] [--postgres-url URL] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# -- one writer process ------------------------------------------------------------------------


def worker(store: str, node: str, metadata: str | None) -> None:
    """Open a client, say READY, wait for ``GO <seconds>``, append+flush until then, print one
    JSON line of results."""
    sys.path.insert(0, str(ROOT))
    import s3stream
    from s3stream.errors import S3StreamError
    from s3stream.metrics import catalog
    from s3stream.types import RecordBatch

    client = s3stream.open(store, node_id=node, wal="memory://", metadata=metadata, environ={})
    stream = client.create_stream({"writer": node})
    print("READY", flush=True)
    seconds = float(sys.stdin.readline().split()[1])
    latencies: list[float] = []
    errors: dict[str, int] = {}
    payload = os.urandom(200)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            stream.append(RecordBatch(payload, count=1))
            started = time.perf_counter()
            client.flush()
            latencies.append(time.perf_counter() - started)
        except S3StreamError as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
    family = client.metrics.registry.family(catalog.METADATA_CONFLICTS.name)
    conflicts = int(family.total()) if family is not None else 0
    print(json.dumps({"node": node, "flushes": latencies, "errors": errors, "lost": conflicts}))
    sys.stdout.flush()
    client.close()


# -- the parent --------------------------------------------------------------------------------


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run(backend: str, writers: int, seconds: float, metadata: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="s3stream-metabench-") as tmp:
        store = str(Path(tmp) / "store")
        # The first writer creates the store (and binds it to its log) alone: no race there.
        procs: list[subprocess.Popen[str]] = []
        try:
            for i in range(writers):
                argv = [sys.executable, __file__, "--worker", store, f"w{i}", metadata or "-"]
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
                )
                procs.append(proc)
                if i == 0:
                    _expect_ready(proc)
            for proc in procs[1:]:
                _expect_ready(proc)
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"GO {seconds}\n")
                proc.stdin.flush()
            results = []
            for proc in procs:
                assert proc.stdout is not None
                results.append(json.loads(proc.stdout.readline()))
            for proc in procs:
                proc.wait(120)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    counts = [len(r["flushes"]) for r in results]
    every = sorted(x for r in results for x in r["flushes"])
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "backend": backend,
        "writers": writers,
        "seconds": seconds,
        "commits": sum(counts),
        "commits_per_s": sum(counts) / seconds,
        "per_writer": counts,
        "slowest_over_fastest": min(counts) / max(counts) if max(counts) else 0.0,
        "flush_ms": {
            "p50": _pct(every, 0.50) * 1000,
            "p99": _pct(every, 0.99) * 1000,
            "max": (every[-1] if every else float("nan")) * 1000,
        },
        "lost_races": sum(r["lost"] for r in results),
        "errors": errors,
    }


def _expect_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "READY":
        raise RuntimeError(f"a writer failed to start (exit {proc.poll()}): {line!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--writers", default="1,2,4,8,16")
    p.add_argument("--backends", default="store,postgres")
    p.add_argument("--postgres-url", default=None, help="an existing server (else one is started)")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/metadata.json")
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from s3stream.testing.postgres import PostgresServer

    counts = [int(x) for x in a.writers.split(",")]
    backends = a.backends.split(",")
    server: PostgresServer | None = None
    if "postgres" in backends and a.postgres_url is None:
        server = PostgresServer(fsync=True).start()
    rows = []
    try:
        for backend in backends:
            for n in counts:
                metadata = None
                if backend == "postgres":
                    base = a.postgres_url or (server.url() if server else "")
                    sep = "&" if "?" in base else "?"
                    metadata = f"{base}{sep}namespace=bench-{uuid.uuid4().hex[:8]}"
                row = run(backend, n, a.seconds, metadata)
                rows.append(row)
                f = row["flush_ms"]
                print(
                    f"{backend:8} {n:2} writers: {row['commits_per_s']:8.1f} commits/s, "
                    f"slowest/fastest {row['slowest_over_fastest']:.2f}, flush p50 "
                    f"{f['p50']:.1f} ms p99 {f['p99']:.1f} ms max {f['max']:.1f} ms, "
                    f"lost races {row['lost_races']}, errors {row['errors'] or 0}",
                    flush=True,
                )
    finally:
        if server is not None:
            server.stop()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "rows": rows}
    a.out.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"saved {a.out}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], None if sys.argv[4] == "-" else sys.argv[4])
    else:
        main()
