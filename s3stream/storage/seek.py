"""Seek by time: the first offset of a stream whose timestamp is >= a given one.

The answer is the smallest offset ``o`` in the searched range whose timestamp is >= the
target, with offset timestamps as `s3stream.format.timestamps` defines them (a record's own
timestamp or its batch's base timestamp; every offset of a raw batch has the batch's base
timestamp). That is Kafka's ``offsetsForTimes``. Timestamps need not grow with offsets: the
answer is still the *first* offset that qualifies, so records after it may be older than the
target, and none before it is as new.

How, for committed data (`seek_objects`): the stream's live objects in offset order (from the
metadata, no I/O); in each, through its (cached) index, the blocks in offset order; a block
whose time range (the object's time-range table) ends below the target is skipped without
reading it, one that starts at or above the target answers with its first offset without
reading it, and the first other block is read (through the block cache) and searched. The
block that first reaches the target holds the answer, so one block is read: two only when
that block straddles the range's start and its matching records all lie below it. Objects:
the metadata records each stream range's smallest and largest timestamp (`StreamRange`), so
objects whose largest is below the target are skipped without reading their index, and the
first object visited holds the answer: one index read (free once cached) and one block per
call. Objects committed before the metadata kept time ranges are visited (their index read);
blocks without a time range (objects written before the table existed) cannot be skipped:
each is read, one GET per block, until the answer.

For the owning client (`seek_with_log_cache`), offsets the LogCache holds are searched there
(in memory, batch by batch) instead of in objects, as the read path does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..cache.log_cache import LogCache
from ..format.block import BlockInfo
from ..format.objects import ObjectIndex
from ..format.timestamps import first_offset_at
from ..metadata import MetadataManager, MetadataState
from ..types import FetchedBatch
from ..validation import check_int
from .reader import missing_data, on_fresh_snapshots, refreshed

__all__ = [
    "BlockSource",
    "check_timestamp",
    "seek_committed",
    "seek_objects",
    "seek_with_log_cache",
]

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
#: Payload bytes of LogCache batches looked at per page (the cache's lock is held per page).
_PAGE_BYTES = 1 << 20


class BlockSource(Protocol):
    """Where seek reads object indexes and blocks: a `BlockCache` (clients and readers) or
    the Spark planner's indexes with a `BlockReader`."""

    def index(self, key: str, size: int | None = None) -> ObjectIndex:
        """The parsed index of object `key` (of `size` bytes if known)."""
        ...

    def get_blocks(self, key: str, blocks: Sequence[BlockInfo]) -> list[list[FetchedBatch]]:
        """The decoded batches of each of `blocks` of object `key`."""
        ...


def check_timestamp(name: str, value: object) -> int:
    """A timestamp argument: an int within i64 (milliseconds since the epoch; negative ones,
    before 1970, are valid, as in batches)."""
    return check_int(name, value, minimum=_I64_MIN, maximum=_I64_MAX)


def _in_batches(batches: Sequence[FetchedBatch], start: int, end: int, ts: int) -> int | None:
    for b in batches:
        if b.next_offset <= start:
            continue
        if b.base_offset >= end:
            return None
        hit = first_offset_at(b, start, ts)
        if hit is not None:
            return hit if hit < end else None
    return None


def seek_objects(
    state: MetadataState, source: BlockSource, stream_id: int, start: int, end: int, ts: int
) -> int | None:
    """The first offset in ``[start, end)`` with timestamp >= `ts`, searched in the objects
    `state` lists (see the module docstring), or None.

    Offsets of the range that no object holds raise as a read would: `OffsetOutOfRangeError`
    below the stream's start offset (trimmed), `CorruptionError` otherwise.
    """
    pos = start
    for obj in state.objects_for(stream_id, start, end) if start < end else ():
        rng = obj.range_of(stream_id)
        if rng is not None and rng.max_timestamp is not None and rng.max_timestamp < ts:
            # Nothing here is as new as the target (the metadata says so): no index read.
            pos = max(pos, rng.end_offset)
            continue
        for block in source.index(obj.key, obj.size).find(stream_id, pos, end):
            if block.start_offset > pos:
                raise missing_data(state, stream_id, pos, block.start_offset, obj.key)
            pos = block.end_offset
            times = block.time_range
            if times is not None and times[1] < ts:
                continue
            if times is not None and times[0] >= ts:
                return max(block.start_offset, start)
            hit = _in_batches(source.get_blocks(obj.key, [block])[0], start, end, ts)
            if hit is not None:
                return hit
    if pos < end:
        raise missing_data(state, stream_id, pos, end, "")
    return None


def seek_committed(
    meta: MetadataManager, source: BlockSource, stream_id: int, start: int, end: int, ts: int
) -> int | None:
    """`seek_objects` on `meta`'s current snapshot, and on fresh ones while objects it
    lists are gone (`on_fresh_snapshots`; a trim may have moved the start meanwhile)."""

    def seek(state: MetadataState) -> int | None:
        first = max(start, state.get_stream(stream_id).start_offset)
        return seek_objects(state, source, stream_id, first, max(first, end), ts)

    return on_fresh_snapshots(seek, meta.state, refreshed(meta))


def _seek_log_cache(
    cache: LogCache, stream_id: int, start: int, end: int, ts: int
) -> tuple[int | None, int | None]:
    """Search the LogCache from `start`: ``(answer or None, None)`` when done, ``(None,
    offset)`` when the cache no longer holds `offset` (it was uploaded and evicted)."""
    pos = start
    while pos < end:
        got, complete = cache.read(stream_id, pos, end, _PAGE_BYTES)
        if not complete:
            return None, pos
        hit = _in_batches(got, pos, end, ts)
        if hit is not None:
            return hit, None
        if not got or got[-1].next_offset <= pos:
            break  # nothing more is cached below `end`
        pos = got[-1].next_offset
    return None, None


def seek_with_log_cache(
    cache: LogCache,
    meta: MetadataManager,
    source: BlockSource,
    stream_id: int,
    start: int,
    end: int,
    ts: int,
) -> int | None:
    """The owning client's seek over ``[start, end)`` (its confirm offset as `end`): offsets
    the LogCache holds are searched there, those below it in committed objects.

    Everything below the cache's first offset is committed (entries leave the cache only
    after their upload is), so offsets the cache drops during the search are searched in
    objects on the next round; each round moves forward.
    """
    pos = start
    stuck = False
    while pos < end:
        first_cached = cache.first_offset(stream_id)
        # Stuck: the cache did not hold `pos` though it holds offsets below it (a gap
        # between writers): the objects answer for `pos` before the cache is asked again.
        floor = pos + 1 if stuck else pos
        objects_end = end if first_cached is None else min(end, max(first_cached, floor))
        if pos < objects_end:
            hit = seek_committed(meta, source, stream_id, pos, objects_end, ts)
            if hit is not None:
                return hit
            pos = objects_end
        if pos >= end:
            break
        hit, evicted_at = _seek_log_cache(cache, stream_id, pos, end, ts)
        if evicted_at is None:
            return hit
        stuck = evicted_at == pos
        pos = evicted_at
    return None
