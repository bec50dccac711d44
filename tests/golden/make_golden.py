"""Generate the golden object files (run by hand, never by the test suite).

    .venv/bin/python tests/golden/make_golden.py

Two generations of files pin the object format (docs/format.md, "Versioning"):

- ``v1_<name>.s3o``: format version 1 as first written, without a time-range table. The
  writer no longer makes these bytes (it always adds the table), so they are frozen: this
  script never writes them again, and the test suite only decodes them.
- ``v1t_<name>.s3o``: format version 1 with the time-range table (footer flag 0x0100):
  the same inputs, plus ``records``, whose records payloads make the time ranges.

Each ``.json`` beside an object records the writer settings, every batch in the order it was
added (payloads in hex plus sha256), the expected index entries (with their time ranges for
``v1t``) and the sha256 of the object. `tests/test_format.py` decodes the committed files
and compares them with the JSON. Once committed, files must never be regenerated with
different bytes: the script writes only missing ones and reports any existing file the
writer would now make differently. A new layout gets new files next to these.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from s3stream.format import ObjectWriter, encode_batch, parse_tail
from s3stream.format.objects import FLAG_TIME_RANGES, ObjectIndex
from s3stream.records import Record, encode_records

HERE = Path(__file__).parent

Batch = tuple[
    int, int, int, int, int, dict[str, str], bytes
]  # sid, off, count, kind, ts, props, payload


def _text(rng: random.Random, n: int) -> bytes:
    words = [b"alpha", b"beta", b"gamma", b"delta", b"order", b"click", b'{"id":', b"42}"]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
    return bytes(out[:n])


def plain() -> tuple[dict[str, Any], list[Batch]]:
    """Three interleaved streams, both batch kinds, properties, several blocks per stream."""
    rng = random.Random(1)
    next_off = {1: 0, 2: 100, 1000: 7}
    batches: list[Batch] = []
    for i in range(40):
        sid = rng.choice(sorted(next_off))
        count = rng.randint(1, 5)
        kind = i % 2
        props = {"i": str(i), "source": "golden"} if i % 3 == 0 else {}
        payload = _text(rng, rng.randint(0, 300))
        batches.append(
            (sid, next_off[sid], count, kind, 1_700_000_000_000 + i * 10, props, payload)
        )
        next_off[sid] += count
    return {"block_target_bytes": 1024, "compression": "none", "zstd_level": 3}, batches


def zstd() -> tuple[dict[str, Any], list[Batch]]:
    """zstd: compressible blocks stored compressed, one incompressible block stored raw."""
    rng = random.Random(2)
    batches: list[Batch] = []
    off = 0
    for i in range(30):
        count = rng.randint(1, 3)
        batches.append((5, off, count, 1, 1_600_000_000_000 + i, {"k": "v"}, _text(rng, 400)))
        off += count
    # Random bytes do not compress: this block must be stored uncompressed.
    batches.append((9, 0, 1, 0, 1_600_000_000_000, {}, rng.randbytes(3000)))
    return {"block_target_bytes": 2048, "compression": "zstd", "zstd_level": 3}, batches


def big_offsets() -> tuple[dict[str, Any], list[Batch]]:
    """Offsets above 2**32 and near 2**62, negative timestamps, max u64 stream id, and a
    batch larger than the block target (a block of its own)."""
    rng = random.Random(3)
    batches: list[Batch] = []
    off = (1 << 32) - 3  # crosses 2**32 inside the stream
    for i in range(6):
        batches.append((7, off, 2, 0, -1_000 - i, {}, _text(rng, 100)))
        off += 2
    batches.append((7, off, 1000, 0, -1, {"big": "yes"}, rng.randbytes(1500)))
    top = (1 << 62) + 5
    for i in range(3):
        batches.append(((1 << 64) - 1, top + i * 3, 3, 1, -(1 << 62) + i, {}, _text(rng, 50)))
    return {"block_target_bytes": 512, "compression": "none", "zstd_level": 3}, batches


def records() -> tuple[dict[str, Any], list[Batch]]:
    """RECORDS batches whose records carry their own timestamps (all, some, none; out of
    order; a zstd body; negative ones), raw batches, and a RECORDS batch whose payload is not
    a records payload (its base timestamp stands for all its offsets)."""
    batches: list[Batch] = []
    off = 0

    def add(kind: int, count: int, ts: int, payload: bytes) -> None:
        nonlocal off
        batches.append((11, off, count, kind, ts, {}, payload))
        off += count

    base = 1_700_000_000_000
    # Every record stamped (timestamp mode 1); the base is their largest, as records_batch sets.
    add(1, 3, base + 30, encode_records([Record(b"a", timestamp=base + t) for t in (10, 30, 20)]))
    # Some stamped, some not (mode 2): those without take the base timestamp.
    add(
        1,
        3,
        base + 500,
        encode_records([Record(b"b", timestamp=base + 900), Record(b"c"), Record(b"d")]),
    )
    # None stamped (mode 0): all take the base.
    add(1, 2, base + 600, encode_records([Record(b"e"), Record(b"f", key=b"k")]))
    # A zstd body with timestamps spread wider than 2**32 ms (mode 2 again) and a negative one.
    spread = [Record(b"g" * 200, timestamp=t) for t in (-5, base + 1, 1 << 40)]
    add(1, 3, 1 << 40, encode_records(spread, compression="zstd"))
    add(0, 4, base + 700, b"raw bytes of four offsets")
    add(1, 2, base + 800, b"not a records payload")
    add(1, 1, base + 50, encode_records([Record(b"late", timestamp=base + 40)]))
    return {"block_target_bytes": 150, "compression": "none", "zstd_level": 3}, batches


def empty() -> tuple[dict[str, Any], list[Batch]]:
    """An object without any block: just an empty index and the footer."""
    return {"block_target_bytes": 1 << 20, "compression": "none", "zstd_level": 3}, []


def build(settings: dict[str, Any], batches: list[Batch]) -> bytes:
    """Write `batches` (in this order) with an `ObjectWriter` made from `settings`."""
    w = ObjectWriter(**settings)
    for sid, off, count, kind, ts, props, payload in batches:
        w.add(sid, off, count, ts, encode_batch(sid, off, count, kind, ts, props, payload))
    return w.finish()


def describe(settings: dict[str, Any], batches: list[Batch], data: bytes) -> dict[str, Any]:
    """The JSON sidecar: inputs and the expected decoded content."""
    index = parse_tail(data, len(data), "golden")
    assert isinstance(index, ObjectIndex)
    return {
        "format_version": 1,
        "footer_flags": FLAG_TIME_RANGES,
        "object_size": len(data),
        "object_sha256": hashlib.sha256(data).hexdigest(),
        "writer": settings,
        "batches": [
            {
                "stream_id": sid,
                "base_offset": off,
                "count": count,
                "kind": kind,
                "base_timestamp": ts,
                "properties": props,
                "payload_hex": payload.hex(),
                "payload_sha256": hashlib.sha256(payload).hexdigest(),
            }
            for sid, off, count, kind, ts, props, payload in batches
        ],
        "blocks": [
            {
                "stream_id": b.stream_id,
                "start_offset": b.start_offset,
                "end_offset": b.end_offset,
                "position": b.position,
                "stored_size": b.stored_size,
                "raw_size": b.raw_size,
                "batch_count": b.batch_count,
                "first_timestamp": b.first_timestamp,
                "max_timestamp": b.max_timestamp,
                "compressed": b.compressed,
                "crc": b.crc,
                "time_range": list(b.time_range or ()),
            }
            for b in index.blocks
        ],
    }


def main() -> None:
    """Write the missing ``v1t_`` objects and sidecars next to this script; check the others."""
    for name, make in (
        ("plain", plain),
        ("zstd", zstd),
        ("big_offsets", big_offsets),
        ("empty", empty),
        ("records", records),
    ):
        settings, batches = make()
        data = build(settings, batches)
        path = HERE / f"v1t_{name}.s3o"
        if path.exists():
            same = path.read_bytes() == data
            print(f"{path.name}: exists, {'same bytes' if same else 'DIFFERENT BYTES (kept)'}")
            continue
        path.write_bytes(data)
        sidecar = describe(settings, batches, data)
        path.with_suffix(".json").write_text(json.dumps(sidecar, indent=1, sort_keys=True) + "\n")
        print(f"{path.name}: {len(data)} bytes, {len(sidecar['blocks'])} blocks")


if __name__ == "__main__":
    main()
