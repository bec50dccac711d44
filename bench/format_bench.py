"""Throughput of the object format: build and decode 64 MiB objects.

Run: ``.venv/bin/python bench/format_bench.py [--mib 64]``. Reports MB/s (payload bytes) for
writing (encode_batch + ObjectWriter.add + finish) and reading (read_index + read_blocks of
everything, from a MemoryObjectStore) with 64 KiB and 100-byte batches, with and without zstd.
"""

from __future__ import annotations

import argparse
import random
import time

from s3stream.format import ObjectWriter, encode_batch, read_blocks, read_index
from s3stream.objectstore.memory import MemoryObjectStore


def run(total: int, batch_size: int, compression: str, streams: int) -> tuple[float, float, float]:
    rng = random.Random(42)
    n = total // batch_size
    zeros = bytes(batch_size - batch_size // 2)
    # Each payload half random, half zeros: compressible about 2:1, never repeated.
    records = [
        encode_batch(
            i % streams,
            (i // streams) * 10,
            10,
            0,
            1_700_000_000_000 + i,
            {},
            rng.randbytes(batch_size // 2) + zeros,
        )
        for i in range(n)
    ]
    t0 = time.perf_counter()
    w = ObjectWriter(compression=compression)
    for i, rec in enumerate(records):
        w.add(i % streams, (i // streams) * 10, 10, 1_700_000_000_000 + i, rec)
    data = w.finish()
    t_write = time.perf_counter() - t0
    store = MemoryObjectStore()
    store.put("obj", data)
    t0 = time.perf_counter()
    idx = read_index(store, "obj")
    got = 0
    for sid in idx.stream_ids():
        for b in read_blocks(store, "obj", idx.find(sid, 0)):
            got += len(b.payload)
    t_read = time.perf_counter() - t0
    assert got == n * batch_size, (got, n * batch_size)
    mb = n * batch_size / 1e6
    return mb / t_write, mb / t_read, len(data) / (n * batch_size)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--streams", type=int, default=4)
    args = ap.parse_args()
    total = args.mib << 20
    print(f"{'batch':>8} {'compr':>5} {'write MB/s':>11} {'read MB/s':>10} {'ratio':>6}")
    for batch_size in (64 * 1024, 100):
        for compression in ("none", "zstd"):
            w, r, ratio = run(total, batch_size, compression, args.streams)
            print(f"{batch_size:>8} {compression:>5} {w:>11.0f} {r:>10.0f} {ratio:>6.2f}")


if __name__ == "__main__":
    main()
