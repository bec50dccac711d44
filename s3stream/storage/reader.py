"""Reading committed data from objects: metadata → object index → ranged block reads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from ..errors import CorruptionError
from ..format.objects import BlockInfo, ObjectIndex, read_blocks, read_index
from ..metadata import MetadataState
from ..objectstore.base import ObjectStore
from ..types import FetchedBatch

__all__ = ["IndexCache", "ObjectDataReader"]


class IndexCache:
    """Parsed object indexes, LRU by count; objects are immutable so entries never go stale."""

    def __init__(self, store: ObjectStore, max_entries: int = 4096) -> None:
        self._store = store
        self._max = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, ObjectIndex] = OrderedDict()

    def get(self, key: str, size: int | None = None) -> ObjectIndex:
        """The index of object `key` (one tail GET on a miss)."""
        with self._lock:
            idx = self._entries.get(key)
            if idx is not None:
                self._entries.move_to_end(key)
                return idx
        idx = read_index(self._store, key, object_size=size)
        with self._lock:
            self._entries[key] = idx
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return idx

    def forget(self, key: str) -> None:
        """Drop a cached index (its object was deleted)."""
        with self._lock:
            self._entries.pop(key, None)


BlockReader = Callable[[str, list[BlockInfo]], list[FetchedBatch]]


class ObjectDataReader:
    """Reads a stream's committed batches from the objects the metadata lists."""

    def __init__(
        self,
        store: ObjectStore,
        indexes: IndexCache,
        block_reader: BlockReader | None = None,
    ) -> None:
        self._store = store
        self._indexes = indexes
        self._read_blocks: BlockReader = block_reader or (
            lambda key, blocks: read_blocks(store, key, blocks)
        )

    def read(
        self, state: MetadataState, stream_id: int, start: int, end: int, max_bytes: int
    ) -> list[FetchedBatch]:
        """Batches overlapping ``[start, end)``: at least one if any exists, about `max_bytes`."""
        out: list[FetchedBatch] = []
        total = 0
        pos = start
        for obj in state.objects_for(stream_id, start, end):
            if pos >= end or (out and total >= max_bytes):
                break
            idx = self._indexes.get(obj.key, obj.size)
            blocks = idx.find(stream_id, pos, end)
            if not blocks:
                continue
            chosen: list[BlockInfo] = []
            budget = 0
            for blk in blocks:
                if chosen and total + budget >= max_bytes:
                    break
                chosen.append(blk)
                budget += blk.raw_size
            for b in self._read_blocks(obj.key, chosen):
                if b.next_offset <= pos:
                    continue
                if b.base_offset > pos:
                    raise CorruptionError(
                        f"stream {stream_id}: offsets {pos}..{b.base_offset} missing in {obj.key}",
                        location=obj.key,
                    )
                if b.base_offset >= end or (out and total + len(b.payload) > max_bytes):
                    return out
                out.append(b)
                total += len(b.payload)
                pos = b.next_offset
            if len(chosen) < len(blocks):
                break  # the byte budget ended inside this object
        return out
