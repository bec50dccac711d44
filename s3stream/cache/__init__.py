"""Caches of the read path.

- `LogCache`: the hot tail. Every acknowledged batch enters it in WAL order; batches not yet
  uploaded are pinned (they exist nowhere else but the WAL), uploaded ones stay for tail readers
  until the byte budget evicts them, oldest upload first.
- `BlockCache` (block_cache.py): blocks read from objects, for catch-up readers.
"""

from .log_cache import CachedBatch, LogCache, entry_batch

__all__ = ["CachedBatch", "LogCache", "entry_batch"]
