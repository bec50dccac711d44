"""The error tree of s3stream.

One root (`S3StreamError`) and a few kinds. Every class says, through its `retryable`
attribute, whether trying the same call again later can succeed. Errors raised by backends
(OSError, botocore, fsspec) are translated at the component boundary with ``raise ... from exc``
so callers only ever need to catch these.
"""

from __future__ import annotations

__all__ = [
    "BackpressureError",
    "ContendedError",
    "CorruptionError",
    "FencedError",
    "InvalidArgumentError",
    "NodeInUseError",
    "ObjectNotFoundError",
    "OffsetMismatchError",
    "OffsetOutOfRangeError",
    "S3StreamError",
    "SequenceError",
    "StreamClosedError",
    "StreamNotFoundError",
    "StreamOwnedError",
    "UnavailableError",
    "WalFullError",
]


class S3StreamError(Exception):
    """Root of every error raised by s3stream."""

    #: Whether the same call may succeed if simply tried again later.
    retryable: bool = False


class FencedError(S3StreamError):
    """A newer epoch owns the stream or node; this writer must stop (not retryable).

    Also raised by `flush` and `close` of a client that had to drop acknowledged appends
    because another client took the stream or node over: the message names the streams.
    """


class StreamOwnedError(S3StreamError):
    """The stream is open on another node that may still hold acknowledged, unuploaded data.

    `owner` names that node. Take the node over first (``client.take_over(owner)``), which
    uploads what it had acknowledged and releases its streams, or open the stream with
    ``force=True``, which discards what that node has not uploaded.
    """

    def __init__(self, message: str, *, stream_id: int, owner: str) -> None:
        super().__init__(message)
        #: The stream that was asked for.
        self.stream_id = stream_id
        #: The node that has it open.
        self.owner = owner

    def __reduce__(self) -> tuple[object, ...]:
        attrs = {"stream_id": self.stream_id, "owner": self.owner}
        return (_rebuild, (type(self), str(self), attrs))


class NodeInUseError(S3StreamError):
    """A live process holds this node's WAL (the same node id opened twice).

    Give each process sharing a store its own ``node_id``; `pid` names the holder when known.
    Not retryable as such: it succeeds only after the holder has exited (or was taken over).
    """

    def __init__(self, message: str, *, node_id: str, pid: int | None = None) -> None:
        super().__init__(message)
        #: The node id that is in use.
        self.node_id = node_id
        #: Process id of the holder, as it recorded it (None if unknown).
        self.pid = pid

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), str(self), {"node_id": self.node_id, "pid": self.pid}))


def _rebuild(cls: type[S3StreamError], message: str, attrs: dict[str, object]) -> S3StreamError:
    """Unpickle an error whose constructor takes keyword arguments (errors cross processes:
    Spark workers, crash-test children)."""
    return cls(message, **attrs)


class StreamClosedError(S3StreamError):
    """The stream (or the client, or a WAL) was closed or destroyed."""


class StreamNotFoundError(S3StreamError, LookupError):
    """No stream with that id exists (or it was destroyed)."""


class ObjectNotFoundError(S3StreamError, LookupError):
    """An object store has no object under the key."""


class OffsetOutOfRangeError(S3StreamError, LookupError):
    """A read begins outside ``[start_offset, confirm_offset]`` of the stream (trimmed away,
    or not written yet; at ``confirm_offset`` itself a read returns nothing)."""


class OffsetMismatchError(S3StreamError):
    """A conditional append (``expected_offset=N``) found the stream's next offset elsewhere.

    Nothing was written. `actual` is the offset the next append would get: after a retry of
    an append whose outcome was unknown (a timeout), ``actual > N`` means the first attempt
    landed and is acknowledged (a retry waits for an attempt still in flight to settle);
    not retryable with the same `expected_offset`.
    """

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        super().__init__(message)
        #: The offset the caller expected the batch to land at.
        self.expected = expected
        #: The stream's next offset when the append was refused.
        self.actual = actual


class SequenceError(S3StreamError):
    """An idempotent append (``producer_id``, ``sequence``) came out of order: a sequence was
    skipped, or it is older than the window of sequences the stream remembers. Nothing was
    written; not retryable with the same sequence (docs/consuming.md)."""

    def __init__(self, message: str, *, producer_id: str, expected: int, got: int) -> None:
        super().__init__(message)
        #: The producer whose sequence is out of order.
        self.producer_id = producer_id
        #: The sequence the stream expects next from it.
        self.expected = expected
        #: The sequence it sent.
        self.got = got


class CorruptionError(S3StreamError):
    """Stored bytes failed validation; the message names the object or WAL position."""

    def __init__(self, message: str, *, location: str | None = None, position: int | None = None):
        super().__init__(message)
        #: Object key or WAL path holding the bad bytes.
        self.location = location
        #: Byte position inside `location` where validation failed.
        self.position = position


class UnavailableError(S3StreamError):
    """A backend (object store, disk) could not be reached or kept failing; retry later."""

    retryable = True


class ContendedError(UnavailableError):
    """Another conditional write of the same key was in flight, and the service refused this
    one without applying it (S3's 409 ``ConditionalRequestConflict``): contention, not an
    outage. The retry layer tries again soon, at a steady short delay rather than backing off
    as from an outage; the next try sees the key created (or creates it)."""


class BackpressureError(S3StreamError):
    """Appends waited too long for the WAL or the upload pipeline to make room; retry later."""

    retryable = True


class WalFullError(BackpressureError):
    """The write-ahead log stayed full for longer than the configured wait."""


class InvalidArgumentError(S3StreamError, ValueError):
    """An argument has the wrong type or value; the message names it."""
