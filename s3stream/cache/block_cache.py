"""BlockCache: decoded data blocks of objects, for readers behind the LogCache.

- An LRU bounded in bytes (the blocks' raw sizes) of decoded blocks, keyed by (object key,
  block position). Objects are immutable, so an entry never goes stale.
- Single flight: readers of a block that is being fetched wait for that fetch instead of
  issuing their own GET; so do readers of an object index being fetched.
- Adjacent missing blocks (at most `merge_gap_bytes` apart) are fetched with one ranged GET,
  split at `max_get_bytes` so that one GET never grows without bound: the merge rule, the GET
  and its length check are the shared `BlockReader`'s (`s3stream.format.block_reader`).
- Parsed object indexes are cached too, in an `ObjectIndexCache` (LRU by count).
- `Readahead` watches each reader's position per stream: a fetch that starts exactly where the
  previous one of that stream ended is sequential (a catch-up reader), and the window of
  blocks fetched ahead in the background doubles with each such fetch up to a maximum; any
  other fetch is random access and gets no readahead.

Readahead GETs go through the rate limiter at `Priority.READAHEAD`; demand reads at
`Priority.FOREGROUND` (counted, never delayed). A demand read that needs a block whose
readahead has not yet passed the limiter (queued, or waiting for tokens) takes that block's
fetch over at its own priority, so a throttled readahead never delays a foreground read.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import ParamSpec

from .._daemon_pool import DaemonPool
from ..errors import InvalidArgumentError, S3StreamError, StreamClosedError, UnavailableError
from ..format.block import BlockInfo
from ..format.block_reader import BlockReader, decode_run
from ..format.objects import ObjectIndex
from ..metadata import MetadataState
from ..metrics.logs import ContextLogger
from ..objectstore.base import ObjectStore
from ..throttle import Priority, PriorityRateLimiter
from ..types import FetchedBatch
from ..units import MiB
from ..validation import check_int, check_text
from .index_cache import ObjectIndexCache

__all__ = ["BlockCache", "BlockCacheMetrics", "Readahead"]

log = logging.getLogger(__name__)


_BlockKey = tuple[str, int]
_P = ParamSpec("_P")


class _NotFetched(S3StreamError):
    """Fails the futures of runs a read never sent, after an earlier run of it failed."""


#: How long a demand read waits for a readahead of its block that has not sent its GET yet
#: before it reads the block itself: usually the readahead goes within milliseconds; queued
#: behind runs that each wait out a store timeout, it could make a fetch take several.
_QUEUED_JOIN_S = 0.25
#: Blocks whose fetch a caller owns, each with the future its readers wait on.
_Owned = list[tuple[BlockInfo, Future[list[FetchedBatch]]]]


@dataclass(frozen=True, slots=True)
class BlockCacheMetrics:
    """Counters of a `BlockCache` (a snapshot)."""

    #: Blocks a read found in the cache.
    hits: int = 0
    #: Blocks a read had to fetch itself.
    misses: int = 0
    #: Blocks a read found being fetched by another reader (or by readahead) and waited for.
    joined: int = 0
    #: Blocks fetched ahead of demand, and how many of those a read later used.
    readahead_blocks: int = 0
    readahead_used: int = 0
    #: Ranged GETs issued for blocks, and the bytes they returned.
    gets: int = 0
    get_bytes: int = 0
    #: Object indexes found cached, and fetched.
    index_hits: int = 0
    index_misses: int = 0
    #: Blocks evicted to stay within the byte budget.
    evictions: int = 0
    #: What the cache holds now.
    cached_blocks: int = 0
    cached_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of block reads served without a GET of their own (hits + joined)."""
        total = self.hits + self.joined + self.misses
        return (self.hits + self.joined) / total if total else 0.0


class _Entry:
    __slots__ = ("batches", "prefetched", "size")

    def __init__(self, batches: list[FetchedBatch], size: int, prefetched: bool) -> None:
        self.batches = batches
        self.size = size
        self.prefetched = prefetched


class BlockCache:
    """Decoded blocks of objects in `store`, at most `capacity_bytes` of them (raw sizes).

    `limiter` throttles readahead (None: no limit); `readahead_workers` threads fetch ahead.
    Thread-safe. Call `close` to stop the readahead threads.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        capacity_bytes: int,
        limiter: PriorityRateLimiter | None = None,
        max_get_bytes: int = 8 * MiB,
        merge_gap_bytes: int = 64 * 1024,
        readahead_workers: int = 4,
        index_entries: int = 4096,
        node_id: str = "",
    ) -> None:
        if not isinstance(store, ObjectStore):
            raise InvalidArgumentError(f"store must be an ObjectStore, got {store!r}")
        # Whose cache this is, for its log records ("" for a reader, which is no node).
        self._log = ContextLogger(log, check_text("node_id", node_id))
        self._capacity = check_int("capacity_bytes", capacity_bytes, minimum=0)
        self._limiter = limiter
        # A throttle may delay a readahead long: demand reads take it over at once; without
        # one, they join it (its GET is usually sent already, or soon).
        self._throttled = limiter is not None and not limiter.unlimited
        self._reader = BlockReader(
            store,
            max_gap_bytes=check_int("merge_gap_bytes", merge_gap_bytes, minimum=0),
            max_run_bytes=check_int("max_get_bytes", max_get_bytes, minimum=1),
        )
        self._indexes = ObjectIndexCache(
            store, max_entries=check_int("index_entries", index_entries, minimum=1)
        )
        self._lock = threading.Lock()
        self._entries: OrderedDict[_BlockKey, _Entry] = OrderedDict()
        self._inflight: dict[_BlockKey, Future[list[FetchedBatch]]] = {}
        #: Blocks of throttled readaheads that have not passed the limiter yet (queued or
        #: waiting for tokens): a demand read takes such a block over instead of waiting.
        self._waiting: dict[_BlockKey, Future[list[FetchedBatch]]] = {}
        #: Readahead runs submitted to the pool and not started: close() fails their futures
        #: (a cancelled task never completes them).
        self._queued: dict[int, tuple[str, _Owned]] = {}
        self._next_run = itertools.count()
        self._bytes = 0
        # Daemon threads: readahead a close stopped waiting for (a GET on a store that
        # stopped answering) must not hold up the process's exit either.
        self._pool = DaemonPool(
            check_int("readahead_workers", readahead_workers, minimum=1), "s3stream-readahead"
        )
        self._closed = False
        #: Readahead tasks running (started, not ended), under `_idle`: `close` waits for them.
        self._idle = threading.Condition(threading.Lock())
        self._active = 0
        self._c = dict.fromkeys(
            (
                "hits",
                "misses",
                "joined",
                "readahead_blocks",
                "readahead_used",
                "gets",
                "get_bytes",
                "evictions",
            ),
            0,
        )

    @property
    def capacity_bytes(self) -> int:
        """The byte budget."""
        return self._capacity

    @property
    def metrics(self) -> BlockCacheMetrics:
        """A snapshot of the counters."""
        with self._lock:
            return BlockCacheMetrics(
                **self._c,
                index_hits=self._indexes.hits,
                index_misses=self._indexes.misses,
                cached_blocks=len(self._entries),
                cached_bytes=self._bytes,
            )

    def close(self, timeout_s: float | None = None) -> None:
        """Stop readahead (pending prefetches are dropped) and empty the cache. Readahead
        under way (a GET, an index read for its planning) is waited for at most `timeout_s`
        (None: until it ends): against a store that stopped answering it ends only by the
        store's timeout, and a client's close has a deadline of its own."""
        with self._lock:
            self._closed = True
        self._pool.shutdown()
        with self._idle:
            self._idle.wait_for(lambda: not self._active, timeout_s)
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            # Readaheads cancelled before they ran never complete their futures; every other
            # future in flight has an owner that completes it (a demand read, or a readahead
            # the shutdown waited for).
            dropped = list(self._queued.values())
            self._queued.clear()
        for key, run in dropped:
            self._fail(key, run, StreamClosedError("the block cache was closed"))
        self._indexes.clear()

    # ------------------------------------------------------------------ indexes

    @property
    def indexes(self) -> ObjectIndexCache:
        """The cache of parsed object indexes (shareable with other readers of the store)."""
        return self._indexes

    def index(self, key: str, size: int | None = None) -> ObjectIndex:
        """The parsed index of object `key` (one tail GET on a miss, shared by concurrent
        callers)."""
        return self._indexes.get(key, size)

    def forget(self, key: str) -> None:
        """Drop everything cached for object `key` (it was deleted)."""
        self._indexes.forget(key)
        with self._lock:
            for bk in [bk for bk in self._entries if bk[0] == key]:
                self._bytes -= self._entries.pop(bk).size

    # ------------------------------------------------------------------ blocks

    def get_blocks(
        self,
        key: str,
        blocks: Sequence[BlockInfo],
        priority: Priority = Priority.FOREGROUND,
    ) -> list[list[FetchedBatch]]:
        """The decoded batches of each of `blocks` of object `key`, in the order given.

        Cached blocks cost nothing; blocks being fetched are waited for; the rest are fetched
        with one ranged GET per run of adjacent blocks.
        """
        return self._get_blocks(key, blocks, priority, take_queued=False)

    def _get_blocks(
        self,
        key: str,
        blocks: Sequence[BlockInfo],
        priority: Priority,
        *,
        take_queued: bool,
    ) -> list[list[FetchedBatch]]:
        """`get_blocks`; with `take_queued`, a readahead of a block that has not sent its GET
        yet is taken over at once (as a throttled one always is)."""
        results: list[list[FetchedBatch] | None] = [None] * len(blocks)
        #: (index, future joined, whether it is a readahead not started yet)
        waits: list[tuple[int, Future[list[FetchedBatch]], bool]] = []
        mine: list[tuple[int, BlockInfo, Future[list[FetchedBatch]]]] = []
        with self._lock:
            for i, blk in enumerate(blocks):
                bk = (key, blk.position)
                entry = self._entries.get(bk)
                if entry is not None:
                    self._entries.move_to_end(bk)
                    self._c["hits"] += 1
                    if entry.prefetched:
                        entry.prefetched = False
                        self._c["readahead_used"] += 1
                    results[i] = entry.batches
                    continue
                fut = self._inflight.get(bk)
                queued = fut is not None and self._waiting.get(bk) is fut
                if queued and (self._throttled or take_queued):
                    # A readahead not yet past the limiter (or queued too long): fetch the
                    # block now, at our priority, with a future of our own (readers that
                    # joined the readahead's give up on it after `_QUEUED_JOIN_S`).
                    del self._waiting[bk]
                    fut = None
                if fut is not None:
                    self._c["joined"] += 1
                    waits.append((i, fut, queued))
                    continue
                fut = self._inflight[bk] = Future()
                self._c["misses"] += 1
                mine.append((i, blk, fut))
        if mine:
            self._fetch(key, [(blk, fut) for _, blk, fut in mine], priority, prefetched=False)
            for i, _, fut in mine:
                results[i] = fut.result()
        # Blocks whose readahead was still queued when the first wait for one ran out: read
        # together (one merged GET where they are adjacent), or joined if sent meanwhile.
        late: list[int] = []
        for i, fut, queued in waits:
            try:
                if queued and not fut.done():
                    if late:
                        late.append(i)
                        continue
                    try:
                        results[i] = fut.result(_QUEUED_JOIN_S)
                    except FutureTimeoutError:
                        # Still queued behind other readaheads (each may take a store timeout
                        # against a store that stopped answering).
                        late.append(i)
                    continue
                results[i] = fut.result()
            except StreamClosedError:
                raise
            except UnavailableError:
                # The store did not answer the fetch we joined within its deadline: asking
                # again on our own account would wait as long once more.
                raise
            except S3StreamError:
                # The fetch we joined failed (a readahead, say): try once on our own account.
                (results[i],) = self._get_blocks(key, [blocks[i]], priority, take_queued=True)
        if late:
            got = self._get_blocks(key, [blocks[i] for i in late], priority, take_queued=True)
            for i, batches in zip(late, got, strict=True):
                results[i] = batches
        return [r if r is not None else [] for r in results]

    def in_background(
        self, fn: Callable[_P, None], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> Future[None] | None:
        """Run ``fn(*args, **kwargs)`` on a readahead thread (readahead work that may wait on the
        store: planning it reads object indexes); None if the cache is closed."""
        with self._lock:
            if self._closed:
                return None
        try:
            return self._submit(functools.partial(fn, *args, **kwargs))
        except RuntimeError:  # closed meanwhile
            return None

    def _submit(self, work: Callable[[], None]) -> Future[None]:
        """Run readahead `work` on the pool, counted while it runs (`close` waits for it);
        `RuntimeError` once the pool is shut down."""
        return self._pool.submit(self._counted, work)

    def _counted(self, work: Callable[[], None]) -> None:
        with self._idle:
            self._active += 1
        try:
            work()
        finally:
            with self._idle:
                self._active -= 1
                if not self._active:
                    self._idle.notify_all()

    def prefetch(self, key: str, blocks: Sequence[BlockInfo]) -> int:
        """Fetch `blocks` of object `key` in the background unless cached or in flight;
        returns how many were scheduled."""
        todo: _Owned = []
        with self._lock:
            if self._closed:
                return 0
            for blk in blocks:
                bk = (key, blk.position)
                if bk in self._entries or bk in self._inflight:
                    continue
                fut: Future[list[FetchedBatch]] = Future()
                self._inflight[bk] = fut
                self._waiting[bk] = fut
                todo.append((blk, fut))
            self._c["readahead_blocks"] += len(todo)
        for run in self._runs(todo):
            n = next(self._next_run)
            with self._lock:
                self._queued[n] = (key, run)
            try:
                self._submit(functools.partial(self._prefetch_run, n, key, run))
            except RuntimeError:
                # Closed meanwhile: nobody may wait forever on these futures.
                with self._lock:
                    self._queued.pop(n, None)
                self._fail(key, run, StreamClosedError("the block cache was closed"))
        return len(todo)

    def _prefetch_run(self, n: int, key: str, run: _Owned) -> None:
        with self._lock:
            if self._queued.pop(n, None) is None:
                return  # close() failed it already
        try:
            self._fetch(key, run, Priority.READAHEAD, prefetched=True)
        except S3StreamError as exc:
            self._log.debug("readahead of %s failed: %s", key, exc)

    def _runs(self, items: _Owned) -> list[_Owned]:
        """`items` in position order, grouped into the reader's runs (one GET each)."""
        futures = {blk.position: fut for blk, fut in items}
        ordered = sorted((blk for blk, _ in items), key=lambda b: b.position)
        return [[(b, futures[b.position]) for b in run] for run in self._reader.runs(ordered)]

    def _fetch(self, key: str, items: _Owned, priority: Priority, *, prefetched: bool) -> None:
        """GET and decode `items` (whose futures this caller owns), completing every future;
        raises the first error after failing the futures it could not complete."""
        runs = self._runs(items)
        # A readahead's blocks may be taken over by demand reads until it sends its GET (past
        # the limiter, if throttled; else after `_QUEUED_JOIN_S` in the queue: `get_blocks`);
        # then demand reads join it.
        may_lose = prefetched
        for n, run in enumerate(runs):
            blocks = [b for b, _ in run]
            if may_lose and not self._still_waiting(key, run):
                continue  # demand reads took every block of this run over
            try:
                if self._limiter is not None:
                    self._limiter.acquire(blocks[-1].end_position - blocks[0].position, priority)
                if may_lose and not self._still_waiting(key, run, discard=True):
                    continue  # taken over while it waited for the limiter
                data = self._reader.fetch(key, blocks, on_response=self._count_get)
                decoded = decode_run(key, blocks, data)
            except BaseException as exc:
                self._fail(key, run, exc)
                # The runs after it were never asked for: readers that joined them try on
                # their own account (an `UnavailableError` of this run's GET would tell them
                # the store did not answer a request nobody made).
                unsent = _NotFetched(f"{key}: not fetched, an earlier GET of its read failed")
                for later in runs[n + 1 :]:
                    self._fail(key, later, exc if isinstance(exc, StreamClosedError) else unsent)
                raise
            self._store_blocks(key, run, decoded, prefetched)

    def _still_waiting(self, key: str, run: _Owned, *, discard: bool = False) -> bool:
        """Whether any block of a readahead's `run` still waits for it (was not taken over by
        a demand read: the mark is still this run's future); with `discard`, they stop
        waiting (marks of later readaheads of the same blocks are left alone)."""
        with self._lock:
            mine = [bk for blk, fut in run if self._waiting.get(bk := (key, blk.position)) is fut]
            if discard:
                for bk in mine:
                    del self._waiting[bk]
            return bool(mine)

    def _count_get(self, nbytes: int) -> None:
        with self._lock:
            self._c["gets"] += 1
            self._c["get_bytes"] += nbytes

    def _store_blocks(
        self, key: str, run: _Owned, decoded: list[list[FetchedBatch]], prefetched: bool
    ) -> None:
        with self._lock:
            for (blk, fut), batches in zip(run, decoded, strict=True):
                bk = (key, blk.position)
                self._forget_inflight(bk, fut)
                if self._capacity and not self._closed and bk not in self._entries:
                    self._entries[bk] = _Entry(batches, blk.raw_size, prefetched)
                    self._bytes += blk.raw_size
            while self._bytes > self._capacity and self._entries:
                _, old = self._entries.popitem(last=False)
                self._bytes -= old.size
                self._c["evictions"] += 1
        for (_, fut), batches in zip(run, decoded, strict=True):
            # Done already when close() failed a dropped readahead.
            if not fut.done():
                fut.set_result(batches)

    def _fail(self, key: str, run: _Owned, exc: BaseException) -> None:
        with self._lock:
            for blk, fut in run:
                self._forget_inflight((key, blk.position), fut)
        for _, fut in run:
            if not fut.done():
                fut.set_exception(exc)

    def _forget_inflight(self, bk: _BlockKey, fut: Future[list[FetchedBatch]]) -> None:
        """Drop `bk`'s in-flight future if it still is `fut` (a later fetch of the block, after
        an eviction, has a future of its own). Lock held."""
        if self._inflight.get(bk) is fut:
            del self._inflight[bk]
        if self._waiting.get(bk) is fut:
            del self._waiting[bk]

    @property
    def logger(self) -> ContextLogger:
        """The cache's logger (its node's; readahead on it logs through it too)."""
        return self._log

    def __repr__(self) -> str:
        return f"BlockCache(capacity_bytes={self._capacity}, cached_bytes={self._bytes})"


class _Cursor:
    __slots__ = ("ahead", "frontier", "planning", "window")

    def __init__(self, window: int, ahead: int, frontier: int) -> None:
        #: Readahead window in bytes (0: not known to be sequential yet).
        self.window = window
        #: Bytes fetched ahead of the reader's position and not yet read.
        self.ahead = ahead
        #: Offset up to which readahead has been issued.
        self.frontier = frontier
        #: A planning of this reader's readahead is queued or running: no second one.
        self.planning = False

    def issued(self, nbytes: int, end: int) -> None:
        """Readahead of `nbytes` more, up to offset `end`, was issued (`Readahead._lock`
        held)."""
        self.ahead += nbytes
        self.frontier = max(self.frontier, end)


class Readahead:
    """Detects sequential readers per stream and fetches ahead of them into a `BlockCache`.

    A reader is identified by where its next fetch must start: a fetch of stream s starting at
    offset o continues the reader whose previous fetch of s ended at o. Its window starts at
    `initial_bytes` on the second sequential fetch and doubles per fetch up to `max_bytes`
    (and at most a quarter of the cache's capacity);
    new readahead is issued only once less than half a window is left ahead of the reader, so
    each batch of readahead is large (few GETs). Up to `max_readers` readers are tracked (LRU).
    """

    def __init__(
        self,
        cache: BlockCache,
        *,
        initial_bytes: int = 1 * MiB,
        max_bytes: int = 32 * MiB,
        max_readers: int = 1024,
    ) -> None:
        self._cache = cache
        self._initial = check_int("initial_bytes", initial_bytes, minimum=0)
        self._max = check_int("max_bytes", max_bytes, minimum=0)
        self._max_readers = check_int("max_readers", max_readers, minimum=1)
        self._lock = threading.Lock()
        self._cursors: OrderedDict[tuple[int, int], _Cursor] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """False when `max_bytes` is 0."""
        return self._max > 0 and self._initial > 0

    def after_read(
        self, state: MetadataState, stream_id: int, start: int, next_offset: int, nbytes: int
    ) -> Future[None] | None:
        """Record a fetch of ``[start, next_offset)`` (`nbytes` payload bytes) and fetch ahead
        if it continues a sequential reader. Never raises: readahead is best effort.

        What the cached indexes show is issued in the caller's thread; if the planning must
        read an index (of an object ahead), it goes on on the cache's readahead threads: a
        fetch served from the cache does not wait a store timeout for an index it does not
        need. Returns the future of that background planning (None if there is none)."""
        if not self.enabled or next_offset <= start:
            return None
        with self._lock:
            cur = self._cursors.pop((stream_id, start), None)
            if cur is None:
                cur = _Cursor(0, 0, next_offset)
                need = 0
            else:
                # Never more than a quarter of the cache ahead, or readahead evicts itself.
                limit = min(self._max, self._cache.capacity_bytes // 4)
                cur.window = min(limit, max(self._initial, cur.window * 2))
                cur.ahead = max(0, cur.ahead - nbytes)
                if cur.ahead == 0 or cur.frontier < next_offset:
                    cur.ahead, cur.frontier = 0, next_offset
                need = cur.window - cur.ahead if cur.ahead * 2 <= cur.window else 0
            frontier = cur.frontier
            self._cursors[(stream_id, next_offset)] = cur
            while len(self._cursors) > self._max_readers:
                self._cursors.popitem(last=False)
            if need <= 0 or cur.planning:
                return None
            cur.planning = True
        # What the cached indexes show is issued at once (a sequential reader's next fetch
        # then finds its blocks on their way); an index to read is read on a readahead
        # thread, with the rest of the planning.
        issued, end, stopped = self._issued(state, stream_id, frontier, need, read_indexes=False)
        with self._lock:
            cur.issued(issued, end)
            if not stopped:
                cur.planning = False
                return None
        plan = self._cache.in_background(self._plan, cur, state, stream_id, end, need - issued)
        if plan is None:  # the cache is closed
            with self._lock:
                cur.planning = False
        return plan

    def _plan(
        self, cur: _Cursor, state: MetadataState, stream_id: int, frontier: int, need: int
    ) -> None:
        issued, end = 0, frontier
        try:
            issued, end, _ = self._issued(state, stream_id, frontier, need, read_indexes=True)
        finally:
            # The reader may have read on meanwhile (its cursor is then keyed by its new
            # position): it is the same cursor object either way.
            with self._lock:
                cur.planning = False
                cur.issued(issued, end)

    def _issued(
        self,
        state: MetadataState,
        stream_id: int,
        frontier: int,
        need: int,
        *,
        read_indexes: bool,
    ) -> tuple[int, int, bool]:
        """`_issue`, never raising (a failure is logged and ends the planning): bytes issued,
        where they end, and whether it stopped at an index not cached (`read_indexes` off)."""
        try:
            return self._issue(state, stream_id, frontier, need, read_indexes=read_indexes)
        except S3StreamError as exc:
            self._cache.logger.for_stream(stream_id).debug(
                "readahead planning for stream %d failed: %s", stream_id, exc
            )
            return 0, frontier, False

    def _issue(
        self, state: MetadataState, stream_id: int, frontier: int, need: int, *, read_indexes: bool
    ) -> tuple[int, int, bool]:
        issued = 0
        pos = frontier
        for obj in state.objects_for(stream_id, frontier):
            if read_indexes:
                idx = self._cache.index(obj.key, obj.size)
            else:
                cached = self._cache.indexes.peek(obj.key)
                if cached is None:
                    return issued, pos, True
                idx = cached
            take: list[BlockInfo] = []
            for blk in idx.find(stream_id, pos):
                take.append(blk)
                issued += blk.raw_size
                pos = blk.end_offset
                if issued >= need:
                    break
            if take:
                self._cache.prefetch(obj.key, take)
            if issued >= need:
                break
        return issued, pos, False
