"""The holder lock of a file WAL: which live process (or `FileWal` instance) has it open.

A `FileWal` holds this lock for its whole lifetime, so a second opener of the same WAL (another
process started with the same node id, or a second instance in one process) fails with
`NodeInUseError` naming the holder, instead of claiming the WAL and fencing a live writer.
The lock shows liveness: the kernel drops it when its descriptor is closed, which also happens
when the process dies (a SIGKILL included), so the next opener after a crash recovers as
before. It is advisory and per host, like the fencing ``flock`` of the WAL itself.

Two forms, by medium (``docs/file-wal.md``, "Ownership and fencing"):

- a **regular file** ``x.wal`` is guarded by ``x.wal.lock`` beside it, ``flock(LOCK_EX)``'d and
  holding the holder's pid and node id as text. It is never deleted (a stale one is harmless:
  only the ``flock`` counts). A take-over of a live holder atomically *replaces* the file with
  a new one it already holds, so later openers see the new holder; the old one keeps a lock on
  an unlinked file, which nobody looks at any more.
- a **block device** gets no file beside it (``/dev`` is no place for one): the lock is an
  open-file-description lock (``F_OFD_SETLK``, Linux) on the device's first byte. OFD locks are
  independent of ``flock`` (the per-commit fencing lock on the same device) and, unlike POSIX
  record locks, belong to the descriptor, so two instances in one process exclude each other
  too. A device records no pid (`NodeInUseError.pid` is None; ``fuser -v /dev/...`` names
  the holder). A take-over of a live holder cannot take an OFD lock away: it runs without
  the lock and picks it up (`retry`) once the fenced holder has let go.

A process that forks without exec (``multiprocessing`` with the fork start method) shares the
descriptor with its child: the lock then lives until both have closed it or exited.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct
import threading
from pathlib import Path

from .._dirs import make_directories
from ..errors import InvalidArgumentError, NodeInUseError, S3StreamError, UnavailableError
from ..metrics.logs import ContextLogger
from .checks import check_wal_medium
from .os_errors import os_error

__all__ = ["LOCK_SUFFIX", "WalHolderLock", "live_holder", "lock_path_for"]

_log = logging.getLogger(__name__)

#: Name suffix of the lock file beside a regular-file WAL.
LOCK_SUFFIX = ".lock"
#: Tries to lock a lock file that keeps being replaced under the opener (take-overs racing).
_ACQUIRE_ATTEMPTS = 64


def lock_path_for(wal_path: str | Path) -> Path:
    """The lock file guarding the regular-file WAL at `wal_path`: beside the file the path
    resolves to, so that every symlink to one WAL finds the same lock (a hard link does not:
    docs/file-wal.md)."""
    p = Path(os.path.realpath(wal_path))
    return p.with_name(p.name + LOCK_SUFFIX)


_FLOCK_FORMAT = "hhqqi4x"


def _ofd_lock(kind: int) -> bytes:
    # struct flock on Linux: l_type, l_whence (shorts), l_start, l_len (off_t), l_pid (0 for
    # OFD locks), padded to 32 bytes. One byte at offset 0 is the whole lock.
    return struct.pack(_FLOCK_FORMAT, kind, os.SEEK_SET, 0, 1, 0)


def _busy(exc: OSError) -> bool:
    return exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


class WalHolderLock:
    """The liveness lock of one file WAL; see the module docstring.

    Get one with `acquire`. A take-over that found a live holder gets one not held yet, until
    `seize` or `retry` succeeds. `release` is idempotent. A `FileWal` given one
    (``FileWal(lock=...)``) owns it from then on.
    """

    def __init__(
        self,
        wal_path: Path,
        node_id: str,
        *,
        device: bool,
        fd: int,
        held: bool,
    ) -> None:
        self._wal_path = wal_path
        self._node_id = node_id
        self._log = ContextLogger(_log, node_id)
        self._device = device
        self._fd = fd
        self._held = held
        #: A device opened with O_EXCL (`_open_device_exclusive`); files need no such claim.
        self._exclusive = not device
        self._guard = threading.Lock()
        #: The lock file this lock created (None: found it there, or a device's lock).
        self._made: Path | None = None

    # ------------------------------------------------------------------ acquiring

    @classmethod
    def acquire(
        cls, wal_path: str | Path, node_id: str, *, take_over: bool = False
    ) -> WalHolderLock:
        """Lock the WAL at `wal_path` for `node_id` without waiting.

        Raises `NodeInUseError` (naming the holder's node and pid) if a live holder has it,
        unless `take_over`: then the returned lock is not `held` yet; call `seize` once the
        WAL was claimed. Missing parent directories are created (as `FileWal` does).
        """
        path = Path(wal_path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise os_error("cannot inspect WAL", path, exc) from exc
        # Checked before any lock file is made beside it.
        if st is not None and check_wal_medium(path, st.st_mode):
            return cls._acquire_device(path, node_id, take_over=take_over)
        return cls._acquire_file(path, node_id, take_over=take_over)

    @classmethod
    def _acquire_file(cls, path: Path, node_id: str, *, take_over: bool) -> WalHolderLock:
        lock_path = lock_path_for(path)
        try:
            make_directories(path.parent, sync=True)
        except OSError as exc:
            raise os_error("cannot create the directory of WAL", path, exc) from exc
        for _ in range(_ACQUIRE_ATTEMPTS):
            fd, made = _open_lock_file(path, lock_path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if not _busy(exc):
                    raise os_error("cannot lock WAL", path, exc) from exc
                if take_over:
                    return cls(path, node_id, device=False, fd=-1, held=False)
                raise _in_use(path, node_id, holder, lock_path) from None
            # A take-over may have replaced the file between our open and our flock: then we
            # locked an unlinked file, which guards nothing. Start over.
            try:
                current = os.stat(lock_path)
                mine = os.fstat(fd)
            except FileNotFoundError:
                os.close(fd)
                continue
            if (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            try:
                _write_holder(fd, node_id)
            except OSError as exc:
                os.close(fd)
                raise os_error("cannot write the lock file of WAL", path, exc) from exc
            lock = cls(path, node_id, device=False, fd=fd, held=True)
            lock._made = lock_path if made else None
            return lock
        raise UnavailableError(
            f"cannot lock WAL {path}: its lock file {lock_path} kept being replaced "
            "(concurrent take-overs)"
        )

    @classmethod
    def _acquire_device(cls, path: Path, node_id: str, *, take_over: bool) -> WalHolderLock:
        # O_EXCL claims the block device itself, whatever node it is opened through (the
        # OFD lock below is on the node's inode: a second node of the same device, made by
        # mknod or a container's --device, got past it and fenced a live writer), and a
        # device that is mounted is refused the same way. A take-over opens it anyway.
        fd = _open_device_exclusive(path)
        exclusive = fd >= 0
        if not exclusive:
            if not take_over:
                raise _device_in_use(path, node_id)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                raise os_error("cannot open WAL", path, exc) from exc
        lock = cls(path, node_id, device=True, fd=fd, held=False)
        lock._exclusive = exclusive
        try:
            got = lock._try_device()
        except BaseException:
            os.close(fd)
            raise
        if got or take_over:
            return lock
        os.close(fd)
        raise _device_in_use(path, node_id)

    def _try_device(self) -> bool:
        """Try the device's OFD lock once, without waiting; whether it is held now. A lock
        that opened the device without ``O_EXCL`` (a take-over from a live holder) claims
        it so first, once the holder has let go."""
        if not self._exclusive:
            fd = _open_device_exclusive(self._wal_path)
            if fd < 0:
                return False
            os.close(self._fd)
            self._fd, self._exclusive = fd, True
        if not hasattr(fcntl, "F_OFD_SETLK"):
            # Not Linux: no lock that tells instances apart; fencing still protects the data.
            self._log.warning("WAL %s: no OFD locks on this platform; not locked", self._wal_path)
            self._held = True
            return True
        try:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _ofd_lock(fcntl.F_WRLCK))
        except OSError as exc:
            if _busy(exc):
                return False
            raise os_error("cannot lock WAL", self._wal_path, exc) from exc
        self._held = True
        return True

    # ------------------------------------------------------------------ state

    @property
    def wal_path(self) -> Path:
        """The WAL this lock guards."""
        return self._wal_path

    @property
    def node_id(self) -> str:
        """The node it was taken for."""
        return self._node_id

    def seize(self) -> None:
        """Take the lock from a live holder (a take-over, after the WAL was claimed).

        A lock file is replaced by a new one this process holds (atomic rename), so later
        openers see this process. A device's lock is tried once: it can only be had once the
        old holder lets go (see `retry`).
        """
        with self._guard:
            if self._held:
                return
            if self._device:
                if not self._try_device():
                    self._log.warning(
                        "WAL %s was taken over from a live holder; its liveness lock stays "
                        "with that holder until it closes or exits",
                        self._wal_path,
                    )
                return
            lock_path = lock_path_for(self._wal_path)
            # Unique among live lock objects of live processes; one left by a dead process
            # that had our pid is garbage.
            temp = lock_path.with_name(f"{lock_path.name}.{os.getpid()}.{id(self):x}")
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
            try:
                fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise os_error("cannot create a lock file for WAL", self._wal_path, exc) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else has it
                _write_holder(fd, self._node_id)
                os.replace(temp, lock_path)
            except OSError as exc:
                os.close(fd)
                with contextlib.suppress(OSError):
                    temp.unlink()
                raise os_error("cannot replace the lock file of WAL", self._wal_path, exc) from exc
            self._fd = fd
            self._held = True

    def retry(self) -> None:
        """Pick up a device's lock a take-over could not have at first, if it is free now.

        Cheap (nothing) once held; called by the WAL before each commit."""
        if self._held or not self._device:
            return
        with self._guard:
            if not self._held and self._fd >= 0:
                with contextlib.suppress(S3StreamError):
                    self._try_device()

    def remove_if_made(self) -> None:
        """The WAL did not open: remove the lock file if this lock created it, while still
        holding it (so nobody holds the unlinked file; an opener that opened it meanwhile
        finds it replaced and starts over). Else it would stay beside a file that may be
        somebody else's, or a WAL whose creation was undone. `release` is still to be
        called."""
        with self._guard:
            made, self._made = self._made, None
            if made is not None and self._held and self._fd >= 0:
                with contextlib.suppress(OSError):
                    os.unlink(made)

    def release(self) -> None:
        """Let go (idempotent): closing the descriptor drops the lock."""
        with self._guard:
            fd, self._fd = self._fd, -1
            self._held = False
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        state = "held" if self._held else "not held"
        return f"WalHolderLock({str(self._wal_path)!r}, node {self._node_id!r}, {state})"


def _open_lock_file(path: Path, lock_path: Path) -> tuple[int, bool]:
    """The lock file of WAL `path`, opened (created if missing), and whether this call created
    it. Never through a symlink (it could point at any file, which the holder's pid would
    overwrite), and never a file that is no lock file of ours (someone's ``notes.txt.lock``):
    `InvalidArgumentError` then."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(lock_path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        pass
    except OSError as exc:
        raise os_error("cannot create the lock file of WAL", path, exc) from exc
    try:
        fd = os.open(lock_path, flags)
    except FileNotFoundError:
        return _open_lock_file(path, lock_path)  # replaced by a take-over meanwhile
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidArgumentError(
                f"the lock file {lock_path} of WAL {path} is a symlink: refusing to follow it"
            ) from exc
        raise os_error("cannot open the lock file of WAL", path, exc) from exc
    try:
        foreign = not stat.S_ISREG(os.fstat(fd).st_mode) or not _may_be_holder_text(fd)
    except OSError as exc:
        os.close(fd)
        raise os_error("cannot inspect the lock file of WAL", path, exc) from exc
    if foreign:
        os.close(fd)
        raise InvalidArgumentError(
            f"{lock_path} exists and is not the lock file of a WAL (it holds no 'pid, node "
            f"id' record): refusing to overwrite it; move it away to use WAL {path}"
        )
    return fd, False


def _may_be_holder_text(fd: int) -> bool:
    """Whether the file at `fd` may be one `_write_holder` wrote: its bytes (NULs aside, which
    a crash can leave in a file never synced) are empty or a start of "pid\nnode id\n". Any
    start, as read: a holder that just won the lock empties the file before writing it, and
    a crash may have cut the write short. What this refuses is a file that is clearly someone
    else's (text that does not open with a pid line)."""
    raw = os.pread(fd, 512, 0).replace(b"\0", b"")
    if len(raw) >= 512:
        return False
    pid, newline, _ = raw.partition(b"\n")
    return pid.isdigit() if newline else (not pid or pid.isdigit())


def _open_device_exclusive(path: Path) -> int:
    """The block device at `path` opened read-write with ``O_EXCL`` (Linux: nobody else may
    open it so, through any of its nodes, nor mount it, until this descriptor closes); -1 if
    it is so held already (``EBUSY``)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_EXCL)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return -1
        raise os_error("cannot open WAL", path, exc) from exc


def _device_in_use(path: Path, node_id: str) -> NodeInUseError:
    return NodeInUseError(
        f"WAL {path} (a block device) is in use by another process or another FileWal of "
        "this process, through this node or another node of the same device, or it is "
        "mounted (a device records no pid: `fuser -v` names it); every process sharing a "
        "store needs its own node_id, or take the node over explicitly "
        "(StreamClient.take_over)",
        node_id=node_id,
        pid=None,
    )


def _write_holder(fd: int, node_id: str) -> None:
    # Text, one field a line: "pid\nnode id\n" (for the error of the next opener, and people).
    data = f"{os.getpid()}\n{node_id}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def live_holder(wal_path: str | Path) -> tuple[int | None, str | None] | None:
    """(pid, node id) of the live process holding the file WAL at `wal_path`, or None if
    none does (or it has no lock file). Read-only: for tools that write nothing (`s3stream
    verify`), so it creates no lock file and writes no pid; a shared ``flock`` that the
    holder's exclusive one refuses is the test. A block device records no pid: (None, None)
    when a holder's OFD lock is on it (through this node; `F_OFD_GETLK`, which takes
    nothing), as a verify beside a live writer must scan again rather than call the frames
    it is writing damage."""
    if _is_device(wal_path):
        return (None, None) if _device_lock_held(wal_path) else None
    lock_path = lock_path_for(wal_path)
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd)
        return None  # the descriptor's close lets the shared lock go
    finally:
        os.close(fd)


def _is_device(path: str | Path) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def _device_lock_held(path: str | Path) -> bool:
    """Whether another open file description holds the OFD lock a holder takes on the block
    device at `path` (`_try_device`); False where OFD locks do not exist."""
    if not hasattr(fcntl, "F_OFD_GETLK"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        probe = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _ofd_lock(fcntl.F_WRLCK))
    except OSError:
        return False
    finally:
        os.close(fd)
    kind: int = struct.unpack(_FLOCK_FORMAT, probe)[0]
    return kind != fcntl.F_UNLCK


def _read_holder(fd: int) -> tuple[int | None, str | None]:
    """(pid, node id) as the holder wrote them; None where unreadable (it may not have
    written them yet)."""
    try:
        text = os.pread(fd, 256, 0).decode("utf-8", "replace")
    except OSError:
        return None, None
    lines = text.split("\n")
    pid: int | None = None
    with contextlib.suppress(ValueError):
        pid = int(lines[0])
    node = lines[1] if len(lines) > 2 else None
    return pid, node


def _in_use(
    path: Path, node_id: str, holder: tuple[int | None, str | None], lock_path: Path
) -> NodeInUseError:
    pid, node = holder
    node = node if node else node_id
    if pid is None:
        who = "another process"
    elif pid == os.getpid():
        who = f"this process (pid {pid}: another FileWal open on it)"
    else:
        who = f"process {pid}"
    return NodeInUseError(
        f"WAL {path} of node {node!r} is in use by {who} (lock file {lock_path}); every "
        "process sharing a store needs its own node_id, or take the node over explicitly "
        "(StreamClient.take_over)",
        node_id=node,
        pid=pid,
    )
