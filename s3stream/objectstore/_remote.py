"""What every store on a network service shares (`S3ObjectStore`, `GcsObjectStore`, and the
obstore stores through `ObstoreObjectStore`), whatever its client library.

`RemoteObjectStore` keeps ONE client per store, built on first use by `_make_client`, shared
by every thread, dropped by `close` and `bound_attempts` (its timeouts are fixed when it is
built) and never pickled (Spark ships stores to executors, each of which builds its own).
It holds the per-try timeouts, the request meters (`meter_requests`), and the parts of the
calls that are the same on every service: a checked list prefix, an empty range answered by
a HEAD, the read-back that decides an ambiguous conditional create, listings in key order.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterator
from typing import Any, ClassVar, Generic, TypeVar

from ..errors import InvalidArgumentError, ObjectNotFoundError, S3StreamError
from ..validation import check_positive
from ._common import check_prefix
from .base import ObjectInfo, ObjectStore, ObjectStoreCapabilities, check_key, check_range
from .requests import RequestMeter

__all__ = ["RemoteObjectStore"]

C = TypeVar("C")


class RemoteObjectStore(ObjectStore, Generic[C]):
    """Base of the stores whose client (of type `C`) talks to a service (see the module
    docstring). `read_name` names the second timeout in errors."""

    #: `ObjectStoreCapabilities.scheme` of the store.
    scheme: ClassVar[str]
    #: Key prefix inside the bucket or container, empty or ending with ``/``.
    prefix: str

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        read_name: str = "read_timeout_s",
    ) -> None:
        self._connect_timeout_s = check_positive("connect_timeout_s", connect_timeout_s)
        self._read_timeout_s = check_positive(read_name, read_timeout_s)
        self._lock = threading.Lock()
        self._client: C | None = None
        #: The client was the caller's (`client=`): used as it is, never rebuilt or closed
        #: here (its timeouts are its own). `bound_attempts` closed it and built one from
        #: the other options: with no endpoint among them, one that talked to AWS.
        self._client_given = False
        #: Told of every request sent (`meter_requests`); not pickled.
        self._meters: tuple[RequestMeter, ...] = ()

    # -- client ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def _make_client(self) -> C:
        """A new client with this store's settings (raises `S3StreamError`)."""

    def _close_client(self, client: C) -> None:
        """Release what a dropped client holds (by default nothing: dropping it is enough)."""
        del client

    def _connected(self) -> C:
        """The client (built on first use)."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None and not self._client_given:
            self._close_client(client)

    @property
    def attempt_timeout_s(self) -> float | None:
        return self._connect_timeout_s + self._read_timeout_s

    def _bounded_timeouts(self, seconds: float) -> tuple[float, float]:
        """The (connect, read) timeouts that make one try end within `seconds`."""
        connect = min(self._connect_timeout_s, seconds / 2)
        return connect, min(self._read_timeout_s, seconds - connect)

    def bound_attempts(self, seconds: float) -> None:
        seconds = float(seconds)
        if seconds <= 0:
            raise InvalidArgumentError(f"seconds must be > 0, got {seconds!r}")
        timeouts = self._bounded_timeouts(seconds)
        if timeouts == (self._connect_timeout_s, self._read_timeout_s) or self._client_given:
            return
        with self._lock:
            self._connect_timeout_s, self._read_timeout_s = timeouts
            # Timeouts are fixed when the client is built: build the next one with these.
            client, self._client = self._client, None
        if client is not None:
            self._close_client(client)

    def meter_requests(self, meter: RequestMeter) -> bool:
        with self._lock:
            self._meters = (*self._meters, meter)
        return True

    def _sent(self, name: str, count: int = 1) -> None:
        """Report `count` requests of S3 API `name` (as S3 bills them, like every store's
        requests: `objectstore.requests`)."""
        for meter in self._meters:
            meter.request(name, count)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_client_given"] = False  # unpickled, it builds a client of its own
        state["_meters"] = ()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        # Conditional creates are decided by the service, for every process and machine
        # alike. Services can also replace only a given version, but no ObjectStore call
        # uses it.
        return ObjectStoreCapabilities(
            scheme=self.scheme,
            atomic_create=True,
            ranged_reads=True,
            conditional_replace=False,
            ordered_listing=True,
        )

    # -- operations -----------------------------------------------------------------------------

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(start, end)
        if end == start:
            # No service reads an empty range: whether the object exists is a HEAD's answer.
            if self.head(key) is None:
                raise ObjectNotFoundError(f"no object {key!r} in {self.describe()}")
            return b""
        return self._get_range(key, start, end)

    @abc.abstractmethod
    def _get_range(self, key: str, start: int, end: int | None) -> bytes:
        """`get` of a checked, non-empty range."""

    def _holds(self, key: str, blob: bytes) -> bool:
        """Whether `key` holds exactly `blob` (deciding whether an ambiguous create was ours:
        after a try that got no answer, "already exists" may be our own object)."""
        try:
            return self.get(key) == blob
        except ObjectNotFoundError:
            return False

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        return self._list(prefix)

    @abc.abstractmethod
    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        """`list` of a checked prefix (a generator: it runs when iterated)."""

    def _in_key_order(
        self, entries: Iterator[ObjectInfo], documented: str | None
    ) -> Iterator[ObjectInfo]:
        """`entries` in key order: streamed, and checked, where the service documents that
        it lists in key order (`documented` says who documents it, for the error); else
        collected and sorted (directory buckets, S3-compatible services that list directory
        by directory, emulators)."""
        if documented is None:
            yield from sorted(entries, key=lambda info: info.key)
            return
        last: str | None = None
        for info in entries:
            if last is not None and info.key <= last:
                raise S3StreamError(
                    f"cannot list {self.describe()}: the service listed {info.key!r} after "
                    f"{last!r}, out of key order, although {documented}"
                )
            last = info.key
            yield info

    # -- errors ---------------------------------------------------------------------------------

    def _what(self, action: str, key: str | None) -> str:
        """What failed, for an error message: ``read 'k' in s3://...``."""
        return f"{action} {key!r} in {self.describe()}" if key else f"{action} {self.describe()}"
