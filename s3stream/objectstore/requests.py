"""Requests an object store sends to its backend, as the provider bills them.

A client's store calls are counted twice over: as calls (`MetricsObjectStore`, at the top of
the stack) and as requests (here, below the retry layer), which is what a cost estimate
needs: every try of a retried call, every page of a list, one ``DeleteObjects`` per 1,000 keys.
`S3ObjectStore` reports each HTTP request it sends (`ObjectStore.meter_requests`); for other
stores `RequestCountingStore` counts one request per call, named as S3 would bill it.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator

from .base import ObjectInfo, ObjectStore
from .forwarding import ForwardingObjectStore

__all__ = [
    "DELETE_OBJECTS",
    "GET_OBJECT",
    "HEAD_BUCKET",
    "HEAD_OBJECT",
    "LIST_OBJECTS",
    "PUT_OBJECT",
    "RequestCountingStore",
    "RequestMeter",
]

#: S3 API names of the requests s3stream sends.
PUT_OBJECT = "PutObject"
GET_OBJECT = "GetObject"
HEAD_OBJECT = "HeadObject"
HEAD_BUCKET = "HeadBucket"
DELETE_OBJECTS = "DeleteObjects"
LIST_OBJECTS = "ListObjectsV2"

#: Keys per ``DeleteObjects`` request, and entries per ``ListObjectsV2`` page, on S3.
_KEYS_PER_REQUEST = 1000


class RequestMeter(ABC):
    """Told of every request a store sends (thread-safe implementations only)."""

    @abstractmethod
    def request(self, name: str, count: int = 1) -> None:
        """`count` requests of S3 API `name` were sent (tries that failed included)."""


class _Meters:
    """The meters attached to one store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.meters: tuple[RequestMeter, ...] = ()

    def add(self, meter: RequestMeter) -> None:
        with self._lock:
            self.meters = (*self.meters, meter)

    def request(self, name: str, count: int = 1) -> None:
        for meter in self.meters:
            meter.request(name, count)


class RequestCountingStore(ForwardingObjectStore):
    """Counts the requests of a store that does not report its own: one per call, named as
    S3 would bill it (a list: one per 1,000 entries it yields, at least one; a delete: one per
    1,000 distinct keys). A store that reports its own requests is asked to, and this wrapper
    then counts nothing. Sits under the retry layer, so each try counts."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self._meters = _Meters()
        #: Whether the inner store reports its own requests (None: no meter asked yet).
        self._delegated: bool | None = None

    def meter_requests(self, meter: RequestMeter) -> bool:
        # The first meter decides: a store that reports its own requests gets every meter.
        if self._delegated is None:
            self._delegated = self.inner.meter_requests(meter)
            if self._delegated:
                return True
        elif self._delegated:
            return self.inner.meter_requests(meter)
        self._meters.add(meter)
        return True

    def put(self, key: str, data: bytes) -> None:
        self._count(PUT_OBJECT)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._count(PUT_OBJECT)
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self._count(GET_OBJECT)
        return self.inner.get(key, start, end)

    def get_suffix(self, key: str, length: int) -> bytes:
        self._count(GET_OBJECT)
        return self.inner.get_suffix(key, length)

    def head(self, key: str) -> ObjectInfo | None:
        self._count(HEAD_OBJECT)
        return self.inner.head(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        key_list = list(keys)
        distinct = len(set(key_list))
        self._count(DELETE_OBJECTS, -(-distinct // _KEYS_PER_REQUEST))
        self.inner.delete_many(key_list)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._count(LIST_OBJECTS)
        return self._pages(self.inner.list(prefix))

    def _pages(self, entries: Iterator[ObjectInfo]) -> Iterator[ObjectInfo]:
        for n, info in enumerate(entries):
            if n and n % _KEYS_PER_REQUEST == 0:
                self._count(LIST_OBJECTS)
            yield info

    def _count(self, name: str, count: int = 1) -> None:
        if count and not self._delegated:
            self._meters.request(name, count)
