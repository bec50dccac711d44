"""The WriteAheadLog contract.

A WAL stores opaque records durably and cheaply-fast, before the data moves to object storage.
Each record gets a `WalPosition`: an int that strictly increases in append order (a byte
position for the file WAL, a sequence for others; positions need not be dense).

Contract, checked by `s3stream.testing.WalTests` for every implementation:

1. Lifecycle: a WAL is usable for appends only after `recover()` has been iterated to its end
   or `reset()` was called; before that, `append` raises `S3StreamError`.
2. `append(data)` returns a Future; futures complete in append order. A future resolves with
   the record's position once the record is durable (per `capabilities.durable_on_ack`), or
   fails; after one failure every later append fails too (no holes are ever acknowledged).
   A record the WAL can never take (larger than `capabilities.max_record_bytes`, not bytes)
   is refused by `append` itself with `InvalidArgumentError`, and so is an append that found
   no room in time (`WalFullError`); neither harms the WAL or any other record.
3. `recover()` yields, in order, every acknowledged record with a position above the trim point
   and nothing else: never a torn or trimmed record, never garbage.
4. `trim(position)` declares records at positions <= `position` no longer needed; trimmed
   records never come back from `recover()`. Trimming is idempotent and monotonic.
5. `reset()` drops every record; later positions stay above every earlier one. After a
   failure whose error is retryable (`err.retryable`: a full disk, an unreachable store),
   `reset()` called once every append future is done makes the WAL take appends again (or
   raises a retryable error while the cause persists, and may be called again later); the
   records that failed are never recovered. After a fatal failure (`FencedError`,
   `CorruptionError`) it raises that error.
6. `close()` waits for in-flight appends, then releases the medium; later calls raise
   `StreamClosedError`.
7. `drive(future)` (optional, default no-op) lends the calling thread to the WAL before it
   blocks on an append future; it changes nothing of the above.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

from .._closeable import Closeable

__all__ = ["WalCapabilities", "WalPosition", "WalRecord", "WriteAheadLog"]

#: Position of a record in a WAL; strictly increasing in append order.
WalPosition = int


class WalRecord(NamedTuple):
    """A record handed back by `WriteAheadLog.recover`."""

    position: WalPosition
    data: bytes


@dataclass(frozen=True, slots=True)
class WalCapabilities:
    """What an implementation claims; the conformance kit tests exactly these claims."""

    #: An acknowledged record survives the death of the writing process.
    persistent: bool
    #: Appends are acknowledged only once durable on the medium (fsync / PUT done).
    durable_on_ack: bool
    #: A crash can leave a partially written record that recovery must detect.
    torn_writes: bool
    #: Fixed capacity: appends block (then fail with `WalFullError`) when it is full.
    bounded_capacity: bool
    #: A newer owner (node epoch) can fence an older writer off the medium.
    fencing: bool
    #: Largest record accepted, in bytes.
    max_record_bytes: int = 64 << 20
    #: `append` acknowledges during the call (its future is done on return), and
    #: `append_and_wait` returns a record's position as cheaply, without a future (a memory WAL).
    acks_on_call: bool = False


class WriteAheadLog(Closeable):
    """Durable, ordered, trimmable log of opaque records."""

    @property
    @abstractmethod
    def capabilities(self) -> WalCapabilities:
        """What this WAL guarantees."""

    @abstractmethod
    def recover(self) -> Iterator[WalRecord]:
        """Yield every live record above the trim point, in position order."""

    @abstractmethod
    def append(self, data: bytes) -> Future[WalPosition]:
        """Append one record; the future resolves with its position once acknowledged."""

    def append_parts(self, head: bytes, tail: bytes) -> Future[WalPosition]:
        """`append` of the record ``head + tail``, given in two parts so that a WAL may write
        a large `tail` (a caller's payload) behind a small `head` without copying it into one
        bytes object first; the record recovered is ``head + tail``. The default joins them.
        """
        return self.append(head + tail)

    def append_and_wait(self, head: bytes, tail: bytes = b"") -> WalPosition:
        """Append the record ``head + tail`` and wait until it is acknowledged; its position.

        A WAL whose capabilities say `acks_on_call` makes this cheaper than `append` (no
        future). The default waits for `append_parts`'s future.
        """
        return self.append_parts(head, tail).result()

    def limit_room_wait(self, remaining_s: Callable[[], float | None]) -> None:
        """Bound the wait of an append for room (a full WAL) by what its caller may still
        wait: `remaining_s()`, called in the appending thread when an append is about to
        wait, gives the seconds left of that call's deadline (None: no limit but the WAL's
        own). The default does nothing: a WAL that never waits for room in `append`. A WAL
        that may wait must not wait past it (it raises `WalFullError` then)."""

    def has_room(self, length: int) -> bool:
        """Whether an append of a `length`-byte record would be taken now without waiting
        for room (a look at this instant, for callers that must not block, such as an event
        loop). The default says True: a WAL that never waits for room in `append`. A WAL
        that may wait must not say True of an append that would wait now."""
        return True

    def drive(self, future: Future[WalPosition]) -> None:
        """Called by a thread about to block on `future`, one of this WAL's append futures.

        An implementation may use the calling thread to make the record durable itself (the
        file WAL commits in it when no commit is under way), sparing the hand-off to a
        background thread and back. It must return promptly when it cannot help, and be
        safe from any thread at any time, also after the future is done. The default does
        nothing.
        """
        return

    @abstractmethod
    def trim(self, position: WalPosition) -> None:
        """Records at positions <= `position` are no longer needed; when this returns, none
        of them is recovered again."""

    @property
    def identity(self) -> int | None:
        """What tells this WAL's medium apart from every other, or None (the default: a WAL
        without one, such as the memory WAL). The client records it for its node when it
        opens a stream (`NodeMeta.wal_uid`) and hands it to the node's next opening of its
        WAL, which refuses a WAL of another identity that holds records (`FileWal`'s and
        `ObjectWal`'s `expect_uid`; docs/file-wal.md, "One WAL, one store")."""
        return None

    def in_completion(self) -> bool:
        """Whether the calling thread is completing this WAL's append futures (running their
        callbacks): what waits there for this WAL to complete more would wait for itself. The
        default says False: a WAL whose futures are done when `append` returns."""
        return False

    def trim_soon(self, position: WalPosition) -> None:
        """`trim`, but it may return before the trim point is durable (a crash soon after
        may recover records at or below `position` again), and it never waits for the WAL's
        own thread: that thread may be running the callbacks of append futures, and one of
        them may wait for the caller of this (an append's callback closing the client waits
        for the upload that trims). For callers that keep those records elsewhere already
        (the uploader: recovery drops what is committed). The default is `trim`."""
        self.trim(position)

    @abstractmethod
    def reset(self) -> None:
        """Drop every record (used after recovered records were uploaded)."""

    @abstractmethod
    def close(self) -> None:
        """Finish in-flight appends and release the medium."""

    def describe(self) -> str:
        """A short human-readable name (for messages and `inspect`)."""
        return type(self).__name__

    def __repr__(self) -> str:
        return self.describe()
