"""On-disk codecs of the file WAL: record frames and the two header slots.

Everything is little-endian. See ``docs/file-wal.md`` for the layout and the recovery argument.

A *frame* is one record: a 32-byte header, the record bytes, then zero padding to a multiple of
`FRAME_ALIGN` bytes::

    0   4s   magic          b"S3WF"
    4   u16  kind           1 = record, 2 = group mark (length 0, no record)
    6   u16  flags          0 (reserved)
    8   u32  length         record bytes (header and padding excluded)
    12  u32  body_crc       crc32c(seed, record bytes)
    16  u64  position       logical position of this frame (its own address)
    24  u32  session        which open of the WAL wrote it (non-decreasing along the log)
    28  u32  header_crc     crc32c(seed, bytes 0..27)

Every group commit is written with a *group mark* after its last frame: a frame header of kind 2
at the position where the group ends, which the next group overwrites. A valid mark where a scan
stops says the group before it was written whole; any valid frame found *past* a damaged one
says the damaged bytes were followed by later writes (see `find_frame`).

A *header slot* (two of them, at file offsets 0 and 4096) describes the ring; the valid slot
with the higher generation wins::

    0   8s   magic          b"S3SWALHD"
    8   u16  version        1
    10  u16  flags          bit 0: clean shutdown (``tail`` is exact)
    12  u32  slot_bytes     4096
    16  u64  generation     +1 on every header write; slot = generation % 2
    24  u64  capacity       bytes of the data area (the ring)
    32  u64  data_start     file offset of the data area (8192)
    40  u64  wal_uid        identity of this format of the medium (seeds every crc32c)
    48  u64  start          position of the first live frame (everything below is trimmed)
    56  u64  tail           end of the last frame (exact only after a clean shutdown)
    64  u64  window_end     no frame was ever written at or past this position
    72  u64  node_epoch     epoch of the node that owns the WAL
    80  u32  session        session of the last open; frames carry sessions <= this
    84  u16  node_id_len
    86  u16  reserved       0
    88  64s  node_id        UTF-8, zero padded
    152 u32  crc            crc32c over bytes 0..151
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum

import crc32c

__all__ = [
    "BLOCK_BYTES",
    "DATA_START",
    "FRAME_ALIGN",
    "FRAME_HEADER",
    "HEADER_MAGIC",
    "HEADER_SLOT",
    "MAX_NODE_ID_BYTES",
    "MIN_DATA_CAPACITY",
    "RING_PROBE_BYTES",
    "SLOT_BYTES",
    "FrameHeader",
    "FrameScanner",
    "HeaderSlot",
    "SlotStatus",
    "align_down",
    "align_up",
    "body_crc",
    "choose_slot",
    "decode_frame_header",
    "decode_frame_header_anywhere",
    "decode_slot",
    "encode_frame_header",
    "encode_group_mark",
    "file_bytes",
    "find_frame",
    "frame_size",
    "may_hold_header",
    "ring_holds_frames",
    "seed_for",
]

#: Alignment unit of the layout: device sector/page size that O_DIRECT needs.
BLOCK_BYTES = 4096
#: The smallest ring a WAL header may describe.
MIN_DATA_CAPACITY = 4 * BLOCK_BYTES
#: Bytes reserved for one header slot.
SLOT_BYTES = BLOCK_BYTES
#: File offset of the data area: two header slots precede it.
DATA_START = 2 * SLOT_BYTES


def file_bytes(capacity: int) -> int:
    """Size of a regular-file WAL whose ring holds `capacity` bytes: the headers, then the
    ring (what a WAL file is created with, and what a valid one keeps)."""
    return DATA_START + capacity


#: Frames start at multiples of this, so a frame header never straddles the ring end.
FRAME_ALIGN = 32
MAX_NODE_ID_BYTES = 64

FRAME_MAGIC = b"S3WF"
FRAME_HEADER = struct.Struct("<4sHHIIQII")
KIND_RECORD = 1
KIND_MARK = 2

HEADER_MAGIC = b"S3SWALHD"


#: How much of the ring's start `ring_holds_frames` is given to look at.
RING_PROBE_BYTES = 4 << 20


def ring_holds_frames(window: bytes) -> bool:
    """Whether the ring's first bytes (`RING_PROBE_BYTES` from file offset `DATA_START`) hold
    a frame header: a ring is written from position 0 on, so a WAL that ever held a record
    has frames there (of some lap; the first may be the tail of a record body straddling the
    ring's end, hence a window, not offset 0 alone), while a new ring holds zeros. Missed only
    when a record body of more than the window straddles the end."""
    at = window.find(FRAME_MAGIC)
    while at >= 0:
        if at % FRAME_ALIGN == 0:
            return True
        at = window.find(FRAME_MAGIC, at + 1)
    return False


def may_hold_header(raw: bytes) -> bool:
    """Whether `raw`, the start of a file, holds this WAL's header magic or the beginning of
    it (a header written whole, or cut short): the file is a WAL, maybe damaged."""
    return HEADER_MAGIC in raw or (bool(raw) and HEADER_MAGIC.startswith(raw[:8]))


HEADER_VERSION = 1
HEADER_SLOT = struct.Struct("<8sHHIQQQQQQQQIHH64s")
_SLOT_CRC = struct.Struct("<I")
FLAG_CLEAN = 1

assert FRAME_HEADER.size == FRAME_ALIGN
assert HEADER_SLOT.size == 152


def align_up(value: int, unit: int = BLOCK_BYTES) -> int:
    """Smallest multiple of `unit` that is >= `value`."""
    return -(-value // unit) * unit


def align_down(value: int, unit: int = BLOCK_BYTES) -> int:
    """Largest multiple of `unit` that is <= `value`."""
    return value - value % unit


def frame_size(length: int) -> int:
    """Bytes a record of `length` bytes occupies in the ring (header and padding included)."""
    return align_up(FRAME_HEADER.size + length, FRAME_ALIGN)


def seed_for(wal_uid: int) -> int:
    """The crc32c seed of a WAL: frames of another format of the same medium never validate."""
    return int(crc32c.crc32c(struct.pack("<Q", wal_uid)))


#: Records below this size are checksummed holding the GIL: for them, letting go of it costs
#: more than the checksum (hardware crc32c runs at gigabytes per second) and, with a busy
#: thread beside (an upload packing an object), the appender may wait milliseconds to get it
#: back. Larger ones let other threads run meanwhile (crc32c's own default above 32 KiB).
_CRC_KEEP_GIL_BELOW = 1 << 20


def body_crc(data: bytes | memoryview, seed: int) -> int:
    """Checksum of a record's bytes as stored in its frame header."""
    if len(data) < _CRC_KEEP_GIL_BELOW:
        return int(crc32c.crc32c(data, seed, gil_release_mode=0))
    return int(crc32c.crc32c(data, seed))


def encode_frame_header(
    position: int, session: int, length: int, crc: int, seed: int, kind: int = KIND_RECORD
) -> bytes:
    """The 32-byte header of the frame at `position` holding `length` bytes with checksum `crc`."""
    head = FRAME_HEADER.pack(FRAME_MAGIC, kind, 0, length, crc, position, session, 0)
    return head[:28] + _SLOT_CRC.pack(crc32c.crc32c(memoryview(head)[:28], seed))


def encode_group_mark(position: int, session: int, seed: int) -> bytes:
    """The group mark written after a group that ends at `position` (`FRAME_ALIGN` bytes)."""
    return encode_frame_header(position, session, 0, 0, seed, kind=KIND_MARK)


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """A decoded, validated frame header."""

    length: int
    body_crc: int
    session: int
    kind: int = KIND_RECORD

    @property
    def is_mark(self) -> bool:
        """A group mark (no record): the group before it was written whole."""
        return self.kind == KIND_MARK


def decode_frame_header(
    buf: bytes | memoryview, offset: int, expected_position: int, seed: int
) -> FrameHeader | None:
    """The frame header at `buf[offset:]` if it is valid for `expected_position`, else None.

    Valid means: right magic and kind, header checksum under this WAL's seed, and the frame's
    own position equals the position the reader expects there (a frame left from an earlier lap
    of the ring carries a smaller position).
    """
    found = decode_frame_header_anywhere(buf, offset, seed)
    if found is None or found[0] != expected_position:
        return None
    return found[1]


def decode_frame_header_anywhere(
    buf: bytes | memoryview, offset: int, seed: int
) -> tuple[int, FrameHeader] | None:
    """The position a valid frame header at `buf[offset:]` says it has, and the header, or
    None; whether that position belongs there is the caller's question."""
    view = memoryview(buf)[offset : offset + FRAME_HEADER.size]
    if len(view) < FRAME_HEADER.size:
        return None
    magic, kind, flags, length, crc, position, session, header_crc = FRAME_HEADER.unpack(view)
    if magic != FRAME_MAGIC or kind not in (KIND_RECORD, KIND_MARK) or flags != 0:
        return None
    if crc32c.crc32c(view[:28], seed) != header_crc:
        return None
    if kind == KIND_MARK and (length or crc):
        return None
    return position, FrameHeader(length, crc, session, kind)


class SlotStatus(Enum):
    """Why a header slot was accepted or rejected."""

    VALID = "valid"
    #: All zero: never written (a fresh file or device).
    EMPTY = "empty"
    #: Not our magic: the medium holds something else.
    FOREIGN = "foreign"
    #: Our magic but a bad checksum: a torn or damaged header write.
    CORRUPT = "corrupt"
    #: Written by a newer, incompatible format version.
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True, slots=True, kw_only=True)
class HeaderSlot:
    """The decoded contents of one header slot (see the module docstring for the layout)."""

    generation: int
    capacity: int
    data_start: int
    wal_uid: int
    start: int
    tail: int
    window_end: int
    node_epoch: int
    session: int
    node_id: str
    clean: bool
    version: int = HEADER_VERSION

    def next(self, **changes: object) -> HeaderSlot:
        """The following header: generation + 1 with `changes` applied."""
        return replace(self, generation=self.generation + 1, **changes)  # type: ignore[arg-type]

    @property
    def slot_index(self) -> int:
        """Which of the two slots (0 or 1) this header is written to."""
        return self.generation % 2

    @property
    def seed(self) -> int:
        """The crc32c seed of frames of this WAL."""
        return seed_for(self.wal_uid)

    def encode(self) -> bytes:
        """The full `SLOT_BYTES` image of this header."""
        node_id = self.node_id.encode()
        body = HEADER_SLOT.pack(
            HEADER_MAGIC,
            self.version,
            FLAG_CLEAN if self.clean else 0,
            SLOT_BYTES,
            self.generation,
            self.capacity,
            self.data_start,
            self.wal_uid,
            self.start,
            self.tail,
            self.window_end,
            self.node_epoch,
            self.session,
            len(node_id),
            0,
            node_id,
        )
        out = body + _SLOT_CRC.pack(crc32c.crc32c(body))
        return out + bytes(SLOT_BYTES - len(out))


def decode_slot(buf: bytes | memoryview) -> tuple[SlotStatus, HeaderSlot | None]:
    """Decode one slot image; the header is returned only when the status is VALID."""
    view = memoryview(buf)
    end = HEADER_SLOT.size + _SLOT_CRC.size
    if len(view) < end:
        return SlotStatus.CORRUPT, None
    if view[: len(HEADER_MAGIC)] != HEADER_MAGIC:
        return (SlotStatus.EMPTY if not any(view) else SlotStatus.FOREIGN), None
    (crc,) = _SLOT_CRC.unpack_from(view, HEADER_SLOT.size)
    if crc32c.crc32c(view[: HEADER_SLOT.size]) != crc:
        return SlotStatus.CORRUPT, None
    fields = HEADER_SLOT.unpack_from(view)
    (_, version, flags, slot_bytes, generation, capacity, data_start, wal_uid) = fields[:8]
    (start, tail, window_end, node_epoch, session, id_len, _, raw_id) = fields[8:]
    if version > HEADER_VERSION:
        return SlotStatus.UNSUPPORTED, None
    if slot_bytes != SLOT_BYTES or id_len > MAX_NODE_ID_BYTES:
        return SlotStatus.CORRUPT, None
    try:
        node_id = bytes(raw_id[:id_len]).decode()
    except UnicodeDecodeError:
        return SlotStatus.CORRUPT, None
    header = HeaderSlot(
        generation=generation,
        capacity=capacity,
        data_start=data_start,
        wal_uid=wal_uid,
        start=start,
        tail=tail,
        window_end=window_end,
        node_epoch=node_epoch,
        session=session,
        node_id=node_id,
        clean=bool(flags & FLAG_CLEAN),
        version=version,
    )
    return SlotStatus.VALID, header


def choose_slot(
    slots: list[tuple[SlotStatus, HeaderSlot | None]],
) -> HeaderSlot | None:
    """The valid header with the highest generation, or None when no slot is valid."""
    valid = [h for status, h in slots if status is SlotStatus.VALID and h is not None]
    return max(valid, key=lambda h: h.generation) if valid else None


class FrameScanner:
    """Walks the frames of a ring from `start`, in order, up to `bound` (exclusive).

    Iterating yields ``(position, record bytes)`` for each valid frame and stops at the first
    frame that is not valid: bad magic, header or body checksum, a position other than the
    expected one, a session above `max_session` or below the previous frame's session, a
    session below `max_session` at or past `current_from` (every session writes its frames
    from the tail its first header names on, and a header's tail only grows: an older
    session's frame there is a leftover, such as the frames of a group that failed, which a
    session that then wrote nothing would otherwise take for its own), or a frame that would
    cross `bound`. A valid group mark ends the scan too (`marked`). Afterwards
    `end` is where the valid prefix ends, `problem` says why the scan stopped there (None when
    it stopped exactly at `bound` or at a mark), and `overrun` is the valid header found at `end`
    whose frame would cross `bound`.

    `read(position, length)` returns the bytes of the logical range (shorter at end of medium);
    reads go in chunks of `chunk_bytes`, so the work is proportional to the live bytes.
    """

    def __init__(
        self,
        read: Callable[[int, int], bytes],
        *,
        start: int,
        bound: int,
        seed: int,
        max_session: int,
        max_length: int,
        chunk_bytes: int,
        current_from: int | None = None,
    ) -> None:
        self._read = read
        self._start = start
        self._bound = bound
        self._seed = seed
        self._max_session = max_session
        self._current_from = bound if current_from is None else current_from
        self._max_length = max_length
        self._chunk = max(chunk_bytes, FRAME_ALIGN)
        #: Position just past the last valid frame seen so far.
        self.end = start
        #: Why the scan stopped before `bound` (None if it reached `bound` or a mark).
        self.problem: str | None = None
        #: Whether the scan ended at a valid group mark.
        self.marked = False
        #: The valid header at `end` whose frame would cross `bound`, if the scan stopped so.
        self.overrun: FrameHeader | None = None

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        pos = self._start
        buf = b""
        buf_lo = pos
        last_session = 0
        hsize = FRAME_HEADER.size
        while pos < self._bound:
            if pos + hsize > self._bound:
                self.problem = f"{self._bound - pos} stray bytes before the end of the window"
                return
            if pos + hsize > buf_lo + len(buf):
                buf, buf_lo = self._fill(pos, hsize), pos
            header = decode_frame_header(buf, pos - buf_lo, pos, self._seed)
            if header is None:
                self.problem = "no valid frame header (torn, stale or damaged)"
                return
            if not last_session <= header.session <= self._max_session:
                self.problem = (
                    f"frame of session {header.session} after session {last_session} "
                    f"(newest {self._max_session}): left over from an earlier session"
                )
                return
            if header.session < self._max_session and pos >= self._current_from:
                self.problem = (
                    f"frame of session {header.session} at or past position "
                    f"{self._current_from}, where session {self._max_session} began: left "
                    "over from an earlier session"
                )
                return
            if header.is_mark:
                self.marked = True
                return
            size = frame_size(header.length)
            if header.length > self._max_length or pos + size > self._bound:
                self.problem = f"frame length {header.length} runs past the end of the window"
                if header.length <= self._max_length:
                    self.overrun = header
                return
            if pos + size > buf_lo + len(buf):
                buf, buf_lo = self._fill(pos, size), pos
            off = pos - buf_lo + hsize
            body = memoryview(buf)[off : off + header.length]
            if len(body) != header.length or body_crc(body, self._seed) != header.body_crc:
                self.problem = "record checksum mismatch (torn or damaged record)"
                return
            yield pos, bytes(body)
            last_session = header.session
            pos += size
            self.end = pos

    def _fill(self, pos: int, need: int) -> bytes:
        return self._read(pos, min(self._bound - pos, max(need, self._chunk)))


def find_frame(
    read: Callable[[int, int], bytes],
    *,
    start: int,
    stop: int,
    seed: int,
    min_session: int,
    chunk_bytes: int,
) -> tuple[int, FrameHeader] | None:
    """The first valid frame header (record or mark) at a position in ``[start, stop)`` whose
    session is at least `min_session`, with its position; None if there is none.

    Used past the point where a scan stopped: such a frame was written *after* the bytes at
    that point (positions only grow within a session), so those bytes are damage, not a torn
    tail. Frame headers are `FRAME_ALIGN`-aligned and carry their own position, so a leftover
    of an earlier lap of the ring never matches; the search looks for the magic in chunks
    (`start` must be aligned), so its cost is a read of the range.
    """
    chunk = max(align_down(chunk_bytes, FRAME_ALIGN), FRAME_ALIGN)
    lo = start
    while lo < stop:
        buf = read(lo, min(chunk, stop - lo))
        if not buf:
            return None
        at = buf.find(FRAME_MAGIC)
        while at >= 0:
            if at % FRAME_ALIGN == 0:
                header = decode_frame_header(buf, at, lo + at, seed)
                if header is not None and header.session >= min_session:
                    return lo + at, header
            at = buf.find(FRAME_MAGIC, at + 1)
        lo += len(buf)
    return None
