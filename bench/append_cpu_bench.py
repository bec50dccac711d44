"""CPU cost of one small append: thread CPU time per 100-byte append to the memory WAL.

Wall-clock rates on a shared machine move with the load of other processes; the CPU time the
appending thread spends per append does not, so this is the figure to compare two checkouts
by (run it from each, side by side, and compare the medians). Saves JSON to
bench/results/append_cpu.json (or --out).

    .venv/bin/python bench/append_cpu_bench.py [--rounds 7] [--appends 20000] [--out FILE]
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/append_cpu_bench.py --out ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import s3stream
from s3stream import ClientSettings, RecordBatch


def cpu_per_append_us(rounds: int, appends: int) -> list[float]:
    """Thread CPU microseconds per append, one figure per round (uploads held back)."""
    settings = ClientSettings(upload_interval_ms=3_600_000, upload_threshold_bytes=256 << 20)
    out: list[float] = []
    with s3stream.open("memory://", settings=settings) as client:
        stream = client.create_stream()
        batch = RecordBatch(b"x" * 100)
        for _ in range(rounds):
            t0 = time.thread_time()
            for _ in range(appends):
                stream.append(batch)
            out.append((time.thread_time() - t0) / appends * 1e6)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--appends", type=int, default=20_000)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "append_cpu.json"))
    args = p.parse_args()
    rounds = cpu_per_append_us(args.rounds, args.appends)
    result = {
        "s3stream": s3stream.__file__,
        "rounds_us": [round(r, 3) for r in rounds],
        "best_us": round(min(rounds), 3),
        "median_us": round(statistics.median(rounds), 3),
    }
    print(
        f"thread CPU per 100-byte append: best {result['best_us']} us, "
        f"median {result['median_us']} us ({args.rounds} x {args.appends:,})"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
