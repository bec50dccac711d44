"""Planning compactions: which objects to replace by which new ones (pure, no writes).

Plans are derived from one metadata snapshot; object indexes are read through `IndexOf` (the
block cache's index cache). A `CompactionTask` names the live objects it replaces and the
output objects to write, each output as `Piece`s (a stream's offsets to copy from one source
object). The executor re-validates a task against the latest metadata when committing it.

Two kinds of compaction, as in AutoMQ:

- **stream-set compaction** merges stream-set objects. Per stream, the data in the merged
  objects is grouped into contiguous runs: a stream with at least `stream_set_split_bytes` (or
  with more than one run: an object holds one range per stream) leaves as stream objects, one per
  run; the others share one new stream-set object. Stream-set objects holding data older than
  `stream_set_max_age_ms` are split completely, every stream into a stream object.
- **stream object compaction** merges runs of small, adjacent stream objects of one stream
  into objects of up to `stream_object_target_bytes`, rewrites an object that is mostly below
  the stream's start offset, and drops objects wholly below it (or of a deleted stream).

Data below a stream's start offset is never copied (the executor drops those batches; a batch
straddling the start offset stays whole).

An object whose index cannot be read (damaged: `CorruptionError`; missing: `ObjectNotFoundError`)
is left out of every plan when `index_of` is guarded (`guard_index`, which names it with its
error): one damaged object must not stop the planning of every other (it stalled every pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import CorruptionError, ObjectNotFoundError, S3StreamError
from ..format.objects import ObjectIndex
from ..metadata import MetadataState, ObjectKind, ObjectMeta, StreamState
from ..settings import CompactionSettings

__all__ = [
    "CompactionTask",
    "IndexOf",
    "OutputObject",
    "Piece",
    "UnreadableIndex",
    "guard_index",
    "keep_from",
    "plan_stream_object_compaction",
    "plan_stream_object_drops",
    "plan_stream_set_compaction",
]

IndexOf = Callable[[ObjectMeta], ObjectIndex]

#: Rewrite a lone stream object when at least this share of its bytes is below the start.
_MOSTLY_TRIMMED = 0.5


class UnreadableIndex(Exception):
    """The index of `obj` could not be read (`guard_index`): what reads it goes on without
    it (a plan, a stream's retention)."""

    def __init__(self, obj: ObjectMeta, error: S3StreamError) -> None:
        super().__init__(str(error))
        self.obj = obj


def guard_index(index_of: IndexOf, unreadable: dict[str, S3StreamError]) -> IndexOf:
    """`index_of`, recording an object whose index is damaged or missing in `unreadable`
    (with its error) and raising `UnreadableIndex` for the caller to leave it out."""

    def guarded(obj: ObjectMeta) -> ObjectIndex:
        try:
            return index_of(obj)
        except (CorruptionError, ObjectNotFoundError) as exc:
            unreadable[obj.key] = exc
            raise UnreadableIndex(obj, exc) from exc

    return guarded


@dataclass(frozen=True, slots=True)
class Piece:
    """Offsets ``[start_offset, end_offset)`` of `stream_id`, copied from object `source`."""

    source: str
    stream_id: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class OutputObject:
    """A new object: `pieces` sorted by (stream, offset), contiguous within each stream."""

    kind: ObjectKind
    pieces: tuple[Piece, ...]

    @property
    def stream_ids(self) -> list[int]:
        """The streams it holds, ascending."""
        return sorted({p.stream_id for p in self.pieces})


@dataclass(frozen=True, slots=True)
class CompactionTask:
    """Replace `replaced` (live objects) by `outputs`; `what` says which compaction it is
    ("stream_set", "split", "stream_object" or "drop") and `read_bytes` what it reads."""

    what: str
    replaced: tuple[ObjectMeta, ...]
    outputs: tuple[OutputObject, ...]
    read_bytes: int


def keep_from(state: MetadataState, stream_id: int) -> int | None:
    """The lowest offset of `stream_id` that must be kept; None if nothing must be (deleted)."""
    stream = state.streams.get(stream_id)
    if stream is None or stream.state is StreamState.DELETED:
        return None
    return stream.start_offset


def _live_pieces(state: MetadataState, obj: ObjectMeta) -> list[Piece]:
    out = []
    for rng in obj.ranges:
        keep = keep_from(state, rng.stream_id)
        if keep is None or rng.end_offset <= keep:
            continue
        out.append(Piece(obj.key, rng.stream_id, rng.start_offset, rng.end_offset))
    return out


def _runs(pieces: list[Piece]) -> list[list[Piece]]:
    """Pieces of one stream, sorted by offset, split where they are not contiguous."""
    runs: list[list[Piece]] = []
    for p in sorted(pieces, key=lambda p: p.start_offset):
        if runs and runs[-1][-1].end_offset == p.start_offset:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def _merge_task(
    state: MetadataState,
    objects: list[ObjectMeta],
    index_of: IndexOf,
    settings: CompactionSettings,
    *,
    split_all: bool,
) -> CompactionTask:
    by_stream: dict[int, list[Piece]] = {}
    sizes: dict[int, int] = {}
    for obj in objects:
        pieces = _live_pieces(state, obj)
        if not pieces:
            continue
        idx = index_of(obj)
        for p in pieces:
            by_stream.setdefault(p.stream_id, []).append(p)
            sizes[p.stream_id] = sizes.get(p.stream_id, 0) + idx.stream_bytes(p.stream_id)
    outputs: list[OutputObject] = []
    shared: list[Piece] = []
    for sid in sorted(by_stream):
        runs = _runs(by_stream[sid])
        if split_all or len(runs) > 1 or sizes[sid] >= settings.stream_set_split_bytes:
            outputs.extend(OutputObject(ObjectKind.STREAM, tuple(run)) for run in runs)
        else:
            shared.extend(runs[0])
    if shared:
        kind = (
            ObjectKind.STREAM if len({p.stream_id for p in shared}) == 1 else ObjectKind.STREAM_SET
        )
        outputs.append(OutputObject(kind, tuple(shared)))
    return CompactionTask(
        "split" if split_all else "stream_set",
        tuple(objects),
        tuple(outputs),
        sum(o.size for o in objects),
    )


def _readable_merge(
    state: MetadataState,
    group: list[ObjectMeta],
    index_of: IndexOf,
    settings: CompactionSettings,
    least: int,
    *,
    split_all: bool,
) -> list[CompactionTask]:
    """The merge task of `group` without its objects whose index cannot be read, if at least
    `least` objects remain (none else)."""
    while len(group) >= least:
        try:
            return [_merge_task(state, group, index_of, settings, split_all=split_all)]
        except UnreadableIndex as exc:
            group = [o for o in group if o.key != exc.obj.key]
    return []


def _batched(objects: Iterable[ObjectMeta], max_bytes: int) -> list[list[ObjectMeta]]:
    groups: list[list[ObjectMeta]] = []
    total = 0
    for obj in objects:
        if groups and total + obj.size <= max_bytes:
            groups[-1].append(obj)
            total += obj.size
        else:
            groups.append([obj])
            total = obj.size
    return groups


def plan_stream_set_compaction(
    state: MetadataState,
    settings: CompactionSettings,
    index_of: IndexOf,
    now_ms: int,
) -> list[CompactionTask]:
    """Tasks that split old stream-set objects and merge small ones (see module docstring)."""
    candidates = sorted(
        (o for o in state.objects.values() if o.live and o.kind is ObjectKind.STREAM_SET),
        key=lambda o: (o.committed_ms, o.key),
    )
    dead = [o for o in candidates if not _live_pieces(state, o)]
    dead_keys = {o.key for o in dead}
    live = [o for o in candidates if o.key not in dead_keys]
    max_age = settings.stream_set_max_age_ms
    old = [o for o in live if max_age and now_ms - o.committed_ms >= max_age]
    old_keys = {o.key for o in old}
    small = [
        o
        for o in live
        if o.key not in old_keys and o.size < settings.stream_set_object_target_bytes
    ]
    tasks: list[CompactionTask] = []
    for group in _batched(old, settings.max_task_bytes):
        tasks.extend(_readable_merge(state, group, index_of, settings, 1, split_all=True))
    least = max(2, settings.stream_set_min_objects)
    for group in _batched(small, settings.max_task_bytes):
        tasks.extend(_readable_merge(state, group, index_of, settings, least, split_all=False))
    if dead:
        tasks.append(CompactionTask("drop", tuple(dead), (), 0))
    return tasks


def plan_stream_object_compaction(
    state: MetadataState, settings: CompactionSettings, index_of: IndexOf
) -> list[CompactionTask]:
    """Per stream (deleted ones included): drop stream objects wholly below the start offset,
    merge runs of small adjacent stream objects, rewrite mostly-trimmed ones."""
    tasks: list[CompactionTask] = []
    dropped: list[ObjectMeta] = []
    for sid in sorted(state.streams):
        keep = keep_from(state, sid)
        for group in _stream_object_groups(state, sid, keep, settings, index_of, dropped):
            if len(group) >= 2 or _mostly_trimmed(group[0], sid, keep, index_of):
                tasks.append(_stream_object_task(state, group))
    if dropped:
        tasks.append(CompactionTask("drop", tuple(dropped), (), 0))
    return tasks


def plan_stream_object_drops(state: MetadataState) -> list[CompactionTask]:
    """The part of `plan_stream_object_compaction` that writes nothing: one task dropping
    the stream objects wholly below their stream's start offset (or of a deleted stream),
    if any; planned without reading an index."""
    dropped = [
        obj
        for sid in sorted(state.streams)
        for keep in (keep_from(state, sid),)
        for obj in state.stream_objects(sid)
        if (rng := obj.range_of(sid)) is not None and _wholly_below(obj, rng.end_offset, keep)
    ]
    return [CompactionTask("drop", tuple(dropped), (), 0)] if dropped else []


def _wholly_below(obj: ObjectMeta, end_offset: int, keep: int | None) -> bool:
    """Whether `obj`, a stream's object whose range ends at `end_offset`, is a stream object
    nothing needs: its stream deleted (`keep` None) or trimmed past its end."""
    return obj.kind is ObjectKind.STREAM and (keep is None or end_offset <= keep)


def _stream_object_groups(
    state: MetadataState,
    stream_id: int,
    keep: int | None,
    settings: CompactionSettings,
    index_of: IndexOf,
    dropped: list[ObjectMeta],
) -> list[list[ObjectMeta]]:
    """Runs of contiguous stream objects worth rewriting together (at most the target size);
    objects wholly below `keep` go to `dropped` instead."""
    target = settings.stream_object_target_bytes
    groups: list[list[ObjectMeta]] = []
    group: list[ObjectMeta] = []
    group_bytes = 0
    for obj in state.stream_objects(stream_id):
        rng = obj.range_of(stream_id)
        if rng is None:  # pragma: no cover - the stream index lists only objects holding it
            continue
        if _wholly_below(obj, rng.end_offset, keep):
            dropped.append(obj)
            continue
        eligible = obj.kind is ObjectKind.STREAM and (
            obj.size < target or _mostly_trimmed(obj, stream_id, keep, index_of)
        )
        contiguous = bool(group) and group[-1].ranges[0].end_offset == rng.start_offset
        if not (eligible and contiguous and obj.size < target and group_bytes + obj.size <= target):
            if group:
                groups.append(group)
            group, group_bytes = [], 0
        if eligible:
            group.append(obj)
            group_bytes += obj.size
    if group:
        groups.append(group)
    return groups


def _mostly_trimmed(obj: ObjectMeta, stream_id: int, keep: int | None, index_of: IndexOf) -> bool:
    """Whether whole blocks below `keep` hold at least half of the object's bytes (so a
    rewrite surely drops them; a rewritten object never qualifies again)."""
    rng = obj.range_of(stream_id)
    if rng is None or keep is None or keep <= rng.start_offset:
        return False
    try:
        idx = index_of(obj)
    except UnreadableIndex:
        return False  # left as it is (recorded as unreadable)
    dead = sum(
        b.stored_size for b in idx.find(stream_id, rng.start_offset, keep) if b.end_offset <= keep
    )
    return dead >= _MOSTLY_TRIMMED * max(1, idx.stream_bytes(stream_id))


def _stream_object_task(state: MetadataState, objects: list[ObjectMeta]) -> CompactionTask:
    pieces = tuple(p for obj in objects for p in _live_pieces(state, obj))
    outputs = (OutputObject(ObjectKind.STREAM, pieces),) if pieces else ()
    return CompactionTask("stream_object", tuple(objects), outputs, sum(o.size for o in objects))
