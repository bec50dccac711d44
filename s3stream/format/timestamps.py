"""The timestamp of every offset of a stream: the one rule behind block time ranges and seek.

Object writers record, per block, the smallest and largest timestamp of its offsets (the
time-range table, ``docs/format.md``); seek by time (`s3stream.storage.seek`) prunes blocks by
those ranges and then searches one block's batches. Both must read the same timestamps from
the same bytes, or a seek would skip a block that holds its answer, so the rule is here once:

- A ``RECORDS`` batch: record *i* (offset ``base_offset + i``) has its own timestamp
  (``CreateTime``) or, if it has none, the batch's base timestamp (``LogAppendTime``): what
  `Stream.read_records` and the Spark source report.
- A ``RAW`` batch: every offset it covers has the batch's base timestamp.
- A ``RECORDS`` batch whose timestamps do not decode (a payload that is not a records payload;
  `append` does not check payloads) counts as raw: its records cannot be read anyway, and an
  upload must not fail over them.

Kafka's ``offsetsForTimes`` works the same way: a batch's max timestamp locates the batch, and
the records in it are searched one by one.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import zstandard

from ..errors import CorruptionError
from ..records import NO_TIMESTAMP, decode_timestamps
from ..types import BatchKind, FetchedBatch

__all__ = ["first_offset_at", "offset_timestamps", "time_range"]

_RECORDS = int(BatchKind.RECORDS)


def _own_timestamps(
    kind: int,
    count: int,
    payload: bytes | memoryview,
    decompressor: zstandard.ZstdDecompressor | None = None,
) -> npt.NDArray[np.int64] | None:
    """The records' own timestamps (`NO_TIMESTAMP` where one has none), or None when the
    batch is raw, no record has one, or they do not decode."""
    if kind != _RECORDS:
        return None
    try:
        return decode_timestamps(payload, expected_count=count, decompressor=decompressor)
    except CorruptionError:
        return None


def offset_timestamps(
    kind: int, count: int, base_timestamp: int, payload: bytes | memoryview
) -> npt.NDArray[np.int64] | None:
    """The timestamp of each of the batch's `count` offsets, or None when every offset has
    `base_timestamp` (a raw batch, a records batch without timestamps of its own, or one
    whose timestamps do not decode)."""
    own = _own_timestamps(kind, count, payload)
    if own is None:
        return None
    missing = own == NO_TIMESTAMP
    if not missing.any():
        return own
    if missing.all():
        return None
    return np.where(missing, np.int64(base_timestamp), own)


def time_range(
    kind: int,
    count: int,
    base_timestamp: int,
    payload: bytes | memoryview,
    *,
    decompressor: zstandard.ZstdDecompressor | None = None,
) -> tuple[int, int]:
    """``(min, max)`` of the batch's offset timestamps (on every upload: two reductions over
    the timestamp column, and nothing else, when every record has its own). A writer passes
    its own `decompressor` for zstd bodies (see `decode_timestamps`)."""
    own = _own_timestamps(kind, count, payload, decompressor)
    if own is None:
        return base_timestamp, base_timestamp
    lo, hi = int(own.min()), int(own.max())
    if lo != NO_TIMESTAMP:  # the smallest i64: no record has it as its own timestamp
        return lo, hi
    present = own[own != NO_TIMESTAMP]
    if not len(present):
        return base_timestamp, base_timestamp
    return min(int(present.min()), base_timestamp), max(hi, base_timestamp)


def first_offset_at(batch: FetchedBatch, start: int, timestamp: int) -> int | None:
    """The first offset of `batch` at or above `start` whose timestamp is >= `timestamp`,
    or None."""
    lo = max(start - batch.base_offset, 0)
    if lo >= batch.count:
        return None
    stamps = offset_timestamps(int(batch.kind), batch.count, batch.base_timestamp, batch.view)
    if stamps is None:
        return batch.base_offset + lo if batch.base_timestamp >= timestamp else None
    hits = np.flatnonzero(stamps[lo:] >= timestamp)
    return batch.base_offset + lo + int(hits[0]) if len(hits) else None
