"""Reading a file WAL's ring at recovery: where the valid frames end and whether that is a torn
tail or damage (the rules are in ``docs/file-wal.md``, "What recovery detects").

`FileWal.recover` and the read-only `check_file_wal` (used by ``s3stream verify``) share this
code, so a check reports exactly what an opening would do, without writing anything.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import InvalidArgumentError, S3StreamError
from .checks import check_wal_medium
from .framing import (
    BLOCK_BYTES,
    DATA_START,
    FRAME_ALIGN,
    FRAME_HEADER,
    MIN_DATA_CAPACITY,
    RING_PROBE_BYTES,
    SLOT_BYTES,
    FrameHeader,
    FrameScanner,
    HeaderSlot,
    SlotStatus,
    choose_slot,
    decode_frame_header,
    decode_frame_header_anywhere,
    decode_slot,
    file_bytes,
    find_frame,
    may_hold_header,
    ring_holds_frames,
)
from .os_errors import os_error

__all__ = [
    "FileWalCheck",
    "PeekedWal",
    "UnusableWal",
    "check_file_wal",
    "choose_header",
    "clean_tail_damage",
    "damage",
    "holds_records",
    "open_wal_for_reading",
    "peek_wal",
    "pread_all",
    "read_header_slots",
    "ring_reader",
    "scan_bound",
]

#: Chunk size of `check_file_wal`'s reads (recovery uses its setting).
_CHECK_READ_BYTES = 8 << 20


def ring_reader(fd: int, capacity: int, path: Path) -> Callable[[int, int], bytes]:
    """``read(position, length)``: the bytes of a logical range of the ring, across its end."""

    def read(position: int, length: int) -> bytes:
        phys = position % capacity
        first = min(length, capacity - phys)
        try:
            data = pread_all(fd, first, DATA_START + phys)
            if length > first and len(data) == first:
                data += pread_all(fd, length - first, DATA_START)
        except OSError as exc:
            raise os_error(f"cannot read position {position} of WAL", path, exc) from exc
        return data

    return read


def choose_header(slots: list[tuple[SlotStatus, HeaderSlot | None]]) -> HeaderSlot | None:
    """The newest valid header of the two slots (a slot whose generation parity does not
    match its place was not written there by us, so it counts as damaged)."""
    checked: list[tuple[SlotStatus, HeaderSlot | None]] = []
    for index, (status, header) in enumerate(slots):
        if header is not None and header.slot_index != index:
            checked.append((SlotStatus.CORRUPT, None))
        else:
            checked.append((status, header))
    return choose_slot(checked)


def scan_bound(header: HeaderSlot) -> tuple[int, bool]:
    """Where recovery's scan ends, and whether every frame before it must be valid (a clean
    header's tail is exact). After a crash: nothing was ever written at or past window_end
    (the header promising it is made durable first), nor at or past start + capacity (that
    would overwrite start)."""
    if header.clean:
        return header.tail, True
    return max(header.start, min(header.window_end, header.start + header.capacity)), False


def clean_tail_damage(scanner: FrameScanner, bound: int) -> str | None:
    """What is wrong before a clean header's exact tail `bound` (every frame there was
    acknowledged and closed cleanly), or None."""
    if scanner.problem is None:
        return None
    return (
        f"damaged record at position {scanner.end} before the clean-shutdown tail {bound}: "
        f"{scanner.problem}"
    )


def damage(
    header: HeaderSlot,
    scanner: FrameScanner,
    bound: int,
    read: Callable[[int, int], bytes],
    chunk_bytes: int,
) -> str | None:
    """Why the end of the valid frames (a finished `scanner`) is damage rather than a torn
    tail, or None. Damage before a clean tail is the caller's to report (`scanner.problem`).

    Only the last group of a session can be torn, and it is written in one go with a group
    mark after it; so a frame written *after* the point where the scan stopped (of the
    header's session or a newer one) proves that the bytes there were acknowledged. A frame
    of a session newer than the header's proves a newer header existed and is lost.
    """
    end, session = scanner.end, header.session

    def found_after(start: int, stop: int, min_session: int) -> tuple[int, FrameHeader] | None:
        # Positions at or past start + capacity alias live ones; nothing is ever there.
        return find_frame(
            read,
            start=start,
            stop=min(stop, header.start + header.capacity),
            seed=header.seed,
            min_session=min_session,
            chunk_bytes=chunk_bytes,
        )

    if header.clean:
        # A session after the clean shutdown starts its frames where the clean one ended.
        found = found_after(end, end + FRAME_ALIGN, session + 1)
        if found is None:
            return None
        return (
            f"the newest header is damaged: a frame of session {found[1].session} lies at "
            f"position {found[0]}, past the clean tail of session {session}"
        )
    ahead = decode_frame_header_anywhere(read(end, FRAME_HEADER.size), 0, header.seed)
    if ahead is not None and ahead[0] > end and (ahead[0] - end) % header.capacity == 0:
        # A later lap wrote where the scan stopped: this header is older than the ring (both
        # slots rolled back), and its start no longer holds what it names.
        return (
            f"a frame of position {ahead[0]} (a later lap of the ring) lies where position "
            f"{end} should be: the header is older than the data (rolled back?)"
        )
    if end < header.tail:
        return (
            f"{scanner.problem or 'the frames end'} at position {end}, below position "
            f"{header.tail}, up to which the header says every frame was durable"
        )
    if scanner.overrun is not None and scanner.overrun.session >= session:
        # Frames are written only below a window end made durable first.
        return (
            f"a frame of session {scanner.overrun.session} at position {end} runs past "
            f"the window end {bound} its header promised: a newer header is lost"
        )
    # Past a damaged frame or the newest group's mark (the group after it would have written
    # over the mark), or the frame at `bound` when the scan reached it.
    first = end + FRAME_ALIGN if scanner.problem is not None or scanner.marked else end
    found = found_after(first, bound + FRAME_ALIGN, session)
    if found is None:
        return None
    what = scanner.problem or (
        "the newest group's mark" if scanner.marked else f"the window end {bound} of the header"
    )
    return (
        f"{what} at position {end}, but a frame of session {found[1].session} was "
        f"written after it at position {found[0]}"
    )


@dataclass(frozen=True, slots=True)
class FileWalCheck:
    """What `check_file_wal` found in one WAL file."""

    path: Path
    node_id: str
    node_epoch: int
    #: The header says the last session closed cleanly (every record was uploaded or is
    #: exactly up to its tail).
    clean: bool
    #: Valid records from the header's start on, and their bytes.
    records: int
    record_bytes: int
    #: Where the valid frames end (a logical position), and why the scan stopped there
    #: before its bound (None: it reached it, or a group mark).
    end: int
    stopped: str | None
    #: Why this is damage an opening would refuse with `CorruptionError`; None if healthy.
    damage: str | None
    #: False for an empty file: not a WAL yet (its creation never got that far; an opening
    #: formats it), which is damage only if its node had streams open.
    formatted: bool = True
    #: The WAL's identity from its header (`PeekedWal.wal_uid`; 0 without a header).
    wal_uid: int = 0

    @property
    def ok(self) -> bool:
        """No damage: an opening would recover every acknowledged record."""
        return self.damage is None


def check_file_wal(path: str | Path) -> FileWalCheck:
    """Check the WAL file `path` the way recovery reads it, without writing anything (opened
    read-only; a live holder is not disturbed). `InvalidArgumentError` when the file cannot
    be read or is not a WAL; damage is reported in the result, not raised."""
    p = Path(path)
    fd = open_wal_for_reading(p)
    try:
        size = os.fstat(fd).st_size
        raw, slots, header = read_header_slots(fd)
        if header is None:
            ring = pread_all(fd, RING_PROBE_BYTES, DATA_START) if size > DATA_START else b""
            return _unreadable(p, raw, size, slots, ring_holds_frames(ring))
        if size != file_bytes(header.capacity) and os.path.isfile(p):
            return _damaged(
                p,
                header,
                f"the file was truncated or resized: {size} bytes, but its header says "
                f"{file_bytes(header.capacity)}",
            )
        read = ring_reader(fd, header.capacity, p)
        bound, strict = scan_bound(header)
        scanner = FrameScanner(
            read,
            start=header.start,
            bound=bound,
            seed=header.seed,
            max_session=header.session,
            max_length=header.capacity,
            chunk_bytes=_CHECK_READ_BYTES,
            current_from=header.tail,
        )
        records = record_bytes = 0
        for _, data in scanner:
            records += 1
            record_bytes += len(data)
        verdict = (clean_tail_damage(scanner, bound) if strict else None) or damage(
            header, scanner, bound, read, _CHECK_READ_BYTES
        )
        if verdict is not None:
            offset = DATA_START + scanner.end % header.capacity
            verdict += f" (file offset {offset})"
        return FileWalCheck(
            path=p,
            node_id=header.node_id,
            node_epoch=header.node_epoch,
            clean=header.clean,
            records=records,
            record_bytes=record_bytes,
            end=scanner.end,
            stopped=scanner.problem,
            damage=verdict,
            wal_uid=header.wal_uid,
        )
    finally:
        os.close(fd)


def read_header_slots(
    fd: int,
) -> tuple[bytes, list[tuple[SlotStatus, HeaderSlot | None]], HeaderSlot | None]:
    """The header area of the WAL open at `fd`, its two slots decoded, and the header they
    give (None: neither is valid, or the file is shorter than the header area)."""
    raw = pread_all(fd, DATA_START, 0)
    slots = [decode_slot(raw[i * SLOT_BYTES : (i + 1) * SLOT_BYTES]) for i in range(2)]
    return raw, slots, choose_header(slots) if len(raw) == DATA_START else None


def holds_records(fd: int, header: HeaderSlot) -> bool:
    """Whether the WAL open at `fd`, whose header is `header`, holds a record at or past its
    trim point: a clean header says so exactly; after a crash, the first live record would
    be a valid frame at `start` (an open's claim left the header unclean even when nothing
    was appended after it)."""
    if header.clean:
        return header.start != header.tail
    at = header.data_start + header.start % header.capacity
    found = decode_frame_header(pread_all(fd, FRAME_HEADER.size, at), 0, header.start, header.seed)
    return found is not None and not found.is_mark


class PeekedWal(NamedTuple):
    """What `peek_wal` read of a WAL's header."""

    node_id: str
    wal_uid: int
    #: Records at or past its trim point, or cut short (what it held cannot be told).
    holds_records: bool


class UnusableWal(NamedTuple):
    """A WAL whose open `FileWal` refuses for its header alone (`peek_wal`): why."""

    problem: str


def peek_wal(path: str | Path) -> PeekedWal | UnusableWal | None:
    """The node, identity and `holds_records` of the WAL file `path` from its header,
    read-only, as `FileWal` judges a WAL of another node or identity; `UnusableWal` where our
    magic is but no header `FileWal` would open (damaged slots, a newer layout, the header
    area cut short, an impossible layout, a file larger than its header says); None where
    there is no WAL yet (new, empty, zeros: the WAL's open judges those) or it cannot be
    read."""
    try:
        fd = open_wal_for_reading(Path(path))
    except S3StreamError:
        return None
    try:
        size = os.fstat(fd).st_size
        raw, _, header = read_header_slots(fd)
        if header is None:
            if may_hold_header(raw):
                return UnusableWal(
                    "it holds no usable header (damaged, cut short, or written by a newer s3stream)"
                )
            return None
        expected = header.data_start + header.capacity
        if (
            header.data_start != DATA_START
            or header.capacity % BLOCK_BYTES
            or header.capacity < MIN_DATA_CAPACITY
        ):
            return UnusableWal("its header describes an impossible layout")
        device = stat.S_ISBLK(os.fstat(fd).st_mode)
        if not device and size > expected:
            return UnusableWal(f"it is {size} bytes but its header says {expected}: resized")
        truncated = not device and size < expected
        return PeekedWal(header.node_id, header.wal_uid, truncated or holds_records(fd, header))
    except OSError:
        return None
    finally:
        os.close(fd)


def open_wal_for_reading(path: Path) -> int:
    """A read-only descriptor of the WAL at `path`; `InvalidArgumentError` if it cannot be
    read or is neither a regular file nor a block device. Opened without blocking, so a FIFO
    (whose open would wait for a writer) is refused instead of hanging the caller."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read WAL {path}: {exc.strerror or exc}") from exc
    try:
        check_wal_medium(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


def _unreadable(
    path: Path,
    raw: bytes,
    size: int,
    slots: list[tuple[SlotStatus, HeaderSlot | None]],
    frames: bool,
) -> FileWalCheck:
    """What a file without a valid header is, judged as an opening judges it (`FileWal`):
    never formatted, damaged, or (`InvalidArgumentError`) not a WAL at all."""
    if frames and all(status is SlotStatus.EMPTY for status, _ in slots):
        return _damaged(path, None, "both header slots read as zeros, but its ring holds records")
    if size == 0 or all(status is SlotStatus.EMPTY for status, _ in slots):
        # Not a WAL yet: empty, or preallocated by a creation that crashed before its first
        # header (an opening formats it); damage only if its node needed one.
        return _damaged(path, None, None, formatted=False)
    if size < DATA_START:
        if not may_hold_header(raw):
            raise InvalidArgumentError(
                f"{path} is not an s3stream WAL: {size} bytes, too small to hold the headers, "
                "and no header magic"
            )
        return _damaged(path, None, f"truncated to {size} bytes: its header slots are cut off")
    if any(status is SlotStatus.CORRUPT for status, _ in slots):
        return _damaged(path, None, "both header slots are damaged (checksum mismatch)")
    raise InvalidArgumentError(f"{path} is not an s3stream WAL (no valid header)")


def _damaged(
    path: Path, header: HeaderSlot | None, reason: str | None, *, formatted: bool = True
) -> FileWalCheck:
    """A check that read no records: the WAL could not be scanned (`reason`)."""
    return FileWalCheck(
        path=path,
        node_id=header.node_id if header is not None else "",
        node_epoch=header.node_epoch if header is not None else 0,
        clean=header is not None and header.clean,
        records=0,
        record_bytes=0,
        end=header.start if header is not None else 0,
        stopped=None,
        damage=reason,
        formatted=formatted,
    )


def pread_all(fd: int, length: int, offset: int) -> bytes:
    """Read up to `length` bytes at `offset`; shorter only at end of file."""
    chunks: list[bytes] = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)
