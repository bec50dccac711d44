"""The invariants every metadata op must keep, checked before it is applied (and written).

Each ``check_*`` function looks at the state an op would be applied to, raises if the op would
break an invariant, and returns what the apply step needs. The numbers (I1..I13) are those of
the written list in ``docs/metadata.md``; error messages quote them.

Errors: an epoch that is not the expected one is `FencedError` (a newer owner exists);
a missing or deleted stream is `StreamNotFoundError`; a commit to a closed stream is
`StreamClosedError`; anything else malformed is `InvalidArgumentError`.
`check_state` verifies a whole state (after loading a checkpoint, and in tests).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import (
    FencedError,
    InvalidArgumentError,
    StreamClosedError,
    StreamNotFoundError,
)
from ..objectstore.base import check_key
from ..validation import check_str_map
from .model import (
    CloseStream,
    CommitObjects,
    CompactObjects,
    CreateStream,
    DeleteStream,
    NodeMeta,
    ObjectKind,
    ObjectMeta,
    OpenStream,
    PurgeObjects,
    RegisterNode,
    StreamMeta,
    StreamRange,
    StreamState,
    TrimStream,
)

if TYPE_CHECKING:
    from .state import MetadataState

__all__ = [
    "CommitPlan",
    "CompactPlan",
    "StateView",
    "check_close",
    "check_commit",
    "check_commit_streams",
    "check_compact",
    "check_create",
    "check_delete",
    "check_open",
    "check_purge",
    "check_register",
    "check_state",
    "check_trim",
]

#: Per stream, the (range, object) pieces an op adds, sorted by start offset.
CommitPlan = dict[int, list[tuple[StreamRange, ObjectMeta]]]


class StateView(Protocol):
    """What the checks read: the state as it is between two ops of one entry."""

    @property
    def next_stream_id(self) -> int:
        """Id the next created stream must get."""

    def stream(self, stream_id: int) -> StreamMeta | None:
        """The stream (deleted ones included), or None."""

    def object(self, key: str) -> ObjectMeta | None:
        """The object (marked-deleted ones included), or None."""

    def node(self, node_id: str) -> NodeMeta | None:
        """The node, or None."""


class CompactPlan:
    """What a valid `CompactObjects` changes: objects to mark, pieces to add and remove."""

    __slots__ = ("added", "removed", "replaced")

    def __init__(
        self,
        replaced: list[ObjectMeta],
        added: CommitPlan,
        removed: dict[int, set[str]],
    ) -> None:
        #: Objects to mark deleted.
        self.replaced = replaced
        #: New pieces per stream.
        self.added = added
        #: Keys of replaced objects per stream whose index loses them.
        self.removed = removed


def check_create(view: StateView, op: CreateStream) -> None:
    """I1: ids are handed out densely, in order; tags map str to str."""
    if op.stream_id != view.next_stream_id:
        raise InvalidArgumentError(
            f"I1: CreateStream.stream_id must be the next stream id {view.next_stream_id}, "
            f"got {op.stream_id}"
        )
    check_str_map("tags", op.tags)


def check_open(view: StateView, op: OpenStream) -> StreamMeta:
    """I2, I3: the stream exists and the new epoch is exactly the previous one + 1."""
    stream = _existing_stream(view, op.stream_id)
    if op.epoch != stream.epoch + 1:
        raise FencedError(
            f"I3: stream {op.stream_id} is at epoch {stream.epoch}; opening it needs epoch "
            f"{stream.epoch + 1}, got {op.epoch} (another owner opened it first)"
        )
    if not op.node_id:
        raise InvalidArgumentError("OpenStream.node_id must be a non-empty str")
    return stream


def check_close(view: StateView, op: CloseStream) -> StreamMeta:
    """I2, I4: the stream exists and the caller holds its current epoch."""
    stream = _existing_stream(view, op.stream_id)
    _check_epoch(stream, op.epoch, "close")
    return stream


def check_trim(view: StateView, op: TrimStream) -> StreamMeta:
    """I2, I4, I5: current epoch; start offset moves forward, never past the end offset."""
    stream = _existing_stream(view, op.stream_id)
    _check_epoch(stream, op.epoch, "trim")
    if op.start_offset < stream.start_offset:
        raise InvalidArgumentError(
            f"I5: start_offset {op.start_offset} is below stream {op.stream_id}'s start offset "
            f"{stream.start_offset} (a trim never moves back)"
        )
    if op.start_offset > stream.end_offset:
        raise InvalidArgumentError(
            f"I5: start_offset {op.start_offset} is past stream {op.stream_id}'s committed end "
            f"offset {stream.end_offset}"
        )
    return stream


def check_delete(view: StateView, op: DeleteStream) -> StreamMeta:
    """I2, I4: the stream exists and the caller holds its current epoch."""
    stream = _existing_stream(view, op.stream_id)
    _check_epoch(stream, op.epoch, "delete")
    return stream


def check_commit(view: StateView, op: CommitObjects) -> CommitPlan:
    """I4, I6, I7, I8, I14: the upload commit extends each stream exactly at its end offset.

    The work is per range the op holds (an upload of 10,000 streams has 10,000): one lookup
    of each stream, no sort of a stream's single piece."""
    return check_commit_streams(view, op)[0]


def check_commit_streams(
    view: StateView, op: CommitObjects
) -> tuple[CommitPlan, dict[int, StreamMeta]]:
    """`check_commit`, and the streams it checked (the apply step needs them: no second
    lookup)."""
    if not op.objects:
        raise InvalidArgumentError("CommitObjects.objects must not be empty")
    if op.node_epoch is not None:
        for node_id in sorted({obj.node_id for obj in op.objects}):
            node = view.node(node_id)
            if node is None or node.epoch != op.node_epoch:
                current = "unregistered" if node is None else f"at epoch {node.epoch}"
                raise FencedError(
                    f"I14: node {node_id!r} is {current}; a commit with node epoch "
                    f"{op.node_epoch} is fenced (the node was taken over)"
                )
    streams = _check_new_objects(view, op.objects, "CommitObjects")
    plan = _pieces_by_stream(op.objects)
    epochs = op.epochs
    if plan.keys() != epochs.keys():
        missing = sorted(plan.keys() - epochs.keys())
        extra = sorted(epochs.keys() - plan.keys())
        raise InvalidArgumentError(
            "CommitObjects.epochs must name exactly the streams of the objects' ranges "
            f"(missing {missing}, extra {extra})"
        )
    open_ = StreamState.OPEN
    for stream_id, pieces in plan.items():
        # Found by `_check_new_objects` (I7): deleted is all that is left to check of I2.
        stream = streams[stream_id]
        if stream.state is StreamState.DELETED:
            _existing_stream(view, stream_id)  # raises I2
        if epochs[stream_id] != stream.epoch:
            _check_epoch(stream, epochs[stream_id], "commit")  # raises I4
        if stream.state is not open_:
            raise StreamClosedError(
                f"I6: stream {stream_id} is {stream.state.value}; only an open stream takes commits"
            )
        expected = stream.end_offset
        for rng, obj in pieces:
            if rng.start_offset != expected:
                what = (
                    "start at its end offset" if expected == stream.end_offset else "be contiguous"
                )
                raise InvalidArgumentError(
                    f"I8: object {obj.key!r} holds stream {stream_id} from offset "
                    f"{rng.start_offset}, but the commit must {what} {expected}"
                )
            expected = rng.end_offset
    return plan, streams


def check_compact(view: StateView, op: CompactObjects) -> CompactPlan:
    """I7, I10: the new objects hold exactly the live data of the replaced ones."""
    if not op.replaced_keys:
        raise InvalidArgumentError("CompactObjects.replaced_keys must not be empty")
    if len(set(op.replaced_keys)) != len(op.replaced_keys):
        raise InvalidArgumentError("CompactObjects.replaced_keys has duplicates")
    replaced: list[ObjectMeta] = []
    for key in op.replaced_keys:
        obj = view.object(key)
        if obj is None or not obj.live:
            state = "does not exist" if obj is None else "is already marked deleted"
            raise InvalidArgumentError(f"I10: replaced object {key!r} {state}")
        replaced.append(obj)
    _check_new_objects(view, op.new_objects, "CompactObjects")
    old = _pieces_by_stream(replaced)
    new = _pieces_by_stream(op.new_objects)
    for stream_id in new.keys() - old.keys():
        raise InvalidArgumentError(
            f"I10: new objects hold stream {stream_id}, which no replaced object holds"
        )
    for stream_id, old_pieces in old.items():
        stream = view.stream(stream_id)
        if stream is None:
            raise InvalidArgumentError(f"I10: replaced objects hold unknown stream {stream_id}")
        keep_from = None if stream.state is StreamState.DELETED else stream.start_offset
        _check_coverage(stream_id, old_pieces, new.get(stream_id, []), keep_from)
    removed = {sid: {obj.key for _, obj in pieces} for sid, pieces in old.items()}
    return CompactPlan(replaced, new, removed)


def check_purge(view: StateView, op: PurgeObjects) -> None:
    """I11: only objects already marked deleted are forgotten."""
    if not op.keys:
        raise InvalidArgumentError("PurgeObjects.keys must not be empty")
    if len(set(op.keys)) != len(op.keys):
        raise InvalidArgumentError("PurgeObjects.keys has duplicates")
    for key in op.keys:
        obj = view.object(key)
        if obj is None or obj.live:
            state = "does not exist" if obj is None else "is live (not marked deleted)"
            raise InvalidArgumentError(f"I11: cannot purge object {key!r}: it {state}")


def check_register(view: StateView, op: RegisterNode) -> None:
    """I12: a node's epoch starts at 1 and grows by exactly one per registration."""
    if not op.node_id:
        raise InvalidArgumentError("RegisterNode.node_id must be a non-empty str")
    node = view.node(op.node_id)
    expected = 1 if node is None else node.epoch + 1
    if op.epoch != expected:
        raise FencedError(
            f"I12: node {op.node_id!r} must be registered at epoch {expected}, got {op.epoch} "
            "(another process registered it first)"
        )


def check_state(state: MetadataState) -> list[str]:
    """Every violated state invariant (I9, I13 and the index), as messages; [] if none."""
    problems: list[str] = []
    for sid, stream in state.streams.items():
        if sid != stream.stream_id or sid >= state.next_stream_id:
            problems.append(f"stream {sid} is filed wrongly or not below next_stream_id")
        if not stream.start_offset <= stream.end_offset:
            problems.append(f"I13: stream {sid} has start_offset > end_offset")
    live: dict[int, list[tuple[int, int, str]]] = {}
    for key, obj in state.objects.items():
        if key != obj.key:
            problems.append(f"object {obj.key!r} is filed under {key!r}")
        try:
            _check_object_shape(obj)
        except InvalidArgumentError as exc:
            problems.append(str(exc))
            continue
        for rng in obj.ranges:
            if rng.stream_id not in state.streams:
                problems.append(f"I7: object {key!r} holds unknown stream {rng.stream_id}")
            elif obj.live:
                live.setdefault(rng.stream_id, []).append((rng.start_offset, rng.end_offset, key))
    for sid, pieces in live.items():
        pieces.sort()
        end = state.streams[sid].end_offset
        for (_, prev_end, prev_key), (start, _, key) in itertools.pairwise(pieces):
            if start < prev_end:
                problems.append(f"I9: objects {prev_key!r} and {key!r} overlap in stream {sid}")
        if pieces and pieces[-1][1] > end:
            problems.append(f"I9: object {pieces[-1][2]!r} holds stream {sid} past its end {end}")
    for sid in state.streams:
        indexed = [(o.range_of(sid), o.key) for o in state.stream_objects(sid)]
        got = [(r.start_offset, r.end_offset, k) for r, k in indexed if r is not None]
        if got != live.get(sid, []) or len(got) != len(indexed):
            problems.append(f"the object index of stream {sid} does not match the objects")
    return problems


def _check_epoch(stream: StreamMeta, epoch: int, action: str) -> None:
    if epoch != stream.epoch:
        raise FencedError(
            f"I4: cannot {action} stream {stream.stream_id} with epoch {epoch}: its current "
            f"epoch is {stream.epoch} (fenced by a newer owner)"
        )


def _existing_stream(view: StateView, stream_id: int) -> StreamMeta:
    stream = view.stream(stream_id)
    if stream is None:
        raise StreamNotFoundError(f"I2: stream {stream_id} does not exist")
    if stream.state is StreamState.DELETED:
        raise StreamNotFoundError(f"I2: stream {stream_id} was deleted")
    return stream


def _check_object_shape(obj: ObjectMeta) -> None:
    check_key(obj.key)
    if not obj.ranges:
        raise InvalidArgumentError(f"I7: object {obj.key!r} holds no stream range")
    if obj.kind is ObjectKind.STREAM and len(obj.ranges) != 1:
        raise InvalidArgumentError(f"I7: stream object {obj.key!r} must hold exactly one range")
    prev = -1
    for rng in obj.ranges:
        if rng.stream_id <= prev:
            raise InvalidArgumentError(
                f"I7: ranges of object {obj.key!r} must be sorted by stream id, one per stream"
            )
        if not 0 <= rng.start_offset < rng.end_offset:
            raise InvalidArgumentError(
                f"I7: object {obj.key!r} holds an empty or negative range of stream "
                f"{rng.stream_id}: [{rng.start_offset}, {rng.end_offset})"
            )
        lo, hi = rng.min_timestamp, rng.max_timestamp
        if (lo is None) != (hi is None) or (lo is not None and hi is not None and lo > hi):
            raise InvalidArgumentError(
                f"I7: object {obj.key!r} gives stream {rng.stream_id} the time range "
                f"[{lo}, {hi}]: both or neither, the smallest first"
            )
        commits = rng.commits
        if commits is not None and (
            not commits
            or commits[0][0] != rng.start_offset
            or commits[-1][0] >= rng.end_offset
            or any(a[0] >= b[0] for a, b in itertools.pairwise(commits))
        ):
            # The producers' rebuild looks commit times up by offset (StreamRange.commits).
            raise InvalidArgumentError(
                f"I7: object {obj.key!r} gives stream {rng.stream_id} the commit times "
                f"{list(commits)}: offsets must ascend from {rng.start_offset}, below "
                f"{rng.end_offset}"
            )
        prev = rng.stream_id


def _check_new_objects(
    view: StateView, objects: Sequence[ObjectMeta], what: str
) -> dict[int, StreamMeta]:
    """I7: new objects are well formed, carry fresh keys and name only known streams;
    returns those streams by id."""
    seen: set[str] = set()
    streams: dict[int, StreamMeta] = {}
    stream_of = view.stream
    for obj in objects:
        _check_object_shape(obj)
        if obj.key in seen or view.object(obj.key) is not None:
            raise InvalidArgumentError(f"I7: {what}: object key {obj.key!r} is already in use")
        seen.add(obj.key)
        if not obj.live:
            raise InvalidArgumentError(f"I7: {what}: new object {obj.key!r} is marked deleted")
        for rng in obj.ranges:
            sid = rng.stream_id
            if sid in streams:
                continue
            stream = stream_of(sid)
            if stream is None:
                raise StreamNotFoundError(
                    f"I7: object {obj.key!r} holds stream {sid}, which does not exist"
                )
            streams[sid] = stream
    return streams


def _pieces_by_stream(objects: Iterable[ObjectMeta]) -> CommitPlan:
    plan: CommitPlan = {}
    several = False
    for obj in objects:
        for rng in obj.ranges:
            pieces = plan.get(rng.stream_id)
            if pieces is None:
                plan[rng.stream_id] = [(rng, obj)]
            else:
                pieces.append((rng, obj))
                several = True
    if several:  # a stream held by one piece (every stream of one upload) needs no sort
        for pieces in plan.values():
            if len(pieces) > 1:
                pieces.sort(key=_start_of_piece)
    return plan


def _start_of_piece(piece: tuple[StreamRange, ObjectMeta]) -> int:
    return piece[0].start_offset


def _merged(pieces: Sequence[tuple[StreamRange, ObjectMeta]]) -> list[tuple[int, int]]:
    """Sorted pieces as maximal intervals (adjacent ones joined)."""
    out: list[tuple[int, int]] = []
    for rng, _ in pieces:
        if out and rng.start_offset <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], rng.end_offset))
        else:
            out.append((rng.start_offset, rng.end_offset))
    return out


def _within(intervals: list[tuple[int, int]], start: int, end: int) -> bool:
    i = bisect.bisect_right(intervals, (start, 1 << 64)) - 1
    return i >= 0 and intervals[i][0] <= start and end <= intervals[i][1]


def _check_coverage(
    stream_id: int,
    old: list[tuple[StreamRange, ObjectMeta]],
    new: list[tuple[StreamRange, ObjectMeta]],
    keep_from: int | None,
) -> None:
    """I10: new ⊆ old, and old ∩ [keep_from, ∞) ⊆ new (keep_from None: all may go)."""
    for (a, a_obj), (b, b_obj) in itertools.pairwise(new):
        if b.start_offset < a.end_offset:
            raise InvalidArgumentError(
                f"I10: new objects {a_obj.key!r} and {b_obj.key!r} overlap in stream {stream_id}"
            )
    old_spans = _merged(old)
    for rng, obj in new:
        if not _within(old_spans, rng.start_offset, rng.end_offset):
            raise InvalidArgumentError(
                f"I10: new object {obj.key!r} holds stream {stream_id} "
                f"[{rng.start_offset}, {rng.end_offset}), which the replaced objects do not"
            )
    if keep_from is None:
        return
    new_spans = _merged(new)
    for start, end in old_spans:
        start = max(start, keep_from)
        if start < end and not _within(new_spans, start, end):
            raise InvalidArgumentError(
                f"I10: compaction would drop live data of stream {stream_id} in "
                f"[{start}, {end}) (at or above its start offset {keep_from})"
            )
