"""asyncio front end: `await s3stream.aio.open(...)` and async handles over the sync ones.

The library is thread-based: a client's WAL, uploader and compactor run in their own threads
and every call blocks its caller until it is done. This module adapts it to an event loop
without blocking the loop and without a second implementation of anything:

- appends call `Stream.append_async` on the loop and await its future
  (`asyncio.wrap_future`): no thread hop per append, and appends from many tasks are
  group-committed as appends from many threads are. An append that would wait for room (the
  upload backlog or the WAL full, the WAL under repair: asked before appending, with the
  batch's size; or a conditional one whose offset an append in flight holds) is made by the
  sync `Stream.append` in a thread instead, with what is left of the call's deadline, so
  the loop never waits for room and the deadline covers the whole call. Those threads are
  a small pool of their own (tails cannot hold them up), and the appends of one stream run
  there one at a time, in the order they were made;
- every other call runs the sync method in a thread of the handle's own small pool, closed
  with the handle; `open`, `open_reader`, `flush` and `close`, which keep deadlines of their
  own, each in a thread of its own (never queued behind other calls);
- long polls (`AsyncStream.fetch` with `wait_s`, `tail`, `tail_records`) run in a second pool,
  so that tails waiting at the end of their streams never keep short calls waiting. Each poll
  waits at most `wait_s`: a cancelled tail's thread returns within one poll (at once when
  the stream or client closes), so cancelling never leaves a thread blocked.

Errors are the sync calls' own exceptions (`StreamClosedError`, `OffsetMismatchError`, ...),
raised unchanged. Cancelling an await does not stop work under way: an append whose await was
cancelled may still become durable, as one whose sync call timed out, and a call already
running in a thread finishes there (a call still queued is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import itertools
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Generic, ParamSpec, Protocol, Self, TypeVar

from . import opening
from ._futures import run_into
from .client import StreamClient, WalFactory
from .compaction import CompactionReport, Progress
from .errors import BackpressureError, InvalidArgumentError, StreamClosedError, UnavailableError
from .failover import TakeOverReport
from .metadata import MetadataState
from .reader import ObjectSummary, StreamReader
from .reader import open_reader as _open_reader
from .records import Record, batch_records, records_batch
from .settings import ClientSettings
from .storage.appender import not_acknowledged
from .stream import Stream
from .types import AppendResult, BatchKind, FetchedBatch, FetchResult, RecordBatch, StreamInfo
from .validation import check_instance, check_int, check_timeout

__all__ = ["AsyncStream", "AsyncStreamClient", "AsyncStreamReader", "open", "open_reader"]

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)

#: Records handed from a thread to the loop at a time by `read_records`.
_RECORDS_PER_HOP = 1024
#: `append_records` encodes up to this many records, of up to this many key and value bytes,
#: on the loop (well under a millisecond); larger inputs are encoded in a thread.
_RECORDS_ENCODED_ON_LOOP = 256
_BYTES_ENCODED_ON_LOOP = 64 << 10
#: An append made in a thread gets this much less than what is left of its call's deadline
#: (at most a tenth of the call's time), so that its own answer (`BackpressureError` when no
#: room came: nothing written) reaches the loop before the loop stops waiting for it.
_THREAD_LEAD_S = 0.01
#: Threads for the appends made in a thread (`_Threads.submit_append`), apart from the long
#: polls so that tails cannot hold them up. Appends of one stream run one at a time there
#: (in submission order), so more threads only let more streams wait for room at once.
_APPEND_THREADS = 8


class _Closes(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closes)


class _Threads:
    """The threads an async handle runs blocking calls in: `call` for calls that return
    promptly, `poll` for long polls, `submit_append` for appends that may wait for room,
    each on a pool of its own (threads start on demand)."""

    def __init__(self, name: str, *, threads: int, poll_threads: int, queue_limit_s: float) -> None:
        check_int("threads", threads, minimum=1)
        check_int("poll_threads", poll_threads, minimum=1)
        self._what = name
        self._threads = threads
        #: How long a call may wait for a thread of the call pool before it fails.
        self._queue_limit_s = queue_limit_s
        self._calls = ThreadPoolExecutor(threads, f"s3stream-aio-{name}")
        self._polls = ThreadPoolExecutor(poll_threads, f"s3stream-aio-{name}-poll")
        self._append_pool = ThreadPoolExecutor(_APPEND_THREADS, f"s3stream-aio-{name}-append")
        self.closed = False
        #: Appends submitted to a thread and not finished there (queued or running), and
        #: those of them that went there to wait for room (in the WAL or the backlog, which
        #: all streams share).
        self._appends = 0
        self._room_appends = 0
        #: Guards the counts and `_lanes`.
        self._appends_lock = threading.Lock()
        #: Appends made in a thread, by stream, in submission order, not yet started. A
        #: stream has a lane while one drainer (`_drain`) is queued or running for it, and
        #: only then: its appends run one after the other, never racing each other for the
        #: append lock (an idempotent producer's pipelined sequences must land in order).
        self._lanes: dict[int, deque[tuple[Future[Any], Callable[[], Any]]]] = {}

    @property
    def waiting_for_room(self) -> bool:
        """Whether appends wait for room in threads now (queued or running)."""
        return self._room_appends > 0

    def must_queue(self, stream_id: int) -> bool:
        """Whether an append to `stream_id` must go to a thread behind others: appends
        wait for room there (a later one, of any stream, goes too rather than race them to
        the room they wait for on the loop), or appends of that stream are there (its
        appends land in the order they were made). A stream's conditional or idempotent
        append waiting in a thread for its own reasons holds up only that stream: made a
        flag of the client, it turned every stream's appends into one-at-a-time durable
        appends in threads, which missed their deadlines (`BackpressureError`)."""
        return self._room_appends > 0 or stream_id in self._lanes

    def submit_append(self, stream_id: int, job: Callable[[], T], *, room: bool) -> Future[T]:
        """`job` (an append to `stream_id` that may wait) in a thread of the append pool,
        after the appends to that stream submitted before it have finished; counted until
        it has finished or was dropped (its future cancelled while queued, or the handle
        closed), with `room`, as one waiting for room (`must_queue`)."""
        ctx = contextvars.copy_context()
        future: Future[T] = Future()
        with self._appends_lock:
            if self.closed:
                raise StreamClosedError(f"the {self._what} is closed")
            self._appends += 1
            self._room_appends += room
            lane = self._lanes.get(stream_id)
            start = lane is None
            if lane is None:
                lane = self._lanes[stream_id] = deque()
            lane.append((future, functools.partial(ctx.run, job)))
        future.add_done_callback(functools.partial(self._append_done, room))
        if start:
            self._schedule(stream_id)
        return future

    def _schedule(self, stream_id: int) -> None:
        """Queue the drainer of a stream's lane (which has appends waiting)."""
        try:
            self._append_pool.submit(self._drain, stream_id)
        except RuntimeError:  # the pool is shut down: the handle was closed
            self._drop_lanes()

    def _drain(self, stream_id: int) -> None:
        """Run the first append of a stream's lane, then queue the lane again behind the
        other streams' (streams take turns for the threads) or end it if it is empty."""
        with self._appends_lock:
            lane = self._lanes[stream_id]
            item = lane.popleft() if lane else None
        if item is not None:
            run_into(*item)  # (nothing, if cancelled while queued)
        with self._appends_lock:
            more = bool(lane)
            if not more:
                del self._lanes[stream_id]
        if more:
            self._schedule(stream_id)

    def _drop_lanes(self) -> None:
        """Cancel every append still queued in a lane (the handle closed): their callers
        get `StreamClosedError`, nothing was written."""
        with self._appends_lock:
            dropped = [item for lane in self._lanes.values() for item in lane]
            for lane in self._lanes.values():
                lane.clear()
        for future, _ in dropped:
            future.cancel()

    def _append_done(self, room: bool, _: object) -> None:
        with self._appends_lock:
            self._appends -= 1
            self._room_appends -= room

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in a thread of the call pool; `UnavailableError` if no
        thread takes it within the queue limit (nothing was done then)."""
        return await self._run(
            self._calls, functools.partial(fn, *args, **kwargs), queue_limit_s=self._queue_limit_s
        )

    async def poll(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, a long poll, in a thread of the poll pool."""
        return await self._run(self._polls, functools.partial(fn, *args, **kwargs))

    async def _run(
        self, pool: ThreadPoolExecutor, job: Callable[[], T], *, queue_limit_s: float | None = None
    ) -> T:
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()  # as asyncio.to_thread: the caller's context vars
        try:
            started = pool.submit(ctx.run, job)
        except RuntimeError:  # the pool is shut down: the handle was closed
            raise StreamClosedError(f"the {self._what} is closed") from None
        future = asyncio.wrap_future(started, loop=loop)
        try:
            if queue_limit_s is not None:
                # Every thread may be busy with calls waiting on a store that stopped
                # answering: each waiting its turn, the 16th of 16 fetches took four store
                # timeouts. A call no thread took in time fails, nothing done.
                done, _ = await asyncio.wait({future}, timeout=queue_limit_s)
                if not done and started.cancel():
                    raise UnavailableError(
                        f"the {self._what}'s call got none of its {self._threads} threads "
                        f"within {queue_limit_s:g} s: they were all busy (with calls waiting "
                        "on a store that does not answer?); nothing was done"
                    )
            return await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                future.cancel()  # a call still queued is dropped (one running goes on)
                raise
            # Not this task's cancellation: `close` dropped the queued call.
            raise StreamClosedError(f"the {self._what} is closed") from None

    async def close(self, timeout_s: float | None = None) -> None:
        """Refuse new calls, drop queued ones, and wait for the running ones to return, at
        most `timeout_s` (None: until they do): each ends by its own deadline, and on a
        closed client it can do nothing more."""
        if self.closed:
            return
        with self._appends_lock:
            self.closed = True
        for pool in (self._append_pool, self._polls, self._calls):
            pool.shutdown(wait=False, cancel_futures=True)
        # A lane's drainer cancelled in the pool would leave its appends pending for ever.
        self._drop_lanes()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(self._join), timeout_s)

    def _join(self) -> None:
        self._append_pool.shutdown(wait=True)
        self._polls.shutdown(wait=True)
        self._calls.shutdown(wait=True)


def _own_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """``fn()`` in a thread of its own (in the caller's context variables), awaitable. For
    the calls that keep a deadline of their own (open, flush, close): in the loop's default
    executor they queued behind the application's own `to_thread` calls, and their deadline
    started only when a thread took them (flush(timeout_s=0.5) took 4.45 s). Not a daemon:
    the interpreter waits for it on its way out, as `asyncio.run` waited for the executor,
    so a close whose await was cancelled still finishes (within its own deadline). Named
    apart from the pools' threads (``s3stream-aio-*``), which a closed handle has stopped:
    this one may still be on its way out when its call has returned."""
    ctx = contextvars.copy_context()
    future: Future[T] = Future()
    threading.Thread(
        target=run_into, args=(future, functools.partial(ctx.run, fn)), name=name
    ).start()
    return asyncio.wrap_future(future)


async def _opened(fn: Callable[[], C]) -> C:
    """``fn()`` in a thread; if the awaiting task is cancelled, what `fn` opens is closed."""
    opening_ = _Opening(fn)
    job = _own_thread(opening_.run, "s3stream-async-open")
    # Once a cancelled caller gave up on it, nobody reads the job's outcome: a failed open
    # would be logged as "Future exception was never retrieved" with the library's traceback.
    job.add_done_callback(_settled)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        opening_.abandon()
        raise


class _Opening(Generic[C]):
    """An opener run in a thread, handing what it opens to its caller or, once the caller
    stopped waiting, to a close. The close needs neither the loop nor its executor (both may
    be gone by then: `asyncio.run` shuts the default executor down on its way out): it runs
    in the opener's own thread, or, if the opener had finished, in a thread of its own (not
    daemons: the interpreter waits for the close on its way out)."""

    def __init__(self, fn: Callable[[], C]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._made: C | None = None
        self._abandoned = False

    def run(self) -> C:
        made = self._fn()
        with self._lock:
            if not self._abandoned:
                self._made = made  # the caller may still stop waiting before it gets it
                return made
        _close_abandoned(made)
        return made

    def abandon(self) -> None:
        """The caller stopped waiting: close what was opened, now or once it is."""
        with self._lock:
            self._abandoned = True
            made, self._made = self._made, None
        if made is not None:
            threading.Thread(
                target=_close_abandoned, args=(made,), name="s3stream-close-abandoned"
            ).start()


def _close_abandoned(made: _Closes) -> None:
    """Close what an opener returned after its caller stopped waiting (errors logged)."""
    try:
        made.close()
    except Exception:
        log.warning("closing %r, opened for a cancelled caller, failed", made, exc_info=True)


def _encoded_on_loop(records: Sequence[Record]) -> bool:
    """Whether `records` are few and small enough to encode on the loop (anything that is
    not a sequence of records is: it is refused at once)."""
    if not isinstance(records, Sequence):
        return True
    if len(records) > _RECORDS_ENCODED_ON_LOOP:
        return False
    size = 0
    for r in records:
        if isinstance(r, Record):
            # Headers too: 16 records of 1 MiB headers blocked the loop for 170 ms.
            size += len(r.value or b"") + len(r.key or b"") + len(r.headers)
            for name, value in r.headers:
                size += len(name) + len(value or b"")
            if size > _BYTES_ENCODED_ON_LOOP:
                return False
    return True


def _take(items: Iterator[T], n: int) -> list[T]:
    return list(itertools.islice(items, n))


async def _in_chunks(threads: _Threads, items: Iterator[T]) -> AsyncIterator[T]:
    """The items of a blocking iterator, advanced in threads a chunk at a time."""
    while True:
        chunk = await threads.call(_take, items, _RECORDS_PER_HOP)
        for item in chunk:
            yield item
        if len(chunk) < _RECORDS_PER_HOP:
            return


def _takes_arguments_of(
    sync: Callable[P, object],
) -> Callable[[Callable[..., Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Give the decorated opener the parameters of `sync`, which it passes through: for type
    checkers and `help()`, and so that the two can never disagree."""

    def decorate(
        fn: Callable[..., Coroutine[Any, Any, R]],
    ) -> Callable[P, Coroutine[Any, Any, R]]:
        own = inspect.signature(fn)
        signature = inspect.signature(sync).replace(return_annotation=own.return_annotation)
        setattr(fn, "__signature__", signature)  # noqa: B010 (not an attribute mypy knows)
        return fn

    return decorate


# ---------------------------------------------------------------------------------------------
# Streams


class AsyncStream:
    """A `Stream` for asyncio: the same methods, awaited (`AsyncStreamClient.create_stream`,
    `open_stream`). Properties are the stream's own (they never block); `sync` is the
    `Stream` itself, for what this class does not cover."""

    def __init__(self, stream: Stream, threads: _Threads, call_timeout_s: float) -> None:
        self._stream = stream
        self._threads = threads
        self._call_timeout_s = call_timeout_s

    @property
    def sync(self) -> Stream:
        """The `Stream` this wraps (its calls block)."""
        return self._stream

    @property
    def stream_id(self) -> int:
        """The stream's id."""
        return self._stream.stream_id

    @property
    def epoch(self) -> int:
        """The epoch this handle writes under."""
        return self._stream.epoch

    @property
    def tags(self) -> Mapping[str, str]:
        """Tags given at creation."""
        return self._stream.tags

    @property
    def start_offset(self) -> int:
        """First readable offset (`Stream.start_offset`)."""
        return self._stream.start_offset

    @property
    def confirm_offset(self) -> int:
        """Everything below this offset is durable and readable."""
        return self._stream.confirm_offset

    @property
    def next_offset(self) -> int:
        """Offset the next appended batch will start at."""
        return self._stream.next_offset

    @property
    def closed(self) -> bool:
        """Whether the handle was closed, the stream destroyed or the client closed."""
        return self._stream.closed

    # -- appends

    async def append(
        self,
        batch: RecordBatch,
        *,
        timeout_s: float | None = None,
        expected_offset: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> AppendResult:
        """Append a batch and wait until it is durable, as `Stream.append`: `expected_offset`,
        `producer_id` and `sequence` included (a mismatch or an out-of-order sequence raises
        at once, nothing written).

        Calls `Stream.append_async` on the loop, where it returns at once. An append that
        would wait in the call (the upload backlog at ``max_pending_bytes``, no room in the WAL
        for this batch or an append already waiting there for room, a WAL under repair, a
        reopened stream's producers to read first, or an append in flight holding
        `expected_offset`), and every append while others wait so, is made by
        `Stream.append` in a thread instead: the loop never waits for room. Appends of one
        stream made in threads land in the order they were made.

        `timeout_s` (default ``call_timeout_ms``) bounds the whole call, the wait for room
        and for a thread included, as the sync `append`: an append that gets no room in
        time is refused with `BackpressureError` (`WalFullError`) and nothing is written; one
        not acknowledged in time raises `UnavailableError`, and then the batch may still
        become durable, as after a cancelled await.
        """
        timeout = check_timeout("timeout_s", timeout_s)
        limit = self._call_timeout_s if timeout is None else timeout
        deadline = asyncio.get_running_loop().time() + limit
        if not isinstance(batch, RecordBatch):
            check_instance("batch", batch, RecordBatch)
        return await self._append(batch, deadline, limit, expected_offset, producer_id, sequence)

    async def append_records(
        self,
        records: Sequence[Record],
        *,
        compression: str = "none",
        timeout_s: float | None = None,
        expected_offset: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> AppendResult:
        """Pack `records` into one RECORDS batch, append it and wait until it is durable, as
        `Stream.append_records` (and as `append`: `timeout_s` bounds the whole call). Up to
        a few hundred small records are encoded on the loop, larger inputs in a thread."""
        timeout = check_timeout("timeout_s", timeout_s)
        limit = self._call_timeout_s if timeout is None else timeout
        deadline = asyncio.get_running_loop().time() + limit
        if _encoded_on_loop(records):
            batch = records_batch(records, compression=compression)
        else:
            batch = await self._threads.call(records_batch, records, compression=compression)
        return await self._append(batch, deadline, limit, expected_offset, producer_id, sequence)

    async def _append(
        self,
        batch: RecordBatch,
        deadline: float,
        limit: float,
        expected_offset: int | None,
        producer_id: str | None,
        sequence: int | None,
    ) -> AppendResult:
        """`batch` appended on the loop, or in a thread if it would wait there; `deadline`
        (on the loop's clock, `limit` s after the call) bounds it all."""
        idempotent = producer_id is not None or sequence is not None
        threads = self._threads
        if threads.must_queue(self.stream_id) or self._would_wait(
            batch, idempotent, expected_offset
        ):
            # Waiting for room (or behind appends that do), which every stream shares, or
            # for this stream's own reasons (an offset to settle, producers to load).
            room = threads.waiting_for_room or self._stream.append_would_wait(batch=batch)
            return await self._append_in_thread(
                batch, deadline, limit, expected_offset, producer_id, sequence, room
            )
        future = self._stream.append_async(
            batch, expected_offset=expected_offset, producer_id=producer_id, sequence=sequence
        )
        return await self._durable(
            future, deadline, limit, conditional=expected_offset is not None, idempotent=idempotent
        )

    def _would_wait(
        self, batch: RecordBatch, idempotent: bool, expected_offset: int | None
    ) -> bool:
        """`Stream.append_would_wait`, asked with the batch, whose size the WAL's room is
        checked for; or a RECORDS batch made by hand, which the append decodes once to check
        it (up to a whole record limit of zstd: not on the loop)."""
        if batch.kind is BatchKind.RECORDS and not batch.records_verified():
            return True
        return self._stream.append_would_wait(
            idempotent=idempotent, batch=batch, expected_offset=expected_offset
        )

    async def _append_in_thread(
        self,
        batch: RecordBatch,
        deadline: float,
        limit: float,
        expected_offset: int | None,
        producer_id: str | None,
        sequence: int | None,
        room: bool,
    ) -> AppendResult:
        """`Stream.append` in a thread of the append pool (appends waiting for room must not
        hold up flush and friends, nor wait behind tails), after the stream's appends
        submitted before it (`_Threads.submit_append`: they land in the order they were
        made), with what is left of the call's deadline once the thread takes it, so the
        room wait and the queue count against it. Past the
        deadline: `BackpressureError` if no thread took it (nothing written), else
        `UnavailableError` (it may still become durable)."""
        loop = asyncio.get_running_loop()
        stream = self._stream
        lead = min(_THREAD_LEAD_S, limit / 10)

        def append() -> AppendResult:
            # The loop's clock, read in a thread (asyncio's: time.monotonic, thread safe).
            remaining = deadline - lead - loop.time()
            if remaining <= 0:
                raise self._no_thread_in_time(limit)
            return stream.append(
                batch,
                timeout_s=remaining,
                expected_offset=expected_offset,
                producer_id=producer_id,
                sequence=sequence,
            )

        job = self._threads.submit_append(stream.stream_id, append, room=room)
        try:
            async with asyncio.timeout_at(deadline) as timer:
                try:
                    return await asyncio.wrap_future(job)
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # the caller's cancellation, or the deadline
                    # Not this task's cancellation: `close` dropped the queued call.
                    raise StreamClosedError("the client is closed") from None
        except TimeoutError:
            if not timer.expired():
                raise
            if job.cancel():  # still queued: dropped, nothing written
                raise self._no_thread_in_time(limit) from None
            if job.done():
                return job.result()  # finished just now: its own outcome
            raise not_acknowledged(
                self.stream_id,
                f"{limit} s",
                conditional=expected_offset is not None,
                idempotent=producer_id is not None or sequence is not None,
            ) from None

    def _no_thread_in_time(self, limit: float) -> BackpressureError:
        return BackpressureError(
            f"append to stream {self.stream_id} waited for a thread (appends are held back) "
            f"past its deadline of {limit} s; nothing was written, retry later"
        )

    async def _durable(
        self,
        future: Future[AppendResult],
        deadline: float,
        limit: float,
        *,
        conditional: bool,
        idempotent: bool,
    ) -> AppendResult:
        if future.done():
            return future.result()  # the WAL acknowledged in the call (a memory WAL)
        try:
            async with asyncio.timeout_at(deadline):
                # Shielded: cancelling the await must not cancel the append's own future,
                # which the client resolves when the WAL acknowledges. Once this await is
                # given up, nobody reads that future's outcome: `_settled` does, or asyncio
                # logs "Future exception was never retrieved" with the library's traceback
                # for an append whose caller got its error already.
                inner = asyncio.wrap_future(future)
                inner.add_done_callback(_settled)
                return await asyncio.shield(inner)
        except TimeoutError as exc:
            raise not_acknowledged(
                self.stream_id, f"{limit} s", conditional=conditional, idempotent=idempotent
            ) from exc

    # -- reads

    async def fetch(
        self,
        start_offset: int,
        end_offset: int | None = None,
        *,
        max_bytes: int = 1 << 20,
        wait_s: float | None = None,
    ) -> FetchResult:
        """Whole batches covering ``[start_offset, end_offset)``, as `Stream.fetch`; with
        `wait_s`, a long poll (in the poll pool: its thread returns within `wait_s` even if
        this await is cancelled)."""
        run = self._threads.poll if wait_s else self._threads.call
        return await run(
            self._stream.fetch, start_offset, end_offset, max_bytes=max_bytes, wait_s=wait_s
        )

    async def offset_for_timestamp(self, ts_ms: int) -> int | None:
        """The first offset whose timestamp is >= `ts_ms`, or None
        (`Stream.offset_for_timestamp`)."""
        return await self._threads.call(self._stream.offset_for_timestamp, ts_ms)

    def read_records(
        self, start_offset: int, end_offset: int | None = None, *, max_bytes: int = 1 << 20
    ) -> AsyncIterator[tuple[int, Record]]:
        """``(offset, record)`` for every record in ``[start_offset, end_offset)``, as
        `Stream.read_records` (arguments checked at the call; records decoded in threads)."""
        records = self._stream.read_records(start_offset, end_offset, max_bytes=max_bytes)
        return _in_chunks(self._threads, records)

    def tail(
        self, start_offset: int, *, max_bytes: int = 1 << 20, wait_s: float = 1.0
    ) -> AsyncIterator[FetchedBatch]:
        """Every batch from `start_offset` on, waiting for new ones, as `Stream.tail`: ends
        when the stream or its client closes, raises `OffsetOutOfRangeError` if a trim passes
        its position. Each internal long poll waits at most `wait_s` (appends and closes wake
        it at once), so a cancelled tail's thread returns within `wait_s`."""
        pos, wait = self._check_tail(start_offset, max_bytes, wait_s)
        return self._tail(pos, max_bytes, wait)

    async def _tail(self, pos: int, max_bytes: int, wait: float) -> AsyncIterator[FetchedBatch]:
        while True:
            try:
                result = await self._threads.poll(
                    self._stream.fetch, pos, max_bytes=max_bytes, wait_s=wait
                )
            except StreamClosedError:
                return
            for batch in result.batches:
                yield batch
            pos = result.next_offset

    def tail_records(
        self, start_offset: int, *, max_bytes: int = 1 << 20, wait_s: float = 1.0
    ) -> AsyncIterator[tuple[int, Record]]:
        """``(offset, record)`` from `start_offset` on, as `tail` delivers batches (a RAW
        batch is one record at its base offset, as in `Stream.tail_records`); records are
        decoded in the polling thread."""
        pos, wait = self._check_tail(start_offset, max_bytes, wait_s)
        return self._tail_records(pos, max_bytes, wait)

    async def _tail_records(
        self, start: int, max_bytes: int, wait: float
    ) -> AsyncIterator[tuple[int, Record]]:
        pos = start

        def fetch_records(at: int) -> tuple[list[tuple[int, Record]], int]:
            result = self._stream.fetch(at, max_bytes=max_bytes, wait_s=wait)
            records = [r for b in result.batches for r in batch_records(b, start)]
            return records, result.next_offset

        while True:
            try:
                records, pos = await self._threads.poll(fetch_records, pos)
            except StreamClosedError:
                return
            for item in records:
                yield item

    def _check_tail(self, start_offset: int, max_bytes: int, wait_s: float) -> tuple[int, float]:
        """`Stream.tail`'s checks (the one rule), made at the call, since an async generator
        would defer them: its generator does nothing until iterated."""
        self._stream.tail(start_offset, max_bytes=max_bytes, wait_s=wait_s)
        return start_offset, wait_s

    # -- lifecycle

    async def trim(self, new_start_offset: int) -> None:
        """Move `start_offset` forward, as `Stream.trim`."""
        await self._threads.call(self._stream.trim, new_start_offset)

    async def close(self) -> None:
        """Upload what the stream has pending and release it, as `Stream.close`."""
        await self._threads.call(self._stream.close)

    async def destroy(self) -> None:
        """Delete the stream and all its data, as `Stream.destroy`. Irreversible."""
        await self._threads.call(self._stream.destroy)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Async{self._stream!r}"


# ---------------------------------------------------------------------------------------------
# Clients


class AsyncStreamClient:
    """A `StreamClient` for asyncio (from `s3stream.aio.open`, or wrapping a client): the same
    methods, awaited; streams are `AsyncStream`s. `async with` closes it.

    Blocking calls run in up to `threads` threads of its own (a call that gets none within
    `call_timeout_ms` fails with `UnavailableError`, nothing done), long polls (tails) in up to
    `poll_threads` more, appends that wait for room in a few more (`AsyncStream.append`),
    all started on demand and stopped by `close`. A tail waiting at the
    end of its stream holds a poll thread for up to its `wait_s` at a time: beyond
    `poll_threads` tails at once, the others wait their turn (up to `wait_s` longer).
    The wrapped client is this one's: `close` closes it.
    """

    def __init__(self, client: StreamClient, *, threads: int = 32, poll_threads: int = 64) -> None:
        if not isinstance(client, StreamClient):
            raise InvalidArgumentError(
                f"client must be a StreamClient, not {type(client).__name__}"
            )
        self._client = client
        self._call_timeout_s = client.settings.call_limit_s()
        self._threads = _Threads(
            "client",
            threads=threads,
            poll_threads=poll_threads,
            queue_limit_s=self._call_timeout_s,
        )

    @property
    def sync(self) -> StreamClient:
        """The `StreamClient` this wraps (its calls block)."""
        return self._client

    @property
    def node_id(self) -> str:
        """This client's node id."""
        return self._client.node_id

    @property
    def node_epoch(self) -> int:
        """Epoch of this client's node registration."""
        return self._client.node_epoch

    @property
    def settings(self) -> ClientSettings:
        """The settings the client runs with."""
        return self._client.settings

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._client.closed

    def _wrap(self, stream: Stream) -> AsyncStream:
        return AsyncStream(stream, self._threads, self._call_timeout_s)

    async def create_stream(self, tags: Mapping[str, str] | None = None) -> AsyncStream:
        """Create a new, empty stream owned by this client (`StreamClient.create_stream`)."""
        return self._wrap(await self._threads.call(self._client.create_stream, tags))

    async def create_streams(self, tags: Sequence[Mapping[str, str] | None]) -> list[AsyncStream]:
        """Create ``len(tags)`` new streams at once, in that order
        (`StreamClient.create_streams`)."""
        streams = await self._threads.call(self._client.create_streams, tags)
        return [self._wrap(s) for s in streams]

    async def open_stream(self, stream_id: int, *, force: bool = False) -> AsyncStream:
        """Open an existing stream for appending and reading (`StreamClient.open_stream`)."""
        return self._wrap(
            await self._threads.call(self._client.open_stream, stream_id, force=force)
        )

    async def list_streams(self, tags: Mapping[str, str] | None = None) -> list[StreamInfo]:
        """Streams whose tags include all of `tags` (`StreamClient.list_streams`)."""
        return await self._threads.call(self._client.list_streams, tags)

    async def stream_info(self, stream_id: int) -> StreamInfo:
        """Committed metadata of one stream (`StreamClient.stream_info`)."""
        return await self._threads.call(self._client.stream_info, stream_id)

    async def read(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int | None = None,
        *,
        max_bytes: int = 1 << 20,
    ) -> FetchResult:
        """Committed batches of any stream, without opening it (`StreamClient.read`)."""
        return await self._threads.call(
            self._client.read, stream_id, start_offset, end_offset, max_bytes=max_bytes
        )

    async def compact(
        self, progress: Progress | None = None, *, sweep_orphans: bool | None = None
    ) -> CompactionReport:
        """One compaction pass now (`StreamClient.compact`); `progress` is called from the
        compacting thread."""
        return await self._threads.call(self._client.compact, progress, sweep_orphans=sweep_orphans)

    async def take_over(
        self,
        node_id: str,
        *,
        wal: str | WalFactory | None = None,
        storage_options: Mapping[str, Any] | None = None,
        accept_wal_loss: bool = False,
    ) -> TakeOverReport:
        """Take over failed node `node_id` (`StreamClient.take_over`)."""
        return await self._threads.call(
            self._client.take_over,
            node_id,
            wal=wal,
            storage_options=storage_options,
            accept_wal_loss=accept_wal_loss,
        )

    async def flush(self, timeout_s: float | None = None) -> None:
        """Upload everything acknowledged so far and commit it (`StreamClient.flush`)."""
        # A thread of its own, not the call pool: there it queued behind reads stuck on a
        # store that stopped answering, and its deadline started only when a thread took it
        # (timeout_s=1 returned after 10.9 s).
        await _own_thread(functools.partial(self._client.flush, timeout_s), "s3stream-async-flush")

    async def close(self, timeout_s: float | None = None) -> None:
        """Close the client (`StreamClient.close`: uploads everything, releases the streams,
        ends their tails), then stop this wrapper's threads. Calling it again reports how
        the first close ended, as the sync `close` does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._call_timeout_s if timeout_s is None else timeout_s)
        try:
            # As `flush`: not behind the calls queued in the pool.
            await _own_thread(
                functools.partial(self._client.close, timeout_s), "s3stream-async-close"
            )
        finally:
            # Calls still running (reads on a store that stopped answering) are waited for
            # within what is left of the deadline only.
            await self._threads.close(max(0.0, deadline - loop.time()))  # idempotent

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Async{self._client!r}"


@_takes_arguments_of(opening.open)
async def open(*args: Any, **kwargs: Any) -> AsyncStreamClient:
    """`s3stream.open` for asyncio: the same arguments; the client opens in a thread (it
    loads the metadata log and recovers the WAL) and comes back as an `AsyncStreamClient`.

    If the awaiting task is cancelled meanwhile (`asyncio.wait_for` timing out), the client
    is closed once it has opened, in the opening thread (`asyncio.run`, shutting its default
    executor down on the way out, waits for that) or in a daemon thread of its own, never
    through the loop. Until that close has ended the node is still held: opening it again
    right after the cancel may raise `NodeInUseError`."""
    client = await _opened(functools.partial(opening.open, *args, **kwargs))
    return AsyncStreamClient(client)


# ---------------------------------------------------------------------------------------------
# Readers


class AsyncStreamReader:
    """A `StreamReader` for asyncio (from `s3stream.aio.open_reader`, or wrapping a reader):
    the same methods, awaited, each in one of `threads` threads of its own. `async with`
    closes it; `sync` is the reader itself (e.g. for `StreamReader.read_arrow`, whose
    `RecordBatchReader` reads as it is consumed: consume it in a thread)."""

    def __init__(self, reader: StreamReader, *, threads: int = 32) -> None:
        if not isinstance(reader, StreamReader):
            raise InvalidArgumentError(
                f"reader must be a StreamReader, not {type(reader).__name__}"
            )
        self._reader = reader
        self._threads = _Threads(
            "reader",
            threads=threads,
            poll_threads=16,
            queue_limit_s=reader.settings.call_limit_s(),
        )

    @property
    def sync(self) -> StreamReader:
        """The `StreamReader` this wraps (its calls block)."""
        return self._reader

    async def refresh(self) -> bool:
        """Apply entries committed since the last look (`StreamReader.refresh`)."""
        return await self._threads.call(self._reader.refresh)

    async def snapshot(self, *, refresh: bool = True) -> MetadataState:
        """The committed metadata as one immutable state (`StreamReader.snapshot`)."""
        return await self._threads.call(self._reader.snapshot, refresh=refresh)

    async def list_streams(self, tags: Mapping[str, str] | None = None) -> list[StreamInfo]:
        """Streams whose tags include all of `tags` (`StreamReader.list_streams`)."""
        return await self._threads.call(self._reader.list_streams, tags)

    async def stream_info(self, stream_id: int) -> StreamInfo:
        """Committed metadata of one stream (`StreamReader.stream_info`)."""
        return await self._threads.call(self._reader.stream_info, stream_id)

    async def read(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int | None = None,
        *,
        max_bytes: int = 1 << 20,
    ) -> FetchResult:
        """Committed batches covering ``[start_offset, end_offset)`` (`StreamReader.read`)."""
        return await self._threads.call(
            self._reader.read, stream_id, start_offset, end_offset, max_bytes=max_bytes
        )

    async def read_records(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int | None = None,
        *,
        max_bytes: int = 1 << 20,
    ) -> AsyncIterator[tuple[int, Record]]:
        """``(offset, record)`` for every committed record in the range
        (`StreamReader.read_records`); errors come at the first iteration."""
        records = await self._threads.call(
            self._reader.read_records, stream_id, start_offset, end_offset, max_bytes=max_bytes
        )
        async for item in _in_chunks(self._threads, records):
            yield item

    def tail(
        self,
        stream_id: int,
        start_offset: int,
        *,
        max_bytes: int = 1 << 20,
        poll_s: float | None = None,
    ) -> AsyncIterator[FetchedBatch]:
        """Every committed batch from `start_offset` on, waiting for new ones, as
        `StreamReader.tail` (arguments checked at the call). Each step is one long poll of
        at most `poll_s` (default ``settings.tail_poll_ms``) in a thread of its own, so a
        cancelled tail's thread returns within `poll_s`; ends when the reader closes."""
        # The sync tail checks the arguments (its generator runs nothing before iteration).
        self._reader.tail(stream_id, start_offset, max_bytes=max_bytes, poll_s=poll_s)
        poll = self._reader.settings.tail_poll_ms / 1000 if poll_s is None else poll_s
        return self._tail(stream_id, start_offset, max_bytes, poll)

    async def _tail(
        self, stream_id: int, pos: int, max_bytes: int, poll: float
    ) -> AsyncIterator[FetchedBatch]:
        reader = self._reader

        def step(at: int) -> FetchResult:
            # `StreamReader.tail`'s own step: `read` with `wait_s` would look at the log
            # every ``tail_poll_ms``, not every `poll_s`.
            reader._check_open()
            return reader._read_waiting(stream_id, at, None, max_bytes, poll, poll)

        while True:
            try:
                result = await self._threads.poll(step, pos)
            except StreamClosedError:
                return
            for batch in result.batches:
                yield batch
            pos = result.next_offset

    async def offset_for_timestamp(self, stream_id: int, ts_ms: int) -> int | None:
        """The first committed offset whose timestamp is >= `ts_ms`, or None
        (`StreamReader.offset_for_timestamp`)."""
        return await self._threads.call(self._reader.offset_for_timestamp, stream_id, ts_ms)

    async def objects(self) -> list[ObjectSummary]:
        """Every data object the metadata lists (`StreamReader.objects`)."""
        return await self._threads.call(self._reader.objects)

    async def close(self) -> None:
        """Close the reader, then stop this wrapper's threads (waiting for the calls still
        running until the reader's ``call_timeout_ms`` from the call). Idempotent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._reader.settings.call_limit_s()
        try:
            # A thread of its own, as the client's close: in the call pool it could get no
            # thread (all busy on a store that stopped answering), the reader was left open,
            # and a second close returned at once as if it had closed it.
            await _own_thread(self._reader.close, "s3stream-async-reader-close")
        finally:
            await self._threads.close(max(0.0, deadline - loop.time()))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


@_takes_arguments_of(_open_reader)
async def open_reader(*args: Any, **kwargs: Any) -> AsyncStreamReader:
    """`s3stream.open_reader` for asyncio: the same arguments; the reader opens in a thread
    (it loads the metadata log) and comes back as an `AsyncStreamReader`."""
    reader = await _opened(functools.partial(_open_reader, *args, **kwargs))
    return AsyncStreamReader(reader)


def _settled(future: asyncio.Future[Any]) -> None:
    """Read a future's outcome, so that an error nobody awaits any more is not reported to
    the event loop's exception handler (its caller was told already)."""
    if not future.cancelled():
        future.exception()
