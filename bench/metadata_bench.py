"""Metadata commits under contention: N writer processes, the log in the store vs PostgreSQL.

Each writer is a process with a node id of its own, on one shared local-directory store (data
objects always go there, fsynced). It appends a small batch and calls ``flush()`` in a loop:
every flush uploads one data object and commits one metadata entry, so the writers race for
the log's next entry all the time. Two backends of the log:

- ``store``: the object-store log in the same directory (conditional create = an fsynced
  file linked with O_EXCL);
- ``postgres``: PostgreSQL (a throw-away server from the machine's binaries,
  `s3stream.testing.postgres`, with fsync on, so both logs are durable), or ``--postgres-url``.

``--put-latency-ms 30`` (and ``--get-latency-ms``) puts the store behind
`s3stream.testing.faults.FaultyObjectStore` with a fixed delay per PUT (data objects and log
entries alike) or per GET/HEAD/LIST, slept on the real clock: an S3-like profile of the same
store, so the two profiles differ in latency only.

Per run it prints commits/s over all writers, the slowest writer's commits ÷ the fastest's
(1.0 = fair), flush latency p50/p99/max over all flushes, lost races, and errors; the JSON goes
to bench/results/metadata.json (or --out). WALs are in memory: only the flush path is measured.

    .venv/bin/python bench/metadata_bench.py [--seconds 10] [--writers 1,2,4,8,16]
        [--backends store,postgres] [--postgres-url URL] [--put-latency-ms MS]
        [--get-latency-ms MS] [--seaweedfs] [--out FILE]

``--seaweedfs`` puts the store on a SeaweedFS S3 server on loopback (a fresh prefix per row)
instead of a local directory; with ``--put-latency-ms`` it is the S3-like profile.

``--creates`` measures `client.create_stream` instead (issue 19): streams/s from 1 and 8
threads of one client on a local directory store, the embedded default.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _stats import pct

ROOT = Path(__file__).resolve().parent.parent


# -- one writer process ------------------------------------------------------------------------


def open_client(
    store: str,
    node: str,
    metadata: str | None,
    latency_ms: tuple[float, float],
    options: dict[str, Any] | None = None,
) -> Any:
    """A client on `store` (a directory, or an ``s3://`` URL reached with `options`), behind a
    fixed PUT/GET delay if `latency_ms` asks."""
    import random

    import s3stream
    from s3stream.client import StreamClient
    from s3stream.clock import SystemClock
    from s3stream.opening import open_object_store
    from s3stream.testing.faults import FaultRule, FaultyObjectStore
    from s3stream.wal.memory import MemoryWal

    put_ms, get_ms = latency_ms
    log: Any = metadata
    if metadata is not None and metadata.endswith("&optimistic"):
        # The PostgreSQL log racing with INSERT ... ON CONFLICT alone (no row lock).
        from s3stream.metadata.postgres import PostgresMetadataLog

        log = PostgresMetadataLog(metadata.removesuffix("&optimistic"), serialize_commits=False)
    if not put_ms and not get_ms:
        return s3stream.open(
            store,
            node_id=node,
            wal="memory://",
            metadata=log,
            environ={},
            storage_options=options,
        )
    rules = []
    if put_ms:
        put_s = put_ms / 1000
        rules.append(
            FaultRule(latency_s=(put_s, put_s), operations=frozenset({"put", "put_if_absent"}))
        )
    if get_ms:
        get_s = get_ms / 1000
        reads = frozenset({"get", "get_suffix", "head", "list"})
        rules.append(FaultRule(latency_s=(get_s, get_s), operations=reads))
    raw = open_object_store(store, options)
    slow = FaultyObjectStore(raw, rng=random.Random(node), clock=SystemClock(), rules=rules)
    return StreamClient(slow, MemoryWal(), node_id=node, metadata=log)


def worker(
    store: str,
    node: str,
    metadata: str | None,
    latency_ms: tuple[float, float],
    options: dict[str, Any] | None = None,
) -> None:
    """Open a client, say READY, wait for ``GO <seconds>``, append+flush until then, print one
    JSON line of results."""
    sys.path.insert(0, str(ROOT))
    from s3stream.errors import S3StreamError
    from s3stream.metrics import catalog
    from s3stream.types import RecordBatch

    class CommitFailures(logging.Handler):
        """Counts commits that gave up (an upload retried by the uploader, or a flush
        error): contention reported as an error, which the flush loop alone would not see."""

        count = 0

        def emit(self, record: logging.LogRecord) -> None:
            if "metadata commit by" in record.getMessage():
                CommitFailures.count += 1

    logging.getLogger().addHandler(CommitFailures(logging.WARNING))
    client = open_client(store, node, metadata, latency_ms, options)
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
    result = {"node": node, "flushes": latencies, "errors": errors, "lost": conflicts}
    result["commit_failures"] = CommitFailures.count
    print(json.dumps(result))
    sys.stdout.flush()
    client.close()


# -- the parent --------------------------------------------------------------------------------


def run(
    backend: str,
    writers: int,
    seconds: float,
    metadata: str | None,
    latency_ms: tuple[float, float] = (0.0, 0.0),
    s3: Any = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="s3stream-metabench-") as tmp:
        store = str(Path(tmp) / "store")
        options: dict[str, Any] | None = None
        if s3 is not None:  # a fresh prefix on the SeaweedFS server instead
            store, options = s3.url(f"metabench-{uuid.uuid4().hex}"), s3.storage_options()
        # The first writer creates the store (and binds it to its log) alone: no race there.
        procs: list[subprocess.Popen[str]] = []
        try:
            for i in range(writers):
                argv = [sys.executable, __file__, "--worker", store, f"w{i}", metadata or "-"]
                argv += [str(x) for x in latency_ms] + [json.dumps(options)]
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
        "object_store": "seaweedfs" if s3 is not None else "local directory",
        "put_latency_ms": latency_ms[0],
        "get_latency_ms": latency_ms[1],
        "writers": writers,
        "seconds": seconds,
        "commits": sum(counts),
        "commits_per_s": sum(counts) / seconds,
        "per_writer": counts,
        "slowest_over_fastest": min(counts) / max(counts) if max(counts) else 0.0,
        "flush_ms": {
            "p50": pct(every, 0.50) * 1000,
            "p99": pct(every, 0.99) * 1000,
            "max": (every[-1] if every else float("nan")) * 1000,
        },
        "lost_races": sum(r["lost"] for r in results),
        "commit_failures": sum(r["commit_failures"] for r in results),
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
    p.add_argument(
        "--pg-optimistic",
        action="store_true",
        help="PostgreSQL without the row lock (racing inserts, as before serialized commits)",
    )
    p.add_argument("--put-latency-ms", type=float, default=0.0, help="delay of every PUT")
    p.add_argument("--get-latency-ms", type=float, default=0.0, help="delay of every GET/HEAD")
    p.add_argument("--creates", action="store_true", help="measure create_stream instead")
    p.add_argument(
        "--seaweedfs",
        action="store_true",
        help="the store on a SeaweedFS S3 server on loopback instead of a local directory",
    )
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    if a.creates:
        out = a.out or ROOT / "bench/results/metadata_creates.json"
        creates(a.seconds, out)
        return
    latency = (a.put_latency_ms, a.get_latency_ms)
    out = a.out or ROOT / "bench/results/metadata.json"
    from s3stream.testing.postgres import PostgresServer

    counts = [int(x) for x in a.writers.split(",")]
    backends = a.backends.split(",")
    server: PostgresServer | None = None
    if "postgres" in backends and a.postgres_url is None:
        server = PostgresServer(fsync=True).start()
    s3: Any = None
    if a.seaweedfs:
        from s3stream.testing.seaweedfs import SeaweedS3Server

        s3 = SeaweedS3Server().start()
    rows = []
    try:
        for backend in backends:
            for n in counts:
                metadata = None
                if backend == "postgres":
                    base = a.postgres_url or (server.url() if server else "")
                    sep = "&" if "?" in base else "?"
                    metadata = f"{base}{sep}namespace=bench-{uuid.uuid4().hex[:8]}"
                    if a.pg_optimistic:
                        metadata += "&optimistic"
                row = run(backend, n, a.seconds, metadata, latency, s3)
                rows.append(row)
                f = row["flush_ms"]
                print(
                    f"{backend:8} put {latency[0]:g} ms {n:2} writers: "
                    f"{row['commits_per_s']:8.1f} commits/s, "
                    f"slowest/fastest {row['slowest_over_fastest']:.2f}, flush p50 "
                    f"{f['p50']:.1f} ms p99 {f['p99']:.1f} ms max {f['max']:.1f} ms, "
                    f"lost races {row['lost_races']}, commits given up "
                    f"{row['commit_failures']}, flush errors {row['errors'] or 0}",
                    flush=True,
                )
    finally:
        if server is not None:
            server.stop()
        if s3 is not None:
            s3.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "rows": rows}
    out.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"saved {out}")


def creates(seconds: float, out: Path) -> None:
    """`client.create_stream` per second from 1 and 8 threads of one client (issue 19)."""
    rows = [
        _create_rate(threads, seconds, via) for via in ("client", "manager") for threads in (1, 8)
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n")
    print(f"saved {out}")


def _create_rate(threads: int, seconds: float, via: str) -> dict[str, Any]:
    """Streams/s `via` ``client.create_stream`` (a create and an open, two commits, under
    the client's lock) or ``manager``: `MetadataManager.create_stream(open_for=...)`, the
    same two ops in one commit and without the client's lock, so that concurrent creates
    fold into one entry (what the client would get by using it)."""
    import threading

    import s3stream

    with tempfile.TemporaryDirectory(prefix="s3stream-createbench-") as tmp:
        client = s3stream.open(str(Path(tmp) / "store"), environ={})
        counts = [0] * threads
        start = threading.Barrier(threads + 1)
        deadline = [0.0]

        def loop(i: int) -> None:
            start.wait()
            meta = client._meta
            while time.monotonic() < deadline[0]:
                if via == "client":
                    client.create_stream({"t": str(i)})
                else:
                    meta.create_stream({"t": str(i)}, open_for="local")
                counts[i] += 1

        pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        deadline[0] = time.monotonic() + seconds
        start.wait()
        for t in pool:
            t.join()
        # Log entries written: how many creates each entry folded.
        entries = client._meta.seq
        client.close()
    row = {
        "via": via,
        "threads": threads,
        "streams_per_s": sum(counts) / seconds,
        "streams": sum(counts),
        "log_entries": entries,
    }
    print(
        f"create_stream via {via}, {threads} threads: {row['streams_per_s']:8.1f} streams/s {row}"
    )
    return row


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--worker":
        latency = (float(sys.argv[5]), float(sys.argv[6]))
        metadata = None if sys.argv[4] == "-" else sys.argv[4]
        worker(sys.argv[2], sys.argv[3], metadata, latency, json.loads(sys.argv[7]))
    else:
        main()
