"""Caching and compaction benchmark against SeaweedFS on loopback.

Measures, in one run (a throw-away ``weed mini`` started with `SeaweedS3Server`):

- **cold catch-up read**: one stream of 1 GiB (interleaved with 20 small streams, then
  compacted into stream objects) read sequentially by a new client with a cold BlockCache,
  1 MiB per fetch, every payload checksummed through the zero-copy `FetchedBatch.view`:
  MB/s and GETs issued, against the server's raw sequential GET throughput for the same
  objects (whole-object GETs one after another), measured in the same run; the same read
  through `FetchedBatch.payload` (a ``bytes`` copy per batch) is reported beside it;
- **tail-read hit rate**: a reader following a writer (same client); the share of fetches
  that needed no GET (served by the LogCache or the BlockCache);
- **compaction cost**: CPU seconds (of the compacting thread) and wall time of unthrottled
  compactions of the append phases' workload, per MB read;
- **append p99** (500 appends/s of 1 KiB, file WAL on local disk, object store on
  SeaweedFS) without compaction, with the client's own compactor running, and with a
  standalone compaction process (``python -m s3stream compact``, with its defaults: CPU
  priority lowered by ``--nice 10``) running; the client's background traffic is throttled
  through the rate limiter to each of ``--compaction-rates`` MiB/s, and so are both
  compactors' own limits (`CompactionSettings.bytes_per_s`, ``--bytes-per-s``); 0 means the
  defaults (no background limit, the compactors' default limit). Phases
  alternate over several rounds and are pooled, so drifts of the machine's load hit all
  alike; a compaction phase with fewer than `n` appends in running slices (or `n` / 2 in
  paused ones) is repeated (new load, new compaction).
  Each compaction phase starts after its load's uploads plus a pause of ``SETTLE_S``, so
  that it measures compaction and not the object store digesting a burst of uploads.
  Within a compaction phase the compaction is paused and resumed every ``SLICE_S`` (the
  standalone job by SIGSTOP/SIGCONT, the in-process compactor held before its next request),
  and appends are counted as running or paused (the first ``GUARD_S`` of each slice not at
  all): a baseline taken seconds apart from the measurement, in the same process state, on a
  shared machine whose fsync latency drifts by 2x from minute to minute. The rate limiter's
  bucket fills while paused, so running slices start with a burst: if anything, harsher than
  steady compaction. Both ratios are reported: against the idle phases and against the
  paused slices (interleaved).
  SeaweedFS keeps its data in /dev/shm: it stands for remote storage, whose disk writes do
  not compete with the local WAL's fdatasync.

Targets: catch-up >= 70% of raw GET throughput with <= 1 GET per 4 MiB read; append p99
under compaction <= 1.5x append p99 without (judged on the interleaved ratio). Prints a
table and saves JSON to bench/results/compaction.json. ``--quick``: 128 MiB, one round, the
defaults only.

    .venv/bin/python bench/compaction_bench.py [--quick] [--out PATH] [--compaction-rates 0,4,16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import crc32c
from _stats import pct

import s3stream
from s3stream import ClientSettings, CompactionSettings, RecordBatch
from s3stream.compaction.executor import CompactionExecutor
from s3stream.objectstore.registry import open_object_store
from s3stream.testing.seaweedfs import SeaweedS3Server

MiB = 1 << 20
GiB = 1 << 30
ROOT = Path(__file__).resolve().parent
#: Appends per second in the append-latency phases.
RATE = 500
#: Pause after each phase's load before measuring (see `bench_append`).
SETTLE_S = 2.0
#: A compaction phase pauses and resumes the compaction every SLICE_S seconds (see
#: `_measure_while`); appends in the first GUARD_S of a slice are not counted, so a request
#: in flight when the pause came does not count as paused, nor the pause as running.
SLICE_S = 1.0
GUARD_S = 0.25


def _batch(base: bytes, i: int) -> bytes:
    # Distinct content per batch without generating random bytes for each.
    return i.to_bytes(8, "little") + base[8:]


# ------------------------------------------------------------------------------------------
# Cold catch-up read vs raw GET


def _catch_up_read(
    url: str, opts: dict[str, Any], sid: int, attempt: int, digest: int, *, as_bytes: bool = False
) -> dict[str, Any]:
    """A new client (cold caches) reads the whole stream, 1 MiB per fetch, and checksums
    every payload: through the zero-copy `FetchedBatch.view`, or with `as_bytes` through
    `FetchedBatch.payload` (one copy per batch)."""
    with s3stream.open(url, wal="memory://", node_id=f"reader{attempt}", storage_options=opts) as r:
        s = r.open_stream(sid)
        m0 = r.metrics
        # crc32c: a checksum cheap enough not to slow the read it checks.
        check = 0
        t = time.perf_counter()
        off, nbytes, fetches = 0, 0, 0
        while off < s.confirm_offset:
            res = s.fetch(off, max_bytes=1 * MiB)
            for b in res.batches:
                check = crc32c.crc32c(b.payload if as_bytes else b.view, check)
                nbytes += b.size
            off = res.next_offset
            fetches += 1
        dt = time.perf_counter() - t
        m = r.metrics
    if check != digest:
        raise SystemExit("catch-up read returned different bytes")
    gets = m.object_store.gets - m0.object_store.gets
    return {
        "mb_per_s": nbytes / dt / 1e6,
        "seconds": dt,
        "bytes": nbytes,
        "fetches": fetches,
        "gets": gets,
        "mib_per_get": nbytes / MiB / max(1, gets),
        "block_gets": m.block_cache.gets,
        "readahead_blocks": m.block_cache.readahead_blocks,
        "readahead_used": m.block_cache.readahead_used,
        "hit_rate": m.block_cache.hit_rate,
    }


def bench_catch_up(url: str, opts: dict[str, Any], total: int, repeats: int) -> dict[str, Any]:
    settings = ClientSettings(
        upload_threshold_bytes=64 * MiB,
        stream_split_bytes=16 * MiB,
        max_pending_bytes=256 * MiB,
        compaction=CompactionSettings(deletion_delay_ms=0),
    )
    batch_bytes = 64 * 1024
    base = os.urandom(batch_bytes)
    digest = 0
    t0 = time.perf_counter()
    with s3stream.open(
        url, wal="memory://", node_id="writer", storage_options=opts, settings=settings
    ) as c:
        big = c.create_stream(tags={"role": "catch-up"})
        small = [c.create_stream() for _ in range(20)]
        futures = []
        for i in range(total // batch_bytes):
            data = _batch(base, i)
            digest = crc32c.crc32c(data, digest)
            futures.append(big.append_async(RecordBatch(data)))
            if i % 16 == 0:
                small[i % 20].append(RecordBatch(data[:1024]))
            if len(futures) >= 512:
                for f in futures:
                    f.result()
                futures.clear()
        for f in futures:
            f.result()
        c.flush()
        write_s = time.perf_counter() - t0
        objects_before = sum(1 for o in c.metadata.state.objects.values() if o.live)
        t1 = time.perf_counter()
        report = c.compact()
        compact_s = time.perf_counter() - t1
        sid = big.stream_id
        objs = [(o.key, o.size) for o in c.metadata.state.objects_for(sid, 0)]
    # Raw GETs and catch-up reads alternate, so that both see the same machine load.
    store = open_object_store(url, opts)
    raw: list[float] = []
    reads: list[dict[str, Any]] = []
    reads_bytes: list[dict[str, Any]] = []
    for attempt in range(repeats):
        t2 = time.perf_counter()
        n = sum(len(store.get(key)) for key, _ in objs)
        raw.append(n / (time.perf_counter() - t2) / 1e6)
        reads.append(_catch_up_read(url, opts, sid, attempt, digest))
        reads_bytes.append(_catch_up_read(url, opts, sid, repeats + attempt, digest, as_bytes=True))
    store.close()
    raw_mb_s = statistics.median(raw)
    ours_mb_s = statistics.median(r["mb_per_s"] for r in reads)
    bytes_mb_s = statistics.median(r["mb_per_s"] for r in reads_bytes)
    return {
        "stream_bytes": total,
        "write_seconds": write_s,
        "objects_before_compaction": objects_before,
        "compaction": {
            "seconds": compact_s,
            "objects_after": report.objects_after,
            "bytes_read": report.bytes_read,
            "bytes_written": report.bytes_written,
        },
        "stream_objects": len(objs),
        "object_mib": [round(size / MiB, 1) for _, size in objs],
        "raw_get_mb_per_s": raw,
        "reads": reads,
        "raw_get_median_mb_per_s": raw_mb_s,
        "catch_up_median_mb_per_s": ours_mb_s,
        "ratio_to_raw": ours_mb_s / raw_mb_s,
        "reads_as_bytes": reads_bytes,
        "catch_up_as_bytes_median_mb_per_s": bytes_mb_s,
        "ratio_to_raw_as_bytes": bytes_mb_s / raw_mb_s,
        "gets": max(r["gets"] for r in reads),
        "mib_per_get": min(r["mib_per_get"] for r in reads),
    }


# ------------------------------------------------------------------------------------------
# Tail reads


def bench_tail(url: str, opts: dict[str, Any], seconds: float) -> dict[str, Any]:
    settings = ClientSettings(upload_threshold_bytes=8 * MiB, upload_interval_ms=1000)
    payload = os.urandom(4096)
    with s3stream.open(
        url, wal="memory://", node_id="tail", storage_options=opts, settings=settings
    ) as c:
        s = c.create_stream()
        stop = threading.Event()
        counts = {"fetches": 0, "with_get": 0, "batches": 0}

        def reader() -> None:
            off = 0
            while not stop.is_set() or off < s.confirm_offset:
                if off >= s.confirm_offset:
                    time.sleep(0.0005)
                    continue
                gets = c.metrics.object_store.gets
                res = s.fetch(off, max_bytes=256 * 1024)
                counts["fetches"] += 1
                counts["batches"] += len(res.batches)
                if c.metrics.object_store.gets != gets:
                    counts["with_get"] += 1
                off = res.next_offset

        t = threading.Thread(target=reader)
        t.start()
        end = time.perf_counter() + seconds
        appended = 0
        while time.perf_counter() < end:
            s.append(RecordBatch(payload))
            appended += 1
        stop.set()
        t.join()
        m = c.metrics
    return {
        "seconds": seconds,
        "appended_batches": appended,
        "fetches": counts["fetches"],
        "fetches_with_get": counts["with_get"],
        "hit_rate": 1 - counts["with_get"] / max(1, counts["fetches"]),
        "uploads": m.storage.uploads,
        "from_log_cache": m.storage.fetches_from_cache,
        "from_objects": m.storage.fetches_from_objects,
    }


# ------------------------------------------------------------------------------------------
# Append latency with and without compaction


def _load_for_compaction(c: s3stream.StreamClient, rounds: int, streams: int) -> None:
    """Many small stream-set objects plus small stream objects: work for the compactor."""
    ss = [c.create_stream(tags={"role": "load"}) for _ in range(streams)]
    body = os.urandom(32 * 1024)
    for r in range(rounds):
        for i, s in enumerate(ss):
            n = 8 if i % 10 == 0 else 1  # a few streams leave as stream objects
            for k in range(n):
                s.append(RecordBatch(_batch(body, r * 100 + k)[: 4096 * (1 + i % 8)]))
        c.flush()


def _append_latencies(
    s: s3stream.Stream,
    payload: bytes,
    *,
    n: int | None = None,
    seconds: float | None = None,
    guard_s: float = 0.0,
) -> list[float]:
    """Latencies (ms) of appends at `RATE`, `n` of them or for `seconds`; appends that start
    within `guard_s` of the start are made but not counted."""
    t0 = time.perf_counter()
    out: list[float] = []
    nxt = t0
    made = 0
    while n is None or made < n:
        nxt += 1 / RATE
        t = time.perf_counter()
        if seconds is not None and t - t0 >= seconds:
            break
        s.append(RecordBatch(payload))
        made += 1
        if t - t0 >= guard_s:
            out.append((time.perf_counter() - t) * 1000)
        pause = nxt - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return out


def _measure_while(
    s: s3stream.Stream,
    payload: bytes,
    busy: Callable[[], bool],
    pause: Callable[[], None],
    resume: Callable[[], None],
) -> tuple[list[float], list[float]]:
    """(latencies while compaction runs, latencies while it is paused): the compaction is
    paused and resumed every `SLICE_S` until `busy()` turns false."""
    running: list[float] = []
    paused: list[float] = []
    on = True
    try:
        while busy():
            (running if on else paused).extend(
                _append_latencies(s, payload, seconds=SLICE_S, guard_s=GUARD_S)
            )
            (pause if on else resume)()
            on = not on
    finally:
        resume()
    return running, paused


@contextlib.contextmanager
def _gated_compactor() -> Iterator[threading.Event]:
    """An event that, while cleared, holds the in-process compactor before its next request
    (bench only: patched into `CompactionExecutor._throttle`, which every request passes)."""
    gate = threading.Event()
    gate.set()
    real = CompactionExecutor._throttle

    def gated(executor: CompactionExecutor, nbytes: int, requests: int = 1) -> None:
        gate.wait()
        real(executor, nbytes, requests)

    with mock.patch.object(CompactionExecutor, "_throttle", gated):
        yield gate


def _in_process_compaction(
    c: s3stream.StreamClient, s: s3stream.Stream, payload: bytes
) -> tuple[list[float], list[float], Any]:
    done = threading.Event()
    reports: list[Any] = []

    def compact() -> None:
        try:
            reports.append(c.compact())
        finally:
            done.set()

    with _gated_compactor() as gate:
        t = threading.Thread(target=compact)
        t.start()
        running, paused = _measure_while(
            s, payload, lambda: not done.is_set(), gate.clear, gate.set
        )
        t.join()
    return running, paused, reports[0]


def _standalone_compaction(
    c: s3stream.StreamClient,
    s: s3stream.Stream,
    payload: bytes,
    url: str,
    opts: dict[str, Any],
    node: str,
    rate: int,
) -> tuple[list[float], list[float], str]:
    env = dict(os.environ)
    env.update(
        {
            "AWS_ACCESS_KEY_ID": opts["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": opts["aws_secret_access_key"],
            "AWS_ENDPOINT_URL": opts["endpoint_url"],
            "AWS_DEFAULT_REGION": opts.get("region_name", "us-east-1"),
        }
    )
    cmd = [sys.executable, "-m", "s3stream", "compact", url, "--no-progress", "--node-id", node]
    cmd += ["--deletion-delay-ms", "0"]
    if rate:
        cmd += ["--bytes-per-s", str(rate)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # The interpreter's start-up is not compaction: measure from the job's node registration
    # in the metadata log (it compacts right after) until it exits.
    while proc.poll() is None:
        c.metadata.refresh()
        if node in c.metadata.state.nodes:
            break
        time.sleep(0.02)

    def signal_job(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)

    running, paused = _measure_while(
        s,
        payload,
        lambda: proc.poll() is None,
        lambda: signal_job(signal.SIGSTOP),
        lambda: signal_job(signal.SIGCONT),
    )
    return running, paused, (proc.stdout.read() if proc.stdout else "").strip()[-300:]


def bench_compaction_cost(url: str, opts: dict[str, Any], rounds: int) -> dict[str, Any]:
    """CPU and wall time of unthrottled compactions of the append phases' workload."""
    settings = ClientSettings(
        upload_threshold_bytes=8 * MiB,
        block_target_bytes=512 * 1024,
        compaction=CompactionSettings(
            deletion_delay_ms=0,
            stream_set_split_bytes=2 * MiB,
            stream_object_target_bytes=16 * MiB,
            bytes_per_s=0,
        ),
    )
    runs: list[dict[str, Any]] = []
    with s3stream.open(
        url, wal="memory://", node_id="cost", storage_options=opts, settings=settings
    ) as c:
        for _ in range(rounds):
            _load_for_compaction(c, 15, 60)
            # Everything a pass does runs in the calling thread: its CPU time is the cost.
            cpu, t = time.thread_time(), time.perf_counter()
            report = c.compact()
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - t
            mb = report.bytes_read / 1e6
            runs.append(
                {
                    "mb_read": mb,
                    "mb_written": report.bytes_written / 1e6,
                    "objects": [report.objects_before, report.objects_after],
                    "cpu_s": cpu,
                    "wall_s": wall,
                    "cpu_ms_per_mb": cpu * 1000 / mb,
                    "wall_ms_per_mb": wall * 1000 / mb,
                }
            )
    return {
        "runs": runs,
        "cpu_ms_per_mb": sum(r["cpu_s"] for r in runs) * 1000 / sum(r["mb_read"] for r in runs),
        "wall_ms_per_mb": sum(r["wall_s"] for r in runs) * 1000 / sum(r["mb_read"] for r in runs),
    }


def bench_append(
    url: str,
    opts: dict[str, Any],
    wal_dir: Path,
    *,
    rate: int,
    n: int,
    load_rounds: int,
    rounds: int,
) -> dict[str, Any]:
    """Append p99 without compaction, with the client's compactor and with a standalone
    compaction process, both throttled to `rate` bytes/s (0: the defaults)."""
    settings = ClientSettings(
        upload_threshold_bytes=8 * MiB,
        upload_interval_ms=2000,
        block_target_bytes=512 * 1024,
        background_bytes_per_s=rate,
        compaction=CompactionSettings(
            deletion_delay_ms=0,
            stream_set_split_bytes=2 * MiB,
            stream_object_target_bytes=16 * MiB,
            # As the standalone job's --bytes-per-s: the compactor's own limit is the rate too.
            bytes_per_s=rate or CompactionSettings().bytes_per_s,
        ),
    )
    wal = f"file://{wal_dir}/node-{rate}.wal?capacity_bytes=512MiB"
    payload = os.urandom(1024)
    out: dict[str, Any] = {
        "appends_per_idle_phase": n,
        "rate_per_s": RATE,
        "rounds": rounds,
        "compaction_bytes_per_s": rate,
        "reports": [],
        "standalone_runs": 0,
    }
    phases: dict[str, list[float]] = {
        "idle": [],
        "in_process": [],
        "in_process_paused": [],
        "standalone": [],
        "standalone_paused": [],
    }
    with s3stream.open(
        url, wal=wal, node_id=f"appender-{rate}", storage_options=opts, settings=settings
    ) as c:
        s = c.create_stream()
        _append_latencies(s, payload, n=200)  # warm up

        def load() -> None:
            # Work for the compactor, then a pause in which the object store digests the
            # burst of uploads: a compaction phase measures compaction, not the burst.
            _load_for_compaction(c, load_rounds, 60)
            time.sleep(SETTLE_S)

        # Phases alternate, so slow drifts of the machine's load hit all of them alike; within
        # a compaction phase, the compaction itself alternates between running and paused.
        for r in range(rounds):
            phases["idle"] += _append_latencies(s, payload, n=n)
            got: list[float] = []
            paused = len(phases["in_process_paused"])
            # Repeated until both the running and the paused slices have enough appends.
            while len(got) < n or len(phases["in_process_paused"]) - paused < n // 2:
                load()
                lat, still, report = _in_process_compaction(c, s, payload)
                got += lat
                phases["in_process_paused"] += still
                out["reports"].append(
                    {
                        "objects_before": report.objects_before,
                        "objects_after": report.objects_after,
                        "bytes_read": report.bytes_read,
                        "seconds": report.duration_s,
                    }
                )
            phases["in_process"] += got
            phases["idle"] += _append_latencies(s, payload, n=n)
            got = []
            paused = len(phases["standalone_paused"])
            while len(got) < n or len(phases["standalone_paused"]) - paused < n // 2:
                load()
                node = f"compactor-{rate}-{r}-{out['standalone_runs']}"
                lat, still, text = _standalone_compaction(c, s, payload, url, opts, node, rate)
                got += lat
                phases["standalone_paused"] += still
                out["standalone_runs"] += 1
                out["standalone_output"] = text
            phases["standalone"] += got
        out["throttle"] = {
            "bytes": c.metrics.throttle.bytes,
            "waited_s": c.metrics.throttle.waited_s,
        }
    for name, xs in phases.items():
        out[name] = {
            "appends": len(xs),
            "p50_ms": pct(xs, 0.50),
            "p99_ms": pct(xs, 0.99),
            "max_ms": max(xs),
        }
    idle_p99 = out["idle"]["p99_ms"]
    out["p99_ratio_in_process"] = out["in_process"]["p99_ms"] / idle_p99
    out["p99_ratio_standalone"] = out["standalone"]["p99_ms"] / idle_p99
    for mode in ("in_process", "standalone"):
        out[f"p99_ratio_{mode}_interleaved"] = out[mode]["p99_ms"] / out[f"{mode}_paused"]["p99_ms"]
    return out


# ------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="128 MiB, short phases")
    ap.add_argument("--out", default=str(ROOT / "results" / "compaction.json"))
    ap.add_argument(
        "--compaction-rates",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="MiB/s limits of background traffic to measure appends under, 0: the defaults "
        "(default 0,4,16; 0 quick)",
    )
    args = ap.parse_args()
    if args.compaction_rates is None:
        args.compaction_rates = [0] if args.quick else [0, 4, 16]
    total = 128 * MiB if args.quick else 1 * GiB
    work = Path(tempfile.mkdtemp(prefix="s3s-compaction-bench-"))
    # The object store stands for remote storage: its disk writes must not queue behind (or
    # in front of) the WAL's fdatasync on the local disk, so SeaweedFS keeps its data in RAM.
    shm = Path("/dev/shm")
    weed_dir = (
        Path(tempfile.mkdtemp(prefix="s3s-weed-", dir=shm)) if shm.is_dir() else work / "weed"
    )
    results: dict[str, Any] = {
        "environment": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "quick": args.quick,
            "seaweedfs_data": str(weed_dir),
            "wal_dir": str(work / "wal"),
            "load_average_at_start": os.getloadavg(),
        }
    }
    try:
        with SeaweedS3Server(weed_dir) as server:
            opts = server.storage_options()
            base = f"s3://{server.bucket}"
            print("cold catch-up read ...", flush=True)
            results["catch_up"] = bench_catch_up(
                f"{base}/catchup", opts, total, 2 if args.quick else 3
            )
            print("tail reads ...", flush=True)
            results["tail"] = bench_tail(f"{base}/tail", opts, 3.0 if args.quick else 10.0)
            print("compaction cost ...", flush=True)
            results["compaction_cost"] = bench_compaction_cost(
                f"{base}/cost", opts, 2 if args.quick else 4
            )
            print("append latency ...", flush=True)
            (work / "wal").mkdir()
            results["append"] = {}
            for rate_mib in args.compaction_rates:
                label = f"{rate_mib} MiB/s" if rate_mib else "defaults"
                results["append"][label] = bench_append(
                    f"{base}/append-{rate_mib}",
                    opts,
                    work / "wal",
                    rate=rate_mib * MiB,
                    n=1000 if args.quick else 2000,
                    load_rounds=10 if args.quick else 15,
                    rounds=1 if args.quick else 2,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(weed_dir, ignore_errors=True)
    results["environment"]["load_average_at_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    _table(results)
    print(f"saved {out}")
    return 0


def _table(r: dict[str, Any]) -> None:
    cu, tail = r["catch_up"], r["tail"]
    rows = [
        ("raw sequential GET (same objects)", f"{cu['raw_get_median_mb_per_s']:.0f} MB/s", ""),
        ("cold catch-up read", f"{cu['catch_up_median_mb_per_s']:.0f} MB/s", ""),
        ("  ratio to raw GET", f"{cu['ratio_to_raw']:.0%}", ">= 70%"),
        (
            "  reading FetchedBatch.payload (a copy)",
            f"{cu['catch_up_as_bytes_median_mb_per_s']:.0f} MB/s "
            f"({cu['ratio_to_raw_as_bytes']:.0%} of raw)",
            "",
        ),
        ("  GETs issued", f"{cu['gets']} ({cu['mib_per_get']:.1f} MiB/GET)", ">= 4 MiB/GET"),
        (
            "compaction before the read",
            f"{cu['objects_before_compaction']} -> {cu['compaction']['objects_after']} objects "
            f"in {cu['compaction']['seconds']:.1f} s",
            "",
        ),
        ("tail-read hit rate", f"{tail['hit_rate']:.1%} of {tail['fetches']} fetches", ""),
    ]
    cost = r["compaction_cost"]
    mb = sum(x["mb_read"] for x in cost["runs"])
    rows.append(
        (
            "compaction cost, unthrottled",
            f"{cost['cpu_ms_per_mb']:.1f} ms CPU, {cost['wall_ms_per_mb']:.1f} ms wall per MB "
            f"({mb:.0f} MB in {len(cost['runs'])} passes)",
            "",
        )
    )
    for rate, ap in r["append"].items():
        rows += [
            (
                f"append p99, no compaction ({rate} runs)",
                f"{ap['idle']['p99_ms']:.2f} ms ({ap['idle']['appends']} appends)",
                "",
            ),
            (
                f"append p99, in-process compaction at {rate}",
                f"{ap['in_process']['p99_ms']:.2f} ms ({ap['p99_ratio_in_process']:.2f}x, "
                f"{ap['in_process']['appends']} appends)",
                "",
            ),
            (
                "  vs the same compaction's paused slices",
                f"{ap['in_process_paused']['p99_ms']:.2f} ms paused: "
                f"{ap['p99_ratio_in_process_interleaved']:.2f}x",
                "<= 1.5x",
            ),
            (
                f"append p99, standalone compaction at {rate}",
                f"{ap['standalone']['p99_ms']:.2f} ms ({ap['p99_ratio_standalone']:.2f}x, "
                f"{ap['standalone']['appends']} appends)",
                "",
            ),
            (
                "  vs the same compaction's paused slices",
                f"{ap['standalone_paused']['p99_ms']:.2f} ms paused: "
                f"{ap['p99_ratio_standalone_interleaved']:.2f}x",
                "<= 1.5x",
            ),
        ]
    w = max(len(a) for a, _, _ in rows)
    v = max(len(b) for _, b, _ in rows)
    for a, b, c in rows:
        print(f"{a:<{w}}  {b:<{v}}  {c}")


if __name__ == "__main__":
    raise SystemExit(main())
