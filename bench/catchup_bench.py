"""Reading missed metadata-log entries: one GET each against parallel runs (issue 18).

A log of N entries in a local directory behind `FaultyObjectStore` adding a fixed latency to
every GET and HEAD (a remote store's round trip); side by side in one run, several rounds:

- **sequential**: `MetadataLogStore.read_entries`, the base class's entry-by-entry read;
- **runs**: `MetadataLog.read_entries`, two entries one by one, then runs of 2, 4, 8 read in
  parallel while every entry of a run is there.

What a client or reader opening a log up to 63 entries past its checkpoint, or a writer held
up while others committed, pays to catch up. JSON to ``bench/results/catchup.json``::

    .venv/bin/python bench/catchup_bench.py [--entries 63] [--get-ms 15] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=63)
    p.add_argument("--get-ms", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "catchup.json")
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from s3stream.clock import SystemClock
    from s3stream.metadata.base import MetadataLogStore
    from s3stream.metadata.log import MetadataLog
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.testing.faults import FaultRule, FaultyObjectStore
    from s3stream.testing.metadata import entry_bytes

    rows: dict[str, list[float]] = {"sequential": [], "runs": []}
    with tempfile.TemporaryDirectory(prefix="s3stream-catchup-") as tmp:
        raw = LocalObjectStore(tmp)
        writer = MetadataLog(raw)
        for seq in range(1, a.entries + 1):
            writer.create_entry(seq, entry_bytes(seq, "w"))
        delay = a.get_ms / 1000
        slow = FaultyObjectStore(
            raw,
            rules=[FaultRule(latency_s=(delay, delay), operations=frozenset({"get", "head"}))],
            rng=random.Random(1),
            clock=SystemClock(),
        )
        log = MetadataLog(slow)
        readers = {
            "sequential": lambda: MetadataLogStore.read_entries(log, 1),
            "runs": lambda: log.read_entries(1),
        }
        for _ in range(a.rounds):
            for name, read in readers.items():
                t0 = time.perf_counter()
                got = sum(1 for _ in read())
                rows[name].append(time.perf_counter() - t0)
                assert got == a.entries, (name, got)
    med = {k: statistics.median(v) for k, v in rows.items()}
    for name, v in rows.items():
        rounds = [round(x * 1e3) for x in v]
        print(
            f"{name:10s} {a.entries} entries at {a.get_ms:g} ms per GET: "
            f"median {med[name] * 1e3:6.0f} ms  rounds {rounds}"
        )
    print(f"sequential / runs: {med['sequential'] / med['runs']:.1f}x")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"entries": a.entries, "get_ms": a.get_ms, "rounds_s": rows, "median_s": med}
    a.out.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
