"""The ObjectStore contract: the few operations s3stream needs from object storage.

Keys are ``/``-separated strings relative to the store's root (bucket + prefix). Objects are
immutable once written: the library never overwrites data objects, and uses `put_if_absent`
(conditional create) wherever two writers could race, such as the metadata log.

Errors: a missing key raises `ObjectNotFoundError`; a store that cannot be reached, or keeps
failing, raises `UnavailableError` (retryable). Implementations translate their backend's
exceptions into these at the boundary.

What a store guarantees beyond that minimum, and where it falls short of it (a conditional
create that is atomic only within one process), it states in `ObjectStore.capabilities`, so that
a component that depends on a guarantee (the metadata log's fencing) can refuse a store that
lacks it instead of corrupting data.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._closeable import Closeable
from ..errors import InvalidArgumentError
from ..validation import check_text

if TYPE_CHECKING:
    from .requests import RequestMeter

__all__ = [
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreCapabilities",
    "check_key",
    "check_range",
]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What `head` and `list` report about one object."""

    key: str
    size: int


@dataclass(frozen=True, slots=True)
class ObjectStoreCapabilities:
    """What a store guarantees, as a record a caller can check before it relies on it.

    Wrappers (retries, metrics, fault injection) report the record of the store they wrap: they
    neither add nor remove guarantees.
    """

    #: The URL scheme that opens such a store (``"s3"``, ``"file"``, ``"memory"``, ``"gcs"``,
    #: ``"fsspec+memory"``, ...), for messages; ``""`` when unknown.
    scheme: str
    #: `put_if_absent` is atomic across processes and machines sharing the store: of concurrent
    #: creators of one key anywhere, exactly one gets True. The metadata log's fencing (one
    #: winner per log entry) needs this.
    atomic_create: bool
    #: `get` of a byte range and `get_suffix` fetch only those bytes from the backend (one
    #: ranged request), not the whole object.
    ranged_reads: bool
    #: The store can replace an object only while it still holds the version the caller read
    #: (S3's ``If-Match``). The `ObjectStore` contract has no such call yet, so every store of
    #: this package says False; a backend's support alone does not make it True.
    conditional_replace: bool
    #: `list` yields keys in lexicographic (code point, which is UTF-8 byte) order, as the
    #: contract asks; a store whose backend does not list in order sorts before yielding.
    ordered_listing: bool
    #: The user declared that one process at a time writes through this store (an explicit
    #: opt-in such as ``FsspecObjectStore(..., single_writer=True)``): a conditional create that
    #: is atomic only within one process is then enough to keep the metadata log consistent.
    single_writer: bool = False

    @property
    def fences_writers(self) -> bool:
        """Whether the metadata log may commit through the store: its conditional creates are
        atomic across processes, or only one process writes (`single_writer`)."""
        return self.atomic_create or self.single_writer


#: The longest key (UTF-8 bytes) S3, GCS and Azure Blob Storage all take.
MAX_KEY_BYTES = 1024


def check_key(key: str) -> str:
    """Validate a key: a non-empty str encodable as UTF-8 (services store names as UTF-8: a
    lone surrogate would be stored as another key), no leading ``/``, no empty or dot
    segments, and no ``\\`` (Azure Blob Storage reads it as ``/``, so the key would alias
    another one, or leave its store's prefix with ``..\\``). One rule for every store, so
    that keys move between stores. No NUL: S3, GCS and Azure refuse it, but only once a
    request was sent (an HTTP 400). Their length limit (`MAX_KEY_BYTES`) is not checked here:
    keys an earlier version wrote under a long prefix must stay readable; what makes new keys
    checks it (`ObjectWal`)."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"object key must be a non-empty str, got {key!r}")
    if "\0" in key:
        raise InvalidArgumentError(f"invalid object key {key!r}: it holds a NUL character")
    if key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidArgumentError(f"invalid object key {key!r}")
    if "\\" in key:
        raise InvalidArgumentError(
            f"invalid object key {key!r}: '\\' is not allowed (Azure reads it as '/')"
        )
    check_text("object key", key)  # UTF-8
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

        Of several concurrent callers for one key, exactly one gets True: in every process
        sharing the store where `capabilities` say ``atomic_create``, else only among callers
        of one store instance.
        """

    @abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (`end` None: to its end); short at the end."""

    def get_suffix(self, key: str, length: int) -> bytes:
        """The last `length` bytes of the object (all of it if shorter): one request where
        the backend supports suffix ranges; by default, where it does not, a HEAD for the size
        and a ranged `get`."""
        from ..errors import ObjectNotFoundError
        from ._common import check_suffix_length  # it imports this module

        check_key(key)
        check_suffix_length(length)
        info = self.head(key)
        if info is None:
            raise ObjectNotFoundError(f"no object {key!r} in {self.describe()}")
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
    def capabilities(self) -> ObjectStoreCapabilities:
        """What this store guarantees (see `ObjectStoreCapabilities`).

        The default states what the contract above requires of every store (an atomic
        conditional create, listings in key order) and nothing more; a store that falls short
        of the contract, or offers more, overrides it. Wrappers return their inner store's.
        """
        return ObjectStoreCapabilities(
            scheme=_scheme_of(self.describe()),
            atomic_create=True,
            ranged_reads=False,
            conditional_replace=False,
            ordered_listing=True,
        )

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

    def remove_leftovers(self, older_than_ms: int, prefixes: Sequence[str]) -> int:
        """Remove what this store's own writes under `prefixes` (key prefixes: the library's
        own folders, never the whole store, which may hold a user's files) left behind when
        their process died (not objects, which the orphan sweep judges: e.g. a local store's
        temporary files), last changed before `older_than_ms` (milliseconds since the
        epoch); how many. A store whose writes leave nothing behind (a PUT to a service) has
        nothing: 0. Wrappers pass it on."""
        return 0

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

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def _scheme_of(description: str) -> str:
    """The scheme of the first URL in a store's description, or ``""``."""
    head, sep, _ = description.partition("://")
    if not sep:
        return ""
    scheme = head.rpartition("(")[2]
    return scheme if scheme[:1].isalpha() else ""
