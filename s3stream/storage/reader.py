"""Reading committed data from objects: metadata → object index → blocks via the BlockCache.

The read path is LogCache → BlockCache → object store: `ObjectDataReader` finds the objects
of a stream in a metadata snapshot, the blocks in their (cached) indexes, and asks the
`BlockCache` for them; `Readahead` fetches ahead of sequential readers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..cache.block_cache import BlockCache, Readahead
from ..errors import CorruptionError, ObjectNotFoundError, OffsetOutOfRangeError
from ..format.objects import BlockInfo
from ..metadata import MetadataManager, MetadataState
from ..types import FetchedBatch

__all__ = ["ObjectDataReader", "on_fresh_snapshots", "refreshed"]

T = TypeVar("T")

#: Snapshots a read tries at most while the objects each lists are deleted under it.
_SNAPSHOT_TRIES = 8


def on_fresh_snapshots(
    work: Callable[[MetadataState], T],
    state: MetadataState,
    refresh: Callable[[], MetadataState],
) -> T:
    """`work` on `state`; while an object the snapshot lists is gone (compaction purged it:
    the snapshot is older than the deletion delay), again on a fresh snapshot from
    `refresh`, as long as each is newer than the one before (at most `_SNAPSHOT_TRIES`).
    Once was not enough: with a short deletion delay a second compaction, committed and
    purged between the refresh and the retry, failed healthy reads with
    `ObjectNotFoundError`. A refresh that shows nothing newer means the object is lost:
    the error is raised."""
    for _ in range(_SNAPSHOT_TRIES - 1):
        try:
            return work(state)
        except ObjectNotFoundError:
            fresh = refresh()
            if fresh.seq <= state.seq:
                raise
            state = fresh
    return work(state)


def refreshed(meta: MetadataManager) -> Callable[[], MetadataState]:
    """`on_fresh_snapshots`'s `refresh` for a metadata manager: its state after a refresh."""

    def refresh() -> MetadataState:
        meta.refresh()
        return meta.state

    return refresh


class ObjectDataReader:
    """Reads a stream's committed batches from the objects a metadata snapshot lists."""

    def __init__(self, cache: BlockCache, readahead: Readahead | None = None) -> None:
        self._cache = cache
        self._readahead = readahead

    @property
    def cache(self) -> BlockCache:
        """The block cache reads go through."""
        return self._cache

    def read_latest(
        self,
        meta: MetadataManager,
        stream_id: int,
        start: int,
        end: int,
        max_bytes: int,
        state: MetadataState | None = None,
    ) -> list[FetchedBatch]:
        """`read` on `state` (default: `meta`'s current one), and on fresh snapshots while
        objects it lists are gone (`on_fresh_snapshots`)."""
        return on_fresh_snapshots(
            lambda snapshot: self.read(snapshot, stream_id, start, end, max_bytes),
            meta.state if state is None else state,
            refreshed(meta),
        )

    def read(
        self, state: MetadataState, stream_id: int, start: int, end: int, max_bytes: int
    ) -> list[FetchedBatch]:
        """Batches overlapping ``[start, end)``: at least one if any exists, about `max_bytes`.

        Raises `OffsetOutOfRangeError` when data at `start` is gone because the stream was
        trimmed past it (by retention, say) since the caller last looked.
        """
        out, nbytes = self._read(state, stream_id, start, end, max_bytes)
        if out and self._readahead is not None:
            self._readahead.after_read(state, stream_id, start, out[-1].next_offset, nbytes)
        return out

    def _read(
        self, state: MetadataState, stream_id: int, start: int, end: int, max_bytes: int
    ) -> tuple[list[FetchedBatch], int]:
        """The batches and their total size (counted as they are taken, once)."""
        out: list[FetchedBatch] = []
        total = 0
        pos = start
        for obj in state.objects_for(stream_id, start, end):
            if pos >= end or (out and total >= max_bytes):
                break
            idx = self._cache.index(obj.key, obj.size)
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
            for batches in self._cache.get_blocks(obj.key, chosen):
                for b in batches:
                    if b.next_offset <= pos:
                        continue
                    if b.base_offset > pos:
                        raise missing_data(state, stream_id, pos, b.base_offset, obj.key)
                    if b.base_offset >= end or (out and total + b.size > max_bytes):
                        return out, total
                    out.append(b)
                    total += b.size
                    pos = b.next_offset
            if len(chosen) < len(blocks):
                break  # the byte budget ended inside this object
        if not out and start < end:
            stream = state.streams.get(stream_id)
            if stream is not None and start < stream.start_offset:
                raise missing_data(state, stream_id, start, stream.start_offset, "")
            if stream is not None and start < stream.end_offset:
                # Committed, yet no listed object holds it (an object replaced or damaged in
                # a way its own checksums cannot see): an empty page here would read as the
                # end of the stream to every caller.
                raise missing_data(state, stream_id, start, min(end, stream.end_offset), "")
        return out, total


def missing_data(
    state: MetadataState, stream_id: int, pos: int, found: int, key: str
) -> OffsetOutOfRangeError | CorruptionError:
    """The error for data of `stream_id` missing from `pos` up to `found`: out of range if
    the stream was trimmed past `pos` (the data is legitimately gone), else corruption."""
    stream = state.streams.get(stream_id)
    if stream is not None and pos < stream.start_offset:
        return OffsetOutOfRangeError(
            f"offset {pos} of stream {stream_id} is below its start offset "
            f"{stream.start_offset} (trimmed)"
        )
    where = f" in {key}" if key else ""
    return CorruptionError(
        f"stream {stream_id}: offsets {pos}..{found} missing{where}", location=key or None
    )
