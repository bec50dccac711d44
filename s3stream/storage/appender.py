"""The append path: offsets, the WAL write, and acknowledgement into the LogCache.

A batch gets its offsets and is written to the WAL under one append lock, so WAL order equals
offset order within each stream and completion callbacks run in WAL order. When the WAL
acknowledges it, the batch enters the LogCache (pinned until uploaded) and the stream's
confirm offset advances. Appends wait (outside the lock, on the pipeline's condition) while
the WAL is under repair or the upload backlog is full.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from .._futures import CompletedFutures
from ..cache.log_cache import APART_MIN_BYTES, CachedBatch, LogCache
from ..clock import Clock
from ..errors import (
    BackpressureError,
    InvalidArgumentError,
    OffsetMismatchError,
    S3StreamError,
    StreamClosedError,
    UnavailableError,
    WalFullError,
)
from ..format.batch import (
    BATCH_HEADER,
    WAL_PREFIX,
    WAL_RECORD_VERSION,
    encode_batch,
    encode_batch_head,
)
from ..metrics.components import StorageInstruments
from ..settings import ClientSettings
from ..types import AppendResult, RecordBatch
from ..wal.base import WalPosition, WriteAheadLog
from ..wal.pipeline import PipelinedWal
from .producers import ProducerTable
from .status import PipelineStatus

__all__ = ["Appender", "WriterState", "deadline_text"]


def not_acknowledged(
    stream_id: int, within: str, *, conditional: bool, idempotent: bool
) -> UnavailableError:
    """The error of an append not acknowledged by its deadline (it may still become durable),
    with what a retry of that kind of append does."""
    if idempotent:
        retry = "a retry with the same producer_id and sequence returns its outcome, never a copy"
    elif conditional:
        retry = "a retry with the same expected_offset lands once or raises OffsetMismatchError"
    else:
        retry = "a retry can then duplicate it"
    return UnavailableError(
        f"append to stream {stream_id} was not acknowledged within {within}; it may still "
        f"become durable ({retry})"
    )


@dataclass(slots=True)
class WriterState:
    """Per-stream append state of the owning client."""

    stream_id: int
    epoch: int
    next_offset: int
    confirm_offset: int
    wal_prefix: bytes
    #: Set once the stream can take no more appends (fenced, closed, WAL failure).
    error: S3StreamError | None = None
    #: Readers waiting for `confirm_offset` to move (`wait_for_data`); appends notify `tail`
    #: only while there are some, so a stream nobody tails pays no lock per append.
    tailers: int = 0
    #: Idempotent producers of the stream (built on its first idempotent append).
    producers: ProducerTable | None = None
    #: Set when the client stops taking appends: waiting readers return.
    stopped: bool = False
    #: The condition tailers wait on, made on first use (`tail`): a client of 10,000 streams
    #: nobody tails keeps no condition per stream (eight objects under the cyclic garbage
    #: collector's eye each, which every full collection walks).
    _tail: threading.Condition | None = None
    #: The client's lock that makes `_tail` once however many threads ask at once.
    made_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def tail(self) -> threading.Condition:
        """The stream's condition (and lock) for its tailers."""
        cond = self._tail
        if cond is None:
            with self.made_lock:
                cond = self._tail
                if cond is None:
                    cond = self._tail = threading.Condition()
        return cond

    def wake_tailers(self) -> None:
        """Wake readers waiting for new data (after an append, or when appends stop)."""
        cond = self._tail
        if cond is None:
            return  # nobody ever waited: there is no one to wake
        with cond:
            cond.notify_all()

    def wait_for_data(self, offset: int, timeout_s: float, clock: Clock) -> bool:
        """Wait up to `timeout_s` until `confirm_offset` passes `offset` or appends stop;
        whether there is data at `offset` now."""
        deadline = clock.monotonic() + timeout_s

        def over() -> bool:
            return (
                self.confirm_offset > offset
                or self.error is not None
                or self.stopped
                or clock.monotonic() >= deadline
            )

        with self.tail:
            self.tailers += 1
            try:
                # An append sets confirm_offset before it reads `tailers`: a waiter counted
                # after that read sees the new offset here, so no wake-up is lost. The wait
                # ends at the deadline on the injected clock or after `timeout_s` of real
                # time, whichever comes first (as `StreamClient.close` waits): a clock that
                # does not move by itself (`ManualClock`) must not keep a reader forever.
                self.tail.wait_for(over, timeout_s)
            finally:
                self.tailers -= 1
        return self.confirm_offset > offset

    def unsettled(self, expected: int) -> bool:
        """Whether an append in flight holds offset `expected` (assigned, not acknowledged):
        a conditional append at it must wait for that one to settle (`wait_settled`)."""
        return self.confirm_offset <= expected < self.next_offset

    def wait_settled(self, expected: int, deadline: float, clock: Clock) -> None:
        """Wait, counted among the tailers (an acknowledgement and a rewind wake them), until
        offset `expected` is no longer held by an append in flight: acknowledged
        (`confirm_offset` passed it) or handed back by a WAL repair (`next_offset` rewound
        to it or below); `UnavailableError` at `deadline` (`clock`'s, bounded in real time
        too, as `wait_for_data`). A conditional append's wait (`Appender._append_counted`)."""
        remaining = deadline - clock.monotonic()

        def settled() -> bool:
            return (
                self.confirm_offset > expected
                or self.next_offset <= expected
                or self.error is not None
                or self.stopped
                or clock.monotonic() >= deadline
            )

        cond = self.tail
        # Bounded, as every wait here (the condition's lock is held only briefly now that
        # producer tables are rebuilt under a lock of their own).
        locked = cond.acquire(timeout=max(0.0, remaining))
        try:
            if locked:
                self.tailers += 1
                try:
                    cond.wait_for(settled, max(0.0, deadline - clock.monotonic()))
                finally:
                    self.tailers -= 1
            if self.error is not None or self.stopped:
                return  # the caller's next look under the append lock raises the reason
            if self.unsettled(expected):
                raise UnavailableError(
                    f"stream {self.stream_id}: expected_offset={expected} is taken by an append "
                    f"still in flight (acknowledged up to {self.confirm_offset}): whether it "
                    "lands is not known yet; nothing was written by this call, retry with the "
                    "same expected_offset"
                )
        finally:
            if locked:
                cond.release()


class _AppendFuture(Future[AppendResult]):
    """An append's future, which knows whether its failure was counted already: a
    synchronous append that timed out is counted then, and not again when the WAL write it
    waited for fails later (`Appender._count_failure`)."""

    counted = False


#: (the caller's future, the WAL's future to drive: None for a duplicate of an append in
#: flight, the call's deadline if a wait computed one).
_Pending = tuple[Future[AppendResult], Future[WalPosition] | None, float | None]
#: An idempotent append's (producer id, sequence).
Ident = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Released:
    """What `Appender.release_writer` stopped: the writer's acknowledged end (None: this
    client had no writer of the stream) and, with `discard`, the LogCache entries it dropped
    that were not uploaded yet, in offset order."""

    confirm_offset: int | None
    dropped: list[CachedBatch]


class Appender:
    """Assigns offsets, writes WAL records and acknowledges them (see the module docstring)."""

    def __init__(
        self,
        *,
        status: PipelineStatus,
        wal: WriteAheadLog,
        cache: LogCache,
        settings: ClientSettings,
        clock: Clock,
        instruments: StorageInstruments,
    ) -> None:
        self._status = status
        self._wal = wal
        #: The append in the WAL's hands (set under the append lock): when it started and
        #: its own timeout, so that a WAL waiting for room stops at this call's deadline
        #: (`_room_wait_left`) rather than at its own ``full_wait_ms``.
        self._call_started = 0.0
        self._call_timeout: float | None = None
        wal.limit_room_wait(self._room_wait_left)
        self._cache = cache
        self._settings = settings
        self._clock = clock
        self._ins = instruments
        # Bound once: the append path reads the clock twice and records once per append.
        self._mono = clock.monotonic
        self._record_append = instruments.append.record
        # One lock orders offsets, WAL appends and completion callbacks (module docstring).
        self._lock = threading.RLock()
        self._writers: dict[int, WriterState] = {}
        #: WAL record prefixes by epoch, one bytes object shared by every stream at that epoch
        #: (an append to 10,000 streams round robin then reads one hot object, not one each).
        self._prefixes: dict[int, bytes] = {}
        #: Makes each writer's tail condition once (`WriterState.tail`): one lock, not one
        #: per stream.
        self._tail_made = threading.Lock()
        #: The WAL's record limit (its capabilities do not change), checked per append.
        self._max_record_bytes = wal.capabilities.max_record_bytes
        self._completed = CompletedFutures()
        self._upload_threshold = settings.upload_threshold_bytes
        #: Threads waiting (on `status.cond`) for `status.outstanding` to reach 0; the last
        #: outstanding append notifies only when there are some, since the uploader sleeps on
        #: that condition too and would be woken by every append for nothing.
        self._quiet_waiters = 0
        #: The WAL append (head, tail) of a synchronous call that drives its own commit
        #: (`append_and_wait`): a WAL built on the pipeline core then leaves its writer thread
        #: asleep. A payload of `APART_MIN_BYTES` or more is the tail, never copied behind
        #: its record's head (`WriteAheadLog.append_parts`).
        self._wal_append_driven: Callable[[bytes, bytes], Future[WalPosition]] = wal.append_parts
        status.on_node_lost(self._fail_writers)
        #: Wakes the WAL's writer for a driven append that will not be driven after all.
        self._wal_wake: Callable[[], None] = _nothing
        if isinstance(wal, PipelinedWal):
            pipelined = wal

            def append_driven(head: bytes, tail: bytes) -> Future[WalPosition]:
                return pipelined.append_parts(head, tail, driven=True)

            self._wal_append_driven = append_driven
            self._wal_wake = pipelined.wake
        #: A WAL that acknowledges on the call (`WalCapabilities.acks_on_call`, a memory WAL)
        #: takes records through `append_and_wait`: no future.
        self._wal_store: Callable[[bytes, bytes], WalPosition] | None = (
            wal.append_and_wait if wal.capabilities.acks_on_call else None
        )

    # ------------------------------------------------------------------ writers

    def register_writer(self, stream_id: int, epoch: int, end_offset: int) -> WriterState:
        """Make this client the appender of a stream it has just opened."""
        with self._lock:
            prefix = self._prefixes.get(epoch)
            if prefix is None:
                prefix = WAL_PREFIX.pack(WAL_RECORD_VERSION, epoch)
                if len(self._prefixes) < 1024:  # epochs are small numbers; bounded anyway
                    self._prefixes[epoch] = prefix
            w = WriterState(
                stream_id, epoch, end_offset, end_offset, prefix, made_lock=self._tail_made
            )
            self._writers[stream_id] = w
        return w

    def release_writer(
        self,
        stream_id: int,
        error: S3StreamError,
        *,
        epoch: int | None = None,
        discard: bool = False,
        live_only: bool = False,
    ) -> Released | None:
        """Stop appends to a stream (closed, destroyed or fenced): appends of its writer
        still completing are refused, not acknowledged; with `discard`, also drop its
        entries from the LogCache. With `epoch`, only if this client does not append to
        the stream at another epoch (it reopened the stream since: that writer and its
        entries stay) and, with `discard`, did not let that epoch go already (a destroy, or
        an earlier drop that was reported). With `live_only`, only while that writer is
        still appending (no close or fence stopped it: those decided its entries already).
        Checked and done under the append lock, so a reopen, a release or a second drop
        cannot slip in between; what was stopped, or None if nothing was done."""
        with self._lock:
            w = self._writers.get(stream_id)
            if epoch is not None and w is not None and w.epoch != epoch:
                return None
            if live_only and (w is None or w.error is not None):
                return None
            if discard and epoch is not None:
                gone = self._cache.discarded_epoch(stream_id)
                if gone is not None and gone >= epoch:
                    return None
            self._writers.pop(stream_id, None)
            if w is not None and w.error is None:
                w.error = error
            stopped = w.epoch if w is not None else epoch
            dropped: list[CachedBatch] = []
            if discard:
                dropped = self._cache.discard_stream(stream_id, stopped)
            elif stopped is not None:
                # Appends of this writer still in the WAL are not acknowledged afterwards.
                self._cache.refuse(stream_id, stopped)
            confirmed = None if w is None else w.confirm_offset
        if w is not None:
            w.wake_tailers()
        return Released(confirmed, dropped)

    def _fail_writers(self, err: S3StreamError) -> None:
        """The client failed for good (its node was taken over): every stream handle fails
        with `err` and its tails end. A tail of a handle whose node was taken over waited
        for ever, and its fetches returned nothing while the stream grew under its new
        owner. Not under the append lock, which an append waiting for room may hold: each
        writer's error is one attribute, set once."""
        for w in list(self._writers.values()):
            if w.error is None:
                w.error = err
            w.wake_tailers()

    def confirm_offset(self, stream_id: int) -> int | None:
        """The acknowledged end of a stream this client appends to (None: not appending)."""
        w = self._writers.get(stream_id)
        return None if w is None else w.confirm_offset

    def refuse_appends(self, deadline: float | None) -> bool:
        """Refuse every later append; False if they were refused already.

        An append may hold the lock while the WAL waits for room: this does not queue behind
        it past `deadline`. Without the lock the flag still stops every append that has not
        yet passed its check; one that has is waited for as outstanding.
        """
        if deadline is None:
            locked = self._lock.acquire()
        else:
            locked = self._lock.acquire(timeout=max(0.0, deadline - self._clock.monotonic()))
        try:
            if self._status.closing:
                return False
            self._status.closing = True
            self._status.notify()
            for w in list(self._writers.values()):
                w.stopped = True
                w.wake_tailers()
            return True
        finally:
            if locked:
                self._lock.release()

    def wait_quiet(self, deadline: float) -> None:
        """Wait until no append waits for the WAL, or raise `UnavailableError` at `deadline`."""
        status = self._status
        with status.cond:
            if status.outstanding > 0 and self._wal.in_completion():
                # They complete on this very thread once the callback running here returns:
                # waiting would only spend the deadline.
                raise UnavailableError(
                    f"{status.outstanding} appends were still waiting for the WAL, whose thread "
                    "is running this append future's callback: they complete once it returns, "
                    "after this close; what they acknowledge stays in the WAL, and the next "
                    "open of this node recovers it (close from another thread to wait for them)"
                )
            while status.outstanding > 0:
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    raise UnavailableError(
                        f"{status.outstanding} appends were still waiting for the WAL at "
                        "the close deadline"
                    )
                self._quiet_waiters += 1
                try:
                    status.cond.wait(remaining)
                finally:
                    self._quiet_waiters -= 1

    def rewind_when_quiet(self, wait_s: float) -> bool:
        """Once every append in flight has completed, hand out offsets again from each
        stream's confirm offset (WAL repair: what was not acknowledged never was). False:
        appends are still in flight after waiting `wait_s` (they notify when they finish)."""
        status = self._status
        with self._lock, status.cond:
            if status.outstanding != 0:
                self._quiet_waiters += 1
                try:
                    status.cond.wait(wait_s)
                finally:
                    self._quiet_waiters -= 1
                return False
            waiting = []
            for w in self._writers.values():
                w.next_offset = w.confirm_offset
                if w.tailers:
                    waiting.append(w)
        # Conditional appends wait among the tailers for the offset they expect to be
        # acknowledged or handed out again (`WriterState.wait_settled`): it is handed out
        # again now. Woken outside the append lock, which is not to be held while waiting for
        # another lock.
        for w in waiting:
            w.wake_tailers()
        return True

    # ------------------------------------------------------------------ appends

    def append(
        self,
        w: WriterState,
        batch: RecordBatch,
        expected: int | None = None,
        ident: Ident | None = None,
    ) -> Future[AppendResult]:
        """Assign offsets, write the WAL record; the future resolves once it is durable.
        With `expected`, only if the stream's next offset is `expected`
        (`OffsetMismatchError` otherwise, raised at the call); while an append in flight
        holds offset `expected`, the call waits for it to be acknowledged (then
        `OffsetMismatchError`) or to fail and be rewound (then this append lands there),
        up to its deadline (`UnavailableError`, nothing written). With `ident` (the batch
        carries it in its properties, `w.producers` is built): a duplicate returns the
        original outcome, an out-of-order sequence raises `SequenceError`."""
        r = self._append(w, batch, None, expected, ident)
        return r[0] if isinstance(r, tuple) else self._completed.result(r)

    def append_and_wait(
        self,
        w: WriterState,
        batch: RecordBatch,
        timeout_s: float | None = None,
        expected: int | None = None,
        ident: Ident | None = None,
    ) -> AppendResult:
        """`append`, then wait for durability (no future at all when the WAL acks at once).

        Without `timeout_s` the wait is bounded by `call_timeout_ms`. On timeout the append
        may still become durable later: `UnavailableError` says so.
        """
        if self._wal.in_completion():
            raise InvalidArgumentError(
                "a synchronous append cannot run in an append future's callback: the callback "
                "runs on the WAL's thread, which would have to make this append durable while "
                "it waits for it; use append_async there"
            )
        timeout = self._settings.call_limit_s(timeout_s)
        r = self._append(w, batch, timeout, expected, ident, driven=timeout_s is None)
        if not isinstance(r, tuple):
            return r  # durable already (no clock read on this path)
        result, wal_future, call_deadline = r
        if timeout_s is None and wal_future is not None:
            # The WAL may make the record durable in this thread (`WriteAheadLog.drive`); with
            # a timeout the wait must stay interruptible, so the WAL's own thread does it.
            try:
                self._wal.drive(wal_future)
            except BaseException:
                # Interrupted (Ctrl-C) before or while committing: the writer thread, which
                # the driven append left asleep, must commit the record instead.
                self._wal_wake()
                raise
        try:
            # What `_append` spent waiting for room counts (it set the call's deadline then).
            return result.result(
                timeout
                if call_deadline is None
                else max(0.0, call_deadline - self._clock.monotonic())
            )
        except TimeoutError as exc:
            self._count_failure(result, exc)
            raise not_acknowledged(
                w.stream_id,
                deadline_text(timeout_s, self._settings),
                conditional=expected is not None,
                idempotent=ident is not None,
            ) from exc

    def _append(
        self,
        w: WriterState,
        batch: RecordBatch,
        call_timeout: float | None = None,
        expected: int | None = None,
        ident: Ident | None = None,
        driven: bool = False,
    ) -> AppendResult | _Pending:
        """Append under the lock; the result, or (its future, the WAL's future, the call's
        deadline if a wait made it compute one). `call_timeout`: of a synchronous call;
        `driven`: the caller drives the WAL future it gets (`WriteAheadLog.drive`). A
        refused append is counted here, for both entry points."""
        try:
            return self._append_counted(w, batch, call_timeout, expected, ident, driven)
        except BaseException as exc:
            self._ins.append_failed(exc)
            raise

    def _append_counted(
        self,
        w: WriterState,
        batch: RecordBatch,
        call_timeout: float | None,
        expected: int | None,
        ident: Ident | None,
        driven: bool,
    ) -> AppendResult | _Pending:
        started = self._mono()
        ts = batch.base_timestamp
        if ts is None:
            ts = self._clock.now_ms()
        payload = batch.payload
        status = self._status
        lock = self._lock
        # One deadline for everything this call may wait for (a WAL under repair, room in
        # the upload backlog, the append lock), never longer than the call's own: waits
        # never add up. It is computed only once a wait comes: the way through reads no clock.
        deadline: float | None = None
        call_deadline: float | None = None
        while True:
            if not lock.acquire(blocking=False):
                # Held, maybe by an append the WAL keeps waiting for room (its own
                # full_wait_ms): waiting for the lock counts against the deadline too.
                if deadline is None:
                    call_deadline, deadline = self._wait_deadlines(call_timeout)
                if not lock.acquire(timeout=max(0.0, deadline - self._clock.monotonic())):
                    raise BackpressureError(
                        "another append holds the way into the WAL (waiting for room in it) "
                        "past this append's deadline; retry later"
                    )
            try:
                if w.error is not None:
                    raise w.error
                if status.closing:
                    raise StreamClosedError("the client is closed")
                if status.failed is not None:
                    raise status.failed
                now_ms = 0
                if ident is not None:
                    now_ms = self._clock.now_ms()
                    earlier = self._earlier(w, ident, now_ms)
                    if earlier is not None:
                        return earlier
                unsettled = False
                if expected is not None and expected != w.next_offset:
                    # Checked under the lock that assigns offsets: no append can slip
                    # between the check and this one's offset. An offset assigned is not
                    # yet an offset taken: an append in flight at `expected` (the caller's
                    # own first attempt, timed out) may still fail, and a WAL repair then
                    # hands its offsets out again (`rewind_when_quiet`). Refusing now
                    # would tell the caller its batch landed when it may never land: wait
                    # for it to settle (outside the lock) and look again.
                    unsettled = w.unsettled(expected)
                    if not unsettled:
                        raise OffsetMismatchError(
                            f"stream {w.stream_id}: expected_offset={expected} but the next "
                            f"offset is {w.next_offset}; nothing was written",
                            expected=expected,
                            actual=w.next_offset,
                        )
                elif status.wal_error is None and not self._no_room():
                    self._call_started, self._call_timeout = started, call_timeout
                    r = self._append_locked(w, batch, ts, payload, call_deadline, started, driven)
                    if ident is not None:
                        assert w.producers is not None
                        w.producers.record(*ident, r[0] if isinstance(r, tuple) else r, now_ms)
                    return r
            finally:
                lock.release()
            # A WAL under repair, no room or an offset not settled yet: wait outside the
            # lock, side by side with others.
            if deadline is None:
                call_deadline, deadline = self._wait_deadlines(call_timeout)
            if unsettled:
                assert expected is not None
                w.wait_settled(expected, deadline, self._clock)
                continue
            if status.wal_error is not None:
                self._wait_for_wal(deadline)
            if self._no_room():
                self._wait_for_room(deadline)

    def _earlier(self, w: WriterState, ident: Ident, now_ms: int) -> AppendResult | _Pending | None:
        """The outcome of an earlier append of `ident` (under the lock), or None if new."""
        if w.producers is None:
            raise InvalidArgumentError("the stream's producers are not loaded")  # a bug
        earlier = w.producers.check(w.stream_id, ident[0], ident[1], now_ms)
        if earlier is None or isinstance(earlier, AppendResult):
            return earlier
        return earlier, None, None

    def would_wait(self, batch: RecordBatch | None = None, *, stamped: bool = False) -> bool:
        """Whether an append of `batch` would wait in the call now: the WAL under repair, the
        upload backlog full, the WAL found full, or (asked of a WAL on the pipeline core
        before appending: `WriteAheadLog.has_room`) no room in the WAL for its record or an
        append already waiting there for room. Without `batch`: room for a small record.
        `stamped`: the batch will carry a producer id and sequence (an idempotent append).
        A look at this instant, for callers that must not block (an event loop)."""
        if self._status.wal_error is not None or self._no_room():
            return True
        return not self._wal.has_room(_record_bound(batch, stamped))

    def _no_room(self) -> bool:
        """Whether an append must wait for an upload first: the WAL refused one for want of
        room, or the upload backlog is at `max_pending_bytes`."""
        return (
            self._status.wal_full or self._cache.pending_bytes >= self._settings.max_pending_bytes
        )

    def _room_wait_left(self) -> float:
        """(Called by the WAL in the appending thread, append lock held, when the append
        would wait for room.) Seconds left of the append's deadline for its waits: the
        backpressure timeout's, or the call's own if sooner, from the call's start."""
        limit = self._settings.backpressure_timeout_ms / 1000
        if self._call_timeout is not None:
            limit = min(limit, self._call_timeout)
        return limit - (self._clock.monotonic() - self._call_started)

    def _wait_deadlines(self, call_timeout: float | None) -> tuple[float | None, float]:
        """(the call's deadline, None for an async append; the deadline of its waits: the
        backpressure timeout's, or the call's if sooner), from now."""
        now = self._clock.monotonic()
        waits = now + self._settings.backpressure_timeout_ms / 1000
        if call_timeout is None:
            return None, waits
        return now + call_timeout, min(waits, now + call_timeout)

    def _append_locked(
        self,
        w: WriterState,
        batch: RecordBatch,
        ts: int,
        payload: bytes,
        call_deadline: float | None,
        started: float,
        driven: bool,
    ) -> AppendResult | _Pending:
        base = w.next_offset
        wal_store = self._wal_store
        apart = len(payload) >= APART_MIN_BYTES
        if apart:
            # `record` is the head only: the payload stays the caller's bytes (immutable).
            record = encode_batch_head(
                w.stream_id, base, batch.count, batch.kind, ts, batch.properties, len(payload),
                prefix=w.wal_prefix,
            )  # fmt: skip
            size = len(record) + len(payload)
        else:
            record = encode_batch(
                w.stream_id, base, batch.count, batch.kind, ts, batch.properties, payload,
                prefix=w.wal_prefix,
            )  # fmt: skip
            size = len(record)
        limit = self._max_record_bytes
        if size > limit:
            raise InvalidArgumentError(
                f"a batch of {len(payload)} payload bytes makes a {size}-byte WAL "
                f"record; {self._wal.describe()} takes at most {limit} bytes per record"
            )
        status = self._status
        wal_future: Future[WalPosition] | None = None
        pos = 0
        try:
            tail = payload if apart else b""
            if wal_store is not None:
                pos = wal_store(record, tail)
            elif driven:
                wal_future = self._wal_append_driven(record, tail)
            elif apart:
                wal_future = self._wal.append_parts(record, tail)
            else:
                wal_future = self._wal.append(record)
        except WalFullError:
            # Refused at the call, like the next ones until an upload trims the WAL.
            with status.cond:
                status.wal_full = True
                status.upload_requested = True
                status.cond.notify_all()
            raise
        except (InvalidArgumentError, BackpressureError):
            # Refused at the call: nothing was written, no offset was used (this call only).
            raise
        except S3StreamError as exc:
            status.on_wal_error(exc)
            raise
        try:
            w.next_offset = base + batch.count
            if wal_future is None:
                # Acknowledged on return (`acks_on_call`), after every earlier record.
                return self._acked(pos, w, batch, base, ts, record, apart, started)
            if wal_future.done():
                # Every earlier WAL future is done and its callback has run (the WAL completes
                # in order), so completing inline keeps LogCache inserts in WAL order.
                return self._durable(wal_future, w, batch, base, ts, record, apart, started)
            result: Future[AppendResult] = _AppendFuture()
            # Running from the start: the record is in the WAL's hands and goes on whatever
            # the caller does, so `cancel()` must say False (a cancelled future would pass
            # for an append that failed, and an idempotent resend would then land twice).
            result.set_running_or_notify_cancel()
            with status.cond:
                status.outstanding += 1
            wal_future.add_done_callback(
                lambda f: self._on_durable(f, w, batch, base, ts, record, apart, result, started)
            )
        except BaseException:
            if driven:
                self._wal_wake()  # this call will not drive the record it appended
            raise
        return result, wal_future, call_deadline

    def _wait_for_wal(self, deadline: float) -> None:
        """Wait (no lock held) until the uploader has repaired the WAL, or raise."""
        status = self._status
        with status.cond:
            while status.wal_error is not None:
                status.raise_if_closing()
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    raise UnavailableError(
                        f"the WAL failed and is not repaired yet: {status.wal_error}; "
                        "the client retries by itself, retry the append later"
                    ) from status.wal_error
                status.cond.wait(remaining)

    def _durable(
        self,
        wal_future: Future[WalPosition],
        w: WriterState,
        batch: RecordBatch,
        base: int,
        ts: int,
        record: bytes,
        apart: bool,
        started: float,
    ) -> AppendResult:
        try:
            pos = wal_future.result()
        except BaseException as exc:
            err = exc if isinstance(exc, S3StreamError) else UnavailableError(f"WAL write: {exc}")
            if err is not exc:
                err.__cause__ = exc
            self._status.on_wal_error(err)
            raise err from None
        return self._acked(pos, w, batch, base, ts, record, apart, started)

    def _acked(
        self,
        pos: WalPosition,
        w: WriterState,
        batch: RecordBatch,
        base: int,
        ts: int,
        record: bytes,
        apart: bool,
        started: float,
    ) -> AppendResult:
        """Into the LogCache and acknowledged: a batch the WAL holds at `pos` (in WAL order)."""
        count = batch.count
        untaken = self._cache.put(
            w.stream_id, base, count, ts, batch.kind, batch.properties, batch.payload,
            record, WAL_PREFIX.size, pos, w.epoch, payload_apart=apart,
        )  # fmt: skip
        if untaken < 0:
            # Durable, but the stream was destroyed or fenced while the WAL wrote it: not
            # acknowledged (recovery drops a deleted or fenced stream's records).
            raise w.error or StreamClosedError(f"stream {w.stream_id} was released")
        w.confirm_offset = base + count
        if w.tailers:
            w.wake_tailers()
        self._record_append(self._mono() - started, len(batch.payload), count)
        status = self._status
        if (untaken >= self._upload_threshold or status.upload_requested) and not (
            status.upload_woken
        ):
            # An upload asked for (the WAL full, a flush) while nothing was acknowledged yet
            # found nothing to take, and the uploader slept until the upload interval: a
            # small WAL with appends in flight then refused appends for full_wait_ms.
            status.wake_uploader()
        return AppendResult(w.stream_id, base, count)

    def _on_durable(
        self,
        wal_future: Future[WalPosition],
        w: WriterState,
        batch: RecordBatch,
        base: int,
        ts: int,
        record: bytes,
        apart: bool,
        result: Future[AppendResult],
        started: float,
    ) -> None:
        outcome: AppendResult | S3StreamError
        try:
            try:
                outcome = self._durable(wal_future, w, batch, base, ts, record, apart, started)
            except S3StreamError as exc:
                self._count_failure(result, exc)
                outcome = exc
        finally:
            # No longer in flight before the caller's callbacks run: one of them may close
            # the client, which waits for appends in flight (not for itself).
            status = self._status
            with status.cond:
                status.outstanding -= 1
                if status.outstanding == 0 and self._quiet_waiters:
                    status.cond.notify_all()
        if isinstance(outcome, AppendResult):
            result.set_result(outcome)
        else:
            result.set_exception(outcome)

    def _count_failure(self, result: Future[AppendResult], exc: BaseException) -> None:
        """Count an append's failure once: its caller's timeout and its WAL write's later
        failure are two ends of one append (errors only: under the status lock)."""
        with self._status.cond:
            if isinstance(result, _AppendFuture):
                if result.counted:
                    return
                result.counted = True
        self._ins.append_failed(exc)

    def _wait_for_room(self, deadline: float) -> None:
        """Wait (no lock held) until the upload backlog is below `max_pending_bytes` and the
        WAL has room again (after an upload trimmed it)."""
        status = self._status
        with status.cond:
            status.upload_requested = True
            status.cond.notify_all()
            while self._no_room():
                if status.wal_full and self._cache.pending_bytes == 0:
                    # Nothing left to upload, so no upload will trim the WAL: its fullness is
                    # not ours to wait out. Let the next append ask the WAL itself.
                    status.wal_full = False
                    break
                status.raise_if_closing()
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    cause = (
                        f" (last upload error: {status.upload_error})"
                        if (status.upload_error is not None)
                        else ""
                    )
                    if status.wal_full:
                        raise WalFullError(
                            f"{self._wal.describe()} is full and no upload has made room yet{cause}"
                        )
                    raise BackpressureError(
                        f"{self._cache.pending_bytes} bytes wait for upload "
                        f"(max_pending_bytes={self._settings.max_pending_bytes}); "
                        f"the object store is too slow or unreachable{cause}"
                    )
                # Every committed upload notifies.
                status.cond.wait(remaining)


#: More than a WAL record holds besides its payload and properties (its prefix and batch
#: header), and the msgpack overhead of a properties map.
_RECORD_HEAD_BOUND = WAL_PREFIX.size + BATCH_HEADER.size + 16
#: More than the properties an idempotent append adds (a producer id of up to 255 bytes, a
#: sequence) take.
_STAMP_BOUND = 512


def _record_bound(batch: RecordBatch | None, stamped: bool) -> int:
    """At least the bytes of the WAL record `batch` makes (cheap: nothing is encoded)."""
    size = _RECORD_HEAD_BOUND + (_STAMP_BOUND if stamped else 0)
    if batch is None:
        return size
    # msgpack: a str is at most 5 header bytes and 4 UTF-8 bytes a character.
    props = sum(10 + 4 * (len(k) + len(v)) for k, v in batch.properties.items())
    return size + props + len(batch.payload)


def deadline_text(timeout_s: float | None, settings: ClientSettings) -> str:
    """How a deadline was set, for error messages."""
    if timeout_s is None:
        return f"call_timeout_ms={settings.call_timeout_ms}"
    return f"{timeout_s:.3g} s"


def _nothing() -> None:
    """`Appender._wal_wake` of a WAL whose appends are never left to a driver."""
