"""ObjectIndexCache: parsed object indexes of one store, for every reader of its objects.

Roles:

- Bounded LRU: at most `max_entries` indexes and, optionally, `max_bytes` of them (weighed
  by the stored size of the index: entries plus footer). Eviction drops the least recently
  used index one at a time, never the whole cache, so a working set larger than the bound
  degrades gradually instead of re-reading everything at once.
- Single flight: callers wanting an index that is being read wait for that read instead of
  sending their own tail GET; a failed read fails them all, and the next call tries again.
- Objects are immutable, so a cached index never goes stale; `forget` drops one whose object
  was deleted.

The `BlockCache` (client and reader read path) and the Spark planner (`IndexReader`) both keep
their indexes here. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future

from ..format.objects import FOOTER_SIZE, INDEX_ENTRY_SIZE, ObjectIndex, read_index
from ..objectstore.base import ObjectStore
from ..validation import check_int

__all__ = ["ObjectIndexCache", "index_bytes"]


def index_bytes(index: ObjectIndex) -> int:
    """The weight of `index` in the byte bound: its size as stored (entries and footer)."""
    return len(index.blocks) * INDEX_ENTRY_SIZE + FOOTER_SIZE


class ObjectIndexCache:
    """Parsed indexes of the objects in `store`, read on a miss with `read_index`."""

    def __init__(
        self, store: ObjectStore, *, max_entries: int = 4096, max_bytes: int | None = None
    ) -> None:
        """At most `max_entries` indexes and (unless None) `max_bytes` of them; the index
        used last is always kept, even when it alone is larger than `max_bytes`."""
        self._store = store
        self._max_entries = check_int("max_entries", max_entries, minimum=1)
        if max_bytes is not None:
            check_int("max_bytes", max_bytes, minimum=1)
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, ObjectIndex] = OrderedDict()
        self._inflight: dict[str, Future[ObjectIndex]] = {}
        self._bytes = 0
        self._hits = 0
        self._misses = 0

    @property
    def hits(self) -> int:
        """Calls of `get` answered from the cache."""
        return self._hits

    @property
    def misses(self) -> int:
        """Calls of `get` that read the index (callers that joined a read count as neither)."""
        return self._misses

    @property
    def cached_bytes(self) -> int:
        """Weight (`index_bytes`) of the indexes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def get(self, key: str, size: int | None = None) -> ObjectIndex:
        """The index of object `key` (of `size` bytes if known: saves a request on a miss).

        A miss costs one tail GET (two for a large index), shared by concurrent callers;
        errors of the read (`ObjectNotFoundError`, `CorruptionError`, ...) pass through.
        """
        with self._lock:
            idx = self._hit_locked(key)
            if idx is not None:
                return idx
            fut = self._inflight.get(key)
            mine = fut is None
            if fut is None:
                fut = self._inflight[key] = Future()
                self._misses += 1
        if not mine:
            return fut.result()
        try:
            idx = read_index(self._store, key, object_size=size)
        except BaseException as exc:
            with self._lock:
                self._inflight.pop(key, None)
            fut.set_exception(exc)
            raise
        with self._lock:
            self._inflight.pop(key, None)
            self._put(key, idx)
        fut.set_result(idx)
        return idx

    def peek(self, key: str) -> ObjectIndex | None:
        """The index of object `key` if it is cached (a hit), else None: never a read."""
        with self._lock:
            return self._hit_locked(key)

    def _hit_locked(self, key: str) -> ObjectIndex | None:
        """The cached index of `key`, counted as a hit and made the most recent (the lock is
        held); None on a miss."""
        idx = self._entries.get(key)
        if idx is not None:
            self._entries.move_to_end(key)
            self._hits += 1
        return idx

    def _put(self, key: str, idx: ObjectIndex) -> None:
        """Add `idx` and evict from the cold end down to the bounds (the lock is held)."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= index_bytes(old)
        self._entries[key] = idx
        self._bytes += index_bytes(idx)
        while len(self._entries) > 1 and (
            len(self._entries) > self._max_entries
            or (self._max_bytes is not None and self._bytes > self._max_bytes)
        ):
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= index_bytes(evicted)

    def forget(self, key: str) -> None:
        """Drop the index of object `key` (it was deleted)."""
        with self._lock:
            idx = self._entries.pop(key, None)
            if idx is not None:
                self._bytes -= index_bytes(idx)

    def clear(self) -> None:
        """Drop every cached index (a read in flight still caches its index when it ends)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __repr__(self) -> str:
        return (
            f"ObjectIndexCache(entries={len(self._entries)}/{self._max_entries}, "
            f"bytes={self._bytes}, max_bytes={self._max_bytes})"
        )
