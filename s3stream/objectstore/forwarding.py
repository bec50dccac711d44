"""`ForwardingObjectStore`: the base of wrappers that intercept only a few calls."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from .base import ObjectInfo, ObjectStore, ObjectStoreCapabilities

if TYPE_CHECKING:
    from .requests import RequestMeter

__all__ = ["ForwardingObjectStore"]


class ForwardingObjectStore(ObjectStore):
    """Passes every call to `inner`: a base for wrappers that intercept only a few calls
    (timing, gating, counting in tests and benchmarks)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self.inner.get(key, start, end)

    def get_suffix(self, key: str, length: int) -> bytes:
        return self.inner.get_suffix(key, length)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.inner.delete_many(keys)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def close(self) -> None:
        self.inner.close()

    def describe(self) -> str:
        return self.inner.describe()

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        return self.inner.capabilities

    @property
    def attempt_timeout_s(self) -> float | None:
        return self.inner.attempt_timeout_s

    def bound_attempts(self, seconds: float) -> None:
        self.inner.bound_attempts(seconds)

    def remove_leftovers(self, older_than_ms: int, prefixes: Sequence[str]) -> int:
        return self.inner.remove_leftovers(older_than_ms, prefixes)

    def meter_requests(self, meter: RequestMeter) -> bool:
        return self.inner.meter_requests(meter)
