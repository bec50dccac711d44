"""BlockCache: LRU in bytes, single flight, merged GETs, cached indexes, readahead; and the
client's read path LogCache → BlockCache → object store."""

from __future__ import annotations

import itertools
import random
import threading
from pathlib import Path

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


def test_concurrent_readers_of_one_block_share_one_get() -> None:
    inner = MemoryObjectStore()
    inner.put(KEY, make_object({1: 10}))
    slow = FaultyObjectStore(
        inner,
        rng=random.Random(1),
        clock=SystemClock(),
        rules=[FaultRule(latency_s=(0.2, 0.2), operations=frozenset({"get"}))],
    )
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
        ra.after_read(state, 0, start, start + 3, 3000)
    cache.close()
    assert cache.metrics.readahead_blocks == 0
    # Sequential: readahead starts at the second fetch and grows.
    cache = BlockCache(store, capacity_bytes=1 << 22)
    ra = Readahead(cache, initial_bytes=8192, max_bytes=64 * 1024)
    issued = []
    pos = 0
    while pos < 300:
        ra.after_read(state, 0, pos, pos + 4, 4000)
        issued.append(cache.metrics.readahead_blocks)
        pos += 4
    assert issued[0] == 0 and issued[1] > 0
    steps = [b - a for a, b in itertools.pairwise(issued) if b > a]
    assert max(steps) > steps[0]  # the window grew
    # Big windows are issued in big chunks: far fewer GETs than fetches.
    cache.close()
    assert cache.metrics.gets < len(issued) / 4


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
