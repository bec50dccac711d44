"""One data block of an object: its index entry and the checks on its stored bytes.

Roles:

- `BlockInfo` — an index entry: where a block lies in its object and which offsets of which
  stream it holds.
- `check_stored`, `decompressed`, `decode_block` — the stored bytes of one block checked
  against its entry (size, crc32c), decompressed, and decoded into batches.
- `corrupt` — the `CorruptionError` every object reader raises: object and byte position.

These sit below both the object layout (`objects`: index, footer, writer) and the block-run
reader (`block_reader`: ranged GETs), which both need them, so neither imports the other's
internals.
"""

from __future__ import annotations

from dataclasses import dataclass

import crc32c
import zstandard

from ..errors import CorruptionError
from ..types import FetchedBatch
from .batch import decode_batch_at

__all__ = ["BlockInfo", "check_stored", "corrupt", "decode_block", "decompressed"]


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """One index entry: where a data block lies and which offsets of which stream it holds.

    The block covers ``[start_offset, end_offset)`` of `stream_id` in `batch_count` whole
    batches and occupies ``[position, position + stored_size)`` of the object; `crc` is the
    crc32c of those stored bytes, `raw_size` their size after decompression.
    `first_timestamp` and `max_timestamp` are batch base timestamps in milliseconds.

    `time_range` is ``(min, max)`` of the timestamps of the block's offsets, as
    `s3stream.format.timestamps` defines them (record timestamps, not only base ones): what
    seek by time prunes blocks by. None when the object has no time-range table (written
    before it existed): then only the block's batches can tell.
    """

    stream_id: int
    start_offset: int
    end_offset: int
    position: int
    stored_size: int
    raw_size: int
    batch_count: int
    first_timestamp: int
    max_timestamp: int
    compressed: bool
    crc: int
    time_range: tuple[int, int] | None = None

    @property
    def record_count(self) -> int:
        """Number of records (offsets) the block covers."""
        return self.end_offset - self.start_offset

    @property
    def end_position(self) -> int:
        """Byte position just after the block."""
        return self.position + self.stored_size


def corrupt(location: str, position: int, what: str) -> CorruptionError:
    """The error for damage `what` found in object `location` at byte `position`: one
    wording for every reader, so messages and `position` mean the same everywhere."""
    return CorruptionError(
        f"corrupt object {location} at byte {position}: {what}",
        location=location,
        position=position,
    )


def check_stored(stored: bytes | memoryview, block: BlockInfo, location: str) -> None:
    """`CorruptionError` unless `stored` has the block's stored size and crc32c."""
    if len(stored) != block.stored_size:
        raise corrupt(
            location,
            block.position,
            f"block has {len(stored)} bytes, index says {block.stored_size}",
        )
    if crc32c.crc32c(stored) != block.crc:
        raise corrupt(location, block.position, "block crc32c mismatch")


def decompressed(stored: bytes | memoryview, block: BlockInfo, location: str) -> bytes | memoryview:
    """The batch records of a block (decompressed if need be), of the raw size its entry says."""
    raw = stored
    if block.compressed:
        try:
            raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=block.raw_size)
        except zstandard.ZstdError as exc:
            raise corrupt(location, block.position, f"block does not decompress: {exc}") from exc
    if len(raw) != block.raw_size:
        raise corrupt(
            location, block.position, f"block has {len(raw)} raw bytes, index says {block.raw_size}"
        )
    return raw


def decode_block(data: bytes | memoryview, block: BlockInfo, location: str) -> list[FetchedBatch]:
    """Verify, decompress and decode the stored bytes of `block`.

    Checks the crc32c and that the batches cover exactly ``[start_offset, end_offset)`` of
    the block's stream; raises `CorruptionError` naming `location` and the block position.
    """
    pos = block.position
    check_stored(data, block, location)
    view = memoryview(decompressed(data, block, location))
    batches: list[FetchedBatch] = []
    expected = block.start_offset
    at = 0
    while at < len(view):
        try:
            batch, at = decode_batch_at(view, at, location)
        except CorruptionError as exc:
            raise corrupt(location, pos, f"batch at byte {at} of the block: {exc}") from exc
        if batch.stream_id != block.stream_id or batch.base_offset != expected:
            raise corrupt(
                location,
                pos,
                f"batch of stream {batch.stream_id} at offset {batch.base_offset}, "
                f"expected stream {block.stream_id} offset {expected}",
            )
        expected = batch.next_offset
        batches.append(batch)
    if expected != block.end_offset or len(batches) != block.batch_count:
        raise corrupt(
            location,
            pos,
            f"block holds {len(batches)} batches up to offset {expected}, index says "
            f"{block.batch_count} up to {block.end_offset}",
        )
    return batches
