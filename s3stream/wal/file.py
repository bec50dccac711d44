"""The file / block-device WAL: a fixed-capacity ring on a preallocated file or a raw device.

Layout, framing and the recovery argument are in ``docs/file-wal.md``; the byte codecs are in
`s3stream.wal.framing`. In short: two alternating header slots, then a ring of frames addressed
by logical positions that grow forever (physical offset = data_start + position % capacity).
Appends, room, in-order completion and the lifecycle are the WAL core's
(`s3stream.wal.pipeline`); this module is the medium: one writer thread (or a caller in
`FileWal.drive`) group-commits every pending record with one vectored write and one
``fdatasync``. Space is reclaimed only once a trim is durable in the header, so untrimmed
bytes are never overwritten.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import logging
import mmap
import os
import threading
from array import array
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

from .._dirs import fsync_directory, make_directories
from ..clock import Clock, SystemClock
from ..errors import (
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    S3StreamError,
    StreamClosedError,
    UnavailableError,
)
from ..metrics.logs import ContextLogger
from ..settings import FileWalSettings
from ..validation import check_int, check_text
from .base import WalCapabilities, WalPosition, WalRecord
from .checks import check_wal_medium
from .file_scan import (
    choose_header,
    clean_tail_damage,
    damage,
    holds_records,
    open_wal_for_reading,
    pread_all,
    read_header_slots,
    ring_reader,
    scan_bound,
)
from .framing import (
    BLOCK_BYTES,
    DATA_START,
    FRAME_ALIGN,
    FRAME_HEADER,
    MAX_NODE_ID_BYTES,
    MIN_DATA_CAPACITY,
    RING_PROBE_BYTES,
    SLOT_BYTES,
    FrameScanner,
    HeaderSlot,
    SlotStatus,
    align_down,
    align_up,
    decode_slot,
    encode_group_mark,
    file_bytes,
    may_hold_header,
    ring_holds_frames,
)
from .holder import WalHolderLock
from .loss import check_wal_loss, refuse_foreign_wal
from .os_errors import os_error
from .pipeline import Group, Pending, PipelinedWal

__all__ = ["FileWal", "read_wal_header"]

_log = logging.getLogger(__name__)

_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
_ZEROS = bytes(BLOCK_BYTES)
_MIN_DATA_CAPACITY = MIN_DATA_CAPACITY
#: Bytes of a slot that hold the header fields and their checksum.
_SLOT_PROBE_BYTES = 160
#: The contract's default `WalCapabilities.max_record_bytes`.
_MAX_RECORD_BYTES = 64 << 20


def read_wal_header(path: str | Path) -> HeaderSlot:
    """The current header of the WAL at `path` (read-only; for tools such as ``inspect``)."""
    p = Path(path)
    fd = open_wal_for_reading(p)
    try:
        _, slots, header = read_header_slots(fd)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read WAL {p}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if header is None:
        raise _no_header_error(p, slots)
    return header


def _no_header_error(
    path: Path, slots: list[tuple[SlotStatus, HeaderSlot | None]]
) -> S3StreamError:
    statuses = {status for status, _ in slots}
    if SlotStatus.UNSUPPORTED in statuses:
        return InvalidArgumentError(
            f"{path} is a WAL of a newer format version than this s3stream supports"
        )
    if SlotStatus.CORRUPT in statuses:
        return CorruptionError(
            f"WAL {path}: both header slots are damaged (checksum mismatch)", location=str(path)
        )
    return InvalidArgumentError(
        f"{path} is not an s3stream WAL (no header magic in either slot); refusing to overwrite it"
    )


class FileWal(PipelinedWal):
    """A durable ring-buffer WAL on a preallocated file or a raw block device.

    The medium of a `PipelinedWal` (appends, backpressure, in-order acknowledgement and the
    lifecycle are the core's, `s3stream.wal.pipeline`): the ring, its headers, the group
    commit of one writer thread (or a caller lending its thread, `drive`), fencing, recovery.

    `path` is created (with missing parent directories) when absent and `create` is true. An
    existing WAL is opened with its own capacity (the header wins over `settings`); it must
    belong to `node_id`, and a header carrying a newer `node_epoch` fences this opener off.
    `on_full` is called (without locks held) whenever an append starts waiting for ring space,
    so the owner can force an upload and trim.

    A live WAL is *held*: the instance keeps a `WalHolderLock` (``<path>.lock`` beside a file,
    a lock on the device itself) until it is closed or its process dies, and opening a WAL
    another live instance or process holds raises `NodeInUseError` naming the holder's pid.
    `take_over` skips that refusal, for taking over a live holder on purpose; `lock` hands
    over a lock taken beforehand with `WalHolderLock.acquire` (the instance owns it then).

    `expect_uid`: the identity (`identity`, the header's ``wal_uid``) the store recorded for
    this node's WAL, or -1 when no WAL's records can be of use to the node (none recorded, no
    stream open). An existing WAL of another identity is another store's or node's: refused
    (`InvalidArgumentError`, nothing written) if it holds records or is cut short, else
    formatted anew with an identity of its own; unless `must_exist`
    (the node still has streams open, so its own WAL, elsewhere, may hold acknowledged
    appends): then the loss is `CorruptionError` unless `accept_loss`. None: no check.

    Opening *claims* the WAL (a header write); the last opener owns it. Every group commit and
    header write runs under an exclusive ``flock`` and first checks that nobody else wrote a
    header since this writer's last one, so an older owner (process or instance) that was taken
    over fails its next write with `FencedError` instead of ever writing again.

    `recover()` tells a crash's torn tail from damage: records the scan cannot read that were
    followed by later writes raise `CorruptionError` naming the file offset (docs/file-wal.md,
    "What recovery detects"); `accept_loss` logs a warning instead and goes on from the last
    valid record, dropping everything after it.

    A failed write or sync (a full disk, EIO) fails the appends in flight and every later one
    with `UnavailableError` (a later `append` returns a future failed with it); `reset()`, once
    their futures are done, resumes the WAL (see `_resume`).
    """

    _raise_when_failed = False
    # `_commit_and_complete` notifies the waiters a commit concerns; a notify per group would
    # wake the writer thread too, for nothing, on every caller-driven commit.
    _notify_on_ack = False

    def __init__(
        self,
        path: str | Path,
        *,
        node_id: str = "",
        node_epoch: int = 0,
        settings: FileWalSettings | None = None,
        clock: Clock | None = None,
        on_full: Callable[[], None] | None = None,
        create: bool = True,
        take_over: bool = False,
        lock: WalHolderLock | None = None,
        accept_loss: bool = False,
        expect_uid: int | None = None,
        must_exist: bool = False,
    ) -> None:
        check_text("node_id", node_id, max_bytes=MAX_NODE_ID_BYTES)
        check_int("node_epoch", node_epoch)
        if expect_uid is not None:
            check_int("expect_uid", expect_uid, minimum=-1)
        if not isinstance(path, str | Path) or not str(path):
            raise InvalidArgumentError(f"path must be a non-empty str or Path, got {path!r}")
        if lock is not None and (
            not isinstance(lock, WalHolderLock)
            or os.path.abspath(lock.wal_path) != os.path.abspath(path)
            or lock.node_id != node_id
        ):
            raise InvalidArgumentError(
                f"lock must be the WalHolderLock of {str(path)!r} for node {node_id!r}, "
                f"got {lock!r}"
            )
        self._path = Path(path)
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._settings = settings if settings is not None else FileWalSettings()
        super().__init__(
            clock=clock if clock is not None else SystemClock(),
            on_full=on_full,
            full_wait_ms=self._settings.full_wait_ms,
            log=ContextLogger(_log, node_id),
        )
        self._accept_loss = accept_loss
        self._expect_uid = expect_uid
        self._must_exist = must_exist
        self._drives = self._settings.caller_commits

        #: Positions of live (untrimmed) records, ascending; maps a trim point to a frame end.
        self._positions: array[int] = array("q")
        self._writer: threading.Thread | None = None
        #: Whether a writer thread is in its loop (it leaves it, under the lock, on a failure).
        self._writer_running = False
        #: The thread writing and completing a group now (the writer, or a caller in `drive`).
        self._committer: int | None = None
        #: Threads in `wait_for_committer_role`, which a commit that ended well must wake.
        self._role_waiters = 0
        #: Where the next frame goes: above every position handed out.
        self._tail = 0
        self._requested_start = 0
        self._durable_start = 0
        self._durable_tail = 0
        self._window_end = 0
        #: Direct I/O rewrites whole blocks: the bytes of the last partial block already on disk.
        self._tail_block = b""
        self._group_buf: mmap.mmap | None = None
        self._header_buf: mmap.mmap | None = None
        #: The header slots mapped read-only (shared): the fencing check of every commit reads
        #: them from the page cache without a system call (`_verify_owner`).
        #: Told ``(seconds, bytes, records)`` of each group commit (`observe_commits`).
        self._on_commit: Callable[[float, int, int], None] | None = None

        self._fd = -1
        self._wfd = -1
        self._header: HeaderSlot
        #: Leading bytes of the current header's slot, and of the other slot, as last seen.
        self._header_image = b""
        self._other_image = b""
        #: Leading bytes of a header whose write failed (it may be in the other slot, whole or
        #: torn); empty when the last header write succeeded.
        self._failed_image = b""
        self._is_device = False
        self._create = create
        self._holder = (
            lock
            if lock is not None
            else WalHolderLock.acquire(self._path, node_id, take_over=take_over)
        )
        try:
            self._open_medium()
            # A take-over of a live holder: the claim above fenced it; now take its lock too.
            self._holder.seize()
        except BaseException:
            self._release_fds(failed=True)
            raise
        self._seed = self._header.seed
        self._capacity: int = self._header.capacity
        self._ring_read = ring_reader(self._fd, self._capacity, self._path)
        self._max_record = min(
            _MAX_RECORD_BYTES,
            self._capacity - 2 * BLOCK_BYTES - FRAME_HEADER.size,
        )
        self._capabilities = WalCapabilities(
            persistent=True,
            durable_on_ack=True,
            torn_writes=True,
            bounded_capacity=True,
            fencing=True,
            max_record_bytes=self._max_record,
        )

    # ------------------------------------------------------------------ introspection

    @property
    def path(self) -> Path:
        """The file or device holding the WAL."""
        return self._path

    @property
    def identity(self) -> int:
        """The header's ``wal_uid``: this formatting of the medium, told apart from every
        other (see `WriteAheadLog.identity`)."""
        return self._header.wal_uid

    @property
    def data_start(self) -> int:
        """File offset of the ring (after the two header slots)."""
        return self._header.data_start

    @property
    def data_capacity(self) -> int:
        """Size of the ring in bytes."""
        return self._capacity

    @property
    def used_bytes(self) -> int:
        """Bytes of the ring holding records not trimmed yet (durably)."""
        return max(0, self._tail - self._durable_start)

    def observe_commits(self, observer: Callable[[float, int, int], None] | None) -> None:
        """Tell `observer` ``(seconds, framed bytes, records)`` of every group commit that
        succeeds, from the committing thread (metrics; None stops it)."""
        self._on_commit = observer

    @property
    def direct_io(self) -> bool:
        """Whether writes bypass the page cache (O_DIRECT): asked for and supported."""
        return self._wfd != self._fd

    @property
    def header(self) -> HeaderSlot:
        """The header most recently read or written."""
        return self._header

    def physical_offset(self, position: WalPosition) -> int:
        """File offset of the byte at logical `position`."""
        return self._header.data_start + position % self._capacity

    @staticmethod
    def read_raw(path: str | Path, offset: int, length: int) -> bytes:
        """Read `length` bytes at file `offset` of a WAL medium, bypassing the WAL (for tests)."""
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def describe(self) -> str:
        return f"FileWal({self._path})"

    # ------------------------------------------------------------------ opening

    def _open_medium(self) -> None:
        path, create = self._path, self._create
        existed = path.exists()
        if not existed:
            if not create:
                raise InvalidArgumentError(f"WAL {path} does not exist (and create=False)")
            try:
                make_directories(path.parent, sync=True)
            except OSError as exc:
                raise os_error("cannot create the directory of WAL", path, exc) from exc
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise os_error("cannot open WAL", path, exc) from exc
        self._wfd = self._fd
        try:
            self._open_fd(created=not existed)
        except BaseException:
            self._release_fds(failed=True)
            raise

    def _open_fd(self, *, created: bool) -> None:
        path, fd = self._path, self._fd
        try:
            self._is_device = check_wal_medium(path, os.fstat(fd).st_mode)
            if self._settings.direct_io:
                self._open_direct()
            with self._exclusive():
                size = os.lseek(fd, 0, os.SEEK_END) if self._is_device else os.fstat(fd).st_size
                if size == 0 and not self._is_device:
                    self._format(size, created=created)
                else:
                    self._load_header(size, created=created)
                # Claim: from this header write on, any earlier opener is fenced, so whatever
                # recovery reads next can no longer change under it.
                self._persist_header(self._header.next(node_epoch=self._node_epoch))
        except OSError as exc:
            raise os_error("cannot open WAL", path, exc) from exc

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the medium's flock: openers and commits of all instances take turns."""
        self._holder.retry()  # a device taken over from a live holder: its lock, once free
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _verify_owner(self) -> None:
        """Raise `FencedError` if another opener wrote a header since our last one (flock held).

        Headers alternate slots, so a foreign write always lands in the slot we did not write
        last, with a newer generation; reading that one small slot is enough.
        """
        mine = self._header
        other = (mine.generation + 1) % 2 * SLOT_BYTES
        # A pread (about 1.6 us from the page cache), not a shared mapping of the slots (0.4
        # us): a file truncated under a mapping kills the process with SIGBUS instead of
        # raising here.
        probe = os.pread(self._fd, _SLOT_PROBE_BYTES, other)
        if not self._is_device and os.fstat(self._fd).st_nlink == 0:
            # Records written to a file no name leads to are lost at the next crash, and a
            # new WAL made at its path (a take-over included) cannot fence this one.
            # Damage, not a take-over (which fences through the header): the node still owns
            # its streams and uploads what it acknowledged.
            raise CorruptionError(
                f"WAL {self._path} was deleted under this writer (by something other than "
                "s3stream); this writer must stop",
                location=str(self._path),
            )
        if len(probe) < _SLOT_PROBE_BYTES:
            raise FencedError(
                f"WAL {self._path} was cut short under this writer (its header slots are "
                "gone: truncated by something other than s3stream); this writer must stop"
            )
        if probe == self._other_image:
            return  # exactly what we left there: the common case, without decoding
        status, header = decode_slot(probe)
        if self._failed_image and (probe == self._failed_image or status is SlotStatus.CORRUPT):
            # Our own header write that failed (EIO, ENOSPC) landed there, whole or torn. A
            # rival's claim is a complete header (a rival whose write tore owns nothing).
            return
        if status is SlotStatus.EMPTY or (
            header is not None
            and header.generation < mine.generation
            and header.wal_uid == mine.wal_uid
        ):
            return
        owner = f"node epoch {header.node_epoch}" if header is not None else "a damaged header"
        raise FencedError(
            f"WAL {self._path} was taken over by another writer ({owner}); this writer "
            f"(node epoch {mine.node_epoch}) must stop"
        )

    def _load_header(self, size: int, *, created: bool) -> None:
        path = self._path
        raw = os.pread(self._fd, DATA_START, 0)
        if len(raw) < DATA_START:
            # Our magic, or the start of it, where a header was: a WAL cut short.
            if may_hold_header(raw):
                check_wal_loss(
                    f"WAL {path} was truncated to {size} bytes: its header slots are cut off "
                    "and every record is lost",
                    location=str(path),
                    accept_loss=self._accept_loss,
                    node_id=self._node_id,
                )
                os.ftruncate(self._fd, 0)
                self._format(0, created=created)
                return
            raise InvalidArgumentError(
                f"{path} is not an s3stream WAL: {size} bytes, too small to hold the headers"
            )
        slots = [decode_slot(raw[i * SLOT_BYTES : (i + 1) * SLOT_BYTES]) for i in range(2)]
        header = choose_header(slots)
        if header is None:
            empty = all(status is SlotStatus.EMPTY for status, _ in slots)
            # A zero header area is an unformatted device, or a file whose creation crashed
            # before its first header reached the disk.
            wanted = file_bytes(self._settings.capacity_bytes)
            if empty and (self._is_device or size == wanted):
                if ring_holds_frames(pread_all(self._fd, RING_PROBE_BYTES, DATA_START)):
                    # Headers zeroed over a ring that held records: a damaged WAL, not a
                    # new one (formatting it would drop them without a word).
                    check_wal_loss(
                        f"WAL {path}: both header slots read as zeros, but its ring holds "
                        "records: the headers were wiped, and every record is lost if it is "
                        "formatted again (to reuse the file or device for a new WAL on "
                        "purpose, delete the file or accept the loss)",
                        location=str(path),
                        accept_loss=self._accept_loss,
                        node_id=self._node_id,
                    )
                self._format(size, created=created)
                return
            raise _no_header_error(path, slots)
        self._check_header(header, size)
        if self._is_foreign(header):
            # Another store's or node's WAL that holds no records (`_check_header` refused
            # one that does): taken with a new identity, written by the claim that follows
            # into the other slot, so a crash before it leaves the old header whole. Its old
            # frames, whose crcs the old identity seeds, never read as this one's.
            uid = self._clock.now_ms()
            header = replace(
                header,
                wal_uid=uid if uid != header.wal_uid else uid + 1,
                start=0,
                tail=0,
                window_end=0,
                session=0,
                clean=True,
            )
        self._header = header
        at = header.slot_index * SLOT_BYTES
        self._header_image = raw[at : at + _SLOT_PROBE_BYTES]

    def _check_header(self, header: HeaderSlot, size: int) -> None:
        path = self._path
        if (
            header.data_start != DATA_START
            or header.capacity % BLOCK_BYTES
            or header.capacity < _MIN_DATA_CAPACITY
        ):
            raise CorruptionError(
                f"WAL {path}: header describes an impossible layout "
                f"(data_start={header.data_start}, capacity={header.capacity})",
                location=str(path),
            )
        expected = header.data_start + header.capacity
        if (self._is_device and size < expected) or (not self._is_device and size > expected):
            raise CorruptionError(
                f"WAL {path} is {size} bytes but its header says {expected} "
                f"(capacity {header.capacity}): the {'device' if self._is_device else 'file'} "
                "was resized",
                location=str(path),
            )
        if header.node_id != self._node_id:
            raise InvalidArgumentError(
                f"WAL {path} belongs to node {header.node_id!r}, not node_id={self._node_id!r}"
            )
        truncated = not self._is_device and size < expected
        if self._is_foreign(header):
            # Before anything is written (the truncation's repair below included): the WAL
            # is another store's or node's, to be left as it is unless it holds nothing.
            self._check_foreign(header, truncated=truncated)
            return
        if truncated:
            check_wal_loss(
                f"WAL {path} was truncated to {size} bytes (its header says {expected}): the "
                "records past the cut are lost",
                location=str(path),
                position=size,
                accept_loss=self._accept_loss,
                node_id=self._node_id,
            )
            # Put the ring back to its size; recovery then reads up to the cut (zeros past it).
            os.ftruncate(self._fd, expected)
        if header.node_epoch > self._node_epoch:
            raise FencedError(
                f"WAL {path} is owned by node {header.node_id!r} epoch {header.node_epoch}; "
                f"this writer has the older epoch {self._node_epoch}"
            )
        if header.capacity != self._settings.capacity_bytes and not self._is_device:
            self._log.info(
                "WAL %s: using the capacity in its header (%d bytes), not capacity_bytes=%d",
                path,
                header.capacity,
                self._settings.capacity_bytes,
            )

    def _is_foreign(self, header: HeaderSlot) -> bool:
        """Whether `header` is of a WAL other than the one the store recorded for the node."""
        return self._expect_uid is not None and header.wal_uid != self._expect_uid

    def _check_foreign(self, header: HeaderSlot, *, truncated: bool) -> None:
        """Refuse a WAL of another identity that holds records (or is cut short, so that
        what it holds cannot be told), and, while the node's streams are open, one that
        holds nothing (its own WAL is elsewhere); a WAL that passes is formatted anew."""
        assert self._expect_uid is not None  # (`_is_foreign` said so)
        refuse_foreign_wal(
            str(self._path),
            self._node_id,
            found=header.wal_uid,
            expect_uid=self._expect_uid,
            holds_records=truncated or holds_records(self._fd, header),
            must_exist=self._must_exist,
            accept_loss=self._accept_loss,
        )

    def _format(self, size: int, *, created: bool) -> None:
        path, fd = self._path, self._fd
        if not self._create:
            raise InvalidArgumentError(f"{path} holds no WAL yet (and create=False)")
        if self._is_device:
            capacity = align_down(size - DATA_START, BLOCK_BYTES)
            if capacity < _MIN_DATA_CAPACITY:
                raise InvalidArgumentError(f"block device {path} is too small for a WAL")
        else:
            capacity = self._settings.capacity_bytes
            try:
                os.posix_fallocate(fd, 0, file_bytes(capacity))
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    # No preallocation on this filesystem: a sparse file still works.
                    os.ftruncate(fd, file_bytes(capacity))
                else:
                    self._undo_create(created)
                    raise os_error(
                        f"cannot preallocate {capacity} bytes for WAL", path, exc
                    ) from exc
            # Only a file this call created, or found empty: a full-size file whose header
            # slots read as zeros may be a damaged WAL whose ring still holds records.
            if self._settings.zero_fill and (created or size == 0):
                try:
                    _zero_fill(fd, DATA_START, capacity)
                except OSError as exc:
                    self._undo_create(created)
                    raise os_error(
                        f"cannot write zeros over the {capacity}-byte ring of WAL", path, exc
                    ) from exc
        header = HeaderSlot(
            generation=1,
            capacity=capacity,
            data_start=DATA_START,
            wal_uid=self._clock.now_ms(),
            start=0,
            tail=0,
            window_end=0,
            node_epoch=self._node_epoch,
            session=0,
            node_id=self._node_id,
            clean=True,
        )
        self._header = header
        os.pwrite(fd, _ZEROS, 0)
        self._persist_header(header)
        if created:
            try:
                fsync_directory(path.parent)
            except OSError as exc:
                # Not acknowledged as created: a retry would find the file and skip the sync.
                self._undo_create(created)
                raise os_error("cannot sync the directory of the new WAL", path, exc) from exc

    def _undo_create(self, created: bool) -> None:
        try:
            if created:
                # The file this call made: through a symlink, the link's target (the link
                # was there before and is the user's).
                os.unlink(os.path.realpath(self._path))
            else:
                os.ftruncate(self._fd, 0)
        except OSError:
            self._log.warning("WAL %s: could not remove the partially created file", self._path)

    def _open_direct(self) -> None:
        try:
            self._wfd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC | os.O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # Some filesystems refuse O_DIRECT (tmpfs before Linux 6.6, some FUSE and network
            # filesystems). Durability is the same without it (fdatasync either way); only
            # the page cache gets the writes too.
            self._log.info("WAL %s: no O_DIRECT on this filesystem, using buffered I/O", self._path)

    def _release_fds(self, *, failed: bool = False) -> None:
        """Close the descriptors and let the holder lock go; `failed` (the WAL did not
        open): and remove the lock file if this WAL's lock made it."""
        for fd in {self._wfd, self._fd}:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._wfd = -1
        if self._group_buf is not None:
            _close_mmap(self._group_buf)
            self._group_buf = None
        if self._header_buf is not None:
            _close_mmap(self._header_buf)
            self._header_buf = None
        # Last: the WAL is not in use any more only once nothing of it can write.
        if failed:
            self._holder.remove_if_made()
        self._holder.release()

    # ------------------------------------------------------------------ low-level I/O

    def _persist_header(self, header: HeaderSlot) -> None:
        self._write_header(header)
        os.fdatasync(self._wfd)

    def _write_header(self, header: HeaderSlot) -> None:
        image = header.encode()
        offset = header.slot_index * SLOT_BYTES
        # Until the write returns, the slot may end up holding this image, whole or in part.
        self._failed_image = image[:_SLOT_PROBE_BYTES]
        if self._wfd != self._fd:
            # O_DIRECT needs an aligned buffer: one for the WAL's life, never closed while a
            # failed write's traceback may still hold views of it (that raised BufferError).
            if self._header_buf is None:
                self._header_buf = mmap.mmap(-1, SLOT_BYTES)
            self._header_buf[:] = image
            _pwrite_all(self._wfd, [memoryview(self._header_buf)], offset)
        else:
            _pwrite_all(self._wfd, [image], offset)
        self._header = header
        # Headers alternate slots: the previous header now sits in the slot a rival would hit.
        self._other_image = self._header_image
        self._header_image = image[:_SLOT_PROBE_BYTES]
        self._failed_image = b""

    def _read_logical(self, position: int, length: int) -> bytes:
        """Bytes of the logical range ``[position, position + length)``, across the ring end."""
        return self._ring_read(position, length)

    def _write_ring(self, position: int, parts: Sequence[bytes | memoryview]) -> None:
        total = sum(len(p) for p in parts)
        phys = position % self._capacity
        first = self._capacity - phys
        if total <= first:
            _pwrite_all(self._wfd, parts, DATA_START + phys)
            return
        head, rest = _split_parts(parts, first)
        _pwrite_all(self._wfd, head, DATA_START + phys)
        _pwrite_all(self._wfd, rest, DATA_START)

    def _write_frames(self, group: list[Pending]) -> None:
        lo = group[0].position
        hi = group[-1].position + group[-1].size
        # The mark goes out in the same write: present after a crash only if the write got
        # that far, so it witnesses a whole group; the next group overwrites it.
        mark = encode_group_mark(hi, self._session, self._seed)
        if self._wfd == self._fd:
            self._write_ring(lo, [part for rec in group for part in rec.parts] + [mark])
            return
        # O_DIRECT: whole aligned blocks from an aligned buffer, re-writing the bytes of the
        # partial first block exactly as they already are on disk.
        a_lo, a_hi = align_down(lo), align_up(hi + len(mark))
        buf = self._aligned_buffer(a_hi - a_lo)
        buf[: lo - a_lo] = self._tail_block
        off = lo - a_lo
        for rec in group:
            for part in rec.parts:
                buf[off : off + len(part)] = part
                off += len(part)
        buf[off : off + len(mark)] = mark
        off += len(mark)
        buf[off : a_hi - a_lo] = _ZEROS[: a_hi - a_lo - off]
        self._tail_block = buf[align_down(hi) - a_lo : hi - a_lo]
        view = memoryview(buf)
        try:
            self._write_ring(a_lo, [view[: a_hi - a_lo]])
        finally:
            view.release()

    def _aligned_buffer(self, size: int) -> mmap.mmap:
        if self._group_buf is None or len(self._group_buf) < size:
            if self._group_buf is not None:
                _close_mmap(self._group_buf)
            usual = min(align_up(self._settings.max_group_bytes), self._capacity)
            want = max(size, usual + 2 * BLOCK_BYTES)
            self._group_buf = mmap.mmap(-1, want)
        return self._group_buf

    # ------------------------------------------------------------------ recovery and reset

    def recover(self) -> Iterator[WalRecord]:
        with self._cond:
            self._check_open()
            if self._ready:
                live = (self._requested_start, self._durable_tail, self._session)
            else:
                live = None
            header = self._header
        if live is not None:
            # Already serving appends: replay what is acknowledged now, touching no state.
            start, bound, session = live
            for pos, data in self._scan_frames(start, bound, header, session):
                yield WalRecord(pos, data)
            return
        bound, strict = scan_bound(header)
        positions: array[int] = array("q")
        scanner = self._scan_frames(header.start, bound, header, header.session)
        for pos, data in scanner:
            positions.append(pos)
            yield WalRecord(pos, data)
        before_tail = clean_tail_damage(scanner, bound) if strict else None
        if before_tail is not None:
            raise CorruptionError(
                f"WAL {self._path}: {before_tail}",
                location=str(self._path),
                position=self.physical_offset(scanner.end),
            )
        verdict = damage(
            header, scanner, bound, self._read_logical, self._settings.recovery_read_bytes
        )
        if verdict is not None:
            check_wal_loss(
                f"WAL {self._path}: {verdict}; records from position {scanner.end} (file "
                f"offset {self.physical_offset(scanner.end)}) on were acknowledged and cannot "
                "be read",
                location=str(self._path),
                position=self.physical_offset(scanner.end),
                accept_loss=self._accept_loss,
                node_id=self._node_id,
            )
        elif scanner.problem is not None:
            self._log.info(
                "WAL %s: recovery stopped at position %d (the torn tail of the last, "
                "unacknowledged group): %s",
                self._path,
                scanner.end,
                scanner.problem,
            )
        with self._cond:
            self._check_open()
            if not self._ready:
                self._become_ready(start=header.start, tail=scanner.end, positions=positions)

    def _scan_frames(
        self, start: int, bound: int, header: HeaderSlot, session: int
    ) -> FrameScanner:
        return FrameScanner(
            self._read_logical,
            start=start,
            bound=bound,
            seed=header.seed,
            max_session=session,
            max_length=self._max_record,
            chunk_bytes=self._settings.recovery_read_bytes,
            current_from=header.tail if session == header.session else None,
        )

    def _become_ready(self, *, start: int, tail: int, positions: array[int]) -> None:
        h = self._header
        window_end = max(h.window_end, tail + self._settings.recovery_window_bytes)
        new = h.next(
            start=start,
            tail=tail,
            window_end=window_end,
            session=h.session + 1,
            node_epoch=self._node_epoch,
            clean=False,
        )
        try:
            # The new session is durable before any of its frames is written, so frames of
            # this session can always be told from leftovers of earlier ones.
            with self._exclusive():
                self._verify_owner()
                self._persist_header(new)
            if self._wfd != self._fd:
                self._tail_block = self._read_logical(align_down(tail), tail - align_down(tail))
        except OSError as exc:
            raise os_error("cannot write the header of WAL", self._path, exc) from exc
        self._session = new.session
        self._tail = tail
        self._requested_start = self._durable_start = start
        self._durable_tail = tail
        self._window_end = window_end
        self._positions = positions
        # Everything below the start is trimmed: trims up to it are no-ops, not errors.
        self._acked = max(self._acked, positions[-1] if positions else -1, start - 1)
        self._ready = True
        self._start_writer()

    def _start_writer(self) -> None:
        self._writer_running = True
        self._writer = threading.Thread(
            target=self._writer_main, name=f"s3stream-file-wal:{self._path.name}", daemon=True
        )
        self._writer.start()

    def _ready_without_records(self) -> None:
        with self._cond:
            self._check_open()
            if not self._ready:
                h = self._header
                # Without a scan the tail is unknown; the window end is past every frame ever
                # written, so positions from there on are above every earlier one.
                tail = scan_bound(h)[0]
                self._become_ready(start=tail, tail=tail, positions=array("q"))

    def _drop_all(self) -> None:
        with self._cond:
            self._positions = array("q")
            self._request_start(self._tail)

    # ------------------------------------------------------------------ room and trim

    def _reserve(self, size: int) -> int:
        pos = self._tail
        # Whole blocks are written (O_DIRECT) or written back (page cache), so the block holding
        # the oldest live byte is never reused until all of it is trimmed. The group mark after
        # the frame needs room too (it must not overwrite live bytes).
        if align_up(pos + size + FRAME_ALIGN) > align_down(self._durable_start) + self._capacity:
            return -1
        self._positions.append(pos)
        self._tail = pos + size
        return pos

    def _room(self) -> tuple[int, int]:
        return self._tail - self._durable_start, self._capacity

    def _persist_trim(self, position: int, *, wait: bool) -> None:
        with self._cond:
            index = bisect.bisect_right(self._positions, position)
            new_start = self._positions[index] if index < len(self._positions) else self._tail
            del self._positions[:index]
            self._request_start(new_start, wait=wait)

    def _request_start(self, new_start: int, *, wait: bool = True) -> None:
        """Ask the writer to persist `new_start`; with `wait`, wait until it is durable (lock
        held)."""
        if new_start > self._requested_start:
            self._requested_start = new_start
            self._cond.notify_all()
        if not wait or threading.get_ident() == self._committer:
            return  # called from a future's callback: the next commit persists it
        while self._durable_start < new_start:
            if self._failed is not None:
                raise self._failed
            if self._closed:
                raise StreamClosedError(f"WAL {self._path} was closed during a trim")
            self._cond.wait()

    # ------------------------------------------------------------------ the writer

    def _writer_main(self) -> None:
        try:
            self._writer_loop()
        finally:
            if self._close_later:
                self._release(clean=True)

    def _has_work(self) -> bool:
        return bool(self._pending) or self._requested_start > self._durable_start

    def _take_group(self) -> tuple[Group, int]:
        """The next group to commit (maybe empty: a trim point alone) and the trim point to
        persist with it (lock held); the calling thread becomes the committer."""
        group = Group(self._cut_pending(self._settings.max_group_bytes))
        if group.records:
            self._unacked.append(group)
        self._committer = threading.get_ident()
        return group, self._requested_start

    def _writer_loop(self) -> None:
        while True:
            with self._cond:
                # A caller driving its own commit (`drive`) holds the committer role: the
                # writer waits for it, since groups must be written and completed in order.
                while self._committer is not None or not (self._has_work() or self._closing):
                    self._cond.wait()
                # Leaving is decided under the lock, with the flag: `reset` after a failure
                # starts a new writer exactly when this one is gone or going.
                if self._abandoned or self._failed is not None or not self._has_work():
                    self._writer_running = False  # failed, or closing with everything durable
                    return
                group, start_target = self._take_group()
            try:
                self._commit_and_complete(group, start_target)
            finally:
                with self._cond:
                    self._committer = None
                    if self._failed is not None or self._role_waiters:
                        self._cond.notify_all()  # `wait_for_committer_role` waits for it

    def drive(self, future: Future[WalPosition]) -> None:
        """Commit pending records in the calling thread when no commit is under way.

        A synchronous append then costs one thread wake-up (the return from ``fdatasync``)
        instead of three (writer woken, its ``fdatasync``, caller woken), which is what its
        latency tail is made of on a busy machine. Records that arrive meanwhile are left to
        the writer thread, so concurrent appenders still share group commits.
        """
        if not self._drives or future.done():
            return
        with self._cond:
            self._awaiting_driver = False
            if (
                self._committer is not None
                or not self._pending
                or self._closing
                or self._failed is not None
            ):
                return
            group, start_target = self._take_group()
        try:
            self._commit_and_complete(group, start_target)
        finally:
            with self._cond:
                self._committer = None
                if (
                    self._has_work()
                    or self._closing
                    or self._failed is not None
                    or self._role_waiters
                ):
                    self._cond.notify_all()

    def wait_for_committer_role(self) -> None:
        """Wait (lock held) until no thread holds the committer role: whoever gives it up
        wakes this waiter (a commit that ended well wakes nobody otherwise)."""
        self._role_waiters += 1
        try:
            while self._committer is not None:
                self._cond.wait()
        finally:
            self._role_waiters -= 1

    def _commit_and_complete(self, group: Group, start_target: int) -> None:
        """Commit `group` (committer role held), then complete its futures in order (or fail
        the WAL, failing them)."""
        observer = self._on_commit
        started = self._clock.monotonic() if observer is not None else 0.0
        records = group.records
        try:
            with self._exclusive():
                self._verify_owner()
                self._commit(records, start_target)
        except OSError as exc:
            self._fail(group, self._write_error(records, exc, sealed=self._seal_failure()))
            return
        except (FencedError, CorruptionError) as exc:  # taken over, or the file deleted
            self._fail(group, exc)
            return
        except Exception as exc:  # a bug must not leave futures hanging forever
            self._seal_failure()
            self._fail(group, S3StreamError(f"WAL {self._path}: writer failed: {exc!r}"))
            return
        except BaseException as exc:
            # Ctrl-C in a caller driving the commit (`drive`): whether the group reached the
            # disk is unknown, so it is not acknowledged; nobody waits for it forever either.
            self._seal_failure()
            self._fail(
                group,
                UnavailableError(f"WAL {self._path}: a commit was interrupted ({exc!r})"),
            )
            raise
        with self._cond:
            moved = start_target > self._durable_start
            if moved:
                self._durable_start = start_target
            group.done = True
            ready = self._take_turn() if records else []
            # Waiters on `_cond` that a commit concerns: a trim waiting for its start to be
            # durable and appends waiting for room (both when the start moved), `_wait_idle`.
            # The writer thread is not one: it is woken when there is work (append, drive).
            if moved or self._idle_waiters:
                self._cond.notify_all()
        try:
            if observer is not None and records:
                observer(
                    self._clock.monotonic() - started, sum(r.size for r in records), len(records)
                )
        finally:
            if ready:
                self._complete_turn(ready)

    def _acknowledged(self, group: Group) -> None:
        last = group.records[-1]
        self._durable_tail = last.position + last.size

    def _commit(self, group: list[Pending], start_target: int) -> None:
        """Make `group` and the trim point `start_target` durable with one fdatasync."""
        if group:
            lo = group[0].position
            hi = group[-1].position + group[-1].size
            if hi + FRAME_ALIGN > self._window_end:
                # The promise must be durable before any byte past the old window is written
                # (the group mark after `hi` included).
                window_end = hi + FRAME_ALIGN + self._settings.recovery_window_bytes
                self._persist_header(
                    self._header.next(start=start_target, tail=lo, window_end=window_end)
                )
                self._window_end = window_end
            self._write_frames(group)
        if start_target > self._header.start:
            # `tail` of a dirty header is a floor of what is durable: this header may reach
            # the disk before the group it is synced with, so it names the group's start.
            tail = group[0].position if group else self._header.tail
            self._write_header(self._header.next(start=start_target, tail=tail))
        os.fdatasync(self._wfd)

    def _seal_failure(self) -> bool:
        """After a commit failed (committer role held): make recovery end where the durable
        records end, with a header whose tail is exact, as a clean shutdown's. Whole frames
        of the failed group may be on the disk (the writes before a full disk's ENOSPC, or
        all of them before a failed sync), and a dirty header's scan replayed them after a
        close or a crash: appends whose callers were told they failed. The header's slots
        are written in place, so this works on a full disk too, mostly. False if it failed
        (or the WAL is no longer this writer's)."""
        with self._cond:
            sealed = self._header.next(
                start=self._durable_start, tail=self._durable_tail, clean=True
            )
        try:
            with self._exclusive():
                self._verify_owner()
                self._persist_header(sealed)
        except (OSError, FencedError, CorruptionError) as exc:
            self._log.warning(
                "WAL %s: after a failed write, its header could not end recovery at the "
                "durable records either: %s",
                self._path,
                exc,
            )
            return False
        return True

    def _write_error(self, group: list[Pending], exc: OSError, *, sealed: bool) -> UnavailableError:
        where = group[0].position if group else self._durable_tail
        may_land = (
            ""
            if sealed
            else " (they may still be recovered after a restart: the WAL's header could not be "
            "updated either)"
        )
        return UnavailableError(
            f"WAL {self._path}: write failed at position {where}: {_reason(exc)}; nothing from "
            f"there on is acknowledged{may_land}, and appends fail until reset() resumes the WAL "
            "once the cause is gone"
        )

    def _resume(self, failure: S3StreamError) -> str:
        """Resume after a retryable failure (`reset`), in a fresh region.

        After a failed write or sync (`UnavailableError`: a full disk, EIO), the WAL resumes
        with a header whose start and tail are the first block boundary above every position
        ever handed out (the failed records may have left frames, whole or torn, below it;
        nothing below the start is ever scanned) and a new session, made durable before
        anything else is written; then a writer runs again. If that header cannot be written
        either, this raises a retryable `UnavailableError` and the WAL stays failed: call
        again later. A fencing found meanwhile is raised and stays.
        """
        with self._cond:
            # The failed group's committer may still be completing its futures; then nothing
            # is in flight (appends fail at once while failed).
            self.wait_for_committer_role()
            h = self._header
            # Above every position handed out (the failed records included), on a block
            # boundary so that an O_DIRECT writer starts on a fresh block (no bytes to carry).
            resume_at = align_up(self._tail)
            # Frames were only ever written below a window end made durable first; keep it a
            # bound on everything written, and promise the usual window ahead of the new tail.
            window_end = max(
                h.window_end, self._window_end, resume_at + self._settings.recovery_window_bytes
            )
            new = h.next(
                start=resume_at,
                tail=resume_at,
                window_end=window_end,
                session=h.session + 1,
                clean=False,
            )
            try:
                with self._exclusive():
                    self._verify_owner()
                    self._persist_header(new)
            except (FencedError, CorruptionError) as exc:
                self._failed = exc
                self._holder.release()
                raise
            except OSError as exc:
                err = UnavailableError(
                    f"WAL {self._path}: cannot resume after a failed write: writing the header "
                    f"failed: {_reason(exc)}; reset() may be called again later"
                )
                self._failed = err
                raise err from exc
            self._session = new.session
            self._tail = self._durable_tail = resume_at
            self._requested_start = self._durable_start = resume_at
            self._window_end = window_end
            self._positions = array("q")
            self._acked = max(self._acked, resume_at - 1)
            self._tail_block = b""
            self._clear_failure_locked()
            if not self._writer_running:
                self._start_writer()
        return f"at position {resume_at} (session {new.session})"

    def _fail(self, group: Group, err: S3StreamError) -> None:
        """Fail `group`, everything pending and every later append with `err`."""
        with self._cond:
            group.done = True
            group.error = err
            self._fail_locked(err)
            ready = self._take_turn()
        if isinstance(err, FencedError):
            # This instance never writes again: a taker of a device can have the lock now.
            self._holder.release()
        if ready:
            self._complete_turn(ready)

    # ------------------------------------------------------------------ close

    def _stop(self, *, abandon: bool) -> None:
        writer = self._writer
        if (
            writer is not None
            and writer is not threading.current_thread()
            and self._committer != threading.get_ident()
        ):
            # The writer leaves once everything is durable (`_closing` is set), or at once
            # when abandoned: a group already being written finishes, like a crash after it.
            writer.join()

    def _release(self, *, clean: bool) -> None:
        with self._cond:
            if self._closed:
                return
            try:
                if clean and self._ready and self._failed is None and not self._abandoned:
                    header = self._header.next(
                        start=self._durable_start, tail=self._durable_tail, clean=True
                    )
                    with self._exclusive():
                        self._verify_owner()
                        self._persist_header(header)
            except (FencedError, CorruptionError) as exc:
                self._log.info("%s; closed without a clean-shutdown header", exc)
            except OSError as exc:
                self._close_error = os_error(
                    "cannot write the clean-shutdown header of WAL", self._path, exc
                )
            finally:
                self._release_fds()
                self._closed = True
                self._cond.notify_all()


def _reason(exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device ({reason})"
    return reason


def _split_parts(
    parts: Sequence[bytes | memoryview], n: int
) -> tuple[list[bytes | memoryview], list[bytes | memoryview]]:
    """Split a list of buffers after its first `n` bytes."""
    head: list[bytes | memoryview] = []
    rest: list[bytes | memoryview] = []
    remaining = n
    for part in parts:
        if remaining <= 0:
            rest.append(part)
        elif len(part) <= remaining:
            head.append(part)
            remaining -= len(part)
        else:
            view = memoryview(part)
            head.append(view[:remaining])
            rest.append(view[remaining:])
            remaining = 0
    return head, rest


def _pwrite_all(fd: int, parts: Sequence[bytes | memoryview], offset: int) -> None:
    """Vectored write of every byte of `parts` at `offset` (IOV_MAX buffers per call)."""
    views = [memoryview(p) for p in parts if len(p)]
    i = 0
    while i < len(views):
        written = os.pwritev(fd, views[i : i + _IOV_MAX], offset)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        offset += written
        while written:
            if written >= len(views[i]):
                written -= len(views[i])
                i += 1
            else:
                views[i] = views[i][written:]
                written = 0


#: Bytes of zeros written per call by `_zero_fill`.
_FILL_CHUNK = 8 << 20


def _zero_fill(fd: int, offset: int, length: int) -> None:
    """Write zeros over ``[offset, offset + length)`` and make them durable, so every block
    of the range is a written one (`FileWalSettings.zero_fill`)."""
    chunk = memoryview(bytes(min(_FILL_CHUNK, length)))
    end = offset + length
    while offset < end:
        _pwrite_all(fd, [chunk[: min(len(chunk), end - offset)]], offset)
        offset += min(len(chunk), end - offset)
    os.fdatasync(fd)


def _close_mmap(buf: mmap.mmap) -> None:
    # A failed write's exception (kept as the WAL's failure) holds views of the buffer; it
    # is then freed with the last of them instead.
    with contextlib.suppress(BufferError):
        buf.close()
