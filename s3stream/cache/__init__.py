"""Caches of the read path.

- `LogCache`: the hot tail. Every acknowledged batch enters it in WAL order; batches not yet
  uploaded are pinned (they exist nowhere else but the WAL), uploaded ones stay for tail readers
  until the byte budget evicts them, oldest upload first.
- `BlockCache` (block_cache.py): blocks read from objects (single-flight, merged ranged GETs,
  parsed indexes), and `Readahead`, which grows prefetching for sequential catch-up readers.
- `ObjectIndexCache` (index_cache.py): parsed object indexes, a bounded LRU with single flight;
  the BlockCache's, and the Spark planner's.
"""

from .block_cache import BlockCache, BlockCacheMetrics, Readahead
from .index_cache import ObjectIndexCache
from .log_cache import CachedBatch, LogCache, entry_batch

__all__ = [
    "BlockCache",
    "BlockCacheMetrics",
    "CachedBatch",
    "LogCache",
    "ObjectIndexCache",
    "Readahead",
    "entry_batch",
]
