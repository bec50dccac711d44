"""Foundation benchmark: the memory WAL over a local-directory object store.

Measures, in one run: appends/s for 100-byte batches from one thread; MB/s appending 64 KiB
batches; fetch MB/s from the LogCache (hot) and from uploaded objects (cold, a new client);
PUT and GET counts per GiB written and read. Prints a table with the targets and saves
JSON to bench/results/foundation.json.

    .venv/bin/python bench/foundation_bench.py [--dir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import s3stream
from s3stream import RecordBatch

GiB = 1 << 30


def _client(root: Path) -> s3stream.StreamClient:
    return s3stream.open(str(root), wal="memory://")


def bench_small(root: Path, n: int) -> dict[str, float]:
    payload = b"x" * 100
    with _client(root) as c:
        s = c.create_stream()
        batch = RecordBatch(payload, base_timestamp=0)
        t0 = time.perf_counter()
        for _ in range(n):
            s.append(batch)
        dt = time.perf_counter() - t0
    return {"batches": n, "seconds": dt, "appends_per_s": n / dt}


def bench_large(root: Path, total_bytes: int, streams: int) -> dict[str, float]:
    size = 64 * 1024
    n = total_bytes // size
    payload = bytes(range(256)) * (size // 256)
    with _client(root) as c:
        ss = [c.create_stream() for _ in range(streams)]
        batch = RecordBatch(payload, base_timestamp=0)
        t0 = time.perf_counter()
        for i in range(n):
            ss[i % streams].append(batch)
        dt_append = time.perf_counter() - t0
        # Hot read: straight from the LogCache (log_cache_bytes keeps the recent tail).
        t1 = time.perf_counter()
        hot = 0
        for s in ss:
            off = max(s.start_offset, s.confirm_offset - 256)
            while off < s.confirm_offset:
                r = s.fetch(off, max_bytes=4 << 20)
                hot += r.total_bytes
                off = r.next_offset
        dt_hot = time.perf_counter() - t1
        t2 = time.perf_counter()
        c.flush()
        dt_flush = time.perf_counter() - t2
        m = c.metrics.object_store
        puts = m.puts + m.conditional_puts
        ids = [s.stream_id for s in ss]
    with _client(root) as c2:
        before = c2.metrics.object_store
        t3 = time.perf_counter()
        cold = 0
        for sid in ids:
            off = 0
            end = c2.stream_info(sid).end_offset
            while off < end:
                r = c2.read(sid, off, max_bytes=8 << 20)
                cold += r.total_bytes
                off = r.next_offset
        dt_cold = time.perf_counter() - t3
        after = c2.metrics.object_store
    written = n * size
    return {
        "batches": n,
        "bytes": written,
        "append_seconds": dt_append,
        "append_mb_per_s": written / 1e6 / dt_append,
        "flush_seconds": dt_flush,
        "hot_fetch_mb_per_s": hot / 1e6 / dt_hot,
        "cold_fetch_mb_per_s": cold / 1e6 / dt_cold,
        "puts": puts,
        "puts_per_gib_written": puts / (written / GiB),
        "mib_per_put": written / (1 << 20) / max(puts, 1),
        "gets_per_gib_read": (after.gets - before.gets) / (cold / GiB),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=None, help="where the object store lives (default: temp)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "foundation.json"))
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="s3s-bench-", dir="/tmp"))
    small_n = 100_000 if args.quick else 500_000
    large_bytes = (256 << 20) if args.quick else GiB
    try:
        small = bench_small(base / "small", small_n)
        large = bench_large(base / "large", large_bytes, streams=4)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = [
        ("appends/s, 100 B batches, 1 thread", small["appends_per_s"], ">= 100,000"),
        ("append MB/s, 64 KiB batches", large["append_mb_per_s"], ">= 500"),
        ("fetch MB/s from LogCache (hot)", large["hot_fetch_mb_per_s"], "-"),
        ("fetch MB/s from objects (cold)", large["cold_fetch_mb_per_s"], ">= 300"),
        ("PUTs per GiB written", large["puts_per_gib_written"], "<= 128 (1 per 8 MiB)"),
        ("GETs per GiB read (cold)", large["gets_per_gib_read"], "-"),
    ]
    print(f"{'figure':42} {'measured':>12}  target")
    for name, value, target in rows:
        print(f"{name:42} {value:12,.1f}  {target}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"small": small, "large": large, "quick": args.quick}, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
