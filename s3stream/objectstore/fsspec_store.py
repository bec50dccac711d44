"""An object store on any fsspec filesystem (gcs://, abfs://, hdfs://, sftp://, ...).

A fallback for URL schemes that have no dedicated store: ``s3://`` and ``file://`` have their
own (`S3ObjectStore`, `LocalObjectStore`), which are faster and give stronger guarantees.
Keys map to paths below the URL's root. Backend exceptions are translated: a missing path
becomes `ObjectNotFoundError`, permission problems `S3StreamError`, other OS-level failures
(connections, timeouts) `UnavailableError`.

Guarantees depend on the filesystem, and this store cannot add what the backend lacks:

* `put` is ``fs.pipe_file(path, data)``: atomic on object stores (a PUT), but on file-like
  backends a reader may see a partly written file.
* `put_if_absent` is ``fs.pipe_file(path, data, mode="create")``, fsspec's exclusive write: a
  backend that implements it on the server (e.g. an S3-style conditional PUT) makes it atomic
  across processes; fsspec's generic implementation checks for the file and then writes it,
  which is **not race-safe** between processes. Within one `FsspecObjectStore` instance,
  concurrent calls for the same key are serialized, so exactly one of them returns True.
  Use a dedicated store where several processes create the same keys.

Its `capabilities` therefore say ``atomic_create=False``, and the metadata log refuses to commit
through it, since two processes could both win one log entry. A deployment where one process
at a time writes (one client, readers elsewhere) says so with ``single_writer=True`` (a
constructor keyword, or ``storage_options={"single_writer": True}`` of `s3stream.open`): the
per-key locks above then make every conditional create of that one writer exclusive. Nothing
checks the claim: a second writing process on the same root may corrupt the metadata log.

fsspec has no common timeout setting, so a backend that stops answering could block a call for
good. Once a client bounds the store's tries (`bound_attempts`, as `store_stack` does), each
*read* (`get`, `get_suffix`, `head`, `list`) runs in a thread of its own and the caller stops
waiting for it after that time (`_bounded.within_deadline`), as an S3 GET's body must arrive
within one try's time; a read left behind changes nothing. Writes stay in the caller's
thread, bounded only by the filesystem's own timeouts: on a backend that writes files in
place, a write left behind would go on writing a key after a retry of it had succeeded, and
cut the committed object short.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .._bounded import within_deadline
from ..clock import Clock, SystemClock
from ..errors import InvalidArgumentError, ObjectNotFoundError, S3StreamError, UnavailableError
from ..validation import check_instance, check_positive
from ._common import as_bytes, check_prefix, check_suffix_length
from .base import ObjectInfo, ObjectStore, ObjectStoreCapabilities, check_key, check_range

__all__ = ["FsspecObjectStore", "from_url"]

# Per-key locks are striped: bounded memory, and distinct keys rarely wait for each other.
_LOCK_STRIPES = 64

# Schemes with a dedicated store: an fsspec store on one of them is reached as ``fsspec+X://``.
_DEDICATED_SCHEMES = frozenset({"file", "memory", "s3", "s3a"})

T = TypeVar("T")


class FsspecObjectStore(ObjectStore):
    """Objects below the root of an fsspec URL, e.g. ``gcs://bucket/prefix``.

    `storage_options` go to the fsspec filesystem unchanged (see its documentation), except
    ``single_writer`` (bool, default False): True declares that one process at a time writes
    through this store, which lets the metadata log commit through it (see the module).
    `clock` times the tries once they are bounded (default: the system clock).
    """

    def __init__(
        self,
        url: str,
        *,
        single_writer: bool = False,
        clock: Clock | None = None,
        **storage_options: Any,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise InvalidArgumentError(f"url must be a non-empty str, got {url!r}")
        if not isinstance(single_writer, bool):
            raise InvalidArgumentError(f"single_writer must be a bool, got {single_writer!r}")
        check_instance("clock", clock, Clock, allow_none=True)
        try:
            from fsspec.core import url_to_fs

            fs, root = url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as exc:
            raise InvalidArgumentError(f"cannot open the fsspec URL {url!r}: {exc}") from exc
        except Exception as exc:
            raise _translate(exc, f"open {url!r}", None) from exc
        self._url = url
        self._single_writer = single_writer
        self._storage_options = dict(storage_options)
        self._fs = fs
        self._root = str(root).rstrip("/")
        self._stripes = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        self._clock = clock if clock is not None else SystemClock()
        #: Longest one try may take (`bound_attempts`); None: unbounded, in the caller's thread.
        self._try_s: float | None = None

    @property
    def fs(self) -> Any:
        """The underlying fsspec filesystem."""
        return self._fs

    def describe(self) -> str:
        return self._url

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        # fsspec's generic exclusive write checks, then writes: not atomic across processes,
        # and nothing tells which backends do better on the server.
        protocol = self._url.partition("://")[0] if "://" in self._url else "file"
        scheme = f"fsspec+{protocol}" if protocol in _DEDICATED_SCHEMES else protocol
        return ObjectStoreCapabilities(
            scheme=scheme,
            atomic_create=False,
            ranged_reads=True,
            conditional_replace=False,
            ordered_listing=True,
            single_writer=self._single_writer,
        )

    @property
    def attempt_timeout_s(self) -> float | None:
        return self._try_s

    def bound_attempts(self, seconds: float) -> None:
        check_positive("seconds", seconds)
        self._try_s = seconds if self._try_s is None else min(self._try_s, seconds)

    def _try(self, action: str, key: str | None, work: Callable[[], T]) -> T:
        """`work` (one try of a read, raising translated errors), within the per-try bound."""
        limit = self._try_s
        if limit is None:
            return work()
        where = f"{action} {key!r}" if key else action
        return within_deadline(
            work,
            clock=self._clock,
            deadline=self._clock.monotonic() + limit,
            name=f"s3stream-fsspec-{action}",
            timeout_error=lambda: UnavailableError(
                f"cannot {where} on {self._url}: no answer within {limit:.3g} s (one try)"
            ),
        )

    def _path(self, key: str) -> str:
        check_key(key)
        return f"{self._root}/{key}" if self._root else key

    def _key(self, path: str) -> str:
        path = path.rstrip("/")
        if self._root:
            return path[len(self._root) + 1 :]
        return path.lstrip("/")

    # Writes run in the caller's thread, never left behind (module docstring).

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        blob = as_bytes(data)
        try:
            self._fs.pipe_file(path, blob)
        except Exception as exc:
            raise _translate(exc, "write", key) from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        blob = as_bytes(data)
        with self._stripes[hash(key) % _LOCK_STRIPES]:
            try:
                self._fs.pipe_file(path, blob, mode="create")
            except FileExistsError:
                return False
            except Exception as exc:
                raise _translate(exc, "create", key) from exc
        return True

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        path = self._path(key)
        check_range(start, end)

        def work() -> bytes:
            try:
                return bytes(self._fs.cat_file(path, start=start or None, end=end))
            except Exception as exc:
                raise _translate(exc, "read", key) from exc

        return self._try("read", key, work)

    def get_suffix(self, key: str, length: int) -> bytes:
        path = self._path(key)
        check_suffix_length(length)

        def work() -> bytes:
            try:
                # fsspec reads a negative start as counted from the end: one request where
                # possible.
                return bytes(self._fs.cat_file(path, start=-length))
            except Exception as exc:
                raise _translate(exc, "read", key) from exc

        return self._try("read", key, work)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)

        def work() -> ObjectInfo | None:
            try:
                info = self._fs.info(path)
            except FileNotFoundError:
                return None
            except Exception as exc:
                raise _translate(exc, "stat", key) from exc
            if info.get("type") != "file":
                return None
            return ObjectInfo(key, int(info["size"]))

        return self._try("stat", key, work)

    def delete_many(self, keys: Iterable[str]) -> None:
        paths = [(key, self._path(key)) for key in keys]
        for key, path in paths:
            try:
                self._fs.rm_file(path)
            except FileNotFoundError:
                continue
            except Exception as exc:
                raise _translate(exc, "delete", key) from exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        dir_part = prefix.rpartition("/")[0]
        try:
            top = self._path(dir_part) if dir_part else (self._root or "/")
        except InvalidArgumentError:
            return  # a prefix no valid key can have

        def work() -> dict[str, Any]:
            try:
                found: dict[str, Any] = self._fs.find(top, withdirs=False, detail=True)
            except FileNotFoundError:
                return {}
            except Exception as exc:
                raise _translate(exc, "list", None) from exc
            return found

        found = self._try("list", None, work)
        infos = []
        for path, info in found.items():
            key = self._key(path)
            if not key.startswith(prefix) or info.get("type", "file") != "file":
                continue
            try:
                check_key(key)
            except InvalidArgumentError:
                continue
            infos.append(ObjectInfo(key, int(info["size"])))
        infos.sort(key=lambda i: i.key)
        yield from infos

    def __getstate__(self) -> dict[str, Any]:
        # Rebuilt from the URL on unpickling: fsspec filesystems are not always picklable.
        return {
            "url": self._url,
            "single_writer": self._single_writer,
            "storage_options": self._storage_options,
            "try_s": self._try_s,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["url"],
            single_writer=state.get("single_writer", False),
            **state["storage_options"],
        )
        self._try_s = state.get("try_s")


def from_url(url: str, **storage_options: Any) -> FsspecObjectStore:
    """Registry factory for every scheme without a dedicated store."""
    return FsspecObjectStore(url, **storage_options)


def _translate(exc: Exception, action: str, key: str | None) -> S3StreamError:
    if isinstance(exc, S3StreamError):
        return exc
    where = f"{action} {key!r}" if key else action
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return ObjectNotFoundError(f"no object {key!r}: {exc}")
    if isinstance(exc, PermissionError):
        return S3StreamError(f"cannot {where}: permission denied ({exc}); retrying will not help")
    if isinstance(exc, OSError):
        # ConnectionError, TimeoutError and backend I/O errors: may clear up by themselves.
        return UnavailableError(f"cannot {where}: {exc}")
    return S3StreamError(f"cannot {where}: {type(exc).__name__}: {exc}")
