"""The Polars scan (`s3stream.polars_scan`): what a filter saves, in objects, GETs and bytes.

Run: ``.venv/bin/python bench/polars_scan_bench.py [--streams 16] [--records 20000]``.

1. Writes ``--streams`` streams of ``--records`` records each (``--value-bytes``
   incompressible value, 10-byte key, timestamps T0 + the record's index in its stream, in ms)
   into two local stores, appending ``--batch`` records per stream in turn and flushing
   after every ``--flush`` records per stream, so every stream is spread over many objects:
   - ``stream_set``: as uploaded, each object holds a piece of every stream (one block each);
   - ``stream_objects``: ``stream_split_bytes=1``, so each upload gives each stream its own
     object (as compaction's split does).
2. Per store and query, on a fresh `StreamReader` (cold block cache; the files themselves
   are in the OS page cache after the first round), runs ``scan(reader).filter(...)`` with
   an aggregate (``count``, ``max(offset)``, ``sum(len(value))``, so every row is decoded) and
   counts, through a store wrapper under the reader: data objects opened (distinct keys
   GET'ed), GETs of data objects, bytes they returned, and all GETs (the metadata log's too).
   Seconds: the best of ``--repeat`` rounds.
   Queries: ``full`` (no filter), ``one_stream`` (``stream_id == streams // 2``),
   ``one_stream_tail`` (and ``offset >= 90%``), ``time_tail`` (``timestamp >=`` the last
   10% of every stream), ``unprunable`` (a filter on ``key``: reads what ``full`` reads).
   "All GETs" include the metadata log's (a look for its next entry per `read_arrow` and
   per time seek).

Prints a table and writes JSON to ``--out`` (default ``bench/results/polars_scan.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

import s3stream
from s3stream import ClientSettings, Record
from s3stream.objectstore import LocalObjectStore, MetricsObjectStore
from s3stream.objectstore.forwarding import ForwardingObjectStore
from s3stream.polars_scan import pruning, scan

REPO = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000


class GetLog(ForwardingObjectStore):
    """Records (key, bytes returned) of every GET (one thread at a time, as here)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.gets: list[tuple[str, int]] = []

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets.append((key, 0))  # counted even if it fails (a metadata entry not there yet)
        data = super().get(key, start, end)
        self.gets[-1] = (key, len(data))
        return data

    def get_suffix(self, key: str, length: int) -> bytes:
        self.gets.append((key, 0))
        data = super().get_suffix(key, length)
        self.gets[-1] = (key, len(data))
        return data


def write(path: Path, args: argparse.Namespace, *, split: bool) -> float:
    pool = np.random.default_rng(42).integers(0, 256, 1 << 22, dtype=np.uint8).tobytes()
    span = len(pool) - args.value_bytes
    settings = ClientSettings(stream_split_bytes=1) if split else ClientSettings()
    t = time.perf_counter()
    with s3stream.open(str(path), wal="memory://", settings=settings) as client:
        streams = [
            client.create_stream(tags={"topic": "bench", "partition": str(p)})
            for p in range(args.streams)
        ]
        for first in range(0, args.records, args.batch):
            for s in streams:
                records = []
                for i in range(first, min(args.records, first + args.batch)):
                    at = (i * 7919 + s.stream_id * 104729) % span
                    records.append(
                        Record(
                            pool[at : at + args.value_bytes],
                            key=b"key-%06d" % (i % 1000),
                            timestamp=T0 + i,
                        )
                    )
                s.append_records(records)
            if (first + args.batch) % args.flush == 0:
                client.flush()
    return time.perf_counter() - t


def queries(streams: int, records: int) -> dict[str, pl.Expr | None]:
    one, tail = streams // 2, records * 9 // 10
    return {
        "full": None,
        "one_stream": pl.col("stream_id") == one,
        "one_stream_tail": (pl.col("stream_id") == one) & (pl.col("offset") >= tail),
        "time_tail": pl.col("timestamp")
        >= datetime.fromtimestamp(T0 / 1000, UTC) + timedelta(milliseconds=tail),
        "unprunable": pl.col("key") == b"key-000007",
    }


def run(path: Path, predicate: pl.Expr | None) -> dict[str, Any]:
    log = GetLog(LocalObjectStore(path, fsync=False))
    with s3stream.StreamReader(MetricsObjectStore(log)) as reader:
        data = set(reader.snapshot().objects)
        log.gets.clear()
        frame = scan(reader)
        if predicate is not None:
            frame = frame.filter(predicate)
        t = time.perf_counter()
        out = frame.select(
            pl.len().alias("rows"),
            pl.col("offset").max().alias("max_offset"),
            pl.col("value").bin.size().sum().alias("value_bytes"),
        ).collect()
        seconds = time.perf_counter() - t
    gets = [(k, n) for k, n in log.gets if k in data]
    return {
        "rows": int(out["rows"][0]),
        "objects_opened": len({k for k, _ in gets}),
        "data_gets": len(gets),
        "data_bytes": sum(n for _, n in gets),
        "all_gets": len(log.gets),
        "seconds": seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--records", type=int, default=20_000, help="records per stream")
    ap.add_argument("--batch", type=int, default=500, help="records per appended batch")
    ap.add_argument("--flush", type=int, default=1000, help="records per stream per upload")
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/s3stream-polars-scan-bench")
    ap.add_argument(
        "--out",
        default=str(REPO / "bench" / "results" / "polars_scan.json"),
        help="JSON results file ('' for none)",
    )
    args = ap.parse_args()
    if args.flush % args.batch:
        sys.exit("--flush must be a multiple of --batch")

    root = Path(args.dir)
    if root.exists():
        shutil.rmtree(root)
    results: dict[str, Any] = {}
    for layout in ("stream_set", "stream_objects"):
        path = root / layout
        seconds = write(path, args, split=layout == "stream_objects")
        with s3stream.open_reader(str(path)) as reader:
            objects = reader.objects()
        size = sum(o.size for o in objects)
        print(
            f"\n{layout}: {len(objects)} objects, {size / 1e6:.1f} MB, written in {seconds:.2f} s"
        )
        print(
            f"{'query':<16} {'rows':>9} {'objects':>8} {'data GETs':>9} "
            f"{'MB read':>8} {'all GETs':>8} {'seconds':>8}"
        )
        by_query: dict[str, Any] = {"objects": len(objects), "bytes": size}
        for name, predicate in queries(args.streams, args.records).items():
            best: dict[str, Any] | None = None
            for _ in range(args.repeat):
                r = run(path, predicate)
                if best is not None:
                    assert {k: v for k, v in r.items() if k != "seconds"} == {
                        k: v for k, v in best.items() if k != "seconds"
                    }
                if best is None or r["seconds"] < best["seconds"]:
                    best = r
            assert best is not None
            best["seconds"] = round(best["seconds"], 4)
            best["pruning"] = repr(pruning(predicate))
            by_query[name] = best
            print(
                f"{name:<16} {best['rows']:>9,} {best['objects_opened']:>8} "
                f"{best['data_gets']:>9} {best['data_bytes'] / 1e6:>8.2f} "
                f"{best['all_gets']:>8} {best['seconds']:>8.3f}"
            )
        results[layout] = by_query
    shutil.rmtree(root)

    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "streams": args.streams,
                    "records_per_stream": args.records,
                    "batch": args.batch,
                    "flush_every": args.flush,
                    "value_bytes": args.value_bytes,
                    "repeat": args.repeat,
                    "polars": pl.__version__,
                    "python": platform.python_version(),
                    "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(),
                    "load_average_1min": round(os.getloadavg()[0], 2),
                    **results,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
