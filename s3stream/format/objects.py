"""Object files: data blocks of batch records, a sorted block index and a fixed footer.

An object is ``[data block]* [time-range table] [index] [footer]`` (all integers
little-endian; the full byte layout is in ``docs/format.md``):

- A *data block* holds consecutive batch records (see `s3stream.format.batch`) of one stream
  with contiguous offsets, optionally zstd-compressed. Its crc32c covers the bytes as stored.
- The *time-range table* holds, per block, the smallest and largest timestamp of its offsets
  (`s3stream.format.timestamps`), for seek by time. It is a compatible addition (footer flag
  `FLAG_TIME_RANGES`): readers that predate it see a gap before the index and ignore it;
  objects written before it have none, and their blocks' `time_range` is None.
- The *index* holds one fixed-size entry per block, sorted by (stream_id, start_offset), with
  64-bit offsets and positions throughout.
- The *footer* (last `FOOTER_SIZE` bytes) locates the index and carries its crc32c, the format
  version and `MAGIC`, and has a crc32c of its own.

A reader needs one suffix GET for footer + table + index (a second GET only when they are
larger than the tail read), a binary search, and one ranged GET per run of adjacent blocks.

Roles here: `ObjectWriter` builds objects; `read_index`/`parse_tail` read and validate the
index (`ObjectIndex`), the only GETs of this module. A block's entry and the checks on its
bytes are in `block` (`BlockInfo`, `decode_block`); the ranged GETs of blocks in
`block_reader` (`coalesce`, `read_blocks`, re-exported here, where readers have always found
them).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence

import crc32c
import zstandard

from ..errors import InvalidArgumentError, StreamClosedError
from ..objectstore.base import ObjectStore
from ..settings import MAX_BLOCK_TARGET_BYTES
from ..types import BatchKind, FetchedBatch
from ..validation import check_choice, check_int, check_zstd_level
from .batch import BATCH_HEADER, decode_batches, encode_batch
from .block import BlockInfo, check_stored, corrupt, decode_block, decompressed
from .block_reader import coalesce, read_blocks
from .timestamps import time_range

__all__ = [
    "DEFAULT_TAIL_READ_BYTES",
    "FLAG_TIME_RANGES",
    "FOOTER_SIZE",
    "FORMAT_VERSION",
    "INDEX_ENTRY_SIZE",
    "MAGIC",
    "TIME_ENTRY_SIZE",
    "BlockInfo",
    "ObjectIndex",
    "ObjectWriter",
    "coalesce",
    "decode_block",
    "parse_tail",
    "read_blocks",
    "read_index",
    "time_table_size",
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
# Time-range table, right before the index: per block (min, max) timestamp of its offsets,
# then the crc32c of those entries and their count.
_TIME_ENTRY = struct.Struct("<qq")
_TIME_TRAILER = struct.Struct("<II")

#: Size of one index entry in bytes.
INDEX_ENTRY_SIZE = _ENTRY.size
#: Size of the footer in bytes.
FOOTER_SIZE = _FOOTER.size
#: Size of one entry of the time-range table in bytes.
TIME_ENTRY_SIZE = _TIME_ENTRY.size
#: Footer flag (compatible byte: readers that do not know it ignore it): a time-range table
#: lies right before the index. Every object this writer makes has one.
FLAG_TIME_RANGES = 0x0100

_BLOCK_ZSTD = 0x01
_KNOWN_BLOCK_FLAGS = _BLOCK_ZSTD
# Footer flags: the low byte is for incompatible features (a reader that does not know a set
# bit must refuse the object), the high byte for compatible ones (safe to ignore).
_FOOTER_INCOMPATIBLE_MASK = 0x00FF
_KNOWN_FOOTER_INCOMPATIBLE = 0
# What one block adds besides its bytes: its index entry and its time-range entry.
_BLOCK_OVERHEAD = INDEX_ENTRY_SIZE + TIME_ENTRY_SIZE

_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1
_I64_MIN = -(1 << 63)
_COMPRESSIONS = ("none", "zstd")
_RECORDS = int(BatchKind.RECORDS)

assert _ENTRY.size == 72 and _FOOTER.size == 40 and _TIME_ENTRY.size + _TIME_TRAILER.size == 24


def time_table_size(entry_count: int) -> int:
    """Bytes of the time-range table of an object of `entry_count` blocks."""
    return entry_count * TIME_ENTRY_SIZE + _TIME_TRAILER.size


class ObjectIndex:
    """The parsed index of one object: its blocks and lookups by (stream, offset).

    Construct it with `parse_tail` or `read_index`, which validate the bytes first. It is
    immutable, so one parsed index can be cached and shared between threads.
    """

    __slots__ = ("_data_size", "_ends", "_slices", "_stream_bytes", "blocks", "object_size")

    def __init__(
        self, object_size: int, blocks: Sequence[BlockInfo], *, data_size: int | None = None
    ) -> None:
        """Index over `blocks`, which must be sorted by (stream_id, start_offset) and have
        contiguous offsets within each stream (as `parse_tail` checks). `data_size`: where
        the data blocks end (default: where the index begins)."""
        #: Total size of the object in bytes.
        self.object_size = object_size
        self._data_size = data_size
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
        """Bytes before the index and its time-range table: where the data blocks live."""
        if self._data_size is not None:
            return self._data_size
        return self.object_size - FOOTER_SIZE - len(self.blocks) * INDEX_ENTRY_SIZE

    @property
    def has_time_ranges(self) -> bool:
        """Whether every block has its `time_range` (the object has a time-range table)."""
        return all(b.time_range is not None for b in self.blocks)


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
        "time_range",
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
        time_range: tuple[int, int],
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
        self.time_range = time_range


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
        "cur_time_max",
        "cur_time_min",
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
        self.cur_time_min = 0
        self.cur_time_max = 0


class ObjectWriter:
    """Builds one object from batch records (`add`, `add_fetched`) and from blocks copied out
    of other objects (`add_block`), of any number of streams.

    Batches and blocks of one stream must arrive in offset order without gaps; streams may be
    added in any order and interleaved. Blocks are emitted grouped and sorted by stream id. A block
    closes when the next batch would push it past `block_target_bytes`; a batch larger than
    the target gets a block of its own. With ``compression="zstd"`` a block is stored
    compressed only when that makes it smaller. Not thread-safe.

    Every object gets a time-range table: a batch's time range comes from its records as it is
    added (only the header and timestamp column of a records payload are read); a copied block
    keeps its entry's range, and one from an object without a table is decoded once to get it.
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
        # For the timestamps of zstd records payloads: one context per writer, not per batch.
        self._decompressor = zstandard.ZstdDecompressor()
        self._target = block_target_bytes
        self._streams: dict[int, _StreamBuffer] = {}
        self._estimate = FOOTER_SIZE + time_table_size(0)
        self._finished = False
        #: Per stream, the smallest and largest timestamp, kept by `finish`.
        self._stream_times: dict[int, tuple[int, int]] = {}

    def add(
        self,
        stream_id: int,
        base_offset: int,
        count: int,
        base_timestamp: int,
        batch_record: bytes | memoryview,
        payload: bytes | None = None,
    ) -> None:
        """Append one encoded batch record (from `encode_batch`) of `stream_id`; with
        `payload`, `batch_record` is the record's head (`encode_batch_head`) and `payload`
        its tail, laid out behind it without joining them.

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
        head_size = len(batch_record)
        size = head_size if payload is None else head_size + len(payload)
        if head_size < BATCH_HEADER.size or size > _U32_MAX:
            raise InvalidArgumentError(
                f"batch_record must be an encoded batch record, got {size} bytes"
            )
        h_sid, h_off, h_count, kind, _f, _r, h_ts, props_len, payload_len = (
            BATCH_HEADER.unpack_from(batch_record, 0)
        )
        if (h_sid, h_off, h_count, h_ts) != (stream_id, base_offset, count, base_timestamp):
            raise InvalidArgumentError(
                "batch_record header does not match stream_id/base_offset/count/base_timestamp"
            )
        if BATCH_HEADER.size + props_len + payload_len != size or (
            payload is not None and BATCH_HEADER.size + props_len != head_size
        ):
            raise InvalidArgumentError("batch_record length does not match its header")

        if kind == _RECORDS:
            # Records carry timestamps of their own: the block's time range needs them.
            start = BATCH_HEADER.size + props_len
            view = memoryview(batch_record)[start:] if payload is None else payload
            times = time_range(kind, count, base_timestamp, view, decompressor=self._decompressor)
        else:
            times = (base_timestamp, base_timestamp)
        buf = self._buffer(stream_id, base_offset)
        if buf.cur_pieces and buf.cur_size + size > self._target:
            self._close_block(buf)
        self._append_raw(
            buf,
            batch_record,
            base_offset,
            base_offset + count,
            1,
            base_timestamp,
            base_timestamp,
            times,
            payload,
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

        The entry's `time_range` goes along (merged blocks combine theirs); an entry without
        one (from an object written before time ranges) has its batches decoded to compute
        it — once: the copy has it.
        """
        if self._finished:
            raise StreamClosedError("ObjectWriter.add_block after finish()")
        if not isinstance(block, BlockInfo):
            raise InvalidArgumentError(f"block must be a BlockInfo, got {block!r}")
        check_stored(stored, block, location)
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
        times = block.time_range
        raw = (
            _raw_bytes(stored, block, location)
            if merge or not block.compressed or times is None
            else None
        )
        if times is None:
            # From an object without a time-range table: its batches tell, once.
            assert raw is not None
            times = _decoded_time_range(raw, block, location)
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
                times,
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
                times,
            )
        )
        buf.closed_bytes += block.stored_size
        buf.next_offset = block.end_offset
        self._estimate += _BLOCK_OVERHEAD + block.stored_size

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
        times: tuple[int, int],
        tail: bytes | None = None,
    ) -> None:
        """Append whole batch records covering ``[start_offset, end_offset)`` to the block
        being filled (opening one if none is), `raw` then `tail` (if any) making them;
        `times` is their time range."""
        if not buf.cur_pieces:
            buf.cur_start = start_offset
            buf.cur_first_ts = first_ts
            buf.cur_max_ts = max_ts
            buf.cur_time_min, buf.cur_time_max = times
            self._estimate += _BLOCK_OVERHEAD
        else:
            if max_ts > buf.cur_max_ts:
                buf.cur_max_ts = max_ts
            if times[0] < buf.cur_time_min:
                buf.cur_time_min = times[0]
            if times[1] > buf.cur_time_max:
                buf.cur_time_max = times[1]
        size = len(raw)
        buf.cur_pieces.append(raw)
        if self._compressor is None:
            # Chained so the finished block needs no second pass over its bytes.
            buf.cur_crc = crc32c.crc32c(raw, buf.cur_crc)
        if tail is not None:
            size += len(tail)
            buf.cur_pieces.append(tail)
            if self._compressor is None:
                buf.cur_crc = crc32c.crc32c(tail, buf.cur_crc)
        buf.cur_batches += batches
        buf.cur_size += size
        buf.next_offset = end_offset
        self._estimate += size

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
                (buf.cur_time_min, buf.cur_time_max),
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

    def time_ranges(self) -> dict[int, tuple[int, int]]:
        """Per stream, the smallest and largest timestamp of what was added (the metadata
        keeps them, so seek by time skips objects without reading their index). Only after
        `finish`, which closes the last blocks."""
        if not self._finished:
            raise StreamClosedError("ObjectWriter.time_ranges called before finish")
        return dict(self._stream_times)

    def finish(self) -> bytes:
        """Close all blocks and return the whole object; the writer is unusable afterwards."""
        if self._finished:
            raise StreamClosedError("ObjectWriter.finish called twice")
        self._finished = True
        parts: list[bytes | memoryview] = []
        entries: list[bytes] = []
        times: list[bytes] = []
        position = 0
        for sid in sorted(self._streams):
            buf = self._streams[sid]
            if buf.cur_pieces:
                self._close_block(buf)
            if buf.blocks:
                self._stream_times[sid] = (
                    min(blk.time_range[0] for blk in buf.blocks),
                    max(blk.time_range[1] for blk in buf.blocks),
                )
            for blk in buf.blocks:
                times.append(_TIME_ENTRY.pack(*blk.time_range))
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
        # The time-range table goes between the blocks and the index: readers that do not
        # know it see a gap after the last block, which they allow (docs/format.md).
        table = b"".join(times)
        table += _TIME_TRAILER.pack(crc32c.crc32c(table), len(times))
        index_pos = position + len(table)
        index = b"".join(entries)
        head = struct.pack("<QQII", index_pos, len(index), len(entries), crc32c.crc32c(index))
        head += struct.pack("<HH", FORMAT_VERSION, FLAG_TIME_RANGES)
        footer = head + struct.pack("<I", crc32c.crc32c(head)) + MAGIC
        parts.append(table)
        parts.append(index)
        parts.append(footer)
        return b"".join(parts)

    def _streams_done(self) -> None:
        # Drop the block bytes but keep the offset ranges so `ranges()` still answers.
        for buf in self._streams.values():
            buf.blocks = []


def _decoded_time_range(
    raw: bytes | memoryview, block: BlockInfo, location: str
) -> tuple[int, int]:
    """The time range of a block's batches (its raw bytes), for a block whose entry has
    none: each batch is decoded (and must be the block's stream)."""
    lo = hi = None
    for b in decode_batches(raw, location):
        if b.stream_id != block.stream_id:
            raise corrupt(
                location,
                block.position,
                f"block of stream {block.stream_id} holds a batch of stream {b.stream_id}",
            )
        first, last = time_range(int(b.kind), b.count, b.base_timestamp, b.view)
        lo = first if lo is None else min(lo, first)
        hi = last if hi is None else max(hi, last)
    if lo is None or hi is None:
        raise corrupt(location, block.position, "block holds no batch")
    return lo, hi


def _raw_bytes(stored: bytes | memoryview, block: BlockInfo, location: str) -> bytes | memoryview:
    """The batch records of a block whose stored bytes passed the crc check: decompressed if
    need be, and checked (cheaply: sizes and the first batch header) against the entry."""
    raw = decompressed(stored, block, location)
    if len(raw) < BATCH_HEADER.size:
        raise corrupt(location, block.position, f"block has only {len(raw)} raw bytes")
    sid, base, *_ = BATCH_HEADER.unpack_from(raw, 0)
    if (sid, base) != (block.stream_id, block.start_offset):
        raise corrupt(
            location,
            block.position,
            f"block begins with stream {sid} offset {base}, index says stream "
            f"{block.stream_id} offset {block.start_offset}",
        )
    return raw


# ---------------------------------------------------------------------------------------------
# Reading


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
        raise corrupt(location, 0, f"object of {object_size} bytes is smaller than a footer")
    if n < FOOTER_SIZE:
        return FOOTER_SIZE
    view = memoryview(tail)
    footer_pos = object_size - FOOTER_SIZE
    (index_pos, index_len, count, index_crc, version, flags, footer_crc, magic) = (
        _FOOTER.unpack_from(view, n - FOOTER_SIZE)
    )
    if magic != MAGIC:
        raise corrupt(location, object_size - len(MAGIC), f"bad magic {magic!r}")
    if crc32c.crc32c(view[n - FOOTER_SIZE : n - FOOTER_SIZE + _FOOTER_CRC_SPAN]) != footer_crc:
        raise corrupt(location, footer_pos, "footer crc32c mismatch")
    if version != FORMAT_VERSION:
        newer = " (written by a newer release?)" if version > FORMAT_VERSION else ""
        raise corrupt(
            location,
            footer_pos,
            f"unsupported format version {version}, this release reads {FORMAT_VERSION}{newer}",
        )
    if flags & _FOOTER_INCOMPATIBLE_MASK & ~_KNOWN_FOOTER_INCOMPATIBLE:
        raise corrupt(
            location,
            footer_pos,
            f"unsupported footer flags {flags:#x} (written by a newer release?)",
        )
    table_len = time_table_size(count) if flags & FLAG_TIME_RANGES else 0
    if (
        index_len != count * INDEX_ENTRY_SIZE
        or index_pos + index_len != footer_pos
        or index_pos < table_len
    ):
        raise corrupt(
            location,
            footer_pos,
            f"footer places an index of {count} entries at {index_pos}+{index_len} "
            f"in an object of {object_size} bytes",
        )
    needed: int = table_len + index_len + FOOTER_SIZE
    if n < needed:
        return needed
    start = n - needed
    table_pos = index_pos - table_len
    index_bytes = view[start + table_len : start + table_len + index_len]
    if crc32c.crc32c(index_bytes) != index_crc:
        raise corrupt(location, index_pos, "index crc32c mismatch")
    times = (
        _parse_time_table(view[start : start + table_len], count, table_pos, location)
        if table_len
        else None
    )
    return ObjectIndex(
        object_size,
        _parse_entries(index_bytes, index_pos, table_pos, times, location),
        data_size=table_pos,
    )


def _parse_time_table(
    table: memoryview, count: int, table_pos: int, location: str
) -> list[tuple[int, int]]:
    """The (min, max) time range of each block, from a time-range table checked by its crc."""
    entries = table[: count * TIME_ENTRY_SIZE]
    crc, n = _TIME_TRAILER.unpack_from(table, count * TIME_ENTRY_SIZE)
    if n != count:
        raise corrupt(location, table_pos, f"time-range table has {n} entries, the index {count}")
    if crc32c.crc32c(entries) != crc:
        raise corrupt(location, table_pos, "time-range table crc32c mismatch")
    out: list[tuple[int, int]] = []
    for i, (lo, hi) in enumerate(_TIME_ENTRY.iter_unpack(entries)):
        if lo > hi:
            raise corrupt(
                location,
                table_pos + i * TIME_ENTRY_SIZE,
                f"time-range entry {i}: min {lo} above max {hi}",
            )
        out.append((lo, hi))
    return out


def _parse_entries(
    index: memoryview,
    index_pos: int,
    data_limit: int,
    times: Sequence[tuple[int, int]] | None,
    location: str,
) -> list[BlockInfo]:
    """The index entries, checked; blocks must end by `data_limit` (where the time-range
    table or the index begins). `times`: each block's time range, if the object has them."""
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
        elif pos < data_end or pos + stored > data_limit:
            problem = f"block at {pos}+{stored} overlaps another block or the index"
        elif prev is not None and (sid, start) <= (prev.stream_id, prev.start_offset):
            problem = "index entries out of order"
        elif prev is not None and sid == prev.stream_id and start != prev.end_offset:
            problem = f"gap or overlap in stream {sid} at offset {prev.end_offset}"
        elif max_ts < first_ts:
            problem = "max_timestamp below first_timestamp"
        if problem is not None:
            raise corrupt(location, entry_pos, f"index entry {i}: {problem}")
        prev = BlockInfo(
            sid,
            start,
            end,
            pos,
            stored,
            raw,
            nbatch,
            first_ts,
            max_ts,
            compressed,
            crc,
            None if times is None else times[i],
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
            # Named where the object ends: the tail read starts at 0 for a small object.
            ends = max(0, object_size - tail_read_bytes) + len(tail)
            raise corrupt(key, ends, "object shorter than expected")
    result = parse_tail(tail, object_size, key)
    if isinstance(result, ObjectIndex):
        return result
    start = object_size - result
    head = store.get(key, start, object_size - len(tail))
    if len(head) != result - len(tail):
        raise corrupt(key, start, "object shorter than its footer says")
    result = parse_tail(head + tail, object_size, key)
    if not isinstance(result, ObjectIndex):
        raise corrupt(key, start, "index still incomplete after the second read")
    return result
