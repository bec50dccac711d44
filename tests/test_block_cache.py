"""BlockCache: LRU in bytes, single flight, merged GETs, cached indexes, readahead; and the
client's read path LogCache → BlockCache → object store."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import ClientSettings, CorruptionError, RecordBatch, SystemClock
from s3stream.cache.block_cache import BlockCache, Readahead
from s3stream.format.batch import encode_batch
from s3stream.format.objects import ObjectIndex, ObjectWriter, read_index
from s3stream.metadata import MetadataState
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.wrappers import MetricsObjectStore
from s3stream.testing.faults import FaultRule, FaultyObjectStore

KEY = "data/obj"


def make_object(streams: dict[int, int], batch_bytes: int = 1000, block: int = 4096) -> bytes:
    """An object with `streams[sid]` batches of `batch_bytes` for each stream."""
    w = ObjectWriter(block_target_bytes=block)
    for sid, n in streams.items():
        for i in range(n):
            payload = bytes([(sid * 31 + i) % 251]) * batch_bytes
            w.add(sid, i, 1, 1000 + i, encode_batch(sid, i, 1, 0, 1000 + i, {}, payload))
    return w.finish()


def setup(
    streams: dict[int, int], **kw: object
) -> tuple[MetricsObjectStore, BlockCache, ObjectIndex]:
    inner = MemoryObjectStore()
    inner.put(KEY, make_object(streams))
    store = MetricsObjectStore(inner)
    idx = read_index(inner, KEY)
    kw.setdefault("capacity_bytes", 1 << 20)
    return store, BlockCache(store, **kw), idx  # type: ignore[arg-type]


def test_hits_after_first_read_and_adjacent_blocks_in_one_get() -> None:
    store, cache, idx = setup({1: 20})
    blocks = idx.find(1, 0)
    assert len(blocks) >= 4
    got = cache.get_blocks(KEY, blocks)
    assert [b.base_offset for bl in got for b in bl] == list(range(20))
    assert store.metrics.gets == 1  # adjacent blocks: one ranged GET
    again = cache.get_blocks(KEY, blocks)
    assert again == got
    assert store.metrics.gets == 1
    m = cache.metrics
    assert (m.misses, m.hits, m.gets) == (len(blocks), len(blocks), 1)
    assert m.cached_blocks == len(blocks)
    assert m.hit_rate == 0.5


def test_blocks_far_apart_need_separate_gets_and_max_get_splits() -> None:
    store, cache, idx = setup({1: 10, 2: 30, 3: 10}, merge_gap_bytes=0)
    cache.get_blocks(KEY, [*idx.find(1, 0), *idx.find(3, 0)])
    assert store.metrics.gets == 2  # stream 2's blocks lie in between
    store2, small_gets, idx2 = setup({1: 40}, max_get_bytes=9000)
    blocks = idx2.find(1, 0)
    small_gets.get_blocks(KEY, blocks)
    total = blocks[-1].end_position - blocks[0].position
    assert store2.metrics.gets >= total // 9000
    assert store2.metrics.gets < len(blocks)


def test_gap_merging_reads_through_a_small_gap() -> None:
    store, cache, idx = setup({1: 8}, merge_gap_bytes=64 * 1024)
    blocks = idx.find(1, 0)
    cache.get_blocks(KEY, blocks[1:2])
    store.reset()
    # Missing blocks 0 and 2..: block 1 (cached) between them is read through, not twice.
    got = cache.get_blocks(KEY, blocks)
    assert store.metrics.gets == 1
    assert [b.base_offset for bl in got for b in bl] == list(range(8))


def test_lru_stays_within_its_byte_budget() -> None:
    store, cache, idx = setup({1: 40}, capacity_bytes=10_000)
    blocks = idx.find(1, 0)
    for blk in blocks:
        cache.get_blocks(KEY, [blk])
    m = cache.metrics
    assert m.cached_bytes <= 10_000
    assert m.evictions == len(blocks) - m.cached_blocks > 0
    store.reset()
    cache.get_blocks(KEY, blocks[:1])  # the oldest was evicted
    assert store.metrics.gets == 1
    cache.get_blocks(KEY, blocks[-1:])  # the newest was not
    assert store.metrics.gets == 1


def test_zero_capacity_caches_nothing_but_still_reads() -> None:
    store, cache, idx = setup({1: 10}, capacity_bytes=0)
    blocks = idx.find(1, 0)
    a = cache.get_blocks(KEY, blocks)
    b = cache.get_blocks(KEY, blocks)
    assert a == b and store.metrics.gets == 2
    assert cache.metrics.cached_bytes == 0


def _slow_store(latency_s: float) -> tuple[MemoryObjectStore, FaultyObjectStore]:
    """An object of stream 1 (10 batches) in memory, and the same store with every GET
    `latency_s` late."""
    inner = MemoryObjectStore()
    inner.put(KEY, make_object({1: 10}))
    slow = FaultyObjectStore(
        inner,
        rng=random.Random(1),
        clock=SystemClock(),
        rules=[FaultRule(latency_s=(latency_s, latency_s), operations=frozenset({"get"}))],
    )
    return inner, slow


def test_concurrent_readers_of_one_block_share_one_get() -> None:
    inner, slow = _slow_store(0.2)
    store = MetricsObjectStore(slow)
    cache = BlockCache(store, capacity_bytes=1 << 20)
    blocks = read_index(inner, KEY).find(1, 0)
    results: list[object] = []
    barrier = threading.Barrier(8)

    def read() -> None:
        barrier.wait()
        results.append(cache.get_blocks(KEY, blocks))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 8 and all(r == results[0] for r in results)
    assert store.metrics.gets == 1
    m = cache.metrics
    assert m.misses == len(blocks) and m.joined + m.hits == 7 * len(blocks)


def test_index_is_cached_and_fetched_once() -> None:
    store, cache, _ = setup({1: 5, 2: 5})
    a = cache.index(KEY)
    b = cache.index(KEY)
    assert a is b
    assert store.metrics.gets == 1
    assert (cache.metrics.index_misses, cache.metrics.index_hits) == (1, 1)
    cache.forget(KEY)
    cache.index(KEY)
    assert store.metrics.gets == 2


def test_corrupt_block_fails_every_reader_loudly() -> None:
    data = bytearray(make_object({1: 6}))
    inner = MemoryObjectStore()
    inner.put(KEY, bytes(data))
    parsed = read_index(inner, KEY)
    blk = parsed.find(1, 0)[0]
    data[blk.position + 50] ^= 0xFF
    inner.put(KEY, bytes(data))
    cache = BlockCache(inner, capacity_bytes=1 << 20)
    for _ in range(2):  # the failed fetch leaves nothing half-done behind
        with pytest.raises(CorruptionError, match="crc32c"):
            cache.get_blocks(KEY, [blk])
    assert cache.metrics.cached_blocks == 0


def test_prefetch_fills_the_cache_in_the_background() -> None:
    store, cache, idx = setup({1: 20})
    blocks = idx.find(1, 0)
    assert cache.prefetch(KEY, blocks) == len(blocks)
    assert cache.prefetch(KEY, blocks) == 0  # in flight or cached: not again
    got = cache.get_blocks(KEY, blocks)  # waits for the prefetch instead of a GET of its own
    assert [b.base_offset for bl in got for b in bl] == list(range(20))
    m = cache.metrics
    assert m.readahead_blocks == len(blocks)
    assert m.misses == 0
    assert m.gets == store.metrics.gets
    cache.close()


def test_a_demand_read_takes_over_a_readahead_waiting_for_the_throttle() -> None:
    """Readahead waits in the limiter (here: far longer than the test); a demand read of the
    same blocks must not wait behind it (foreground reads are never delayed)."""
    from s3stream.throttle import Priority, PriorityRateLimiter

    limiter = PriorityRateLimiter(clock=SystemClock(), bytes_per_s=100, burst_s=1.0)
    limiter.acquire(100, Priority.READAHEAD)  # the burst is spent: readahead now waits
    store, cache, idx = setup({1: 20}, limiter=limiter)
    blocks = idx.find(1, 0)
    assert cache.prefetch(KEY, blocks) == len(blocks)
    started = time.monotonic()
    got = cache.get_blocks(KEY, blocks)
    assert time.monotonic() - started < 5  # the readahead alone would wait ~200 s
    assert [b.base_offset for bl in got for b in bl] == list(range(20))
    assert cache.metrics.misses == len(blocks)  # fetched by the demand read itself
    limiter.close()  # lets the readahead through: it finds its blocks taken and skips them
    cache.close()
    assert store.metrics.gets == 1


def test_a_second_readahead_of_a_taken_over_block_is_not_lost() -> None:
    """A block taken over from a throttled readahead (R1), not kept by the cache, is read
    ahead again (R2): R1, let through later, must not consume R2's mark, or R2 would skip
    its block and leave its future pending for every later reader to wait on forever."""
    from s3stream.throttle import Priority, PriorityRateLimiter

    limiter = PriorityRateLimiter(clock=SystemClock(), bytes_per_s=100, burst_s=1.0)
    limiter.acquire(100, Priority.READAHEAD)  # the burst is spent: readahead now waits
    _, cache, idx = setup({1: 20}, limiter=limiter, capacity_bytes=1, readahead_workers=1)
    block = idx.find(1, 0)[:1]
    cache.prefetch(KEY, block)  # R1 waits in the limiter
    time.sleep(0.2)
    cache.get_blocks(KEY, block)  # taken over; too big to keep
    cache.prefetch(KEY, block)  # R2, queued behind R1
    limiter.close()  # R1 and then R2 go through
    deadline = time.monotonic() + 5
    while cache.metrics.gets < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    t, outcome = _in_thread(lambda: cache.get_blocks(KEY, block))
    t.join(5)
    assert not t.is_alive(), "a reader waits forever on a readahead that never ran"
    assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    cache.close()


def _slow_cache(latency_s: float) -> tuple[MemoryObjectStore, BlockCache]:
    inner, slow = _slow_store(latency_s)
    return inner, BlockCache(slow, capacity_bytes=1 << 20, readahead_workers=1)


def _in_thread(call: Any) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, outcome


def test_closing_the_cache_while_a_demand_read_is_in_flight_returns_its_blocks() -> None:
    """close() during a demand read's GET: the read still returns its blocks (their owner
    completes them), never a raw `InvalidStateError` from a future failed under it."""
    inner, cache = _slow_cache(0.3)
    blocks = read_index(inner, KEY).find(1, 0)
    t, outcome = _in_thread(lambda: cache.get_blocks(KEY, blocks[:2]))
    time.sleep(0.1)  # the demand GET is in flight
    cache.close()
    t.join(10)
    assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    expected = BlockCache(inner, capacity_bytes=0).get_blocks(KEY, blocks[:2])
    assert outcome[0] == expected


def test_a_reader_joined_to_a_readahead_that_close_cancels_is_told() -> None:
    """A readahead queued behind another (one worker) is cancelled by close(); a demand read
    that joined it is told (`StreamClosedError`) or reads the block itself, instead of
    waiting forever."""
    inner, cache = _slow_cache(0.5)
    blocks = read_index(inner, KEY).find(1, 0)
    assert len(blocks) >= 3
    cache.prefetch(KEY, blocks[:1])  # the one worker runs this (0.5 s)
    time.sleep(0.05)
    cache.prefetch(KEY, blocks[2:3])  # queued behind it
    t, outcome = _in_thread(lambda: cache.get_blocks(KEY, blocks[2:3]))
    time.sleep(0.05)
    assert cache.metrics.joined == 1
    cache.close()
    t.join(10)
    assert not t.is_alive(), "the joined reader hangs"
    # Told, or (having given up on the queued readahead after `_QUEUED_JOIN_S`) its blocks.
    assert len(outcome) == 1, outcome
    if isinstance(outcome[0], Exception):
        assert isinstance(outcome[0], s3stream.StreamClosedError), outcome
    else:
        assert outcome[0] == BlockCache(inner, capacity_bytes=0).get_blocks(KEY, blocks[2:3])


def test_a_demand_read_does_not_wait_behind_readaheads_queued_on_a_hung_get() -> None:
    """The readahead workers are stuck in a GET the store does not answer (here: 3 s); a
    demand read of a block whose readahead is queued behind them joined it and waited for
    the whole queue (with a frozen store and the default timeouts: minutes). It waits
    `_QUEUED_JOIN_S` now, then reads the block itself; the readahead, run later, finds its
    block taken and skips it."""
    inner = MemoryObjectStore()
    inner.put(KEY, make_object({1: 10}))
    blocks = read_index(inner, KEY).find(1, 0)
    assert len(blocks) >= 3
    hung = blocks[0].position

    class HungFirstBlock(MetricsObjectStore):
        def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
            if start == hung:
                time.sleep(3)
            return super().get(key, start, end)

    store = HungFirstBlock(inner)
    cache = BlockCache(store, capacity_bytes=1 << 20, readahead_workers=1)
    cache.prefetch(KEY, blocks[:1])  # the one worker is stuck in this GET
    time.sleep(0.05)
    ahead = blocks[2:]
    cache.prefetch(KEY, ahead)  # queued behind it, one run
    started = time.monotonic()
    got = cache.get_blocks(KEY, ahead)
    # ~0.25 s once (not per block) and one GET of its own, not the 3 s ahead.
    assert time.monotonic() - started < 1.5
    assert got == BlockCache(inner, capacity_bytes=0).get_blocks(KEY, ahead)
    assert cache.metrics.joined == len(ahead) and cache.metrics.misses == len(ahead)
    cache.close()
    assert store.metrics.gets == 2  # the hung readahead's and one merged demand GET


def test_a_reader_joined_to_a_readahead_the_store_did_not_answer_is_told_at_once() -> None:
    """The readahead a demand read joined got no answer from the store within its deadline
    (`UnavailableError`): the read fails with it, instead of asking again on its own account
    and waiting as long once more."""
    inner = MemoryObjectStore()
    inner.put(KEY, make_object({1: 10}))
    down = MetricsObjectStore(
        FaultyObjectStore(
            inner,
            rng=random.Random(1),
            clock=SystemClock(),
            rules=[FaultRule(error_rate=1.0, latency_s=(0.3, 0.3), operations=frozenset({"get"}))],
        )
    )
    cache = BlockCache(down, capacity_bytes=1 << 20, readahead_workers=1)
    blocks = read_index(inner, KEY).find(1, 0)[:1]
    cache.prefetch(KEY, blocks)
    time.sleep(0.1)  # its GET is under way
    with pytest.raises(s3stream.UnavailableError):
        cache.get_blocks(KEY, blocks)
    assert cache.metrics.joined == 1
    assert down.metrics.errors == 1  # one GET: the readahead's
    cache.close()


def test_a_reader_joined_to_a_run_never_sent_reads_it_itself() -> None:
    """A read of two runs failed at the first GET (the store did not answer): a reader that
    had joined the second run, which was never sent, was told the store did not answer
    (`UnavailableError`) for a request nobody made. It reads its block itself now."""
    inner = MemoryObjectStore()
    inner.put(KEY, make_object({1: 10}))
    blocks = read_index(inner, KEY).find(1, 0)
    first, far = blocks[0], blocks[-1]
    joined = threading.Event()

    class FirstGetFails(MetricsObjectStore):
        def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
            if start == first.position:
                assert joined.wait(5)
                raise s3stream.UnavailableError("no answer")
            return super().get(key, start, end)

    store = FirstGetFails(inner)
    cache = BlockCache(store, capacity_bytes=1 << 20, merge_gap_bytes=0)
    owner, owner_outcome = _in_thread(lambda: cache.get_blocks(KEY, [first, far]))
    time.sleep(0.1)  # the owner's first GET is under way; the far run waits behind it
    other, outcome = _in_thread(lambda: cache.get_blocks(KEY, [far]))
    time.sleep(0.1)
    assert cache.metrics.joined == 1
    joined.set()
    owner.join(10)
    other.join(10)
    assert isinstance(owner_outcome[0], s3stream.UnavailableError), owner_outcome
    assert outcome == [BlockCache(inner, capacity_bytes=0).get_blocks(KEY, [far])], outcome
    cache.close()


def _state_with(objects: list[tuple[str, int, int, int]]) -> MetadataState:
    """A metadata state with one stream and the given stream objects (key, size, start, end)."""
    from s3stream.metadata import (
        CommitObjects,
        CreateStream,
        LogEntry,
        ObjectKind,
        ObjectMeta,
        OpenStream,
        StreamRange,
    )

    state = MetadataState.empty()
    ops: list[object] = [CreateStream(0, {}, 0), OpenStream(0, 1, "n")]
    ops.append(
        CommitObjects(
            objects=tuple(
                ObjectMeta(
                    key=k,
                    kind=ObjectKind.STREAM,
                    size=size,
                    ranges=(StreamRange(0, a, b),),
                    committed_ms=0,
                    node_id="n",
                )
                for k, size, a, b in objects
            ),
            epochs={0: 1},
        )
    )
    return state.apply(LogEntry(seq=1, ops=tuple(ops), writer="t", ts_ms=0))  # type: ignore[arg-type]


def test_readahead_grows_for_sequential_reads_and_stays_off_for_random_ones() -> None:
    inner = MemoryObjectStore()
    w = ObjectWriter(block_target_bytes=4096)
    for i in range(400):
        w.add(0, i, 1, i, encode_batch(0, i, 1, 0, i, {}, bytes([i % 251]) * 1000))
    data = w.finish()
    inner.put("data/s", data)
    state = _state_with([("data/s", len(data), 0, 400)])
    store = MetricsObjectStore(inner)
    cache = BlockCache(store, capacity_bytes=1 << 22)
    ra = Readahead(cache, initial_bytes=8192, max_bytes=64 * 1024)
    # Random access: never any readahead.
    rnd = random.Random(3)
    for _ in range(20):
        start = rnd.randrange(0, 390)
        assert ra.after_read(state, 0, start, start + 3, 3000) is None
    cache.close()
    assert cache.metrics.readahead_blocks == 0
    # Sequential: readahead starts at the second fetch and grows.
    cache = BlockCache(store, capacity_bytes=1 << 22)
    ra = Readahead(cache, initial_bytes=8192, max_bytes=64 * 1024)
    issued = []
    pos = 0
    while pos < 300:
        planning = ra.after_read(state, 0, pos, pos + 4, 4000)
        if planning is not None:
            planning.result(timeout=10)
        issued.append(cache.metrics.readahead_blocks)
        pos += 4
    assert issued[0] == 0 and issued[1] > 0
    steps = [b - a for a, b in itertools.pairwise(issued) if b > a]
    assert max(steps) > steps[0]  # the window grew
    # Big windows are issued in big chunks: far fewer GETs than fetches.
    cache.close()
    assert cache.metrics.gets < len(issued) / 4


def test_readahead_planning_does_not_hold_the_reader() -> None:
    """Planning reads the indexes of the objects ahead: on the readahead threads, so a fetch
    (served from the cache, say) never waits for a slow index it does not need."""
    inner = MemoryObjectStore()
    objects = []
    for name, first in (("data/a", 0), ("data/b", 100)):
        w = ObjectWriter(block_target_bytes=4096)
        for i in range(first, first + 100):
            w.add(0, i, 1, i, encode_batch(0, i, 1, 0, i, {}, bytes([i % 251]) * 1000))
        data = w.finish()
        inner.put(name, data)
        objects.append((name, len(data), first, first + 100))
    state = _state_with(objects)
    slow = FaultRule(latency_s=(1.5, 1.5), key_prefix="data/b")
    store = FaultyObjectStore(inner, rng=random.Random(0), clock=SystemClock(), rules=[slow])
    cache = BlockCache(store, capacity_bytes=1 << 22)
    ra = Readahead(cache, initial_bytes=64 * 1024, max_bytes=256 * 1024)
    try:
        cache.index("data/a")  # the reader's own object: read by its fetches
        assert ra.after_read(state, 0, 90, 94, 4000) is None  # a new reader: no readahead yet
        started = time.monotonic()
        planning = ra.after_read(state, 0, 94, 98, 4000)  # sequential: plans into data/b
        took = time.monotonic() - started
        assert took < 0.5, f"the reader waited {took:.2f} s for readahead planning"
        assert planning is not None
        # The rest of data/a (its index cached) was issued at once.
        assert cache.metrics.readahead_blocks > 0
        before_b = cache.metrics.readahead_blocks
        # A fetch meanwhile starts no second planning of the same reader.
        assert ra.after_read(state, 0, 98, 99, 1000) is None
        planning.result(timeout=10)
        assert cache.metrics.readahead_blocks > before_b  # data/b's, after its index came
    finally:
        cache.close()


_EXIT_CHILD = """
import random, time
from s3stream.cache.block_cache import BlockCache
from s3stream.clock import SystemClock
from s3stream.format.batch import encode_batch
from s3stream.format.objects import ObjectWriter, read_index
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.testing.faults import FaultRule, FaultyObjectStore

inner = MemoryObjectStore()
w = ObjectWriter(block_target_bytes=4096)
for i in range(50):
    w.add(0, i, 1, i, encode_batch(0, i, 1, 0, i, {}, b"x" * 1000))
inner.put("data/a", w.finish())
blocks = read_index(inner, "data/a").blocks
slow = FaultRule(latency_s=(8.0, 8.0), operations=frozenset({"get"}))
store = FaultyObjectStore(inner, rng=random.Random(0), clock=SystemClock(), rules=[slow])
cache = BlockCache(store, capacity_bytes=1 << 22)
cache.prefetch("data/a", blocks[:3])
time.sleep(0.3)  # the readahead's GET is under way
started = time.monotonic()
cache.close(0.2)
assert time.monotonic() - started < 1, "close overran its timeout"
"""


def test_readahead_left_behind_by_a_close_does_not_hold_up_the_exit() -> None:
    """A close that stopped waiting for a readahead GET (a store that stopped answering) kept
    its deadline, and the process then did not end until the GET did: the readahead threads
    were a ThreadPoolExecutor's, which the interpreter joins at exit (8.5 s here)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_CHILD], capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert took < 5, f"the process took {took:.1f} s to end after the close"


@pytest.fixture
def small_client(tmp_path: Path) -> s3stream.StreamClient:
    settings = ClientSettings(
        upload_threshold_bytes=256 * 1024,
        stream_split_bytes=64 * 1024,
        block_target_bytes=16 * 1024,
        max_pending_bytes=4 << 20,
        upload_interval_ms=0,
        log_cache_bytes=0,  # every read below the tail goes to objects
        readahead_initial_bytes=32 * 1024,
        readahead_max_bytes=512 * 1024,
    )
    return s3stream.open(str(tmp_path), wal="memory://", settings=settings)


def test_client_reads_go_through_the_block_cache(small_client: s3stream.StreamClient) -> None:
    with small_client as client:
        s = client.create_stream()
        for i in range(400):
            s.append(RecordBatch(bytes([i % 251]) * 2000))
        client.flush()
        before = client.metrics
        first = s.fetch(100, max_bytes=50_000)
        mid = client.metrics
        second = s.fetch(100, max_bytes=50_000)
        after = client.metrics
        assert first.batches == second.batches
        assert mid.object_store.gets > before.object_store.gets
        assert after.object_store.gets == mid.object_store.gets  # served by the BlockCache
        assert after.block_cache.hits > mid.block_cache.hits


def test_catch_up_reader_gets_readahead_and_few_gets(small_client: s3stream.StreamClient) -> None:
    with small_client as client:
        s = client.create_stream()
        payloads = [bytes([i % 251]) * 2000 for i in range(2000)]
        for p in payloads:
            s.append(RecordBatch(p))
        client.flush()
        client.compact()  # fewer, larger objects
        base = client.metrics
        off, got = 0, []
        fetches = 0
        while off < s.confirm_offset:
            res = s.fetch(off, max_bytes=16 * 1024)
            got.extend(b.payload for b in res.batches)
            off = res.next_offset
            fetches += 1
        assert got == payloads
        m = client.metrics
        gets = m.object_store.gets - base.object_store.gets
        assert m.block_cache.readahead_blocks > 0
        assert m.block_cache.readahead_used > 0
        assert gets * 4 < fetches  # readahead turned many small fetches into few big GETs
