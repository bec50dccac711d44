"""Durable directories: how the local store and the file WAL create directories and sync them.

A new directory entry (a file, or a directory) survives a power loss only once the directory
holding it is synced, so a directory made for a store or a WAL is synced into its parent too,
all the way up to the first one that existed: otherwise a WAL synced after every append could
vanish with the folder it was created in.
"""

from __future__ import annotations

import errno
import os

__all__ = ["fsync_directory", "make_directories", "missing_directories"]


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the entries of `directory` durable. File systems that cannot sync a directory
    (``EINVAL``, ``ENOTSUP``) keep entries durable otherwise, and a directory this process
    may write but not read (mode ``-wx``) cannot be opened to be synced: no error then (the
    entry is as durable as the file system makes it by itself); any other failure raises
    `OSError`."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def missing_directories(directory: str | os.PathLike[str]) -> list[str]:
    """`directory` and those of its parents that are no directory yet, innermost first."""
    missing: list[str] = []
    # Not normalised (`abspath` would): "link/.." is the link target's parent to the kernel,
    # and a textual ".." removal names another directory.
    probe = os.fspath(directory)
    if not os.path.isabs(probe):
        probe = os.path.join(os.getcwd(), probe)
    while not os.path.isdir(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return missing


def make_directories(directory: str | os.PathLike[str], *, sync: bool) -> None:
    """``mkdir -p`` of `directory`; with `sync`, each directory it made is synced into its
    parent. Raises `OSError` as `os.makedirs` does."""
    missing = missing_directories(directory)
    if not missing:
        # No mkdir at all on a directory that exists: a read-only check of a store (the
        # CLI's) on a frozen filesystem blocked in that mkdir until the thaw.
        return
    os.makedirs(directory, exist_ok=True)
    if sync:
        for created in reversed(missing):
            fsync_directory(os.path.dirname(created))
