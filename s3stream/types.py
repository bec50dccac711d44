"""Value types of the public API: what goes in (`RecordBatch`) and what comes out.

All are immutable. Offsets count records, not bytes: a batch of `count` records appended at
`base_offset` occupies ``[base_offset, base_offset + count)``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import InvalidArgumentError
from .validation import check_int, check_str_map

__all__ = [
    "MAX_BATCH_COUNT",
    "AppendResult",
    "BatchKind",
    "FetchResult",
    "FetchedBatch",
    "RecordBatch",
    "StreamInfo",
    "StreamState",
]

#: Largest number of records one batch may carry (the format stores it in 32 bits).
MAX_BATCH_COUNT = (1 << 31) - 1
_EMPTY: Mapping[str, str] = MappingProxyType({})


class BatchKind(enum.IntEnum):
    """What a batch payload holds; stored in the batch header so readers can decode it."""

    #: Opaque bytes owned by the application.
    RAW = 0
    #: Records packed by `s3stream.records` (key, value, timestamp, headers per record).
    RECORDS = 1


_KIND_VALUES = frozenset(int(k) for k in BatchKind)


class StreamState(enum.Enum):
    """Lifecycle of a stream in the metadata."""

    OPEN = "open"
    CLOSED = "closed"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A batch of `count` records to append, carried as one opaque `payload`.

    `base_timestamp` is milliseconds since the epoch; `None` stamps the batch with the
    client's clock at append time. `properties` are small string attributes stored with the
    batch. Use `s3stream.records` (or `Stream.append_records`) to pack real records.
    """

    payload: bytes
    count: int = 1
    base_timestamp: int | None = None
    properties: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    kind: BatchKind = BatchKind.RAW
    #: Set by `s3stream.records.records_batch` to the (payload, count) its encoder made: a
    #: RECORDS batch built any other way, or changed since (`dataclasses.replace`), is
    #: decoded once at append (`records_verified`), so that a payload that is not a records
    #: payload is refused there instead of failing every later scan of the store.
    _verified: tuple[bytes, int] | None = field(
        default=None, repr=False, compare=False, kw_only=True
    )

    def records_verified(self) -> bool:
        """Whether this RECORDS batch's payload is known to be a records payload of `count`
        records (made so by `records_batch`, and unchanged since)."""
        made = getattr(self, "_verified", None)  # a batch unpickled from an older version
        return made is not None and made[0] is self.payload and made[1] == self.count

    def __post_init__(self) -> None:
        payload = self.payload
        if type(payload) is not bytes:
            if isinstance(payload, bytearray | memoryview):
                object.__setattr__(self, "payload", bytes(payload))
            else:
                raise InvalidArgumentError(
                    f"payload must be bytes, bytearray or memoryview, not {type(payload).__name__}"
                )
        check_int("count", self.count, minimum=1, maximum=MAX_BATCH_COUNT)
        if self.base_timestamp is not None:
            # The record codec's bound too (-2**63 stands for "no timestamp" there), so every
            # batch appended can be read back as records.
            check_int("base_timestamp", self.base_timestamp, minimum=-(1 << 63) + 1)
        if self.properties is not _EMPTY:  # the default needs no check (the hot path)
            # None is taken for "no properties", as the empty default.
            props = check_str_map("properties", self.properties, allow_none=True)
            object.__setattr__(self, "properties", MappingProxyType(props) if props else _EMPTY)
        kind = self.kind
        if not isinstance(kind, BatchKind):
            # Exactly an int: BatchKind(True) or BatchKind(1.0) would find RECORDS.
            if type(kind) is not int or kind not in _KIND_VALUES:
                raise InvalidArgumentError(
                    f"kind must be a BatchKind ({sorted(_KIND_VALUES)}), got {kind!r}"
                )
            object.__setattr__(self, "kind", BatchKind(kind))


class FetchedBatch:
    """A batch read back from a stream, with the offsets it was given at append time.

    Immutable. The payload is available two ways:

    - `view`: a read-only ``memoryview``, without copying. A batch read from object storage
      is a slice of the block's GET buffer (zero-copy), so holding the view (or the batch)
      keeps that whole buffer alive — up to `BlockCache`'s largest GET, 8 MiB by default.
      Fast readers (checksums, ``pyarrow`` buffers, decoders taking buffers) use this.
    - `payload`: ``bytes``; made from the view on first use (one copy, then kept).

    Equality and hashing compare the payload bytes, whichever form the batch holds.
    """

    __slots__ = (
        "_payload",
        "base_offset",
        "base_timestamp",
        "count",
        "kind",
        "properties",
        "stream_id",
    )

    stream_id: int
    base_offset: int
    count: int
    base_timestamp: int
    properties: Mapping[str, str]
    kind: BatchKind
    _payload: bytes | memoryview

    def __init__(
        self,
        stream_id: int,
        base_offset: int,
        count: int,
        payload: bytes | memoryview,
        base_timestamp: int,
        properties: Mapping[str, str] = _EMPTY,
        kind: BatchKind = BatchKind.RAW,
    ) -> None:
        if isinstance(payload, memoryview) and not payload.readonly:
            payload = payload.toreadonly()
        elif not isinstance(payload, bytes | memoryview):
            raise InvalidArgumentError(
                f"payload must be bytes or memoryview, not {type(payload).__name__}"
            )
        setter = object.__setattr__
        setter(self, "stream_id", stream_id)
        setter(self, "base_offset", base_offset)
        setter(self, "count", count)
        setter(self, "_payload", payload)
        setter(self, "base_timestamp", base_timestamp)
        setter(self, "properties", properties)
        setter(self, "kind", kind)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"FetchedBatch is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"FetchedBatch is immutable: cannot delete {name!r}")

    @property
    def payload(self) -> bytes:
        """The payload as ``bytes`` (copied from the view once, on first use)."""
        p = self._payload
        if type(p) is bytes:
            return p
        b = bytes(p)
        # A benign race: two threads may both copy; either copy is the same bytes.
        object.__setattr__(self, "_payload", b)
        return b

    @property
    def view(self) -> memoryview:
        """The payload as a read-only ``memoryview``, without copying."""
        p = self._payload
        return p if isinstance(p, memoryview) else memoryview(p)

    @property
    def size(self) -> int:
        """Payload length in bytes (no copy)."""
        return len(self._payload)

    @property
    def last_offset(self) -> int:
        """Offset of the last record in the batch."""
        return self.base_offset + self.count - 1

    @property
    def next_offset(self) -> int:
        """Offset just after the batch: where the next batch begins."""
        return self.base_offset + self.count

    def _args(self, payload: bytes | memoryview) -> tuple[object, ...]:
        """The constructor's arguments, with `payload` for the payload."""
        return (
            self.stream_id,
            self.base_offset,
            self.count,
            payload,
            self.base_timestamp,
            dict(self.properties),
            self.kind,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FetchedBatch):
            return NotImplemented
        return self._args(self._payload) == other._args(other._payload)

    def __hash__(self) -> int:
        # A copy: a memoryview hashes only when the buffer under it is hashable, and a view
        # over a bytearray is not.
        return hash((self.stream_id, self.base_offset, self.count, self.view.tobytes(), self.kind))

    def __repr__(self) -> str:
        return (
            f"FetchedBatch(stream_id={self.stream_id}, base_offset={self.base_offset}, "
            f"count={self.count}, payload=<{self.size} bytes>, "
            f"base_timestamp={self.base_timestamp}, properties={dict(self.properties)!r}, "
            f"kind={self.kind!r})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        # A memoryview does not pickle: send the bytes.
        return (FetchedBatch, self._args(self.payload))


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an acknowledged batch landed: ``[base_offset, base_offset + count)``."""

    stream_id: int
    base_offset: int
    count: int

    @property
    def next_offset(self) -> int:
        """Offset just after the appended batch."""
        return self.base_offset + self.count


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Whole batches returned by `Stream.fetch`, in offset order.

    The first batch may begin before the requested start offset. `next_offset` is where a
    reader continuing sequentially should fetch next.
    """

    batches: list[FetchedBatch]
    next_offset: int

    @property
    def total_bytes(self) -> int:
        """Sum of payload sizes of the returned batches."""
        return sum(b.size for b in self.batches)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """Committed metadata of a stream, as `StreamClient.list_streams` reports it.

    `end_offset` counts what is committed to object storage; a live stream's
    `confirm_offset` may be ahead of it by what sits in the WAL.
    """

    stream_id: int
    epoch: int
    start_offset: int
    end_offset: int
    state: StreamState
    tags: Mapping[str, str]
