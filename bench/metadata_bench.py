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
(1.0 = fair), flush latency p50/p99/max over all flushes, lost races, and errors; then where
the time went: CPU per commit of the writer processes and of the PostgreSQL server (the one the
bench started), how busy the machine was, and for PostgreSQL the commit's steps as its clients
timed them (the wait for the lock and the read of the missed entries, the build with the lock
held, the INSERT and COMMIT), and the writers' CPU per commit by thread (the flush loop, the
uploader, the PUT pool; user + system, from /proc). The JSON goes to
bench/results/metadata.json (or --out). WALs are in memory: only the flush path is measured.

``--code DIR`` makes the writers import ``DIR/s3stream`` instead of this tree's: run it
alternately with a pristine copy (``git archive HEAD s3stream | tar -x -C DIR``) to measure a
change side by side in one session, on this noisy machine.

    .venv/bin/python bench/metadata_bench.py [--seconds 10] [--writers 1,2,4,8,16]
        [--backends store,postgres] [--postgres-url URL] [--put-latency-ms MS]
        [--get-latency-ms MS] [--seaweedfs] [--code DIR] [--objects-dir DIR] [--out FILE]
        [--manager-only]

``--seaweedfs`` puts the store on a SeaweedFS S3 server on loopback (a fresh prefix per row)
instead of a local directory; with ``--put-latency-ms`` it is the S3-like profile.

``--manager-only`` measures the metadata log alone (issue 18): N processes, each a
`MetadataManager` on the PostgreSQL log committing `create_stream` in a loop, no data objects
and no client: commits/s over all, slowest ÷ fastest, commit p99 and client CPU per commit.
With ``--code DIR`` the processes import another tree's package (run it twice, alternating).

``--creates`` measures stream creation instead (issue 19): streams/s of one client on a local
directory store, the embedded default: `client.create_stream` from 1 and 8 threads, the
manager's `create_stream(open_for=...)` alone, and `client.create_streams` in batches of 100
and 1,000 (from 1 thread).
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
    code: Path = ROOT,
) -> None:
    """Open a client, say READY, wait for ``GO <seconds>``, append+flush until then, print one
    JSON line of results. `code` is the tree whose ``s3stream`` package it imports."""
    sys.path.insert(0, str(code))
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
    times_before = _commit_times(client)
    threads_before = _thread_cpu_s()
    cpu_before = time.process_time()
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
    result["cpu_s"] = time.process_time() - cpu_before
    threads = _thread_cpu_s()
    result["threads_cpu_s"] = {
        k: [a - b for a, b in zip(v, threads_before.get(k, (0.0, 0.0)), strict=True)]
        for k, v in threads.items()
    }
    times = _commit_times(client)
    if times is not None and times_before is not None:
        result["commit_times"] = {k: v - times_before[k] for k, v in times.items()}
    print(json.dumps(result))
    sys.stdout.flush()
    client.close()


def _thread_cpu_s() -> dict[str, tuple[float, float]]:
    """User and system CPU seconds of this process's threads so far, summed by role (the
    thread's name without its pool number: the main loop, the uploader, the PUT pool, ...),
    from /proc/self/task (empty where there is none)."""
    import re
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, tuple[float, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended meanwhile
        name = re.sub(r"[-_]?\d+$", "", names.get(int(tid), "other"))
        user, system = out.get(name, (0.0, 0.0))
        out[name] = (user + int(fields[11]) / tick, system + int(fields[12]) / tick)
    return out


def _commit_times(client: Any) -> dict[str, float] | None:
    """The PostgreSQL log's totals of where its serialized commits spent their time."""
    import dataclasses

    times = getattr(client._meta.log, "commit_times", None)
    return None if times is None else dataclasses.asdict(times)


# -- the parent --------------------------------------------------------------------------------


def run(
    backend: str,
    writers: int,
    seconds: float,
    metadata: str | None,
    latency_ms: tuple[float, float] = (0.0, 0.0),
    s3: Any = None,
    server_pid: int | None = None,
    code: Path = ROOT,
    objects_dir: Path | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="s3stream-metabench-", dir=objects_dir) as tmp:
        store = str(Path(tmp) / "store")
        options: dict[str, Any] | None = None
        if s3 is not None:  # a fresh prefix on the SeaweedFS server instead
            store, options = s3.url(f"metabench-{uuid.uuid4().hex}"), s3.storage_options()
        # The first writer creates the store (and binds it to its log) alone: no race there.
        procs: list[subprocess.Popen[str]] = []
        try:
            for i in range(writers):
                argv = [sys.executable, __file__, "--worker", store, f"w{i}", metadata or "-"]
                argv += [str(x) for x in latency_ms] + [json.dumps(options), str(code)]
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
                )
                procs.append(proc)
                if i == 0:
                    _expect_ready(proc)
            for proc in procs[1:]:
                _expect_ready(proc)
            server_cpu, machine = _server_cpu_s(server_pid), _machine_cpu_s()
            wal = _wal_syncs(metadata if server_pid else None)
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"GO {seconds}\n")
                proc.stdin.flush()
            # Sampled at the end of the run, before the writers close (a backend that exited
            # and is not reaped yet would not be counted).
            time.sleep(seconds)
            server_cpu = _server_cpu_s(server_pid) - server_cpu
            wal_now = _wal_syncs(metadata if server_pid else None)
            wal = (wal_now[0] - wal[0], wal_now[1] - wal[1])
            busy, idle = (b - a for a, b in zip(machine, _machine_cpu_s(), strict=True))
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
    commits = max(1, sum(counts))
    cpu = {
        "writers_ms_per_commit": 1000 * sum(r["cpu_s"] for r in results) / commits,
        "server_ms_per_commit": 1000 * server_cpu / commits if server_pid else None,
        "machine_busy": busy / (busy + idle) if busy + idle else 0.0,
        # The server's WAL flushes (pg_stat_wal, track_wal_io_timing on): per commit, and
        # the mean time of one, which every serialized commit waits for with the lock held.
        "wal_syncs_per_commit": wal[0] / commits if server_pid else None,
        "wal_sync_ms": wal[1] / wal[0] if server_pid and wal[0] else None,
    }
    by_thread: dict[str, list[float]] = {}
    for r in results:
        for k, (user, system) in r.get("threads_cpu_s", {}).items():
            acc = by_thread.setdefault(k, [0.0, 0.0])
            acc[0] += 1000 * user / commits
            acc[1] += 1000 * system / commits
    cpu["writer_threads_ms_per_commit"] = by_thread
    timed = [r["commit_times"] for r in results if "commit_times" in r]
    lock: dict[str, float] = {}
    if timed:
        n = max(1, sum(t["commits"] for t in timed))
        lock = {k: 1000 * sum(t[k] for t in timed) / n for k in ("lock_s", "compose_s", "write_s")}
        lock["missed_entries"] = sum(t["entries"] for t in timed) / n
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
        "cpu": cpu,
        "commit_ms": lock,
    }


def _server_cpu_s(pid: int | None) -> float:
    """CPU seconds of a local PostgreSQL server: the postmaster, its live children and the
    children it reaped (cutime, cstime); 0 without one."""
    if pid is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")

    def fields(p: int | str) -> list[str]:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rpartition(")")[2].split()

    top = fields(pid)
    total = sum(int(x) for x in top[11:15])  # utime stime cutime cstime
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                f = fields(p)
            except OSError:
                continue
            if int(f[1]) == pid:
                total += int(f[11]) + int(f[12])
    return total / tick


def _wal_syncs(url: str | None) -> tuple[float, float]:
    """The server's WAL syncs so far and their total time in ms (0, 0 without a server the
    bench started, which turned track_wal_io_timing on)."""
    if url is None:
        return 0.0, 0.0
    import psycopg

    with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
        row = conn.execute("SELECT wal_sync, wal_sync_time FROM pg_stat_wal").fetchone()
    return (float(row[0]), float(row[1])) if row else (0.0, 0.0)


def _machine_cpu_s() -> tuple[float, float]:
    """Busy and idle CPU seconds of the machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK"), idle / os.sysconf("SC_CLK_TCK")


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
        "--manager-only",
        action="store_true",
        help="PostgreSQL metadata commits alone: a MetadataManager per process, no data objects",
    )
    p.add_argument(
        "--seaweedfs",
        action="store_true",
        help="the store on a SeaweedFS S3 server on loopback instead of a local directory",
    )
    p.add_argument(
        "--code",
        type=Path,
        default=ROOT,
        help="the tree whose s3stream package the writers import (a copy of another version, "
        "to measure two side by side in one session)",
    )
    p.add_argument(
        "--objects-dir",
        type=Path,
        default=None,
        help="where the local-directory store lives (default: the temp directory), e.g. "
        "/dev/shm to take the kernel's file create and fsync of each object out of the "
        "figures (the PostgreSQL server stays in the temp directory, fsync on)",
    )
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    if a.creates:
        out = a.out or ROOT / "bench/results/metadata_creates.json"
        creates(a.seconds, out)
        return
    if a.manager_only:
        out = a.out or ROOT / "bench/results/metadata_manager_only.json"
        counts = [int(x) for x in a.writers.split(",")]
        manager_only(counts, a.seconds, a.code.resolve(), a.postgres_url, out)
        return
    latency = (a.put_latency_ms, a.get_latency_ms)
    out = a.out or ROOT / "bench/results/metadata.json"
    from s3stream.testing.postgres import PostgresServer

    counts = [int(x) for x in a.writers.split(",")]
    backends = a.backends.split(",")
    server: PostgresServer | None = None
    if "postgres" in backends and a.postgres_url is None:
        server = PostgresServer(fsync=True).start()
        import psycopg

        with psycopg.connect(server.url(), autocommit=True) as conn:  # for _wal_syncs
            conn.execute("ALTER SYSTEM SET track_wal_io_timing = on")
            conn.execute("SELECT pg_reload_conf()")
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
                    metadata = _namespaced(base)
                    if a.pg_optimistic:
                        metadata += "&optimistic"
                pid = server.pid if server is not None and backend == "postgres" else None
                row = run(
                    backend, n, a.seconds, metadata, latency, s3, pid, a.code.resolve(),
                    a.objects_dir,
                )  # fmt: skip
                row["objects_dir"] = str(a.objects_dir) if a.objects_dir else "temp directory"
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
                _print_costs(row)
    finally:
        if server is not None:
            server.stop()
        if s3 is not None:
            s3.stop()
    _save(out, rows)


def _save(out: Path, rows: list[dict[str, Any]]) -> None:
    """Write a run's rows (and what ran them) to `out` as JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "rows": rows}
    out.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"saved {out}")


def _namespaced(url: str) -> str:
    """The PostgreSQL log URL `url` with a namespace of its own (a fresh log per row)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}namespace=bench-{uuid.uuid4().hex[:8]}"


def _print_costs(row: dict[str, Any]) -> None:
    """Where a row's time went: CPU per commit (writers, server), and the PostgreSQL log's
    commit steps per commit as its clients timed them."""
    c, t = row["cpu"], row["commit_ms"]
    line = f"{'':8} cpu per commit: writers {c['writers_ms_per_commit']:.2f} ms"
    if c["server_ms_per_commit"] is not None:
        line += f", server {c['server_ms_per_commit']:.2f} ms"
    line += f", machine {100 * c['machine_busy']:.0f}% busy"
    if c.get("wal_sync_ms") is not None:
        line += f", WAL syncs {c['wal_syncs_per_commit']:.2f}/commit of {c['wal_sync_ms']:.2f} ms"
    if t:
        line += (
            f"; per commit: lock wait+read {t['lock_s']:.2f} ms, build {t['compose_s']:.2f} ms "
            f"({t['missed_entries']:.1f} missed entries), insert+commit {t['write_s']:.2f} ms"
        )
    print(line, flush=True)
    threads = c.get("writer_threads_ms_per_commit") or {}
    if threads:
        parts = ", ".join(
            f"{k} {u:.2f}+{s:.2f}"
            for k, (u, s) in sorted(threads.items(), key=lambda kv: -sum(kv[1]))
        )
        print(f"{'':8} writer threads, ms per commit (user+sys): {parts}", flush=True)


def _manager_committer(code: str, url: str, writer: str, seconds: float, out: Any) -> None:
    """One process of `manager_only`: `create_stream` in a loop for `seconds`; reports its
    commits, latencies and CPU."""
    sys.path.insert(0, code)
    import resource

    from s3stream.clock import SystemClock
    from s3stream.metadata import MetadataManager
    from s3stream.metadata.postgres import PostgresMetadataLog

    log = PostgresMetadataLog(url)
    m = MetadataManager(log, clock=SystemClock(), writer_id=writer)
    m.load()
    m.create_stream({"writer": writer})  # tables and the first entry outside the timing
    latencies: list[float] = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        m.create_stream({"writer": writer, "n": str(len(latencies))})
        latencies.append(time.monotonic() - started)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    log.close()
    out.put((writer, latencies, cpu))


def manager_only(counts: list[int], seconds: float, code: Path, url: str | None, out: Path) -> None:
    """Metadata commits alone on the PostgreSQL log (see the module docstring)."""
    import multiprocessing

    from s3stream.testing.postgres import PostgresServer

    server = None if url is not None else PostgresServer(fsync=True).start()
    base = url or (server.url() if server is not None else "")
    rows = []
    try:
        for n in counts:
            target = _namespaced(base)
            queue: Any = multiprocessing.Queue()
            procs = [
                multiprocessing.Process(
                    target=_manager_committer, args=(str(code), target, f"w{i}", seconds, queue)
                )
                for i in range(n)
            ]
            for proc in procs:
                proc.start()
            results = [queue.get(timeout=seconds + 120) for _ in procs]
            for proc in procs:
                proc.join()
            commits = [len(lat) for _, lat, _ in results]
            latencies = sorted(x for _, lat, _ in results for x in lat)
            total = sum(commits)
            row = {
                "writers": n,
                "code": str(code),
                "commits_per_s": total / seconds,
                "slowest_over_fastest": min(commits) / max(commits) if max(commits) else 0.0,
                "commit_ms": {
                    "p50": pct(latencies, 0.5) * 1000,
                    "p99": pct(latencies, 0.99) * 1000,
                },
                "client_cpu_ms_per_commit": 1000 * sum(c for _, _, c in results) / max(total, 1),
            }
            rows.append(row)
            print(
                f"manager only, {n:2} writers ({code.name}): {row['commits_per_s']:8.1f} "
                f"commits/s, slowest/fastest {row['slowest_over_fastest']:.2f}, commit p50 "
                f"{row['commit_ms']['p50']:.1f} ms p99 {row['commit_ms']['p99']:.1f} ms, "
                f"client CPU {row['client_cpu_ms_per_commit']:.2f} ms/commit",
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()
    _save(out, rows)


def creates(seconds: float, out: Path) -> None:
    """Streams created per second by one client (issue 19): `create_stream` from 1 and 8
    threads, through the client and through the manager alone; `create_streams` in batches."""
    rows = [
        _create_rate(threads, seconds, via) for via in ("client", "manager") for threads in (1, 8)
    ]
    rows += [_create_rate(1, seconds, "batch", batch) for batch in (100, 1000)]
    _save(out, rows)


def _create_rate(threads: int, seconds: float, via: str, batch: int = 1) -> dict[str, Any]:
    """Streams/s `via` ``client``: ``client.create_stream`` (one entry per create, concurrent
    creates folded; before issue 19's change it committed a create and an open, two entries,
    under the client's lock); ``manager``: `MetadataManager.create_stream(open_for=...)`,
    the metadata commit alone, without the client's bookkeeping; ``batch``:
    ``client.create_streams`` of `batch` streams a call."""
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
            tags = [{"t": str(i)}] * batch
            while time.monotonic() < deadline[0]:
                if via == "client":
                    client.create_stream({"t": str(i)})
                elif via == "batch":
                    client.create_streams(tags)
                else:
                    meta.create_stream({"t": str(i)}, open_for="local")
                counts[i] += batch

        pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        started = time.monotonic()
        deadline[0] = started + seconds
        start.wait()
        for t in pool:
            t.join()
        # A call started before the deadline ends after it: rates are over the time taken.
        elapsed = time.monotonic() - started
        # Log entries written: how many creates each entry folded.
        entries = client._meta.seq
        client.close()
    row = {
        "via": via,
        "threads": threads,
        "batch": batch,
        "streams_per_s": sum(counts) / elapsed,
        "streams": sum(counts),
        "log_entries": entries,
    }
    print(
        f"create via {via}, {threads} threads, batch {batch}: "
        f"{row['streams_per_s']:8.1f} streams/s {row}",
        flush=True,
    )
    return row


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "--worker":
        latency = (float(sys.argv[5]), float(sys.argv[6]))
        metadata = None if sys.argv[4] == "-" else sys.argv[4]
        options = json.loads(sys.argv[7])
        worker(sys.argv[2], sys.argv[3], metadata, latency, options, Path(sys.argv[8]))
    else:
        main()
