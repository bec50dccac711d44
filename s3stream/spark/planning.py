"""Driver side: choose streams, resolve offset ranges and cut them into input partitions.

Everything here runs where Spark plans (the driver's Python planner), reads only metadata
and object indexes (one tail GET per object, in parallel), and produces small picklable
`PartitionPlan`s that name the exact blocks an executor must fetch.

Partitioning. The offsets to read form a sequence of *units*, one per data block clipped to
the range, weighted by the block's stored bytes. The partition count is
``max(minPartitions, ceil(bytes / maxPartitionBytes))``, at most one per offset. When there
are fewer blocks than partitions, the heaviest unit is halved by offsets until there are
enough; then the units are cut into exactly that many contiguous groups of balanced weight,
so boundaries fall on block boundaries wherever the count allows. Any offset boundary is
correct: a records batch is filtered per record, and a raw batch belongs to the partition
holding its base offset.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .._futures import StopAtOutage
from ..arrow import stream_labels
from ..cache.index_cache import ObjectIndexCache
from ..errors import CorruptionError, InvalidArgumentError, StreamNotFoundError
from ..format.block import BlockInfo
from ..format.block_reader import BlockReader
from ..format.objects import ObjectIndex
from ..metadata import MetadataState, StreamMeta
from ..objectstore.base import ObjectStore
from ..storage.seek import seek_objects
from ..types import FetchedBatch
from ..validation import check_int
from .options import EARLIEST, LATEST, OffsetSpec, SourceOptions, StreamSelection

__all__ = [
    "IndexReader",
    "PartitionPlan",
    "ReadSlice",
    "StreamTarget",
    "offset_for_timestamp",
    "plan_partitions",
    "resolve_offsets",
    "select_streams",
    "stream_target",
]


@dataclass(frozen=True, slots=True)
class StreamTarget:
    """Offsets ``[start_offset, end_offset)`` of one stream to read, with its row labels."""

    stream_id: int
    topic: str | None
    partition: int | None
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class ReadSlice:
    """Offsets ``[start_offset, end_offset)`` of one stream held by `blocks` of object `key`."""

    stream_id: int
    topic: str | None
    partition: int | None
    key: str
    blocks: tuple[BlockInfo, ...]
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """The work of one Spark task: slices read in order; `stored_bytes` is an estimate."""

    slices: tuple[ReadSlice, ...]
    stored_bytes: int

    @property
    def record_offsets(self) -> int:
        """Number of offsets the partition covers."""
        return sum(s.end_offset - s.start_offset for s in self.slices)


# ---------------------------------------------------------------------------------------------
# Streams and their labels


def topic_of(meta: StreamMeta, opts: SourceOptions) -> str | None:
    """The ``topic`` column of a stream: its `topicTag` tag, or None."""
    return stream_labels(meta.tags, opts.topic_tag, opts.partition_tag)[0]


def partition_of(meta: StreamMeta, opts: SourceOptions) -> int | None:
    """The ``partition`` column of a stream: its `partitionTag` tag as an int32, or None."""
    return stream_labels(meta.tags, opts.topic_tag, opts.partition_tag)[1]


def select_streams(state: MetadataState, opts: SourceOptions) -> list[StreamMeta]:
    """The streams the options select, sorted by id.

    Raises `InvalidArgumentError` naming the option when ``streamIds`` or ``assign`` names a
    stream that does not exist (``subscribe`` and ``subscribePattern`` may match nothing).
    """
    sel: StreamSelection = opts.selection
    if sel.stream_ids:
        out = []
        for sid in sel.stream_ids:
            try:
                out.append(state.get_stream(sid))
            except StreamNotFoundError:
                raise InvalidArgumentError(
                    f"option streamIds: no stream {sid} in {opts.url}"
                ) from None
        candidates = out
    else:
        candidates = state.list_streams()
    if sel.tags:
        candidates = [m for m in candidates if all(m.tags.get(k) == v for k, v in sel.tags.items())]
    if sel.topics:
        wanted = set(sel.topics)
        candidates = [m for m in candidates if topic_of(m, opts) in wanted]
    if sel.topic_pattern is not None:
        pattern = re.compile(sel.topic_pattern)
        candidates = [
            m
            for m in candidates
            if (t := topic_of(m, opts)) is not None and pattern.fullmatch(t) is not None
        ]
    if sel.assign:
        found: dict[tuple[str, int], StreamMeta] = {}
        for m in candidates:
            t, p = topic_of(m, opts), partition_of(m, opts)
            if t is not None and p is not None and p in sel.assign.get(t, ()):
                other = found.setdefault((t, p), m)
                if other is not m:
                    # Tags are not unique: reading one of them would drop the other's rows
                    # without a word, and per-partition offsets could not tell them apart.
                    raise InvalidArgumentError(
                        f"option assign: {t}-{p} names more than one stream in {opts.url} "
                        f"(streams {other.stream_id} and {m.stream_id}); select them with "
                        "streamIds instead"
                    )
        missing = [(t, p) for t, ps in sel.assign.items() for p in ps if (t, p) not in found]
        if missing:
            names = ", ".join(f"{t}-{p}" for t, p in missing)
            raise InvalidArgumentError(f"option assign: no stream for {names} in {opts.url}")
        candidates = sorted(found.values(), key=lambda m: m.stream_id)
    return candidates


def stream_target(meta: StreamMeta, opts: SourceOptions, start: int, end: int) -> StreamTarget:
    """A `StreamTarget` for `meta` with its topic and partition labels."""
    return StreamTarget(meta.stream_id, topic_of(meta, opts), partition_of(meta, opts), start, end)


# ---------------------------------------------------------------------------------------------
# Offsets


def _spec_value(spec: OffsetSpec, meta: StreamMeta, opts: SourceOptions) -> int | str:
    if meta.stream_id in spec.per_stream:
        return spec.per_stream[meta.stream_id]
    topic, part = topic_of(meta, opts), partition_of(meta, opts)
    if topic is not None and part is not None and part in spec.per_topic.get(topic, {}):
        return spec.per_topic[topic][part]
    return spec.default


def _check_spec_names(spec: OffsetSpec, streams: Sequence[StreamMeta], opts: SourceOptions) -> None:
    ids = {m.stream_id for m in streams}
    for sid in spec.per_stream:
        if sid not in ids:
            raise InvalidArgumentError(
                f"option {spec.option}: stream {sid} does not exist or is not selected"
            )
    pairs = {(topic_of(m, opts), partition_of(m, opts)) for m in streams}
    for topic, parts in spec.per_topic.items():
        for part in parts:
            if (topic, part) not in pairs:
                raise InvalidArgumentError(
                    f"option {spec.option}: no selected stream for topic {topic!r} partition {part}"
                )


def _resolve(value: int | str, meta: StreamMeta, spec: OffsetSpec, fail_on_data_loss: bool) -> int:
    if value in ("earliest", EARLIEST):
        return meta.start_offset
    if value in ("latest", LATEST):
        return meta.end_offset
    assert isinstance(value, int)
    if value > meta.end_offset:
        raise InvalidArgumentError(
            f"option {spec.option}: offset {value} of stream {meta.stream_id} is beyond its end "
            f"offset {meta.end_offset} (data not yet uploaded is not visible: flush the client)"
        )
    if value < meta.start_offset:
        if fail_on_data_loss:
            raise InvalidArgumentError(
                f"option {spec.option}: offset {value} of stream {meta.stream_id} is below its "
                f"start offset {meta.start_offset} (trimmed); set failOnDataLoss=false to read "
                f"from {meta.start_offset}"
            )
        return meta.start_offset
    return value


def resolve_offsets(
    state: MetadataState,
    store: ObjectStore,
    indexes: IndexReader,
    streams: Sequence[StreamMeta],
    opts: SourceOptions,
    *,
    with_ending: bool,
) -> list[StreamTarget]:
    """Start (and, for batch reads, end) offsets of every selected stream from the options.

    Explicit offsets below a trimmed start raise when ``failOnDataLoss`` (else they are
    moved up); offsets past the end always raise. Without `with_ending` the end is the
    stream's end offset.
    """
    _check_spec_names(opts.starting, streams, opts)
    if with_ending:
        _check_spec_names(opts.ending, streams, opts)
    out: list[StreamTarget] = []
    for meta in streams:
        if opts.starting_timestamp is not None:
            start = offset_for_timestamp(state, store, indexes, meta, opts.starting_timestamp)
        else:
            start = _resolve(
                _spec_value(opts.starting, meta, opts), meta, opts.starting, opts.fail_on_data_loss
            )
        end = meta.end_offset
        if with_ending and opts.ending_timestamp is not None:
            # Data-dependent: with timestamps out of order the first offset at the ending
            # time may precede the first at the starting one; that range is empty.
            end = max(
                start, offset_for_timestamp(state, store, indexes, meta, opts.ending_timestamp)
            )
        elif with_ending:
            end = _resolve(
                _spec_value(opts.ending, meta, opts), meta, opts.ending, opts.fail_on_data_loss
            )
            if end < start:
                raise InvalidArgumentError(
                    f"option endingOffsets: offset {end} of stream {meta.stream_id} is below "
                    f"its starting offset {start}"
                )
        out.append(stream_target(meta, opts, start, end))
    return out


# ---------------------------------------------------------------------------------------------
# Object indexes


class IndexReader:
    """The planner's object indexes: an `ObjectIndexCache` (objects are immutable), filled
    through a thread pool when a plan needs many indexes at once."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        threads: int = 16,
        max_entries: int = 65536,
        cache: ObjectIndexCache | None = None,
    ) -> None:
        """Indexes of objects in `store`, read `threads` at a time; kept in `cache` (one
        shared with other readers of the store) or in a new one of `max_entries`."""
        self._threads = check_int("threads", threads, minimum=1)
        self._cache = (
            cache if cache is not None else ObjectIndexCache(store, max_entries=max_entries)
        )

    @property
    def cache(self) -> ObjectIndexCache:
        """Where the indexes are kept."""
        return self._cache

    def get(self, key: str, size: int) -> ObjectIndex:
        """The index of one object (one tail GET on a miss)."""
        return self._cache.get(key, size)

    def prefetch(self, objects: Iterable[tuple[str, int]]) -> None:
        """Read the indexes of `objects` (key, size) not cached yet, in parallel."""
        todo = sorted({(k, s) for k, s in objects if k not in self._cache})
        if len(todo) <= 1:
            for key, size in todo:
                self.get(key, size)
            return
        guard = StopAtOutage()
        with ThreadPoolExecutor(min(self._threads, len(todo))) as pool:
            # Consumed for the errors: the first failed read raises here.
            for _ in pool.map(lambda ks: guard.call(self._cache.get, *ks), todo):
                pass


class _SeekBlocks:
    """What seek by time reads on the driver: the planner's cached indexes, and blocks
    through the one `BlockReader` (the driver keeps no block cache: a seek reads one block
    per stream, once per query)."""

    def __init__(self, indexes: IndexReader, store: ObjectStore) -> None:
        self._indexes = indexes
        self._reader = BlockReader(store)

    def index(self, key: str, size: int | None = None) -> ObjectIndex:
        return self._indexes.cache.get(key, size)

    def get_blocks(self, key: str, blocks: Sequence[BlockInfo]) -> list[list[FetchedBatch]]:
        return [self._reader.read(key, [b]) for b in blocks]


def offset_for_timestamp(
    state: MetadataState,
    store: ObjectStore,
    indexes: IndexReader,
    meta: StreamMeta,
    timestamp_ms: int,
) -> int:
    """The first offset of `meta` whose timestamp is >= `timestamp_ms`, or its end offset if
    there is none: `Stream.offset_for_timestamp`'s rule and code (`storage.seek`), on the
    planner's snapshot `state`. The stream's indexes are read in parallel first (planning
    reads them anyway)."""
    start, end = meta.start_offset, meta.end_offset
    if start >= end:
        return end
    indexes.prefetch((o.key, o.size) for o in state.objects_for(meta.stream_id, start, end))
    found = seek_objects(
        state, _SeekBlocks(indexes, store), meta.stream_id, start, end, timestamp_ms
    )
    return end if found is None else found


# ---------------------------------------------------------------------------------------------
# Partitions


@dataclass(slots=True)
class _Unit:
    order: int
    target: StreamTarget
    key: str
    block: BlockInfo
    lo: int
    hi: int
    weight: float


def _units(
    state: MetadataState, indexes: IndexReader, targets: Sequence[StreamTarget]
) -> list[_Unit]:
    wanted = [t for t in targets if t.start_offset < t.end_offset]
    objects = {
        t.stream_id: state.objects_for(t.stream_id, t.start_offset, t.end_offset) for t in wanted
    }
    indexes.prefetch((o.key, o.size) for objs in objects.values() for o in objs)
    units: list[_Unit] = []
    for t in wanted:
        pos = t.start_offset
        for obj in objects[t.stream_id]:
            for block in indexes.get(obj.key, obj.size).find(t.stream_id, pos, t.end_offset):
                if block.start_offset > pos:
                    raise CorruptionError(
                        f"stream {t.stream_id}: offsets {pos}..{block.start_offset} are in the "
                        f"metadata but in no object block (next block in {obj.key})",
                        location=obj.key,
                    )
                hi = min(block.end_offset, t.end_offset)
                share = (hi - pos) / block.record_count
                units.append(
                    _Unit(len(units), t, obj.key, block, pos, hi, block.stored_size * share)
                )
                pos = hi
        if pos < t.end_offset:
            raise CorruptionError(
                f"stream {t.stream_id}: offsets {pos}..{t.end_offset} are in the metadata but "
                "in no live object"
            )
    return units


def _split_to(units: list[_Unit], count: int) -> list[_Unit]:
    """Halve the heaviest splittable units until there are `count` (the caller ensures
    enough offsets)."""
    heap = [(-u.weight, u.order, u.lo, u) for u in units if u.hi - u.lo > 1]
    heapq.heapify(heap)
    done = [u for u in units if u.hi - u.lo <= 1]
    total = len(units)
    while total < count and heap:
        _, order, _, u = heapq.heappop(heap)
        mid = u.lo + (u.hi - u.lo) // 2
        share = (mid - u.lo) / (u.hi - u.lo)
        halves = (
            _Unit(order, u.target, u.key, u.block, u.lo, mid, u.weight * share),
            _Unit(order, u.target, u.key, u.block, mid, u.hi, u.weight * (1 - share)),
        )
        for half in halves:
            if half.hi - half.lo > 1:
                heapq.heappush(heap, (-half.weight, half.order, half.lo, half))
            else:
                done.append(half)
        total += 1
    out = done + [entry[3] for entry in heap]
    out.sort(key=lambda u: (u.order, u.lo))
    return out


def _group(units: list[_Unit], count: int) -> list[list[_Unit]]:
    """Cut `units` (at least `count`) into exactly `count` contiguous, balanced groups."""
    groups: list[list[_Unit]] = []
    remaining = sum(u.weight for u in units)
    i, n = 0, len(units)
    for left in range(count, 0, -1):
        target = remaining / left
        group = [units[i]]
        weight = units[i].weight
        i += 1
        while i < n and n - i > left - 1:
            nxt = units[i].weight
            if left > 1 and abs(weight + nxt - target) > abs(weight - target):
                break
            group.append(units[i])
            weight += nxt
            i += 1
        groups.append(group)
        remaining -= weight
    return groups


def _slices(group: list[_Unit]) -> tuple[ReadSlice, ...]:
    out: list[ReadSlice] = []
    for u in group:
        last = out[-1] if out else None
        if (
            last is not None
            and last.stream_id == u.target.stream_id
            and last.key == u.key
            and last.end_offset == u.lo
        ):
            blocks = last.blocks if last.blocks[-1] == u.block else (*last.blocks, u.block)
            out[-1] = ReadSlice(
                last.stream_id,
                last.topic,
                last.partition,
                last.key,
                blocks,
                last.start_offset,
                u.hi,
            )
        else:
            t = u.target
            out.append(ReadSlice(t.stream_id, t.topic, t.partition, u.key, (u.block,), u.lo, u.hi))
    return tuple(out)


def plan_partitions(
    state: MetadataState,
    indexes: IndexReader,
    targets: Sequence[StreamTarget],
    *,
    min_partitions: int | None,
    max_partition_bytes: int,
) -> list[PartitionPlan]:
    """Cut the offsets of `targets` into input partitions (see the module docstring).

    Returns ``max(min_partitions, ceil(stored bytes / max_partition_bytes))`` partitions,
    or one per offset when there are fewer offsets than that; none when there is no data.
    """
    if type(max_partition_bytes) is not int or max_partition_bytes < 1:
        raise InvalidArgumentError(
            f"max_partition_bytes must be an int >= 1, got {max_partition_bytes!r}"
        )
    units = _units(state, indexes, targets)
    if not units:
        return []
    offsets = sum(u.hi - u.lo for u in units)
    total = sum(u.weight for u in units)
    count = max(min_partitions or 1, math.ceil(total / max_partition_bytes))
    count = min(count, offsets)
    if len(units) < count:
        units = _split_to(units, count)
    plans = []
    for group in _group(units, count):
        plans.append(PartitionPlan(_slices(group), round(sum(u.weight for u in group))))
    return plans
