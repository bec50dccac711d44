"""Benchmark of the object-store ("S3") WAL against SeaweedFS on loopback, beside SlateDB.

For 1 KiB and 64 KiB records at ``wal_batch_interval_ms`` 250, 50 and 10, two phases each:

- *latency*: an open-loop load at a fixed offered rate; each append's latency is measured
  from the moment it was scheduled (so a stall cannot hide queued requests) to its
  acknowledgement; p50/p99/p999, and the PUT latency of the WAL's own PUTs as the server's
  reference (target: p99 <= interval + 2 x PUT p99);
- *throughput*: a closed loop keeping 64 MiB of appends outstanding; bytes/s, PUTs/s and
  PUTs per GiB.

SlateDB (the ``slatedb`` Python package, an embedded LSM store whose WAL is also on object
storage) runs the same phases against the same server with ``flush_interval`` equal to the
batch interval, each write awaited until durable. Both sides are driven from Python.

Usage: ``python bench/s3_wal_bench.py [--quick] [--out bench/results/s3_wal.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from s3stream.objectstore.base import ObjectStore  # noqa: E402
from s3stream.objectstore.s3 import S3ObjectStore  # noqa: E402
from s3stream.objectstore.wrappers import ForwardingObjectStore  # noqa: E402
from s3stream.settings import ObjectWalSettings  # noqa: E402
from s3stream.testing.seaweedfs import SeaweedS3Server  # noqa: E402
from s3stream.wal.object import ObjectWal  # noqa: E402

SIZES = (1 << 10, 64 << 10)
INTERVALS_MS = (250, 50, 10)
#: Offered load of the latency phase, appends per second, by record size.
RATE = {1 << 10: 2000, 64 << 10: 200}
WINDOW_BYTES = 64 << 20
AUTOMQ_S3_WAL = {"avg_ms": 168, "p99_ms": 296, "note": "AutoMQ S3 WAL on AWS S3, 250 ms batch"}


class TimingStore(ForwardingObjectStore):
    """Records the latency of every conditional create (the WAL's PUTs)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.lock = threading.Lock()
        self.put_s: list[float] = []

    def take(self) -> list[float]:
        with self.lock:
            out, self.put_s = self.put_s, []
        return out

    def put_if_absent(self, key: str, data: bytes) -> bool:
        t0 = time.perf_counter()
        created = self.inner.put_if_absent(key, data)
        with self.lock:
            self.put_s.append(time.perf_counter() - t0)
        return created


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` in milliseconds (nearest rank)."""
    if not values:
        return float("nan")
    s = sorted(values)
    return 1000 * s[min(len(s) - 1, int(q * len(s)))]


def lat_summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "avg_ms": 1000 * statistics.fmean(values) if values else float("nan"),
        "p50_ms": pct(values, 0.50),
        "p99_ms": pct(values, 0.99),
        "p999_ms": pct(values, 0.999),
    }


# -- s3stream ------------------------------------------------------------------------------------


def s3stream_run(
    server: SeaweedS3Server,
    size: int,
    interval_ms: int,
    duration: float,
    inflight: int,
    freeze: bool,
) -> dict:
    store = TimingStore(
        S3ObjectStore(server.bucket, f"bench-{uuid.uuid4().hex}", **server.storage_options())
    )
    settings = ObjectWalSettings(
        wal_batch_interval_ms=interval_ms, wal_batch_max_bytes=8 << 20, max_inflight_puts=inflight
    )
    wal = ObjectWal(store, node_id="bench", node_epoch=1, settings=settings)
    list(wal.recover())
    # Warm up: open every pooled connection (one per PUT in flight) before measuring.
    for _ in range(3):
        warm = []
        for _ in range(4 * settings.max_inflight_puts):
            warm.append(wal.append(b"warm-up"))
            time.sleep(interval_ms / 4000)
        for f in warm:
            f.result()
    store.take()
    settle(freeze)
    record = os.urandom(size)

    # Latency: open loop at RATE[size].
    rate = RATE[size]
    latencies: list[float] = []
    lock = threading.Lock()

    def done(scheduled: float, fut: Future[int]) -> None:
        elapsed = time.perf_counter() - scheduled
        with lock:
            latencies.append(elapsed)

    n = int(rate * duration)
    start = time.perf_counter()
    # Only the last future is kept (acks come in order): a harness holding thousands of
    # futures makes every full garbage collection, and so the measured tail, longer.
    last: Future[int] | None = None
    for i in range(n):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        last = wal.append(record)
        last.add_done_callback(lambda f, s=scheduled: done(s, f))
    assert last is not None
    last.result()
    put_s = store.take()
    latency = lat_summary(latencies)

    # Throughput: closed loop with WINDOW_BYTES outstanding; trimmed every 16 MiB as the
    # uploader would after each upload (else the WAL fills up at max_unflushed_bytes).
    window = max(1, WINDOW_BYTES // size)
    sem = threading.Semaphore(window)
    highest = [-1]

    def acked_one(fut: Future[int]) -> None:
        highest[0] = max(highest[0], fut.result())
        sem.release()

    t0 = time.perf_counter()
    acked = 0
    trims = 0
    while time.perf_counter() - t0 < duration:
        sem.acquire()
        wal.append(record).add_done_callback(acked_one)
        acked += 1
        if acked % max(1, (16 << 20) // size) == 0 and highest[0] >= 0:
            wal.trim(highest[0])
            trims += 1
    for _ in range(window):
        sem.acquire()
    elapsed = time.perf_counter() - t0
    tput_puts = len(store.take())
    wal.close()
    store.inner.close()
    gib = acked * size / (1 << 30)
    return {
        "latency": latency,
        "offered_appends_per_s": rate,
        "put_latency": lat_summary(put_s),
        "puts_per_s_at_offered_load": len(put_s) / duration,
        "throughput_mb_s": acked * size / elapsed / 1e6,
        "throughput_appends_per_s": acked / elapsed,
        "puts_per_s": tput_puts / elapsed,
        "puts_per_gib": tput_puts / gib if gib else float("nan"),
        "trims_per_s": trims / elapsed,
    }


# -- SlateDB -------------------------------------------------------------------------------------


def slatedb_run(
    server: SeaweedS3Server, size: int, interval_ms: int, duration: float, freeze: bool
) -> dict:
    from slatedb.uniffi import DbBuilder, Settings
    from slatedb.uniffi import ObjectStore as SlateStore

    async def main() -> dict:
        store = SlateStore.resolve(f"s3://{server.bucket}/")
        builder = DbBuilder(f"slatedb-bench-{uuid.uuid4().hex}", store)
        settings = Settings.default()
        settings.set("flush_interval", json.dumps(f"{interval_ms}ms"))
        builder.with_settings(settings)
        db = await builder.build()
        record = os.urandom(size)
        counter = iter(range(1 << 62))

        async def write() -> None:
            handle = await db.put(b"k%016d" % next(counter), record)
            await handle.await_durable()

        await write()
        settle(freeze)
        rate = RATE[size]
        latencies: list[float] = []

        async def timed(scheduled: float) -> None:
            await write()
            latencies.append(time.perf_counter() - scheduled)

        n = int(rate * duration)
        start = time.perf_counter()
        outstanding: set[asyncio.Future[None]] = set()  # only what is in flight, as above
        for i in range(n):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(timed(scheduled))
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
        await asyncio.gather(*outstanding)
        latency = lat_summary(latencies)

        window = max(1, WINDOW_BYTES // size)
        sem = asyncio.Semaphore(window)
        acked = 0

        async def bounded() -> None:
            try:
                await write()
            finally:
                sem.release()

        t0 = time.perf_counter()
        pending = set()
        while time.perf_counter() - t0 < duration:
            await sem.acquire()
            task = asyncio.ensure_future(bounded())
            pending.add(task)
            task.add_done_callback(pending.discard)
            acked += 1
        await asyncio.gather(*pending)
        elapsed = time.perf_counter() - t0
        await db.shutdown()
        return {
            "latency": latency,
            "offered_appends_per_s": rate,
            "throughput_mb_s": acked * size / elapsed / 1e6,
            "throughput_appends_per_s": acked / elapsed,
        }

    return asyncio.run(main())


# -- driver --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (CI smoke run)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per phase")
    parser.add_argument("--no-slatedb", action="store_true", help="skip the SlateDB runs")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="record bytes")
    parser.add_argument("--intervals", type=int, nargs="+", default=INTERVALS_MS, help="ms")
    parser.add_argument("--inflight", type=int, default=4, help="max_inflight_puts")
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="do not gc.freeze() before each run"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "s3_wal.json"))
    args = parser.parse_args(argv)
    duration = args.duration or (1.5 if args.quick else 5.0)
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="s3wal-bench-") as tmp:
        server = SeaweedS3Server(Path(tmp)).start()
        try:
            opts = server.storage_options()
            os.environ.update(
                AWS_ENDPOINT=opts["endpoint_url"],
                AWS_ALLOW_HTTP="true",
                AWS_ACCESS_KEY_ID=opts["aws_access_key_id"],
                AWS_SECRET_ACCESS_KEY=opts["aws_secret_access_key"],
                AWS_REGION=opts["region_name"],
            )
            for size in args.sizes:
                for interval in args.intervals:
                    row: dict[str, Any] = {"record_bytes": size, "interval_ms": interval}
                    freeze = not args.no_gc_freeze
                    row["s3stream"] = s3stream_run(
                        server, size, interval, duration, args.inflight, freeze
                    )
                    if not args.no_slatedb:
                        row["slatedb"] = slatedb_run(server, size, interval, duration, freeze)
                    ours = row["s3stream"]
                    bound = interval + 2 * ours["put_latency"]["p99_ms"]
                    row["p99_bound_ms"] = bound
                    row["p99_within_bound"] = ours["latency"]["p99_ms"] <= bound
                    if "slatedb" in row:
                        peer = row["slatedb"]
                        row["beats_slatedb"] = {
                            "throughput": ours["throughput_mb_s"] > peer["throughput_mb_s"],
                            "p99": ours["latency"]["p99_ms"] < peer["latency"]["p99_ms"],
                        }
                    results.append(row)
                    print_row(row)
        finally:
            server.stop()
    report = {
        "bench": "s3_wal",
        "quick": args.quick,
        "phase_seconds": duration,
        "max_inflight_puts": args.inflight,
        "gc_freeze": not args.no_gc_freeze,
        "server": "SeaweedFS (weed mini) on loopback",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            # Other work on the machine inflates tails: the 1-minute load before and after.
            "loadavg_1m": [load_before[0], os.getloadavg()[0]],
        },
        "automq_reference": AUTOMQ_S3_WAL,
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def settle(freeze: bool) -> None:
    """Let the server settle after the previous run; with `freeze`, move every object alive
    now (the libraries, boto3's clients) out of the collector's reach, as a latency-minded
    application does after start-up, so full collections only scan what the run creates."""
    time.sleep(1)
    gc.unfreeze()
    gc.collect()
    if freeze:
        gc.freeze()


_HEADER_PRINTED = False


def print_row(row: dict[str, Any]) -> None:
    global _HEADER_PRINTED
    if not _HEADER_PRINTED:
        print(
            f"{'system':9} {'rec':>5} {'ivl':>4} | {'p50':>7} {'p99':>7} {'p999':>7} ms | "
            f"{'PUT p99':>7} {'bound':>6} | {'MB/s':>7} {'app/s':>8} {'PUT/s':>6} {'PUT/GiB':>8}"
        )
        _HEADER_PRINTED = True
    size = f"{row['record_bytes'] // 1024}K"
    for name in ("s3stream", "slatedb"):
        r = row.get(name)
        if r is None:
            continue
        lat = r["latency"]
        extra = (
            f"{r['put_latency']['p99_ms']:7.1f} {row['p99_bound_ms']:6.0f}"
            if name == "s3stream"
            else f"{'':7} {'':6}"
        )
        puts = (
            f"{r['puts_per_s']:6.1f} {r['puts_per_gib']:8.0f}"
            if name == "s3stream"
            else f"{'':6} {'':8}"
        )
        print(
            f"{name:9} {size:>5} {row['interval_ms']:4d} | {lat['p50_ms']:7.1f} "
            f"{lat['p99_ms']:7.1f} {lat['p999_ms']:7.1f}    | {extra} | "
            f"{r['throughput_mb_s']:7.1f} {r['throughput_appends_per_s']:8.0f} {puts}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
