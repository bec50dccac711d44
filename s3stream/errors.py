"""The error tree of s3stream.

One root (`S3StreamError`) and a few kinds. Every class says, through its `retryable`
attribute, whether trying the same call again later can succeed. Errors raised by backends
(OSError, botocore, fsspec) are translated at the component boundary with ``raise ... from exc``
so callers only ever need to catch these.
"""

from __future__ import annotations

__all__ = [
    "BackpressureError",
    "CorruptionError",
    "FencedError",
    "InvalidArgumentError",
    "ObjectNotFoundError",
    "OffsetOutOfRangeError",
    "S3StreamError",
    "StreamClosedError",
    "StreamNotFoundError",
    "UnavailableError",
    "WalFullError",
]


class S3StreamError(Exception):
    """Root of every error raised by s3stream."""

    #: Whether the same call may succeed if simply tried again later.
    retryable: bool = False


class FencedError(S3StreamError):
    """A newer epoch owns the stream or node; this writer must stop (not retryable)."""


class StreamClosedError(S3StreamError):
    """The stream (or the client, or a WAL) was closed or destroyed."""


class StreamNotFoundError(S3StreamError, LookupError):
    """No stream with that id exists (or it was destroyed)."""


class ObjectNotFoundError(S3StreamError, LookupError):
    """An object store has no object under the key."""


class OffsetOutOfRangeError(S3StreamError, LookupError):
    """The offset lies outside ``[start_offset, confirm_offset)`` of the stream."""


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


class BackpressureError(S3StreamError):
    """Appends waited too long for the WAL or the upload pipeline to make room; retry later."""

    retryable = True


class WalFullError(BackpressureError):
    """The write-ahead log stayed full for longer than the configured wait."""


class InvalidArgumentError(S3StreamError, ValueError):
    """An argument has the wrong type or value; the message names it."""
