"""The WAL core shared by the file and object WALs: appends queued, written by a background
writer, acknowledged in order.

Roles:

- `PipelinedWal`: everything of a durable WAL that does not depend on its medium. It takes
  appends (checks, framing, positions, the pending queue), makes appenders wait for room and
  calls ``on_full`` (backpressure, ``full_wait_ms``, `WalFullError`), acknowledges groups of
  records strictly in the order they were cut, and keeps the lifecycle (ready, failed,
  closing, closed, abandoned) and its errors. `FileWal` and `ObjectWal` subclass it and supply
  the *medium*: where a frame of a given size goes and whether it fits (`_reserve`), how the
  background writer turns pending records into groups and makes them durable, what trim,
  reset, resume and close do to the medium, and the recovery iterator.
- `Pending`: one appended record, framed, waiting for the writer.
- `Group`: records made durable together (one group commit of the file WAL, one WAL object of
  the object WAL), acknowledged as one.

Semantics, the same for every WAL built on the core (where the file and object WALs used to
differ, the stricter or clearer behaviour, as `s3stream.testing.WalTests` checks it, won):

- *Lifecycle.* Before `recover()` ran to its end or `reset()` was called, `append` and `trim`
  raise `S3StreamError`. From the first `close()` on (also while it runs) every call but
  `close()` raises `StreamClosedError`. A record that is not bytes or larger than
  ``max_record_bytes`` is refused by `append` with `InvalidArgumentError`, harming nothing.
  `recover()` itself is the medium's: the file WAL replays its live records when called on
  a ready WAL, the object WAL (whose replay would re-read the store) refuses that.
- *Room.* An append that does not fit calls ``on_full`` once (no lock held; an exception it
  raises is logged, never passed to the appender) and waits, keeping its turn among appenders,
  until a trim makes room, up to ``full_wait_ms`` on the injected clock; then `WalFullError`.
  The wait is a condition wait with that deadline, woken by trims, failures and close: no
  polling. Called from an append future's callback (the thread that must complete the next
  futures), an append that does not fit raises `WalFullError` at once and skips the queue of
  waiting appenders, since waiting there could only deadlock. `has_room` tells, without
  waiting, whether an append of a given size would wait for room now (for event loops).
- *Order.* Groups are acknowledged in the order they were cut, whatever order their writes
  finish in; the futures of a group complete in position order. Once a group failed, every
  later one fails with the same error, so no hole is ever acknowledged. An interrupt raised
  by a callback is re-raised only once every settled future is completed.
- *Failure.* A failed write fails its group, every pending record and every later append
  with the same error (the first failure wins). After a fatal failure (not ``retryable``:
  `FencedError`, `CorruptionError`) `reset()` raises it; after a retryable one, `reset()`
  waits until nothing is in flight and resumes the medium (the failed records are never
  recovered). Whether a later `append` raises the failure or returns a future already failed
  with it is the one difference left between the WALs (`_raise_when_failed`): tests of each
  pin its present behaviour; both satisfy the contract.
- *Trim.* Positions above the last acknowledged one are refused with `InvalidArgumentError`;
  trimming a failed WAL raises its failure.
- *Close.* Pending records are written and acknowledged first. Every `close()` returns once
  the WAL is closed; only the first raises an error of the final write. Called from an append
  future's callback, `close()` returns at once and the background writer finishes it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from ..clock import Clock
from ..errors import S3StreamError, StreamClosedError, WalFullError
from ..metrics.logs import ContextLogger
from .base import WalCapabilities, WalPosition, WriteAheadLog
from .checks import (
    check_trim_position,
    closed_error,
    not_ready_error,
    record_error,
    record_size_error,
    trim_past_acked_error,
)
from .framing import (
    BLOCK_BYTES,
    FRAME_ALIGN,
    FRAME_HEADER,
    body_crc,
    encode_frame_header,
    frame_size,
)

__all__ = ["Group", "Pending", "PipelinedWal"]

#: Records up to this size are copied into one buffer with their frame header at append time
#: (one iovec, one join later); larger ones are kept as the caller's bytes, without a copy.
_INLINE_RECORD_BYTES = 16 << 10
#: Padding source for frames (a frame is padded to `FRAME_ALIGN`, well below this).
_ZEROS = bytes(FRAME_ALIGN)


class Pending(NamedTuple):
    """An appended record waiting for the writer."""

    position: int
    #: Bytes of its frame (header, record, padding).
    size: int
    #: The frame's bytes: joined for small records, else header, record, padding.
    parts: tuple[bytes, ...]
    future: Future[WalPosition]


@dataclass(slots=True, eq=False)
class Group:
    """Records written together and acknowledged as one, in the order groups were cut."""

    records: list[Pending]
    #: Settled: written (`error` None) or failed; its turn to be acknowledged may still wait.
    done: bool = False
    error: S3StreamError | None = None


class PipelinedWal(WriteAheadLog):
    """The medium-independent part of a WAL with a background writer (module docstring).

    A subclass calls ``super().__init__`` first, sets `_capabilities`, `_max_record`, `_seed`
    and `_session` (and `_wake_bytes` if its writer waits to fill batches), and implements the
    medium hooks below. Its writer takes records with `_cut_pending`, appends the `Group` it
    makes of them to `_unacked`, and once the write is done (or failed) settles it: under
    `_cond` it sets ``done`` (or calls `_fail_locked`), then `_take_turn`, and after releasing
    the lock passes what that returned to `_complete_turn`. When its writer stops with
    `_close_later` set, it finishes the close (`_stop`, `_release`).

    Locks: `_cond` (over `_lock`) guards all state and is never held while futures complete
    or the medium is written, except where a subclass says so; `_order_lock` is taken before
    it by appenders only.
    """

    #: After a failure: True, `append` raises it; False, it returns a future failed with it.
    _raise_when_failed: ClassVar[bool] = True
    #: Whether `drive` commits in the caller's thread (then a caller that says it will drive
    #: its append does not wake the writer: `append(driven=True)`). A medium may set it per
    #: instance (the file WAL does, from its settings).
    _drives: bool = False
    #: Whether settling a group notifies `_cond` (every waiter, the writer included). A medium
    #: that notifies exactly the waiters an acknowledgement concerns turns it off.
    _notify_on_ack: ClassVar[bool] = True

    def __init__(
        self,
        *,
        clock: Clock,
        on_full: Callable[[], None] | None,
        full_wait_ms: int,
        log: ContextLogger,
    ) -> None:
        self._clock = clock
        self._on_full = on_full
        self._full_wait_s = full_wait_ms / 1000
        self._room_limit: Callable[[], float | None] | None = None
        self._log = log
        self._capabilities: WalCapabilities
        #: `WalCapabilities.max_record_bytes`, at hand for the append path.
        self._max_record: int
        #: Frame checksum seed and session number of the frames written now.
        self._seed = 0
        self._session = 0
        #: The writer is woken when the first record is pending (unless its caller commits it:
        #: `append(driven=True)`), and when this many bytes are.
        self._wake_bytes = sys.maxsize

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        #: Serialises appenders, so that one waiting for room keeps its turn.
        self._order_lock = threading.Lock()
        #: Appenders waiting for room in `_admit` (they hold `_order_lock`): read by `has_room`.
        self._room_waiters = 0
        self._pending: deque[Pending] = deque()
        self._pending_bytes = 0
        #: Groups cut and not yet acknowledged, in cut order.
        self._unacked: deque[Group] = deque()
        #: The thread completing futures now (it holds the completion turn), if any.
        self._completing: int | None = None
        #: Threads waiting in `_wait_idle` (they need a wake-up when the turn ends).
        self._idle_waiters = 0
        #: The error every later group is completed with once one failed.
        self._ack_failure: S3StreamError | None = None
        #: The highest position acknowledged (or trimmed, or recovered): trims go up to it.
        self._acked = -1
        #: Asks a writer that waits to fill batches to write what is pending now.
        self._flush_now = False
        #: A record was appended without waking the writer (`append(driven=True)`) and its
        #: caller has not called `drive` yet: the next append wakes the writer, so a driver
        #: that never comes (an exception between the two calls) delays a record, never
        #: strands it.
        self._awaiting_driver = False

        self._ready = False
        self._closing = False
        self._closed = False
        self._abandoned = False
        #: Close was called from a completion callback: the writer finishes it when it stops.
        self._close_later = False
        self._failed: S3StreamError | None = None
        #: An error of the final write, raised by the first `close()`.
        self._close_error: S3StreamError | None = None

    # ------------------------------------------------------------------ the medium

    @abstractmethod
    def _reserve(self, size: int) -> int:
        """(Lock held.) The position of a new frame of `size` bytes, its space claimed, or -1
        if it does not fit now."""

    @abstractmethod
    def _room(self) -> tuple[int, int]:
        """(Lock held.) Bytes untrimmed and the capacity, for `WalFullError`."""

    @abstractmethod
    def _acknowledged(self, group: Group) -> None:
        """(Lock held.) `group` is acknowledged now (before its futures complete)."""

    @abstractmethod
    def _persist_trim(self, position: int, *, wait: bool) -> None:
        """Persist the trim point `position` (checked already; no lock held); without
        `wait`, a medium whose background thread persists it may return before (`trim_soon`)."""

    @abstractmethod
    def _ready_without_records(self) -> None:
        """`reset()` before `recover()`: become ready without reading any record, positions
        above every earlier one (no lock held)."""

    @abstractmethod
    def _drop_all(self) -> None:
        """`reset()` of a ready WAL with nothing in flight: drop every record."""

    @abstractmethod
    def _resume(self, failure: S3StreamError) -> str:
        """`reset()` after the retryable `failure`, nothing in flight: make the medium take
        appends again, clearing the failure under the lock (`_clear_failure_locked`) before
        the writer runs again, and say where it resumed (for the log); raise (a retryable
        error: reset may be called again later) if it cannot."""

    @abstractmethod
    def _stop(self, *, abandon: bool) -> None:
        """Stop the background writer, once it wrote everything pending unless `abandon`
        (`_closing` is set); no lock held. Called by every `close()`: idempotent."""

    @abstractmethod
    def _release(self, *, clean: bool) -> None:
        """Release the medium (a clean shutdown if `clean`) and set `_closed`; idempotent.
        An error to report goes to `_close_error`."""

    # ------------------------------------------------------------------ introspection

    @property
    def capabilities(self) -> WalCapabilities:
        return self._capabilities

    # ------------------------------------------------------------------ state checks

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise closed_error(self.describe())

    def _check_ready(self, what: str) -> None:
        self._check_open()
        if not self._ready:
            raise not_ready_error(self.describe(), what)

    def _check_usable(self, what: str) -> None:
        """Open, ready and not failed (lock held)."""
        self._check_ready(what)
        if self._failed is not None:
            raise self._failed

    def in_completion(self) -> bool:
        """`WriteAheadLog.in_completion`; a close from there returns at once and the
        completing thread finishes it."""
        return self._completing == threading.get_ident()

    # ------------------------------------------------------------------ append

    def append(self, data: bytes, *, driven: bool = False) -> Future[WalPosition]:
        """Append one record (`WriteAheadLog.append`).

        `driven`: the caller promises to call `drive` with the returned future next, so the
        writer thread is not woken for it (only a WAL whose `drive` commits, `_drives`). A
        synchronous appender then commits its own record without the writer ever running:
        a wake-up it does not need costs a context switch and a fight for the GIL with the
        committing thread, per append.
        """
        return self.append_parts(data, b"", driven=driven)

    def append_parts(
        self, head: bytes, tail: bytes, *, driven: bool = False
    ) -> Future[WalPosition]:
        """`append` of the record ``head + tail`` (`WriteAheadLog.append_parts`): a large
        `tail` goes into the vectored write as it is, never copied behind `head`."""
        if type(head) is not bytes or type(tail) is not bytes:
            raise record_error(head if type(head) is not bytes else tail, 0, self.describe())
        length = len(head) + len(tail)
        if length > self._max_record:
            raise record_size_error(length, self._max_record, self.describe())
        size = frame_size(length)
        crc = body_crc(head, self._seed)
        if tail:
            crc = body_crc(tail, crc)
        fut: Future[WalPosition] = Future()
        # Running: nobody can cancel it, so completing it never fails.
        fut.set_running_or_notify_cancel()
        in_callback = self._completing == threading.get_ident()
        # In a callback the order lock may be held by an append waiting for this very thread.
        order = _NO_LOCK if in_callback else self._order_lock
        with order, self._cond:
            if self._ready and not self._closing and self._failed is None:
                pos = self._reserve(size)
            else:
                pos = -1
            if pos < 0:
                pos = self._admit(size, in_callback)
                if pos < 0:
                    failed = self._failed
                    assert failed is not None
                    if self._raise_when_failed:
                        raise failed
                    fut.set_exception(failed)
                    return fut
            frame = encode_frame_header(pos, self._session, length, crc, self._seed)
            pad = size - FRAME_HEADER.size - length
            if length <= _INLINE_RECORD_BYTES:
                parts: tuple[bytes, ...] = (frame + head + tail + _ZEROS[:pad],)
            elif tail:
                parts = (frame, head, tail, _ZEROS[:pad])
            else:
                parts = (frame, head, _ZEROS[:pad])
            pending = self._pending
            pending.append(Pending(pos, size, parts, fut))
            self._pending_bytes += size
            if driven and self._drives and not self._awaiting_driver:
                self._awaiting_driver = True
            elif (
                len(pending) == 1 or self._pending_bytes >= self._wake_bytes
            ) or self._awaiting_driver:
                self._cond.notify_all()
        return fut

    def wake(self) -> None:
        """The caller of a ``driven`` append will not drive it after all (it was interrupted
        or failed between the two): wake the writer thread, which commits what is pending.
        Safe from any thread at any time; a wake-up with nothing to do costs one look."""
        with self._cond:
            self._awaiting_driver = False
            self._cond.notify_all()

    def _admit(self, size: int, in_callback: bool) -> int:
        """The slow path of `append` (lock held): check the state, wait for room. The position
        claimed, or -1 if the WAL failed."""
        self._check_ready("append()")
        if self._failed is not None:
            return -1
        pos = self._reserve(size)
        if pos >= 0:
            return pos
        if in_callback:
            raise WalFullError(self._full_message(size, 0.0))
        self._room_waiters += 1
        try:
            return self._wait_for_room(size)
        finally:
            self._room_waiters -= 1

    def _wait_for_room(self, size: int) -> int:
        """(Lock held; counted in `_room_waiters`.) `_admit`'s wait: the position claimed,
        -1 if the WAL failed, `WalFullError` after ``full_wait_ms``."""
        started = self._clock.monotonic()
        wait_s = self._full_wait_s
        caller_s = self._room_limit() if self._room_limit is not None else None
        if caller_s is not None:
            wait_s = max(0.0, min(wait_s, caller_s))
        deadline = started + wait_s
        if self._on_full is not None:
            self._cond.release()
            try:
                self._call_on_full()
            finally:
                self._cond.acquire()
        while True:
            self._check_ready("append()")
            if self._failed is not None:
                return -1
            pos = self._reserve(size)
            if pos >= 0:
                return pos
            now = self._clock.monotonic()
            if now >= deadline:
                raise WalFullError(self._full_message(size, now - started))
            self._cond.wait(deadline - now)

    def limit_room_wait(self, remaining_s: Callable[[], float | None]) -> None:
        self._room_limit = remaining_s

    def has_room(self, length: int) -> bool:
        """Whether an append of a `length`-byte record would be taken now without waiting
        for room: no appender waits for room (a later one would queue behind it) and a frame
        of that size fits, with room to spare for any medium's alignment (a block at each end
        of the live bytes). Asked before an append by callers that must not block (an event
        loop: `Appender.would_wait`); it never waits itself (a busy state lock: False).

        Conservative: it may say False of a frame that would just fit (whose append then only
        takes a slower path), never True of one that would wait now; but it is a look at this
        instant: an append from another thread may take the room just after. A WAL that is
        not ready, closing or failed says True: an append there fails at once, it does not
        wait."""
        if self._room_waiters:
            return False
        size = frame_size(length)
        # Not waited for: a medium may hold the state lock across its own I/O (a file WAL
        # writing its clean-shutdown header), which a device that stopped answering makes
        # endless. Busy, the answer is "it would wait".
        if not self._cond.acquire(blocking=False):
            return False
        try:
            if self._room_waiters:
                return False
            if not self._ready or self._closing or self._failed is not None:
                return True
            used, capacity = self._room()
        finally:
            self._cond.release()
        # An empty WAL takes any record it takes at all (one larger than `max_record_bytes`
        # is refused at once, it never waits).
        return used == 0 or used + size + FRAME_ALIGN + 2 * BLOCK_BYTES <= capacity

    def _call_on_full(self) -> None:
        assert self._on_full is not None
        try:
            self._on_full()
        except Exception:
            self._log.exception("%s: the on_full callback failed", self.describe())

    def _full_message(self, size: int, waited: float) -> str:
        used, capacity = self._room()
        return (
            f"{self.describe()} is full: a {size}-byte frame does not fit while {used} of "
            f"{capacity} bytes hold untrimmed records (waited {waited * 1000:.0f} ms; records "
            "must be uploaded and trimmed)"
        )

    # ------------------------------------------------------------------ the writer's side

    def _cut_pending(self, max_bytes: int) -> list[Pending]:
        """(Lock held.) Take the oldest pending records: at least one, then up to `max_bytes`
        of frames."""
        pending = self._pending
        records: list[Pending] = []
        total = 0
        while pending and (not records or total + pending[0].size <= max_bytes):
            rec = pending.popleft()
            records.append(rec)
            total += rec.size
        self._pending_bytes -= total
        if not pending:
            self._flush_now = False
        return records

    def _fail_locked(self, err: S3StreamError) -> None:
        """(Lock held.) The WAL failed with `err` (unless it failed already: the first failure
        wins): every pending record and every later append fails."""
        if self._failed is None:
            self._failed = err
            self._log.error("%s failed; appends fail until reset(): %s", self.describe(), err)
        self._doom_pending(err)

    def _doom_pending(self, err: S3StreamError) -> None:
        """(Lock held.) Fail every pending record with `err`, in order after the groups cut."""
        if self._pending:
            self._unacked.append(Group(list(self._pending), done=True, error=err))
            self._pending.clear()
            self._pending_bytes = 0
        self._cond.notify_all()

    def _clear_failure_locked(self) -> None:
        """(Lock held.) The medium resumed: appends are taken again."""
        self._failed = None
        self._ack_failure = None
        self._cond.notify_all()

    # ------------------------------------------------------------------ in-order completion

    def _take_turn(self) -> list[tuple[Group, S3StreamError | None]]:
        """(Lock held.) Pop the settled groups at the head of `_unacked`, each with the error
        to complete it with, taking the completion turn if there are any; empty if there are
        none or another thread holds the turn (it completes them). Pass a non-empty result to
        `_complete_turn` once the lock is released."""
        if self._completing is not None:
            return []
        ready = self._pop_settled()
        if ready:
            self._completing = threading.get_ident()
        return ready

    def _pop_settled(self) -> list[tuple[Group, S3StreamError | None]]:
        unacked = self._unacked
        ready: list[tuple[Group, S3StreamError | None]] = []
        while unacked and unacked[0].done:
            group = unacked.popleft()
            error = self._ack_failure or group.error
            if error is None:
                self._acked = group.records[-1].position
                self._acknowledged(group)
            else:
                self._ack_failure = error
            ready.append((group, error))
        if ready and self._notify_on_ack:
            self._cond.notify_all()
        return ready

    def _complete_turn(self, ready: list[tuple[Group, S3StreamError | None]]) -> None:
        """Complete the futures of `ready` (from `_take_turn`) and of every group settled
        meanwhile, in order; then give the turn back. No lock held. An interrupt raised by a
        callback is raised once every settled group is completed: nobody may wait forever."""
        interrupt: BaseException | None = None
        while ready:
            for group, error in ready:
                try:
                    _complete(group.records, error)
                except BaseException as exc:
                    interrupt = interrupt or exc
            with self._cond:
                ready = self._pop_settled()
                if not ready:
                    self._completing = None
                    if self._idle_waiters:
                        self._cond.notify_all()
        if interrupt is not None:
            raise interrupt

    def _wait_idle(self) -> None:
        """Wait until every append so far is completed (no lock held). In a completion
        callback it returns at once: the calling thread is the one that must complete them."""
        with self._cond:
            if self.in_completion():
                return
            self._flush_now = True
            self._cond.notify_all()
            self._idle_waiters += 1
            try:
                while self._pending or self._unacked or self._completing is not None:
                    self._cond.wait()
            finally:
                self._idle_waiters -= 1

    # ------------------------------------------------------------------ trim, reset

    def trim(self, position: WalPosition) -> None:
        self._check_trim(position, "trim()")
        self._persist_trim(position, wait=True)

    def trim_soon(self, position: WalPosition) -> None:
        self._check_trim(position, "trim_soon()")
        self._persist_trim(position, wait=False)

    def _check_trim(self, position: WalPosition, call: str) -> None:
        check_trim_position(position)
        with self._cond:
            self._check_usable(call)
            if position > self._acked:
                raise trim_past_acked_error(self.describe(), position, self._acked)

    def reset(self) -> None:
        """Drop every record; after a retryable failure, also resume taking appends (module
        docstring; the medium's `_resume` says how)."""
        with self._cond:
            self._check_open()
            ready = self._ready
        if not ready:
            self._ready_without_records()
        self._wait_idle()
        with self._cond:
            self._check_open()
            failed = self._failed
        if failed is None:
            self._drop_all()
            return
        if not failed.retryable:
            raise failed
        where = self._resume(failed)
        self._log.warning("%s resumed %s after: %s", self.describe(), where, failed)

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        with self._cond:
            first = not (self._closing or self._closed)
            self._closing = True
            self._cond.notify_all()
            if self.in_completion():
                # This thread must go on completing futures: the writer finishes the close.
                self._close_later = True
                return
        try:
            self._stop(abandon=False)
        finally:
            self._release(clean=True)
        if first and self._close_error is not None:
            raise self._close_error

    def _abandon(self) -> None:
        """Stop as a crash would, for tests: pending records are never written, no clean
        shutdown."""
        with self._cond:
            if self._closed:
                return
            self._closing = self._abandoned = True
            self._cond.notify_all()
        self._stop(abandon=True)
        with self._cond:
            self._doom_pending(StreamClosedError(f"{self.describe()} was abandoned"))
            ready = self._take_turn()
        if ready:
            self._complete_turn(ready)
        self._release(clean=False)


#: Stands in for the order lock in a completion callback.
_NO_LOCK = contextlib.nullcontext()


def _complete(records: list[Pending], error: S3StreamError | None) -> None:
    """Complete the futures of `records` in order, with their positions or `error`. An
    interrupt (raised by a callback, or delivered between two completions) still completes
    the rest, since nobody may wait for them forever, and is raised after."""
    i = 0
    try:
        if error is None:
            for i, rec in enumerate(records):  # noqa: B007 - `i` is read on an interrupt
                rec.future.set_result(rec.position)
        else:
            for i, rec in enumerate(records):  # noqa: B007
                rec.future.set_exception(error)
    except BaseException:
        for rec in records[i:]:
            if rec.future.done():
                continue
            if error is None:
                rec.future.set_result(rec.position)
            else:
                rec.future.set_exception(error)
        raise
