"""Real disk faults for tests: a write fault under a running `FileWal`, a small tmpfs to fill.

`failing_writes`: the WAL's write descriptor is swapped (``dup2``) for a read-only
descriptor of the same file, so the kernel refuses every write (``EBADF``) until the context
ends and the WAL's own descriptor is put back. The swap happens while this thread holds the
WAL's committer role, so no commit is ever half on one descriptor and half on the other, and
the ``flock`` a commit takes is always released on the descriptor it was taken on.

`read_only_bind` shows a directory read-only at another path (a bind mount), for proving that
something only reads (as root, permission bits do not stop writes; a read-only mount does).
`tmpfs` mounts a small tmpfs (root only; `DiskFaultUnavailable` says why it cannot) and
`fill_filesystem` fills one to the last byte, for the ``ENOSPC`` of a really full disk.
`frozen_filesystem` mounts a small ext4 filesystem that `Freezer.freeze` freezes
(``fsfreeze``): every write and sync on it blocks in the kernel until it is thawed, as on a
device that stops answering; the thread blocked cannot be interrupted, so only a caller that
never waits on the device itself can keep its deadline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import unittest
from collections.abc import Iterator
from pathlib import Path

from ..wal.file import FileWal

__all__ = [
    "DiskFaultUnavailable",
    "Freezer",
    "failing_writes",
    "fill_filesystem",
    "frozen_filesystem",
    "read_only_bind",
    "tmpfs",
]


class DiskFaultUnavailable(unittest.SkipTest):
    """This machine cannot stage the fault (not root, or mounting is not allowed). A
    `unittest.SkipTest`, so a test (pytest or unittest) that meets it is skipped, saying why."""


#: Holds the committer role while a descriptor is swapped (no real thread has this ident).
_SWAPPER = -1


@contextlib.contextmanager
def _commits_paused(wal: FileWal) -> Iterator[None]:
    with wal._cond:
        wal.wait_for_committer_role()
        wal._committer = _SWAPPER
    try:
        yield
    finally:
        with wal._cond:
            wal._committer = None
            wal._cond.notify_all()


@contextlib.contextmanager
def failing_writes(wal: FileWal) -> Iterator[None]:
    """While inside, every write `wal` makes fails in the kernel; afterwards it works again
    (a WAL closed inside stays closed)."""
    with _commits_paused(wal):
        fd = wal._wfd
        if fd < 0:
            raise ValueError(f"{wal.describe()} is not open")
        saved = os.dup(fd)
        read_only = os.open(wal.path, os.O_RDONLY | os.O_CLOEXEC)
        os.dup2(read_only, fd)
        os.close(read_only)
    try:
        yield
    finally:
        with _commits_paused(wal):
            if wal._wfd == fd:
                os.dup2(saved, fd)
            os.close(saved)


@contextlib.contextmanager
def _mounted(what: str, target: Path, *commands: list[str]) -> Iterator[Path]:
    """Run the mount `commands` on `target`, unmount it on leaving; `DiskFaultUnavailable`
    (undoing what was mounted) where this machine does not allow it."""
    if os.geteuid() != 0:
        raise DiskFaultUnavailable(f"{what} needs root")
    target.mkdir(parents=True, exist_ok=True)
    for i, cmd in enumerate(commands):
        done = subprocess.run(cmd, capture_output=True, check=False)
        if done.returncode != 0:
            if i:
                subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)
            raise DiskFaultUnavailable(f"cannot make {what}: {done.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def tmpfs(directory: Path, options: str) -> contextlib.AbstractContextManager[Path]:
    """Mount a tmpfs with mount `options` (``size=4m``, ``ro,size=1m``) on `directory` while
    inside; raises `DiskFaultUnavailable` where that is impossible."""
    return _mounted(
        "a tmpfs", directory, ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)]
    )


def fill_filesystem(directory: Path) -> Path:
    """Fill the filesystem of `directory` to the last byte; the filler file's path (delete it
    to free the space)."""
    filler = directory / "filler"
    chunk = b"\0" * (64 << 10)
    with open(filler, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0")
    return filler


def read_only_bind(source: Path, target: Path) -> contextlib.AbstractContextManager[Path]:
    """`source` bind-mounted read-only at `target` while inside; raises
    `DiskFaultUnavailable` where that is impossible."""
    return _mounted(
        "a read-only bind mount",
        target,
        ["mount", "--bind", str(source), str(target)],
        ["mount", "-o", "remount,ro,bind", str(target)],
    )


class Freezer:
    """Freezes and thaws the filesystem mounted at `path` (see `frozen_filesystem`)."""

    def __init__(self, path: Path, max_frozen_s: float) -> None:
        self.path = path
        self._max_frozen_s = max_frozen_s
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def freeze(self) -> None:
        """Freeze it: writes and syncs on it block until `thaw` (or, as a safety net for a
        test that hangs, until `max_frozen_s` has passed)."""
        with self._lock:
            if self._timer is not None:
                return
            subprocess.run(["fsfreeze", "-f", str(self.path)], check=True, capture_output=True)
            self._timer = threading.Timer(self._max_frozen_s, self.thaw)
            self._timer.daemon = True
            self._timer.start()

    def thaw(self) -> None:
        """Thaw it (nothing if it is not frozen); blocked writes and syncs go on."""
        with self._lock:
            if self._timer is None:
                return
            self._timer.cancel()
            self._timer = None
            subprocess.run(["fsfreeze", "-u", str(self.path)], check=False, capture_output=True)


@contextlib.contextmanager
def frozen_filesystem(
    directory: Path, *, size_mb: int = 32, max_frozen_s: float = 30.0
) -> Iterator[Freezer]:
    """A fresh ext4 filesystem of `size_mb` MiB mounted at ``directory / "fs"`` while inside
    (its image lives on a tmpfs at ``directory / "backing"``), with a `Freezer` for it; thawed
    and unmounted on leaving. Raises `DiskFaultUnavailable` where that is impossible (not root,
    no loop devices, no ``mkfs.ext4`` or ``fsfreeze``)."""
    for tool in ("mkfs.ext4", "fsfreeze"):
        if shutil.which(tool) is None:
            raise DiskFaultUnavailable(f"a frozen filesystem needs {tool}, which is missing")
    with tmpfs(directory / "backing", f"size={size_mb + 4}m") as backing:
        image = backing / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        made = subprocess.run(
            ["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, check=False
        )
        if made.returncode != 0:
            raise DiskFaultUnavailable(f"cannot make ext4: {made.stderr.decode().strip()}")
        with _mounted(
            "a loop-mounted ext4",
            directory / "fs",
            ["mount", "-o", "loop", str(image), str(directory / "fs")],
        ) as fs:
            freezer = Freezer(fs, max_frozen_s)
            try:
                yield freezer
            finally:
                freezer.thaw()
