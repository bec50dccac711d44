"""ObjectIndexCache: bounded LRU (entries, bytes) evicting one index at a time, single flight,
failures not cached; shared by the BlockCache and the Spark planner's IndexReader."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from s3stream import SystemClock
from s3stream.cache.block_cache import BlockCache
from s3stream.cache.index_cache import ObjectIndexCache, index_bytes
from s3stream.errors import InvalidArgumentError, ObjectNotFoundError
from s3stream.format.batch import encode_batch
from s3stream.format.objects import ObjectIndex, ObjectWriter
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.metered import MetricsObjectStore
from s3stream.testing.faults import FaultRule, FaultyObjectStore


def make_object(blocks: int) -> bytes:
    """An object of one stream with `blocks` blocks (one batch each)."""
    w = ObjectWriter(block_target_bytes=1)
    for i in range(blocks):
        w.add(1, i, 1, 0, encode_batch(1, i, 1, 0, 0, {}, b"x"))
    return w.finish()


def store_with(sizes: dict[str, int]) -> tuple[MetricsObjectStore, dict[str, int]]:
    """A counted store with one object per key, of `sizes[key]` blocks; and the object sizes."""
    inner = MemoryObjectStore()
    lengths = {}
    for key, blocks in sizes.items():
        data = make_object(blocks)
        inner.put(key, data)
        lengths[key] = len(data)
    return MetricsObjectStore(inner), lengths


def test_lru_by_entries_evicts_one_at_a_time() -> None:
    store, size = store_with({k: 1 for k in "abcd"})
    cache = ObjectIndexCache(store, max_entries=3)
    for key in "abc":
        cache.get(key, size[key])
    cache.get("a", size["a"])  # now the most recent
    cache.get("d", size["d"])  # evicts b only, the least recently used
    assert len(cache) == 3
    assert "b" not in cache and all(k in cache for k in "acd")
    assert (cache.hits, cache.misses) == (1, 4)
    store.reset()
    for key in "acd":
        cache.get(key, size[key])
    assert store.metrics.gets == 0


def test_lru_by_bytes_keeps_at_least_the_newest() -> None:
    store, size = store_with({"small1": 1, "small2": 1, "big": 50})
    probe = ObjectIndexCache(store)
    small = index_bytes(probe.get("small1", size["small1"]))
    cache = ObjectIndexCache(store, max_bytes=2 * small)
    cache.get("small1", size["small1"])
    cache.get("small2", size["small2"])
    assert len(cache) == 2 and cache.cached_bytes == 2 * small
    big = cache.get("big", size["big"])
    # Larger than the whole budget: kept alone (the caller is about to use it).
    assert len(cache) == 1 and "big" in cache and cache.cached_bytes == index_bytes(big)
    cache.get("small1", size["small1"])
    assert len(cache) == 1 and "small1" in cache


def test_concurrent_misses_share_one_read() -> None:
    inner = MemoryObjectStore()
    data = make_object(3)
    inner.put("k", data)
    slow = FaultyObjectStore(
        inner,
        rng=random.Random(1),
        clock=SystemClock(),
        rules=[FaultRule(latency_s=(0.2, 0.2), operations=frozenset({"get"}))],
    )
    store = MetricsObjectStore(slow)
    cache = ObjectIndexCache(store)
    barrier = threading.Barrier(6)
    got: list[ObjectIndex] = []

    def read() -> None:
        barrier.wait()
        got.append(cache.get("k", len(data)))

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 6 and all(idx is got[0] for idx in got)
    assert store.metrics.gets == 1
    assert cache.misses == 1


def test_a_failed_read_is_not_cached_and_forget_drops_one() -> None:
    store, size = store_with({"a": 2})
    cache = ObjectIndexCache(store)
    with pytest.raises(ObjectNotFoundError):
        cache.get("late")
    assert "late" not in cache
    store.put("late", make_object(1))
    assert len(cache.get("late").blocks) == 1
    cache.get("a", size["a"])
    cache.forget("late")
    assert "late" not in cache and "a" in cache
    assert cache.cached_bytes == index_bytes(cache.get("a", size["a"]))
    cache.clear()
    assert len(cache) == 0 and cache.cached_bytes == 0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="max_entries"):
        ObjectIndexCache(MemoryObjectStore(), max_entries=0)
    with pytest.raises(InvalidArgumentError, match="max_bytes"):
        ObjectIndexCache(MemoryObjectStore(), max_bytes=0)


def _index_reader() -> Any:
    """The Spark planner's IndexReader (the s3stream.spark package needs pyspark)."""
    pytest.importorskip("pyspark", reason="the Spark planner needs pyspark (s3stream[spark])")
    from s3stream.spark.planning import IndexReader

    return IndexReader


def test_block_cache_and_spark_planner_share_one_index_cache() -> None:
    IndexReader = _index_reader()
    store, size = store_with({k: 2 for k in "abcde"})
    blocks = BlockCache(store, capacity_bytes=1 << 20)
    blocks.index("a", size["a"])
    planner = IndexReader(store, cache=blocks.indexes, threads=4)
    store.reset()
    planner.prefetch((k, size[k]) for k in "abcde")
    assert store.metrics.gets == 4  # "a" was cached by the block cache
    assert planner.get("e", size["e"]) is blocks.index("e")
    assert store.metrics.gets == 4
    assert blocks.metrics.index_hits >= 1
    blocks.close()


def test_planner_cache_is_bounded_without_clearing_wholesale() -> None:
    IndexReader = _index_reader()
    store, size = store_with({k: 1 for k in "abcdef"})
    planner = IndexReader(store, max_entries=4, threads=2)
    planner.prefetch((k, size[k]) for k in "abcd")
    planner.prefetch((k, size[k]) for k in "ef")
    # The two least recently read went; the rest stayed (the old dict was emptied here).
    assert len(planner.cache) == 4 and "e" in planner.cache and "f" in planner.cache
