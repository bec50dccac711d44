"""The ObjectStore contract: the few operations s3stream needs from object storage.

Keys are ``/``-separated strings relative to the store's root (bucket + prefix). Objects are
immutable once written: the library never overwrites data objects, and uses `put_if_absent`
(conditional create) wherever two writers could race, such as the metadata log.

Errors: a missing key raises `ObjectNotFoundError`; a store that cannot be reached, or keeps
failing, raises `UnavailableError` (retryable). Implementations translate their backend's
exceptions into these at the boundary.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._closeable import Closeable
from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from .requests import RequestMeter

__all__ = ["ObjectInfo", "ObjectStore", "check_key", "check_range"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What `head` and `list` report about one object."""

    key: str
    size: int


def check_key(key: str) -> str:
    """Validate a key: non-empty str, no leading ``/``, no empty or dot segments."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"object key must be a non-empty str, got {key!r}")
    if key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidArgumentError(f"invalid object key {key!r}")
    return key


def check_range(start: int, end: int | None) -> None:
    """Validate a ``[start, end)`` byte range."""
    if type(start) is not int or start < 0:
        raise InvalidArgumentError(f"range start must be an int >= 0, got {start!r}")
    if end is not None and (type(end) is not int or end < start):
        raise InvalidArgumentError(f"range end must be an int >= start, got {end!r}")


class ObjectStore(Closeable):
    """Immutable-object storage: put, conditional create, ranged get, head, delete, list."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write `data` under `key`, atomically: readers see the old object or the whole new one."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create `key` only if no object exists there; True if created, False if it existed.

        Of several concurrent callers for one key, exactly one gets True.
        """

    @abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (`end` None: to its end); short at the end."""

    def get_suffix(self, key: str, length: int) -> bytes:
        """The last `length` bytes of the object (all of it if shorter): one request where
        the backend supports suffix ranges."""
        if type(length) is not int or length <= 0:
            raise InvalidArgumentError(f"suffix length must be an int > 0, got {length!r}")
        info = self.head(key)
        if info is None:
            from ..errors import ObjectNotFoundError

            raise ObjectNotFoundError(f"no object {key!r}")
        return self.get(key, max(0, info.size - length))

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size of the object, or None if there is none."""

    @abstractmethod
    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete every key given; keys that do not exist are ignored."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, in key order. Never on a hot path."""

    @property
    def attempt_timeout_s(self) -> float | None:
        """Longest one try of a call can take before the store gives up on it (a remote
        store's connect plus read timeout); None when unbounded or not applicable. The retry
        layer uses it to never start a try that could not end before its deadline."""
        return None

    def bound_attempts(self, seconds: float) -> None:
        """Make one try of a call end within about `seconds` (lower socket timeouts), so
        that calls fit a deadline of a few tries; stores without timeouts ignore it."""
        return

    def meter_requests(self, meter: RequestMeter) -> bool:
        """Report every request this store sends to its backend to `meter` from now on (tries
        and pages included), for cost accounting. False, the default, when the store cannot:
        `RequestCountingStore` then counts its calls instead. Wrappers pass it on."""
        return False

    def close(self) -> None:
        """Release connections and other resources."""

    def describe(self) -> str:
        """A short human-readable name of the store (for messages and `inspect`)."""
        return type(self).__name__
