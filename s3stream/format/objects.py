"""Object files: data blocks of batch records, a sorted block index and a fixed footer.

An object is ``[data block]* [index] [footer]`` (all integers little-endian; the full byte
layout is in ``docs/format.md``):

- A *data block* holds consecutive batch records (see `s3stream.format.batch`) of one stream
  with contiguous offsets, optionally zstd-compressed. Its crc32c covers the bytes as stored.
- The *index* holds one fixed-size entry per block, sorted by (stream_id, start_offset), with
  64-bit offsets and positions throughout.
- The *footer* (last `FOOTER_SIZE` bytes) locates the index and carries its crc32c, the format
  version and `MAGIC`, and has a crc32c of its own.

A reader needs one suffix GET for footer + index (a second GET only when the index is larger
than the tail read), a binary search, and one ranged GET per run of adjacent blocks.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
import zstandard

from ..errors import CorruptionError, InvalidArgumentError, StreamClosedError
from ..objectstore.base import ObjectStore
from ..settings import MAX_BLOCK_TARGET_BYTES
from ..types import FetchedBatch
from ..validation import check_choice, check_int, check_zstd_level
from .batch import BATCH_HEADER, decode_batch_at, encode_batch

__all__ = [
    "DEFAULT_TAIL_READ_BYTES",
    "FOOTER_SIZE",
    "FORMAT_VERSION",
    "INDEX_ENTRY_SIZE",
    "MAGIC",
    "BlockInfo",
    "ObjectIndex",
    "ObjectWriter",
    "coalesce",
    "decode_block",
    "parse_tail",
    "read_blocks",
    "read_index",
]

#: Last 8 bytes of every object.
MAGIC = b"S3STREAM"
#: Major format version written into the footer; readers reject any other value.
FORMAT_VERSION = 1
#: Bytes read from the end of an object to get footer + index in one request (usually).
DEFAULT_TAIL_READ_BYTES = 64 * 1024

# stream_id, start_offset, end_offset, position, stored_size, raw_size, batch_count, crc32c,
# first_timestamp, max_timestamp, flags, 7 reserved bytes: 72 bytes, 8-byte aligned fields.
_ENTRY = struct.Struct("<QqqQIIIIqqB7x")
# index_position, index_length, entry_count, index_crc32c, format_version, flags,
# footer_crc32c (over the 28 bytes before it), magic.
_FOOTER = struct.Struct("<QQIIHHI8s")
_FOOTER_CRC_SPAN = 28

#: Size of one index entry in bytes.
INDEX_ENTRY_SIZE = _ENTRY.size
#: Size of the footer in bytes.
FOOTER_SIZE = _FOOTER.size

_BLOCK_ZSTD = 0x01
_KNOWN_BLOCK_FLAGS = _BLOCK_ZSTD
# Footer flags: the low byte is for incompatible features (a reader that does not know a set
# bit must refuse the object), the high byte for compatible ones (safe to ignore).
_FOOTER_INCOMPATIBLE_MASK = 0x00FF
_KNOWN_FOOTER_INCOMPATIBLE = 0

_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1
_I64_MIN = -(1 << 63)
_COMPRESSIONS = ("none", "zstd")

assert _ENTRY.size == 72 and _FOOTER.size == 40


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """One index entry: where a data block lies and which offsets of which stream it holds.

    The block covers ``[start_offset, end_offset)`` of `stream_id` in `batch_count` whole
    batches and occupies ``[position, position + stored_size)`` of the object; `crc` is the
    crc32c of those stored bytes, `raw_size` their size after decompression.
    Timestamps are batch base timestamps in milliseconds.
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

    @property
    def record_count(self) -> int:
        """Number of records (offsets) the block covers."""
        return self.end_offset - self.start_offset

    @property
    def end_position(self) -> int:
        """Byte position just after the block."""
        return self.position + self.stored_size


class ObjectIndex:
    """The parsed index of one object: its blocks and lookups by (stream, offset).

    Construct it with `parse_tail` or `read_index`, which validate the bytes first. It is
    immutable, so one parsed index can be cached and shared between threads.
    """

    __slots__ = ("_ends", "_slices", "_stream_bytes", "blocks", "object_size")

    def __init__(self, object_size: int, blocks: Sequence[BlockInfo]) -> None:
        """Index over `blocks`, which must be sorted by (stream_id, start_offset) and have
        contiguous offsets within each stream (as `parse_tail` checks)."""
        #: Total size of the object in bytes.
        self.object_size = object_size
        #: Every block, sorted by (stream_id, start_offset).
        self.blocks: Sequence[BlockInfo] = tuple(blocks)
        self._ends = [b.end_offset for b in self.blocks]
        slices: dict[int, tuple[int, int]] = {}
        sizes: dict[int, int] = {}
        lo = 0
        for i, b in enumerate(self.blocks):
            if i and b.stream_id != self.blocks[i - 1].stream_id:
                lo = i
            slices[b.stream_id] = (lo, i + 1)
            sizes[b.stream_id] = sizes.get(b.stream_id, 0) + b.stored_size
        self._slices = slices
        self._stream_bytes = sizes

    def __repr__(self) -> str:
        return (
            f"ObjectIndex(object_size={self.object_size}, blocks={len(self.blocks)}, "
            f"streams={len(self._slices)})"
        )

    def stream_ids(self) -> list[int]:
        """Ids of the streams with data in this object, ascending."""
        return list(self._slices)

    def stream_range(self, stream_id: int) -> tuple[int, int] | None:
        """``(start, end)`` offsets of `stream_id` covered by this object, or None."""
        sl = self._slices.get(stream_id)
        if sl is None:
            return None
        return self.blocks[sl[0]].start_offset, self.blocks[sl[1] - 1].end_offset

    def stream_ranges(self) -> list[tuple[int, int, int]]:
        """``(stream_id, start, end)`` for every stream in the object, sorted by stream id."""
        return [
            (sid, self.blocks[lo].start_offset, self.blocks[hi - 1].end_offset)
            for sid, (lo, hi) in self._slices.items()
        ]

    def find(
        self, stream_id: int, start_offset: int, end_offset: int | None = None
    ) -> list[BlockInfo]:
        """Blocks of `stream_id` overlapping ``[start_offset, end_offset)``, in offset order.

        `end_offset` None means to the end of the stream's data in this object. The first
        block returned may begin before `start_offset`.
        """
        sl = self._slices.get(stream_id)
        if sl is None or (end_offset is not None and end_offset <= start_offset):
            return []
        lo, hi = sl
        # End offsets are strictly increasing within a stream (its blocks are contiguous), so
        # the first block ending after start_offset is the first that overlaps.
        i = bisect_right(self._ends, start_offset, lo, hi)
        if end_offset is None:
            return list(self.blocks[i:hi])
        out: list[BlockInfo] = []
        while i < hi and self.blocks[i].start_offset < end_offset:
            out.append(self.blocks[i])
            i += 1
        return out

    def stream_bytes(self, stream_id: int) -> int:
        """Stored (possibly compressed) bytes of `stream_id`'s blocks in this object."""
        return self._stream_bytes.get(stream_id, 0)

    @property
    def data_size(self) -> int:
        """Bytes before the index: where the data blocks live."""
        return self.object_size - FOOTER_SIZE - len(self.blocks) * INDEX_ENTRY_SIZE


# ---------------------------------------------------------------------------------------------
# Writing


class _Block:
    """A finished block of one stream, waiting for `finish` to place it."""

    __slots__ = (
        "batch_count",
        "compressed",
        "crc",
        "end_offset",
        "first_timestamp",
        "max_timestamp",
        "pieces",
        "raw_size",
        "start_offset",
        "stored_size",
    )

    def __init__(
        self,
        pieces: list[bytes | memoryview],
        start_offset: int,
        end_offset: int,
        stored_size: int,
        raw_size: int,
        batch_count: int,
        first_timestamp: int,
        max_timestamp: int,
        compressed: bool,
        crc: int,
    ) -> None:
        self.pieces = pieces
        self.start_offset = start_offset
        self.end_offset = end_offset
        self.stored_size = stored_size
        self.raw_size = raw_size
        self.batch_count = batch_count
        self.first_timestamp = first_timestamp
        self.max_timestamp = max_timestamp
        self.compressed = compressed
        self.crc = crc


class _StreamBuffer:
    """Blocks of one stream: the finished ones and the one being filled."""

    __slots__ = (
        "blocks",
        "closed_bytes",
        "cur_batches",
        "cur_crc",
        "cur_first_ts",
        "cur_max_ts",
        "cur_pieces",
        "cur_size",
        "cur_start",
        "next_offset",
        "start_offset",
    )

    def __init__(self, start_offset: int) -> None:
        self.blocks: list[_Block] = []
        self.closed_bytes = 0
        self.start_offset = start_offset
        self.next_offset = start_offset
        self.cur_pieces: list[bytes | memoryview] = []
        self.cur_batches = 0
        self.cur_size = 0
        self.cur_crc = 0
        self.cur_start = start_offset
        self.cur_first_ts = 0
        self.cur_max_ts = 0


class ObjectWriter:
    """Builds one object from batch records (`add`, `add_fetched`) and from blocks copied out
    of other objects (`add_block`), of any number of streams.

    Batches and blocks of one stream must arrive in offset order without gaps; streams may be
    added in any order and interleaved. Blocks are emitted grouped and sorted by stream id. A block
    closes when the next batch would push it past `block_target_bytes`; a batch larger than
    the target gets a block of its own. With ``compression="zstd"`` a block is stored
    compressed only when that makes it smaller. Not thread-safe.
    """

    def __init__(
        self,
        *,
        block_target_bytes: int = 1 << 20,
        compression: str = "none",
        zstd_level: int = 3,
    ) -> None:
        """Writer with the given block size target (bytes) and compression ("none"/"zstd")."""
        check_int(
            "block_target_bytes", block_target_bytes, minimum=1, maximum=MAX_BLOCK_TARGET_BYTES
        )
        check_choice("compression", compression, _COMPRESSIONS)
        check_zstd_level("zstd_level", zstd_level)
        self._compressor: zstandard.ZstdCompressor | None = None
        if compression == "zstd":
            self._compressor = zstandard.ZstdCompressor(level=zstd_level)
        self._target = block_target_bytes
        self._streams: dict[int, _StreamBuffer] = {}
        self._estimate = FOOTER_SIZE
        self._finished = False

    def add(
        self,
        stream_id: int,
        base_offset: int,
        count: int,
        base_timestamp: int,
        batch_record: bytes | memoryview,
    ) -> None:
        """Append one encoded batch record (from `encode_batch`) of `stream_id`.

        The record header must agree with the other arguments, and `base_offset` must equal
        the end of the previous batch of the same stream in this writer. The writer keeps a
        reference to `batch_record` until `finish`, so a memoryview must not change meanwhile.
        """
        if self._finished:
            raise StreamClosedError("ObjectWriter.add after finish()")
        # Inline checks, not `validation.check_int`: this runs once per batch of an upload.
        if type(stream_id) is not int or not 0 <= stream_id <= _U64_MAX:
            raise InvalidArgumentError(f"stream_id must be a u64 int, got {stream_id!r}")
        if type(base_offset) is not int or base_offset < 0:
            raise InvalidArgumentError(f"base_offset must be an int >= 0, got {base_offset!r}")
        if type(count) is not int or count < 1 or base_offset + count > _I64_MAX:
            raise InvalidArgumentError(f"count must be an int >= 1 within i64, got {count!r}")
        if type(base_timestamp) is not int or not _I64_MIN <= base_timestamp <= _I64_MAX:
            raise InvalidArgumentError(f"base_timestamp must be an i64, got {base_timestamp!r}")
        size = len(batch_record)
        if size < BATCH_HEADER.size or size > _U32_MAX:
            raise InvalidArgumentError(
                f"batch_record must be an encoded batch record, got {size} bytes"
            )
        h_sid, h_off, h_count, _k, _f, _r, h_ts, props_len, payload_len = BATCH_HEADER.unpack_from(
            batch_record, 0
        )
        if (h_sid, h_off, h_count, h_ts) != (stream_id, base_offset, count, base_timestamp):
            raise InvalidArgumentError(
                "batch_record header does not match stream_id/base_offset/count/base_timestamp"
            )
        if BATCH_HEADER.size + props_len + payload_len != size:
            raise InvalidArgumentError("batch_record length does not match its header")

        buf = self._buffer(stream_id, base_offset)
        if buf.cur_pieces and buf.cur_size + size > self._target:
            self._close_block(buf)
        self._append_raw(
            buf, batch_record, base_offset, base_offset + count, 1, base_timestamp, base_timestamp
        )

    def add_block(
        self, block: BlockInfo, stored: bytes | memoryview, *, location: str = "?"
    ) -> None:
        """Append a data block read from another object without decoding its batches.

        `block` is the block's index entry in its source object (`location` names that
        object in errors) and `stored` its bytes as stored there. The crc32c of `stored` is
        checked against the entry (`CorruptionError` on a mismatch: the copy never carries
        damaged bytes on). A small block joins the block being filled for its stream when
        both fit in `block_target_bytes` together — an uncompressed block's bytes are its
        batch records, so they are appended as they are; a compressed one is decompressed
        first. Any other block is copied verbatim: bytes, crc, compression and index fields.
        Blocks never shrink. `block.start_offset` must continue the stream as in `add`. The
        writer keeps a reference to `stored` until `finish`.
        """
        if self._finished:
            raise StreamClosedError("ObjectWriter.add_block after finish()")
        if not isinstance(block, BlockInfo):
            raise InvalidArgumentError(f"block must be a BlockInfo, got {block!r}")
        _check_stored(stored, block, location)
        prev = self._streams.get(block.stream_id)
        if prev is not None and block.start_offset != prev.next_offset:
            raise InvalidArgumentError(
                f"block of stream {block.stream_id} starts at {block.start_offset}, which is "
                f"not contiguous: expected {prev.next_offset}"
            )
        filling = prev is not None and bool(prev.cur_pieces)
        fits = (prev.cur_size if prev is not None else 0) + block.raw_size <= self._target
        # A small block is worth merging (an index entry and a block boundary for readers go
        # away); one of at least half the target stays as it is, which is free even when it
        # is compressed.
        merge = block.raw_size < self._target // 2 or (filling and fits)
        # Everything that may fail comes before the writer changes. The first batch header
        # is checked whenever it is at hand without decompressing.
        raw = _raw_bytes(stored, block, location) if merge or not block.compressed else None
        buf = self._buffer(block.stream_id, block.start_offset)
        if filling and not fits:
            self._close_block(buf)
        if merge and raw is not None:
            self._append_raw(
                buf,
                raw,
                block.start_offset,
                block.end_offset,
                block.batch_count,
                block.first_timestamp,
                block.max_timestamp,
            )
            return
        buf.blocks.append(
            _Block(
                [stored],
                block.start_offset,
                block.end_offset,
                block.stored_size,
                block.raw_size,
                block.batch_count,
                block.first_timestamp,
                block.max_timestamp,
                block.compressed,
                block.crc,
            )
        )
        buf.closed_bytes += block.stored_size
        buf.next_offset = block.end_offset
        self._estimate += INDEX_ENTRY_SIZE + block.stored_size

    def _buffer(self, stream_id: int, start_offset: int) -> _StreamBuffer:
        """The stream's buffer, created at `start_offset`; which must continue the stream."""
        buf = self._streams.get(stream_id)
        if buf is None:
            buf = self._streams[stream_id] = _StreamBuffer(start_offset)
        elif start_offset != buf.next_offset:
            raise InvalidArgumentError(
                f"base_offset {start_offset} of stream {stream_id} is not contiguous: "
                f"expected {buf.next_offset}"
            )
        return buf

    def _append_raw(
        self,
        buf: _StreamBuffer,
        raw: bytes | memoryview,
        start_offset: int,
        end_offset: int,
        batches: int,
        first_ts: int,
        max_ts: int,
    ) -> None:
        """Append whole batch records covering ``[start_offset, end_offset)`` to the block
        being filled (opening one if none is)."""
        if not buf.cur_pieces:
            buf.cur_start = start_offset
            buf.cur_first_ts = first_ts
            buf.cur_max_ts = max_ts
            self._estimate += INDEX_ENTRY_SIZE
        elif max_ts > buf.cur_max_ts:
            buf.cur_max_ts = max_ts
        buf.cur_pieces.append(raw)
        buf.cur_batches += batches
        buf.cur_size += len(raw)
        if self._compressor is None:
            # Chained so the finished block needs no second pass over its bytes.
            buf.cur_crc = crc32c.crc32c(raw, buf.cur_crc)
        buf.next_offset = end_offset
        self._estimate += len(raw)

    def add_fetched(self, batch: FetchedBatch) -> None:
        """Append a batch read back from storage (re-encodes it; used by compaction)."""
        record = encode_batch(
            batch.stream_id,
            batch.base_offset,
            batch.count,
            int(batch.kind),
            batch.base_timestamp,
            batch.properties,
            batch.view,
        )
        self.add(batch.stream_id, batch.base_offset, batch.count, batch.base_timestamp, record)

    def _close_block(self, buf: _StreamBuffer) -> None:
        pieces = buf.cur_pieces
        raw_size = buf.cur_size
        stored: list[bytes | memoryview] = pieces
        stored_size = raw_size
        compressed = False
        crc = buf.cur_crc
        if self._compressor is not None:
            raw = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            packed = self._compressor.compress(raw)
            if len(packed) < raw_size:
                stored, stored_size, compressed = [packed], len(packed), True
            else:
                stored = [raw]
            crc = crc32c.crc32c(stored[0])
        buf.blocks.append(
            _Block(
                stored,
                buf.cur_start,
                buf.next_offset,
                stored_size,
                raw_size,
                buf.cur_batches,
                buf.cur_first_ts,
                buf.cur_max_ts,
                compressed,
                crc,
            )
        )
        self._estimate += stored_size - raw_size
        buf.closed_bytes += stored_size
        buf.cur_pieces = []
        buf.cur_batches = 0
        buf.cur_size = 0
        buf.cur_crc = 0

    @property
    def size_estimate(self) -> int:
        """Size the object would have now (exact except for compression of open blocks)."""
        return self._estimate

    def is_empty(self) -> bool:
        """True if no batch has been added."""
        return not self._streams

    def ranges(self) -> list[tuple[int, int, int]]:
        """``(stream_id, start, end)`` of everything added, sorted by stream id."""
        return [
            (sid, self._streams[sid].start_offset, self._streams[sid].next_offset)
            for sid in sorted(self._streams)
        ]

    def finish(self) -> bytes:
        """Close all blocks and return the whole object; the writer is unusable afterwards."""
        if self._finished:
            raise StreamClosedError("ObjectWriter.finish called twice")
        self._finished = True
        parts: list[bytes | memoryview] = []
        entries: list[bytes] = []
        position = 0
        for sid in sorted(self._streams):
            buf = self._streams[sid]
            if buf.cur_pieces:
                self._close_block(buf)
            for blk in buf.blocks:
                entries.append(
                    _ENTRY.pack(
                        sid,
                        blk.start_offset,
                        blk.end_offset,
                        position,
                        blk.stored_size,
                        blk.raw_size,
                        blk.batch_count,
                        blk.crc,
                        blk.first_timestamp,
                        blk.max_timestamp,
                        _BLOCK_ZSTD if blk.compressed else 0,
                    )
                )
                parts.extend(blk.pieces)
                position += blk.stored_size
        self._streams_done()
        index = b"".join(entries)
        head = struct.pack("<QQII", position, len(index), len(entries), crc32c.crc32c(index))
        head += struct.pack("<HH", FORMAT_VERSION, 0)
        footer = head + struct.pack("<I", crc32c.crc32c(head)) + MAGIC
        parts.append(index)
        parts.append(footer)
        return b"".join(parts)

    def _streams_done(self) -> None:
        # Drop the block bytes but keep the offset ranges so `ranges()` still answers.
        for buf in self._streams.values():
            buf.blocks = []


def _check_stored(stored: bytes | memoryview, block: BlockInfo, location: str) -> None:
    """`CorruptionError` unless `stored` has the block's stored size and crc32c."""
    if len(stored) != block.stored_size:
        raise _corrupt(
            location,
            block.position,
            f"block has {len(stored)} bytes, index says {block.stored_size}",
        )
    if crc32c.crc32c(stored) != block.crc:
        raise _corrupt(location, block.position, "block crc32c mismatch")


def _decompressed(
    stored: bytes | memoryview, block: BlockInfo, location: str
) -> bytes | memoryview:
    """The batch records of a block (decompressed if need be), of the raw size its entry says."""
    raw = stored
    if block.compressed:
        try:
            raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=block.raw_size)
        except zstandard.ZstdError as exc:
            raise _corrupt(location, block.position, f"block does not decompress: {exc}") from exc
    if len(raw) != block.raw_size:
        raise _corrupt(
            location, block.position, f"block has {len(raw)} raw bytes, index says {block.raw_size}"
        )
    return raw


def _raw_bytes(stored: bytes | memoryview, block: BlockInfo, location: str) -> bytes | memoryview:
    """The batch records of a block whose stored bytes passed the crc check: decompressed if
    need be, and checked (cheaply: sizes and the first batch header) against the entry."""
    raw = _decompressed(stored, block, location)
    if len(raw) < BATCH_HEADER.size:
        raise _corrupt(location, block.position, f"block has only {len(raw)} raw bytes")
    sid, base, *_ = BATCH_HEADER.unpack_from(raw, 0)
    if (sid, base) != (block.stream_id, block.start_offset):
        raise _corrupt(
            location,
            block.position,
            f"block begins with stream {sid} offset {base}, index says stream "
            f"{block.stream_id} offset {block.start_offset}",
        )
    return raw


# ---------------------------------------------------------------------------------------------
# Reading


def _corrupt(location: str, position: int, what: str) -> CorruptionError:
    return CorruptionError(
        f"corrupt object {location} at byte {position}: {what}",
        location=location,
        position=position,
    )


def parse_tail(tail: bytes | memoryview, object_size: int, location: str) -> ObjectIndex | int:
    """Parse footer and index from the last ``len(tail)`` bytes of an object.

    Returns the validated `ObjectIndex`, or the number of tail bytes needed when `tail` is
    too short to hold the whole index. Raises `CorruptionError` naming `location` and the
    byte position on a bad magic, version, crc or an inconsistent index.
    """
    check_int("object_size", object_size)
    n = len(tail)
    if n > object_size:
        raise InvalidArgumentError(f"tail has {n} bytes but object_size is {object_size}")
    if object_size < FOOTER_SIZE:
        raise _corrupt(location, 0, f"object of {object_size} bytes is smaller than a footer")
    if n < FOOTER_SIZE:
        return FOOTER_SIZE
    view = memoryview(tail)
    footer_pos = object_size - FOOTER_SIZE
    (index_pos, index_len, count, index_crc, version, flags, footer_crc, magic) = (
        _FOOTER.unpack_from(view, n - FOOTER_SIZE)
    )
    if magic != MAGIC:
        raise _corrupt(location, object_size - len(MAGIC), f"bad magic {magic!r}")
    if crc32c.crc32c(view[n - FOOTER_SIZE : n - FOOTER_SIZE + _FOOTER_CRC_SPAN]) != footer_crc:
        raise _corrupt(location, footer_pos, "footer crc32c mismatch")
    if version != FORMAT_VERSION:
        raise _corrupt(location, footer_pos, f"unsupported format version {version}")
    if flags & _FOOTER_INCOMPATIBLE_MASK & ~_KNOWN_FOOTER_INCOMPATIBLE:
        raise _corrupt(location, footer_pos, f"unsupported footer flags {flags:#x}")
    if index_len != count * INDEX_ENTRY_SIZE or index_pos + index_len != footer_pos:
        raise _corrupt(
            location,
            footer_pos,
            f"footer places an index of {count} entries at {index_pos}+{index_len} "
            f"in an object of {object_size} bytes",
        )
    needed: int = index_len + FOOTER_SIZE
    if n < needed:
        return needed
    start = n - needed
    index_bytes = view[start : start + index_len]
    if crc32c.crc32c(index_bytes) != index_crc:
        raise _corrupt(location, index_pos, "index crc32c mismatch")
    return ObjectIndex(object_size, _parse_entries(index_bytes, index_pos, location))


def _parse_entries(index: memoryview, index_pos: int, location: str) -> list[BlockInfo]:
    blocks: list[BlockInfo] = []
    prev: BlockInfo | None = None
    data_end = 0
    for i, fields in enumerate(_ENTRY.iter_unpack(index)):
        (sid, start, end, pos, stored, raw, nbatch, crc, first_ts, max_ts, flags) = fields
        entry_pos = index_pos + i * INDEX_ENTRY_SIZE
        compressed = bool(flags & _BLOCK_ZSTD)
        problem = None
        if flags & ~_KNOWN_BLOCK_FLAGS:
            problem = f"unknown block flags {flags:#x}"
        elif not 0 <= start < end:
            problem = f"bad offset range [{start}, {end})"
        elif nbatch < 1 or nbatch > end - start or raw < nbatch * BATCH_HEADER.size:
            problem = f"bad batch count {nbatch} for {raw} raw bytes"
        elif stored < 1 or (not compressed and stored != raw):
            problem = f"bad block sizes stored={stored} raw={raw}"
        elif pos < data_end or pos + stored > index_pos:
            problem = f"block at {pos}+{stored} overlaps another block or the index"
        elif prev is not None and (sid, start) <= (prev.stream_id, prev.start_offset):
            problem = "index entries out of order"
        elif prev is not None and sid == prev.stream_id and start != prev.end_offset:
            problem = f"gap or overlap in stream {sid} at offset {prev.end_offset}"
        elif max_ts < first_ts:
            problem = "max_timestamp below first_timestamp"
        if problem is not None:
            raise _corrupt(location, entry_pos, f"index entry {i}: {problem}")
        prev = BlockInfo(
            sid, start, end, pos, stored, raw, nbatch, first_ts, max_ts, compressed, crc
        )
        blocks.append(prev)
        data_end = pos + stored
    return blocks


def _size_from_footer(tail: bytes) -> int | None:
    """The object size implied by an intact footer (the index ends where the footer starts)."""
    n = len(tail)
    if n < FOOTER_SIZE:
        return None
    view = memoryview(tail)[n - FOOTER_SIZE :]
    index_pos, index_len, *_rest, footer_crc, magic = _FOOTER.unpack(view)
    if magic != MAGIC or crc32c.crc32c(view[:_FOOTER_CRC_SPAN]) != footer_crc:
        return None
    # Too small a size would make the tail look longer than the object; parse_tail reports
    # the inconsistent footer instead.
    return int(max(n, index_pos + index_len + FOOTER_SIZE))


def read_index(
    store: ObjectStore,
    key: str,
    *,
    tail_read_bytes: int = DEFAULT_TAIL_READ_BYTES,
    object_size: int | None = None,
) -> ObjectIndex:
    """Read and validate the index of object `key`.

    One request for the last `tail_read_bytes` (a suffix GET when `object_size` is unknown),
    and one more ranged GET only if the index does not fit in that tail.
    """
    check_int("tail_read_bytes", tail_read_bytes, minimum=FOOTER_SIZE)
    if object_size is None:
        tail = store.get_suffix(key, tail_read_bytes)
        object_size = len(tail) if len(tail) < tail_read_bytes else _size_from_footer(tail)
        if object_size is None:
            # The footer is damaged: ask for the real size so errors name true positions.
            info = store.head(key)
            object_size = len(tail) if info is None else max(info.size, len(tail))
    else:
        check_int("object_size", object_size)
        tail = store.get(key, max(0, object_size - tail_read_bytes), object_size)
        if len(tail) != min(object_size, tail_read_bytes):
            raise _corrupt(key, object_size - tail_read_bytes, "object shorter than expected")
    result = parse_tail(tail, object_size, key)
    if isinstance(result, ObjectIndex):
        return result
    start = object_size - result
    head = store.get(key, start, object_size - len(tail))
    if len(head) != result - len(tail):
        raise _corrupt(key, start, "object shorter than its footer says")
    result = parse_tail(head + tail, object_size, key)
    if not isinstance(result, ObjectIndex):
        raise _corrupt(key, start, "index still incomplete after the second read")
    return result


def decode_block(data: bytes | memoryview, block: BlockInfo, location: str) -> list[FetchedBatch]:
    """Verify, decompress and decode the stored bytes of `block`.

    Checks the crc32c and that the batches cover exactly ``[start_offset, end_offset)`` of
    the block's stream; raises `CorruptionError` naming `location` and the block position.
    """
    pos = block.position
    _check_stored(data, block, location)
    view = memoryview(_decompressed(data, block, location))
    batches: list[FetchedBatch] = []
    expected = block.start_offset
    at = 0
    while at < len(view):
        try:
            batch, at = decode_batch_at(view, at, location)
        except CorruptionError as exc:
            raise _corrupt(location, pos, f"batch at byte {at} of the block: {exc}") from exc
        if batch.stream_id != block.stream_id or batch.base_offset != expected:
            raise _corrupt(
                location,
                pos,
                f"batch of stream {batch.stream_id} at offset {batch.base_offset}, "
                f"expected stream {block.stream_id} offset {expected}",
            )
        expected = batch.next_offset
        batches.append(batch)
    if expected != block.end_offset or len(batches) != block.batch_count:
        raise _corrupt(
            location,
            pos,
            f"block holds {len(batches)} batches up to offset {expected}, index says "
            f"{block.batch_count} up to {block.end_offset}",
        )
    return batches


def coalesce(blocks: Sequence[BlockInfo], max_gap_bytes: int = 0) -> list[list[BlockInfo]]:
    """Group consecutive `blocks` into runs that one ranged GET can fetch.

    A block joins the previous run when it starts at most `max_gap_bytes` after the run's
    end (0: only exactly adjacent blocks). The given order is kept.
    """
    check_int("max_gap_bytes", max_gap_bytes)
    runs: list[list[BlockInfo]] = []
    end = -1
    for b in blocks:
        if runs and 0 <= b.position - end <= max_gap_bytes:
            runs[-1].append(b)
        else:
            runs.append([b])
        end = b.position + b.stored_size
    return runs


def read_blocks(store: ObjectStore, key: str, blocks: Sequence[BlockInfo]) -> list[FetchedBatch]:
    """Fetch and decode `blocks` of object `key`: one ranged GET per run of adjacent blocks.

    Returns the batches of all blocks, in the order the blocks were given.
    """
    out: list[FetchedBatch] = []
    for run in coalesce(blocks):
        start = run[0].position
        end = run[-1].position + run[-1].stored_size
        data = store.get(key, start, end)
        if len(data) != end - start:
            raise _corrupt(key, start + len(data), f"object ends before byte {end}")
        view = memoryview(data)
        for b in run:
            out.extend(
                decode_block(view[b.position - start : b.position - start + b.stored_size], b, key)
            )
    return out
