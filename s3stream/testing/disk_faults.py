"""`failing_writes`: a real write fault under a running `FileWal`, as a dying disk gives.

The WAL's write descriptor is swapped (``dup2``) for a read-only descriptor of the same file,
so the kernel refuses every write (``EBADF``) until the context ends and the WAL's own
descriptor is put back. The swap happens while this thread holds the WAL's committer role,
so no commit is ever half on one descriptor and half on the other, and the ``flock`` a
commit takes is always released on the descriptor it was taken on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ..wal.file import FileWal

__all__ = ["failing_writes"]

#: Holds the committer role while a descriptor is swapped (no real thread has this ident).
_SWAPPER = -1


@contextlib.contextmanager
def _commits_paused(wal: FileWal) -> Iterator[None]:
    with wal._cond:
        while wal._committer is not None:
            wal._cond.wait()
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
