"""Benchmark of the object-store ("S3") WAL against SeaweedFS on loopback, beside SlateDB.

For 1 KiB and 64 KiB records at ``wal_batch_interval_ms`` 250, 50 and 10, two phases each:

- *latency*: an open-loop load at a fixed offered rate; each append's latency is measured
  from the moment it was scheduled (so a stall cannot hide queued requests) to its
  acknowledgement; p50/p99/p999, and the PUT latency of the WAL's own PUTs as the server's
  reference (target: p99 <= interval + 2 x PUT p99);
- *throughput*: a closed loop keeping 64 MiB of appends outstanding; bytes/s, PUTs/s and
  PUTs per GiB.

Slow WAL PUTs are hedged (``ObjectWalSettings.max_hedged_puts``, adaptive delay); each row
records the hedges sent and won, and for every PUT slower than 5x the median how many other
PUTs started and finished while it ran (so an isolated slow request tells itself apart from
a stall of the whole server). "PUT" latencies count every attempt, hedges included.

The WAL's S3 client (``--clients``): obstore (`ObstoreS3ObjectStore`, the S3 WAL's default)
and boto3 (`S3ObjectStore`) run row by row, interleaved, in a rotating order; each row's
``s3stream`` is the first client's run, ``by_client`` has every client's, and
``client_ratios`` boto3's latency percentiles over obstore's.

SlateDB (the ``slatedb`` Python package, an embedded LSM store whose WAL is also on object
storage) runs the same phases against the same server with ``flush_interval`` equal to the
batch interval, each write awaited until durable. Both sides are driven from Python.

Usage: ``python bench/s3_wal_bench.py [--quick] [--rows 1024:50 ...] [--no-hedge]
[--clients obstore boto3] [--out bench/results/s3_wal.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from _stats import pct

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from s3stream.objectstore.base import ObjectStore  # noqa: E402
from s3stream.objectstore.s3 import S3ObjectStore  # noqa: E402
from s3stream.objectstore.s3_obstore import ObstoreS3ObjectStore  # noqa: E402
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
    """Records start and end of every conditional create (the WAL's PUTs, hedges included)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.lock = threading.Lock()
        self.spans: list[tuple[float, float]] = []

    def take(self) -> list[tuple[float, float]]:
        with self.lock:
            out, self.spans = self.spans, []
        return out

    def put_if_absent(self, key: str, data: bytes) -> bool:
        t0 = time.perf_counter()
        try:
            return self.inner.put_if_absent(key, data)
        finally:
            with self.lock:
                self.spans.append((t0, time.perf_counter()))


class StallingStore(ForwardingObjectStore):
    """Once armed, holds the first attempt of the `at`-th new WAL object for `stall_s`: one
    isolated slow request, like the 1 s outlier seen in a full run, made reproducible to
    show what hedging does about it (``--stall-ms``; off by default)."""

    def __init__(self, inner: ObjectStore, stall_s: float, at: int) -> None:
        super().__init__(inner)
        self.stall_s = stall_s
        self.at = at
        self.lock = threading.Lock()
        self.armed = False
        self.seen: set[str] = set()
        self.stalled = 0

    def put_if_absent(self, key: str, data: bytes) -> bool:
        with self.lock:
            stall = self.armed and key not in self.seen and len(self.seen) + 1 == self.at
            if self.armed:
                self.seen.add(key)
            self.stalled += stall
        if stall:
            time.sleep(self.stall_s)
        return self.inner.put_if_absent(key, data)


_WALL_OFFSET = time.time() - time.perf_counter()


def slow_puts(spans: list[tuple[float, float]], factor: float = 5.0) -> list[dict[str, float]]:
    """Every PUT slower than `factor` x the median, with how many other PUTs started and
    finished while it ran: many means the server kept serving (a hedge can help), none
    with PUTs started meanwhile means everything stalled."""
    if not spans:
        return []
    median = statistics.median(b - a for a, b in spans)
    out = []
    for a, b in spans:
        if b - a > factor * median:
            started = [(a2, b2) for a2, b2 in spans if a < a2 < b]
            out.append(
                {
                    "at_unix_s": round(a + _WALL_OFFSET, 3),  # to match the server's log
                    "ms": 1000 * (b - a),
                    "others_started": len(started),
                    "others_done_meanwhile": sum(b2 < b for _, b2 in started),
                }
            )
    return out


def lat_summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "avg_ms": 1000 * statistics.fmean(values) if values else float("nan"),
        "p50_ms": 1000 * pct(values, 0.50),
        "p99_ms": 1000 * pct(values, 0.99),
        "p999_ms": 1000 * pct(values, 0.999),
    }


# -- s3stream ------------------------------------------------------------------------------------


def s3stream_run(
    server: SeaweedS3Server,
    size: int,
    interval_ms: int,
    duration: float,
    inflight: int,
    freeze: bool,
    hedges: int,
    stall_ms: int = 0,
    stall_at: int = 50,
    client: str = "boto3",
) -> dict[str, Any]:
    kind = ObstoreS3ObjectStore if client == "obstore" else S3ObjectStore
    s3 = kind(server.bucket, f"bench-{uuid.uuid4().hex}", **server.storage_options())
    stalling = StallingStore(s3, stall_ms / 1000, stall_at)
    store = TimingStore(stalling)
    settings = ObjectWalSettings(
        wal_batch_interval_ms=interval_ms,
        wal_batch_max_bytes=8 << 20,
        max_inflight_puts=inflight,
        max_hedged_puts=hedges,
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
    hedged0, won0 = wal.hedged_puts, wal.hedges_won
    stalling.armed = stall_ms > 0

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
        last.add_done_callback(functools.partial(done, scheduled))
    assert last is not None
    wal.trim(last.result())  # as the uploader would; long phases would fill the WAL otherwise
    spans = store.take()
    put_s = [b - a for a, b in spans]
    latency = lat_summary(latencies)
    hedging = {
        "hedged_puts": wal.hedged_puts - hedged0,
        "hedges_won": wal.hedges_won - won0,
        # for objects of < 256 KiB, < 2 MiB and more (each size class adapts on its own)
        "hedge_delay_ms_at_end": [wal.hedge_delay_ms(n) for n in (0, 1 << 20, 8 << 20)],
    }
    hedged1, won1 = wal.hedged_puts, wal.hedges_won
    stalling.armed = False

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
    tput_spans = store.take()
    tput_puts = len(tput_spans)
    hedging["throughput_hedged_puts"] = wal.hedged_puts - hedged1
    hedging["throughput_hedges_won"] = wal.hedges_won - won1
    wal.close()
    s3.close()
    gib = acked * size / (1 << 30)
    return {
        "latency": latency,
        "offered_appends_per_s": rate,
        "put_latency": lat_summary(put_s),
        "slow_puts": slow_puts(spans),
        "injected_stalls": stalling.stalled,
        "hedging": hedging,
        "puts_per_s_at_offered_load": len(put_s) / duration,
        "throughput_mb_s": acked * size / elapsed / 1e6,
        "throughput_appends_per_s": acked / elapsed,
        "puts_per_s": tput_puts / elapsed,
        "puts_per_gib": tput_puts / gib if gib else float("nan"),
        "throughput_put_latency": lat_summary([b - a for a, b in tput_spans]),
        "trims_per_s": trims / elapsed,
    }


# -- SlateDB -------------------------------------------------------------------------------------


def slatedb_run(
    server: SeaweedS3Server, size: int, interval_ms: int, duration: float, freeze: bool
) -> dict[str, Any]:
    from slatedb.uniffi import DbBuilder, Settings
    from slatedb.uniffi import ObjectStore as SlateStore

    async def main() -> dict[str, Any]:
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
        "--rows",
        nargs="+",
        default=None,
        metavar="BYTES:MS",
        help="only these rows, e.g. 1024:50 (overrides --sizes and --intervals)",
    )
    parser.add_argument("--hedges", type=int, default=1, help="max_hedged_puts (0: no hedging)")
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="do not gc.freeze() before each run"
    )
    parser.add_argument(
        "--stall-ms",
        type=int,
        default=0,
        help="hold one WAL PUT this long in each latency phase (a reproducible outlier)",
    )
    parser.add_argument(
        "--stall-at", type=int, default=50, help="...the first attempt of this WAL object"
    )
    parser.add_argument("--server-log", default=None, help="copy SeaweedFS's log here")
    parser.add_argument(
        "--clients",
        nargs="+",
        choices=("obstore", "boto3"),
        default=["obstore", "boto3"],
        help="the WAL's S3 clients, interleaved (the first is each row's 's3stream')",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "s3_wal.json"))
    args = parser.parse_args(argv)
    duration = args.duration or (1.5 if args.quick else 5.0)
    if args.rows:
        try:
            rows = [tuple(int(x) for x in r.split(":")) for r in args.rows]
            assert all(len(r) == 2 for r in rows)
        except (ValueError, AssertionError):
            parser.error(f"--rows takes BYTES:MS pairs, got {args.rows}")
    else:
        rows = [(size, interval) for size in args.sizes for interval in args.intervals]
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
            for n, (size, interval) in enumerate(rows):
                row: dict[str, Any] = {"record_bytes": size, "interval_ms": interval}
                freeze = not args.no_gc_freeze
                clients = list(args.clients)
                by_client: dict[str, Any] = {}
                # A rotating order, so that drift of the machine touches every client alike.
                for client in clients[n % len(clients) :] + clients[: n % len(clients)]:
                    by_client[client] = s3stream_run(
                        server,
                        size,
                        interval,
                        duration,
                        args.inflight,
                        freeze,
                        args.hedges,
                        args.stall_ms,
                        args.stall_at,
                        client=client,
                    )
                row["s3stream"] = by_client[clients[0]]
                row["client"] = clients[0]
                row["by_client"] = {c: by_client[c] for c in clients}
                if {"obstore", "boto3"} <= by_client.keys():
                    b, o = by_client["boto3"], by_client["obstore"]
                    row["client_ratios"] = {
                        f"append_{q}_boto3_over_obstore": b["latency"][f"{q}_ms"]
                        / o["latency"][f"{q}_ms"]
                        for q in ("p50", "p99")
                    } | {
                        "put_p50_boto3_over_obstore": b["put_latency"]["p50_ms"]
                        / o["put_latency"]["p50_ms"],
                        "throughput_obstore_over_boto3": o["throughput_mb_s"]
                        / b["throughput_mb_s"],
                    }
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
            if args.server_log:
                shutil.copy(Path(tmp) / "weed.log", args.server_log)
    report = {
        "bench": "s3_wal",
        "quick": args.quick,
        "phase_seconds": duration,
        "max_inflight_puts": args.inflight,
        "max_hedged_puts": args.hedges,
        "clients": args.clients,
        "injected_stall_ms": args.stall_ms,
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
            f"{'PUT p99':>7} {'bound':>6} {'hedges':>7} | {'MB/s':>7} {'app/s':>8} {'PUT/s':>6} "
            f"{'PUT/GiB':>8} {'hedges':>7}"
        )
        _HEADER_PRINTED = True
    size = f"{row['record_bytes'] // 1024}K"
    runs = [(f"s3s/{c}"[:9], r) for c, r in row["by_client"].items()]
    if "slatedb" in row:
        runs.append(("slatedb", row["slatedb"]))
    for name, r in runs:
        lat = r["latency"]
        if name != "slatedb":
            h = r["hedging"]
            won = f"{h['hedged_puts']}/{h['hedges_won']}"
            won_t = f"{h['throughput_hedged_puts']}/{h['throughput_hedges_won']}"
            extra = f"{r['put_latency']['p99_ms']:7.1f} {row['p99_bound_ms']:6.0f} {won:>7}"
            puts = f"{r['puts_per_s']:6.1f} {r['puts_per_gib']:8.0f} {won_t:>7}"
        else:
            extra = f"{'':7} {'':6} {'':7}"
            puts = f"{'':6} {'':8} {'':7}"
        print(
            f"{name:9} {size:>5} {row['interval_ms']:4d} | {lat['p50_ms']:7.1f} "
            f"{lat['p99_ms']:7.1f} {lat['p999_ms']:7.1f}    | {extra} | "
            f"{r['throughput_mb_s']:7.1f} {r['throughput_appends_per_s']:8.0f} {puts}"
        )
        slow = r.get("slow_puts") or []
        if slow:
            shown = ", ".join(
                f"{p['ms']:.0f} ms ({p['others_done_meanwhile']}/{p['others_started']})"
                for p in sorted(slow, key=lambda p: -p["ms"])[:6]
            )
            print(f"{'':9} slow PUTs (others done/started meanwhile): {shown}")
    for name, value in (row.get("client_ratios") or {}).items():
        print(f"{'':9} {name}: {value:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
