"""An object store in a local directory: one file per object, written atomically.

Keys map to files below the root (``a/b/c`` → ``ROOT/a/b/c``). Writes never expose a partial
file: `put` writes a temporary file in the target's directory, flushes it to disk and renames it
over the target (``os.replace``); `put_if_absent` hard-links the finished temporary file to the
target (``os.link`` fails if the name exists), which is an atomic exclusive create. Temporary
files are named ``.tmp-*``; `list` never shows them, and keys may not use that name pattern.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .._dirs import fsync_directory, make_directories, missing_directories
from .._registry import split_scheme
from ..errors import (
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    UnavailableError,
)
from ._common import as_bytes, check_prefix, check_suffix_length
from .base import ObjectInfo, ObjectStore, ObjectStoreCapabilities, check_key, check_range

__all__ = ["TEMP_PREFIX", "LocalObjectStore", "check_local_url", "from_url", "is_temp_name"]

#: Names starting with this are temporary files of unfinished writes, never objects.
TEMP_PREFIX = ".tmp-"

# Conditions that can clear up by themselves (space freed, device back, descriptors released).
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EIO,
        errno.EAGAIN,
        errno.EINTR,
        errno.EMFILE,
        errno.ENFILE,
        errno.ENOMEM,
        errno.EBUSY,
        errno.ESTALE,
        errno.ETIMEDOUT,
    }
)
# Conditions that need an operator: retrying the same call cannot succeed.
_DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_MISSING_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR})

# (name, is_dir, size) of one directory's entries; a named alias because `list` is a method.
_Entries = list[tuple[str, bool, int]]
_Stack = list[tuple[str, str, Iterator[tuple[str, bool, int]]]]

# A concurrent delete may remove a freshly created directory before our temporary file lands in
# it; the write then starts over. Bounded so that a persistent failure still surfaces.
_MAX_TEMP_ATTEMPTS = 64


def check_local_url(url: str) -> None:
    """Refuse a ``file://`` store URL with a query or a fragment: as for remote stores,
    options go in storage_options (else the directory's name would hold the query)."""
    if "://" in url and ("?" in url or "#" in url):
        raise InvalidArgumentError(
            f"a local store's URL takes no query or fragment (options go in "
            f"storage_options; a name that holds '?' or '#' is written %3F, %23), got {url!r}"
        )


def is_temp_name(name: str) -> bool:
    """Whether a file or folder name is reserved for a local store's temporary files."""
    return name.startswith(TEMP_PREFIX)


#: A temporary file's name: ``TEMP_PREFIX`` + the writing process's pid + a counter.
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"([0-9]+)-[0-9]+")

#: Reads open without blocking: a FIFO (or device) at a key's path would otherwise block the
#: open until a writer appears, for ever; opened, it is refused as no object (not a regular
#: file). On a regular file the flag changes nothing.
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


class LocalObjectStore(ObjectStore):
    """Objects as files below `root` (created if missing).

    With ``fsync=True`` (the default) a write returns only after the file data and the directory
    entry are on disk, so an acknowledged object survives a power loss. ``fsync=False`` trades
    that for speed (tests, scratch data); writes stay atomic either way.

    Unlike S3, a directory cannot hold both an object ``a`` and an object ``a/b``: writing the
    second raises `InvalidArgumentError`. Temporary files left by a crashed writer are ignored
    by every operation and may be removed by hand.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        if not isinstance(root, (str, os.PathLike)) or not os.fspath(root):
            raise InvalidArgumentError(f"root must be a non-empty path, got {root!r}")
        if "\0" in os.fspath(root):
            # The OS cannot name such a file: say so instead of the ValueError `mkdir` raises.
            raise InvalidArgumentError(f"root cannot hold a NUL byte, got {os.fspath(root)!r}")
        self._root = Path(root).expanduser().absolute()
        self._root_str = str(self._root)
        self._fsync = bool(fsync)
        # Unique temporary names within this instance; O_EXCL settles clashes with others.
        self._counter = itertools.count()
        #: Temporary files being written, and how many times the store was closed: a close
        #: removes those a write left behind (a process exiting after a Ctrl-C kills its
        #: upload threads mid-write, which left tens of MB of them until the orphan sweep).
        self._writing: set[str] = set()
        self._closes = 0
        self._writing_lock = threading.Lock()
        try:
            make_directories(self._root, sync=self._fsync)
        except FileExistsError as exc:
            raise InvalidArgumentError(
                f"root {self._root_str!r} exists and is not a directory"
            ) from exc
        except NotADirectoryError as exc:
            raise InvalidArgumentError(
                f"root {self._root_str!r}: a parent of it is not a directory"
            ) from exc
        except OSError as exc:
            raise self._translate(exc, "create the root directory", None) from exc

    @classmethod
    def from_url(cls, url: str, **storage_options: Any) -> LocalObjectStore:
        """A store for ``file:///abs/path``, ``file://rel/path`` or a plain path.

        Storage options: ``fsync`` (bool, default True).
        """
        scheme, path = split_scheme(url)
        if scheme != "file":
            raise InvalidArgumentError(f"not a file URL: {url!r}")
        check_local_url(url)
        options = dict(storage_options)
        fsync = options.pop("fsync", True)
        if options:
            names = ", ".join(sorted(options))
            raise InvalidArgumentError(f"unknown storage_options for file://: {names}")
        if not isinstance(fsync, bool):
            raise InvalidArgumentError(f"storage option fsync must be a bool, got {fsync!r}")
        return cls(path, fsync=fsync)

    @property
    def root(self) -> Path:
        """The directory holding the objects."""
        return self._root

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        # os.link fails with EEXIST in every process sharing the file system: atomic creates.
        return ObjectStoreCapabilities(
            scheme="file",
            atomic_create=True,
            ranged_reads=True,
            conditional_replace=False,
            ordered_listing=True,
        )

    # -- writes ---------------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        final = self._path(key)
        blob = as_bytes(data)
        tmp = self._write_temp(final, blob, key)
        try:
            os.replace(tmp, final)
        except BaseException as exc:
            _unlink_quietly(tmp)
            if isinstance(exc, IsADirectoryError):
                raise self._conflict(key) from exc
            if isinstance(exc, OSError):
                raise self._translate(exc, "write", key) from exc
            raise
        finally:
            self._done_writing(tmp)
        if self._fsync:
            self._fsync_dir(os.path.dirname(final), key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        blob = as_bytes(data)
        # Shortcut for the common loser: an object that exists now makes False correct.
        if os.path.lexists(final):
            if os.path.isdir(final):
                raise self._conflict(key)
            return False
        tmp = self._write_temp(final, blob, key)
        try:
            os.link(tmp, final)
        except FileExistsError as exc:
            if os.path.isdir(final):
                raise self._conflict(key) from exc
            return False
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise S3StreamError(
                    f"cannot create {key!r} exclusively in {self.describe()}: the file system "
                    f"does not support hard links ({exc.strerror}); put_if_absent needs them"
                ) from exc
            raise self._translate(exc, "create", key) from exc
        finally:
            _unlink_quietly(tmp)
            self._done_writing(tmp)
        if self._fsync:
            self._fsync_dir(os.path.dirname(final), key)
        return True

    def _write_temp(self, final: str, blob: bytes, key: str) -> str:
        """Write `blob` to a new temporary file beside `final`; returns its path, listed as
        being written until the caller's `_done_writing`."""
        directory = os.path.dirname(final)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        for _ in range(_MAX_TEMP_ATTEMPTS):
            tmp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{next(self._counter)}")
            closes = self._closes  # a close from here on sweeps this file, or is seen below
            try:
                fd = os.open(tmp, flags, 0o666)
            except FileExistsError:
                continue  # a name left by another writer
            except (FileNotFoundError, NotADirectoryError):
                # The directory is missing (new, or pruned by a delete): make it, then try
                # again. Made only when missing, so a put into an existing directory costs
                # no stat (it raises the conflict if a file stands where a directory must).
                self._ensure_dir(directory, key)
                continue
            except OSError as exc:
                raise self._translate(exc, "write", key) from exc
            with self._writing_lock:
                self._writing.add(tmp)
                closed = closes != self._closes
            try:
                if closed:
                    # A close swept the temporary files while this one was being created.
                    raise UnavailableError(
                        f"{self.describe()} was closed while {key!r} was written"
                    )
                _write_all(fd, blob)
                if self._fsync:
                    os.fsync(fd)
            except BaseException as exc:
                os.close(fd)
                _unlink_quietly(tmp)
                self._done_writing(tmp)
                if isinstance(exc, OSError):
                    raise self._translate(exc, "write", key) from exc
                raise
            os.close(fd)
            return tmp
        raise UnavailableError(
            f"could not create a temporary file for {key!r} in {directory!r} "
            f"after {_MAX_TEMP_ATTEMPTS} attempts"
        )

    def _done_writing(self, tmp: str) -> None:
        with self._writing_lock:
            self._writing.discard(tmp)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for Spark's executors: the writes under way are this process's only.
        state = self.__dict__.copy()
        del state["_writing_lock"]
        state["_writing"] = set()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._writing_lock = threading.Lock()

    def close(self) -> None:
        """Remove the temporary files of writes still under way (a process on its way out
        after a Ctrl-C, whose upload threads stop mid-write): those writes fail."""
        with self._writing_lock:
            self._closes += 1
            left = list(self._writing)
        for tmp in left:
            _unlink_quietly(tmp)

    def _ensure_dir(self, directory: str, key: str) -> None:
        if os.path.isdir(directory):
            return
        missing = missing_directories(directory)
        for attempt in range(_MAX_TEMP_ATTEMPTS):
            try:
                os.makedirs(directory, exist_ok=True)
                break
            except FileNotFoundError as exc:
                # A concurrent delete pruned a parent we had just created: start over.
                if attempt + 1 >= _MAX_TEMP_ATTEMPTS:
                    raise self._translate(exc, "create a directory for", key) from exc
            except FileExistsError as exc:
                if os.path.lexists(directory) and not os.path.isdir(directory):
                    raise self._conflict(key) from exc
                # Another writer created it and a concurrent delete pruned it between
                # makedirs' mkdir and its isdir check: start over.
                if attempt + 1 >= _MAX_TEMP_ATTEMPTS:
                    raise self._translate(exc, "create a directory for", key) from exc
            except NotADirectoryError as exc:
                raise self._conflict(key) from exc
            except OSError as exc:
                raise self._translate(exc, "create a directory for", key) from exc
        if self._fsync:
            # A new directory entry is durable only once its parent is synced.
            for created in reversed(missing):
                self._fsync_dir(os.path.dirname(created), key)

    # -- reads ----------------------------------------------------------------------------------

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        path = self._path(key)
        check_range(start, end)
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError as exc:
            raise self._translate(exc, "read", key) from exc
        try:
            size = self._regular_size(fd, key)
            stop = size if end is None else min(end, size)
            return _pread_exact(fd, stop - start, start)
        except OSError as exc:
            raise self._translate(exc, "read", key) from exc
        finally:
            os.close(fd)

    def get_suffix(self, key: str, length: int) -> bytes:
        path = self._path(key)
        check_suffix_length(length)
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError as exc:
            raise self._translate(exc, "read", key) from exc
        try:
            size = self._regular_size(fd, key)
            start = max(0, size - length)
            return _pread_exact(fd, size - start, start)
        except OSError as exc:
            raise self._translate(exc, "read", key) from exc
        finally:
            os.close(fd)

    def _regular_size(self, fd: int, key: str) -> int:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            # A directory standing for the prefix of other keys is not an object.
            raise ObjectNotFoundError(f"no object {key!r} in {self.describe()}")
        return st.st_size

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._translate(exc, "stat", key) from exc
        return ObjectInfo(key, st.st_size) if stat.S_ISREG(st.st_mode) else None

    def remove_leftovers(self, older_than_ms: int, prefixes: Sequence[str]) -> int:
        """Remove the temporary files of writes whose process died (a SIGKILL between a
        temporary file's creation and its rename or link), last changed before
        `older_than_ms`: named as this store names them, in the folders of `prefixes` (a
        write's temporary file lies beside its key; symlinked directories below them are
        not followed; a user's files elsewhere in the root are never looked at), of a pid
        that no process on this host has. A temporary file of a live process, or of one on
        another host sharing the file system, is younger than any sensible bound. How many
        were removed."""
        removed = 0
        tops = sorted(
            top
            for top in {check_prefix(p).strip("/") for p in prefixes}
            # Only folders below the root (a prefix is the library's own, checked all the
            # same: the empty one would be the whole root, ".." a way out of it).
            if top and not any(part in ("", ".", "..") for part in top.split("/"))
        )
        walks = (os.walk(os.path.join(self._root_str, top)) for top in tops)
        for directory, _, names in itertools.chain.from_iterable(walks):
            for name in names:
                found = _TEMP_NAME.fullmatch(name)
                if found is None or _process_alive(int(found.group(1))):
                    continue
                path = os.path.join(directory, name)
                try:
                    if os.lstat(path).st_mtime_ns // 1_000_000 >= older_than_ms:
                        continue
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise self._translate(exc, "remove a leftover temporary file", name) from exc
                removed += 1
        return removed

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        if "\x00" in prefix:
            return iter(())  # no file name holds one
        dir_part, sep, name_prefix = prefix.rpartition("/")
        if dir_part:
            segments = dir_part.split("/")
            if any(s in ("", ".", "..") or is_temp_name(s) for s in segments):
                # No valid key lies below such a prefix.
                return iter(())
            top = os.path.join(self._root_str, dir_part)
        else:
            top = self._root_str
        return self._walk(top, dir_part + sep, name_prefix)

    def _walk(self, top: str, key_prefix: str, name_prefix: str) -> Iterator[ObjectInfo]:
        # Depth-first over directories sorted by "name/" (dirs) or "name" (files): that order is
        # exactly the key order, so results stream without collecting the whole tree first.
        stack: _Stack = [(key_prefix, top, iter(self._entries(top, name_prefix)))]
        while stack:
            base, directory, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                continue
            name, is_dir, size = entry
            if is_dir:
                child = os.path.join(directory, name)
                stack.append((f"{base}{name}/", child, iter(self._entries(child, ""))))
            else:
                yield ObjectInfo(base + name, size)

    def _entries(self, directory: str, name_prefix: str) -> _Entries:
        found: _Entries = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    name = entry.name
                    if (
                        is_temp_name(name)
                        or not name.startswith(name_prefix)
                        or not _is_key_name(name)
                    ):
                        continue
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            found.append((name, True, 0))
                        elif entry.is_file():
                            found.append((name, False, entry.stat().st_size))
                    except FileNotFoundError:
                        continue  # deleted while we looked
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise self._translate(exc, "list", None) from exc
        found.sort(key=lambda e: e[0] + "/" if e[1] else e[0])
        return found

    # -- deletes --------------------------------------------------------------------------------

    def delete_many(self, keys: Iterable[str]) -> None:
        # Validate every key before deleting any, so a bad key never leaves a half-done delete.
        paths = [(key, self._path(key)) for key in keys]
        touched: set[str] = set()
        for key, path in paths:
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
            except OSError as exc:
                raise self._translate(exc, "delete", key) from exc
            touched.add(os.path.dirname(path))
        if self._fsync:
            for directory in touched:
                try:
                    self._fsync_dir(directory, None)
                except UnavailableError:
                    if os.path.isdir(directory):
                        raise
        for directory in touched:
            self._prune_empty(directory)

    def _prune_empty(self, directory: str) -> None:
        # Empty directories would pile up as compaction deletes objects; S3 has none either.
        while directory != self._root_str and directory.startswith(self._root_str):
            try:
                os.rmdir(directory)
            except OSError:
                return  # not empty (or gone, or busy): leave it
            directory = os.path.dirname(directory)

    # -- helpers --------------------------------------------------------------------------------

    def describe(self) -> str:
        # Encoded as a file URL's path is decoded (`split_scheme`): pasted back, it names
        # this directory whatever characters its name holds.
        return self._root.as_uri()

    def _path(self, key: str) -> str:
        check_key(key)
        if "\x00" in key:
            raise InvalidArgumentError(f"invalid object key {key!r}: contains a NUL character")
        if any(is_temp_name(part) for part in key.split("/")):
            raise InvalidArgumentError(
                f"invalid object key {key!r}: segments starting with {TEMP_PREFIX!r} are reserved "
                "for temporary files"
            )
        return os.path.join(self._root_str, key)

    def _fsync_dir(self, directory: str, key: str | None) -> None:
        try:
            fsync_directory(directory)
        except OSError as exc:
            raise self._translate(exc, "sync the directory of", key) from exc

    def _conflict(self, key: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"key {key!r} conflicts with another object in {self.describe()}: a local store "
            "cannot hold both an object 'x' and an object 'x/...'"
        )

    def _translate(self, exc: OSError, action: str, key: str | None) -> S3StreamError:
        what = f"{action} {key!r} in {self.describe()}" if key else f"{action} {self.describe()}"
        code = exc.errno
        if code in _MISSING_ERRNOS:
            if action in ("read", "stat"):
                return ObjectNotFoundError(f"no object {key!r} in {self.describe()}")
            # Files or directories removed under a running write: another process interfered.
            return UnavailableError(f"cannot {what}: {exc.strerror}")
        if code == errno.ENAMETOOLONG:
            return InvalidArgumentError(f"key {key!r} is too long for the local file system")
        if code in _DENIED_ERRNOS:
            return S3StreamError(
                f"cannot {what}: {exc.strerror} (check ownership, mode and mount options of "
                f"{self._root_str!r}; retrying will not help)"
            )
        if code in _TRANSIENT_ERRNOS:
            return UnavailableError(f"cannot {what}: {exc.strerror}")
        return S3StreamError(f"cannot {what}: {exc}")


def from_url(url: str, **storage_options: Any) -> LocalObjectStore:
    """Registry factory for ``file://`` URLs and plain paths."""
    return LocalObjectStore.from_url(url, **storage_options)


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    """`length` bytes at `offset` (fewer only at end of file), without extra copies."""
    if length <= 0:
        return b""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    # One pread returns at most ~2 GiB on Linux; gather the rest.
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _process_alive(pid: int) -> bool:
    """Whether a process with `pid` exists on this host (of any user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # none, or a number no pid can be
        return False
    except PermissionError:  # another user's: it exists
        pass
    return True


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _is_key_name(name: str) -> bool:
    """Whether a file name found under the root can be part of a key (`check_key`): names
    other tools left (a ``\\``, bytes that are not UTF-8) are not listed, since `get` and
    `delete_many` would refuse the keys they make."""
    if "\\" in name:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
