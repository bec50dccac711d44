"""`MetadataState`: the state derived purely by applying log entries, as immutable snapshots.

A snapshot never changes once built, so readers (the read path, Spark planning against a
pinned entry) use one without locks while commits build the next. Building the next is cheap:
streams, objects and nodes live in HAMT maps (`immutables.Map`) that share structure between
snapshots, so a commit costs O(changes · log n), not a copy of thousands of objects.

Per stream, a sorted index of live objects by offset makes `objects_for` a bisect. Live
ranges of a stream never overlap (invariant I9) and uploads only append at the end, so the
index is an append-mostly vector whose lists are shared by every snapshot that sees a prefix
of them; only compaction (rare) rebuilds one stream's index.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence

import immutables
import msgspec

from ..errors import InvalidArgumentError, StreamNotFoundError
from ..validation import check_int, check_str_map
from . import invariants
from .model import (
    FORMAT_VERSION,
    Checkpoint,
    CloseStream,
    CommitObjects,
    CompactObjects,
    CreateStream,
    DeleteStream,
    LogEntry,
    NodeMeta,
    ObjectMeta,
    Op,
    OpenStream,
    PurgeObjects,
    RegisterNode,
    StreamMeta,
    StreamState,
    TrimStream,
)

__all__ = ["MetadataState"]

_replace = msgspec.structs.replace


class _Shared:
    """Lists that several snapshots' indexes read, each up to its own length."""

    __slots__ = ("ends", "lock", "objects", "starts")

    def __init__(self, starts: list[int], ends: list[int], objects: list[ObjectMeta]) -> None:
        self.starts = starts
        self.ends = ends
        self.objects = objects
        # Guards the check-then-append, so two branches built from one snapshot (a commit
        # attempt and a refresh) never both extend the lists in place. (A lock is not a
        # container: the cyclic collector does not walk it.)
        self.lock = threading.Lock()


class _StreamIndex:
    """Live objects of one stream, sorted by (disjoint) range: a view of a `_Shared` prefix."""

    __slots__ = ("_n", "_shared")

    def __init__(self, shared: _Shared, n: int) -> None:
        self._shared = shared
        self._n = n

    @classmethod
    def build(cls, pieces: Iterable[tuple[int, int, ObjectMeta]]) -> _StreamIndex:
        ordered = sorted(pieces, key=lambda piece: piece[0])
        shared = _Shared([p[0] for p in ordered], [p[1] for p in ordered], [p[2] for p in ordered])
        return cls(shared, len(ordered))

    def __len__(self) -> int:
        return self._n

    def appended(self, start: int, end: int, obj: ObjectMeta) -> _StreamIndex:
        shared, n = self._shared, self._n
        # `objects` is appended to last (below): when it holds entry n, so do the others.
        if (
            len(shared.objects) > n
            and shared.objects[n] is obj
            and shared.starts[n] == start
            and shared.ends[n] == end
        ):
            # Another branch appended this very piece already (the lists only ever grow):
            # share it instead of copying the prefix.
            return _StreamIndex(shared, n + 1)
        with shared.lock:
            if len(shared.ends) == n:
                shared.starts.append(start)
                shared.ends.append(end)
                shared.objects.append(obj)
                return _StreamIndex(shared, n + 1)
        # Another branch already extended these lists past our view: copy our prefix.
        copy = _Shared(
            [*shared.starts[:n], start], [*shared.ends[:n], end], [*shared.objects[:n], obj]
        )
        return _StreamIndex(copy, n + 1)

    def replaced(
        self, removed: set[str], added: Iterable[tuple[int, int, ObjectMeta]]
    ) -> _StreamIndex:
        kept = [piece for piece in self.items() if piece[2].key not in removed]
        return _StreamIndex.build([*kept, *added])

    def items(self) -> Iterator[tuple[int, int, ObjectMeta]]:
        shared = self._shared
        for i in range(self._n):
            yield shared.starts[i], shared.ends[i], shared.objects[i]

    def overlapping(self, start: int, end: int | None) -> list[ObjectMeta]:
        shared, n = self._shared, self._n
        # Ranges are disjoint and sorted, so ends are sorted too: the first end > start is
        # the first object holding data at or after `start`.
        i = bisect.bisect_right(shared.ends, start, 0, n)
        if end is None:
            return shared.objects[i:n]
        if end <= start:
            return []
        j = bisect.bisect_left(shared.starts, end, i, n)
        return shared.objects[i:j]


_EMPTY_INDEX = _StreamIndex(_Shared([], [], []), 0)


class MetadataState:
    """The metadata after entry `seq`: streams, objects, nodes and the per-stream index.

    Immutable: `apply` returns a new state. Queries never do I/O.
    """

    __slots__ = ("_index", "_next_stream_id", "_nodes", "_objects", "_seq", "_streams")

    def __init__(
        self,
        *,
        seq: int,
        next_stream_id: int,
        streams: immutables.Map[int, StreamMeta],
        objects: immutables.Map[str, ObjectMeta],
        nodes: immutables.Map[str, NodeMeta],
        index: immutables.Map[int, _StreamIndex],
    ) -> None:
        self._seq = seq
        self._next_stream_id = next_stream_id
        self._streams = streams
        self._objects = objects
        self._nodes = nodes
        self._index = index

    @classmethod
    def empty(cls) -> MetadataState:
        """The state before the first entry (seq 0)."""
        return cls(
            seq=0,
            next_stream_id=0,
            streams=immutables.Map(),
            objects=immutables.Map(),
            nodes=immutables.Map(),
            index=immutables.Map(),
        )

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> MetadataState:
        """Rebuild a state (and its index) from a checkpoint; run `check_state` to verify it."""
        pieces: dict[int, list[tuple[int, int, ObjectMeta]]] = {}
        for obj in checkpoint.objects:
            if obj.live:
                for rng in obj.ranges:
                    pieces.setdefault(rng.stream_id, []).append(
                        (rng.start_offset, rng.end_offset, obj)
                    )
        return cls(
            seq=checkpoint.seq,
            next_stream_id=checkpoint.next_stream_id,
            streams=immutables.Map((s.stream_id, s) for s in checkpoint.streams),
            objects=immutables.Map((o.key, o) for o in checkpoint.objects),
            nodes=immutables.Map((n.node_id, n) for n in checkpoint.nodes),
            index=immutables.Map((sid, _StreamIndex.build(p)) for sid, p in pieces.items()),
        )

    def to_checkpoint(self) -> Checkpoint:
        """This state as a checkpoint, sorted so equal states encode to equal bytes."""
        return Checkpoint(
            seq=self._seq,
            next_stream_id=self._next_stream_id,
            streams=tuple(self._streams[sid] for sid in sorted(self._streams)),
            objects=tuple(self._objects[key] for key in sorted(self._objects)),
            nodes=tuple(self._nodes[nid] for nid in sorted(self._nodes)),
            format_version=FORMAT_VERSION,
        )

    @property
    def seq(self) -> int:
        """The last log entry applied (0: none)."""
        return self._seq

    @property
    def next_stream_id(self) -> int:
        """The id the next created stream gets."""
        return self._next_stream_id

    @property
    def streams(self) -> Mapping[int, StreamMeta]:
        """Every stream by id, deleted ones included."""
        return self._streams

    @property
    def objects(self) -> Mapping[str, ObjectMeta]:
        """Every object by key, including those marked deleted but not yet purged."""
        return self._objects

    @property
    def nodes(self) -> Mapping[str, NodeMeta]:
        """Every registered node by id."""
        return self._nodes

    def registered_again(self, node_id: str, epoch: int) -> str | None:
        """How node `node_id`'s session at `epoch` ended in this state (the node was
        registered again since: a take-over, or another open of the node id), for messages;
        None while that session is the node's latest, or if this state predates it. Every
        judge of "is this session over" asks here, so they cannot disagree."""
        node = self._nodes.get(node_id)
        if node is None or node.epoch <= epoch:
            return None
        return f"node {node_id!r} was registered again (its epoch is {node.epoch}, not {epoch})"

    def closes(self, held: Iterable[tuple[int, int]]) -> list[CloseStream]:
        """The ops releasing the streams of `held` (stream id, epoch) that are still open at
        that epoch: one opened, closed or deleted by someone since is theirs, left out."""
        ops = []
        for sid, epoch in held:
            s = self._streams.get(sid)
            if s is not None and s.state is StreamState.OPEN and s.epoch == epoch:
                ops.append(CloseStream(sid, epoch))
        return ops

    def get_stream(self, stream_id: int) -> StreamMeta:
        """The stream; `StreamNotFoundError` if it does not exist or was deleted."""
        check_int("stream_id", stream_id)
        stream = self._streams.get(stream_id)
        if stream is None or stream.state is StreamState.DELETED:
            raise StreamNotFoundError(f"no stream {stream_id}")
        return stream

    def list_streams(self, tags: Mapping[str, str] | None = None) -> list[StreamMeta]:
        """Streams not deleted whose tags include every item of `tags`, sorted by id."""
        wanted = list(check_str_map("tags", tags, allow_none=True).items())
        found = [
            s
            for s in self._streams.values()
            if s.state is not StreamState.DELETED
            and all(s.tags.get(k, _MISSING) == v for k, v in wanted)
        ]
        found.sort(key=lambda s: s.stream_id)
        return found

    def objects_for(
        self, stream_id: int, start_offset: int, end_offset: int | None = None
    ) -> list[ObjectMeta]:
        """Live objects holding data of the stream overlapping ``[start, end)``, by offset.

        `end_offset` None means no upper bound. The stream's start offset is not applied:
        objects holding trimmed data stay listed until compaction drops them.
        """
        self.get_stream(stream_id)
        check_int("start_offset", start_offset)
        if end_offset is not None:
            check_int("end_offset", end_offset, minimum=start_offset)
        return self._index.get(stream_id, _EMPTY_INDEX).overlapping(start_offset, end_offset)

    def stream_objects(self, stream_id: int) -> list[ObjectMeta]:
        """All live objects holding data of the stream, by offset, even if it was deleted.

        For compaction, which must also find the data of deleted streams; [] if none.
        """
        check_int("stream_id", stream_id)
        return self._index.get(stream_id, _EMPTY_INDEX).overlapping(0, None)

    def apply(self, entry: LogEntry) -> MetadataState:
        """The state after `entry`, which must be entry ``seq + 1``.

        Raises, leaving this state untouched, if an op breaks an invariant (see
        `s3stream.metadata.invariants`): ops of one entry apply all or none.
        """
        if entry.seq != self._seq + 1:
            raise InvalidArgumentError(
                f"entry {entry.seq} cannot follow state at seq {self._seq}: entries are dense"
            )
        if not entry.ops:
            # Nothing changes but the seq (the leader's staged state becomes the entry's):
            # the same maps, without a transaction over them.
            return MetadataState(
                seq=entry.seq,
                next_stream_id=self._next_stream_id,
                streams=self._streams,
                objects=self._objects,
                nodes=self._nodes,
                index=self._index,
            )
        txn = _Txn(self, entry.ts_ms)
        for op in entry.ops:
            txn.apply(op)
        return txn.finish(entry.seq)

    def apply_run(self, entries: Sequence[LogEntry]) -> MetadataState:
        """The state after `entries`, which must be entries ``seq + 1, seq + 2, ...``: what
        `apply` computes one entry after the other (each op checked on the state the ops
        before it left, at its own entry's timestamp), without building the states between
        them, which a catch-up over many entries never uses.

        Raises, leaving this state untouched, if an op breaks an invariant; it does not say
        which entry (apply them one by one for that)."""
        txn = _Txn(self, 0)
        seq = self._seq
        for entry in entries:
            if entry.seq != seq + 1:
                raise InvalidArgumentError(
                    f"entry {entry.seq} cannot follow state at seq {seq}: entries are dense"
                )
            txn.set_time(entry.ts_ms)
            for op in entry.ops:
                txn.apply(op)
            seq = entry.seq
        return txn.finish(seq)

    def stage(self, ops: Sequence[Op], ts_ms: int) -> MetadataState:
        """This state with `ops` applied but the seq unchanged: an entry being assembled by
        group commit, each caller's ops checked on what the callers before it staged.

        Raises, leaving this state untouched, if an op breaks an invariant (the same checks
        as `apply`, op by op)."""
        txn = _Txn(self, ts_ms)
        for op in ops:
            txn.apply(op)
        return txn.finish(self._seq)

    def __repr__(self) -> str:
        return (
            f"MetadataState(seq={self._seq}, streams={len(self._streams)}, "
            f"objects={len(self._objects)}, nodes={len(self._nodes)})"
        )


_MISSING = object()


class _Txn:
    """Ops of one entry applied to a base state through HAMT mutations (a `StateView`)."""

    def __init__(self, base: MetadataState, ts_ms: int) -> None:
        self._streams = base._streams.mutate()
        self._objects = base._objects.mutate()
        self._nodes = base._nodes.mutate()
        self._index = base._index.mutate()
        self._next_stream_id = base.next_stream_id
        self._ts_ms = ts_ms

    @property
    def next_stream_id(self) -> int:
        return self._next_stream_id

    def set_time(self, ts_ms: int) -> None:
        """The timestamp of the entry whose ops come next (`MetadataState.apply_run`)."""
        self._ts_ms = ts_ms

    def stream(self, stream_id: int) -> StreamMeta | None:
        return self._streams.get(stream_id)

    def object(self, key: str) -> ObjectMeta | None:
        return self._objects.get(key)

    def node(self, node_id: str) -> NodeMeta | None:
        return self._nodes.get(node_id)

    def apply(self, op: Op) -> None:
        match op:
            case CommitObjects():
                self._commit(op)
            case CreateStream():
                invariants.check_create(self, op)
                self._streams[op.stream_id] = StreamMeta(
                    stream_id=op.stream_id,
                    epoch=0,
                    start_offset=0,
                    end_offset=0,
                    state=StreamState.CLOSED,
                    tags=dict(op.tags),
                    created_ms=op.created_ms,
                )
                self._next_stream_id = op.stream_id + 1
            case OpenStream():
                stream = invariants.check_open(self, op)
                self._streams[op.stream_id] = _replace(
                    stream, epoch=op.epoch, state=StreamState.OPEN, owner=op.node_id
                )
                # The node's WAL is the one this open names; one without an identity (or a
                # client that records none, before identities were) leaves it unknown.
                node = self._nodes.get(op.node_id)
                if node is not None and node.wal_uid != op.wal_uid:
                    self._nodes[op.node_id] = _replace(node, wal_uid=op.wal_uid)
            case CloseStream():
                stream = invariants.check_close(self, op)
                self._streams[op.stream_id] = _replace(stream, state=StreamState.CLOSED, owner=None)
            case TrimStream():
                stream = invariants.check_trim(self, op)
                self._streams[op.stream_id] = _replace(stream, start_offset=op.start_offset)
            case DeleteStream():
                stream = invariants.check_delete(self, op)
                self._streams[op.stream_id] = _replace(
                    stream, state=StreamState.DELETED, owner=None
                )
            case CompactObjects():
                self._compact(op)
            case PurgeObjects():
                invariants.check_purge(self, op)
                for key in op.keys:
                    del self._objects[key]
            case RegisterNode():
                invariants.check_register(self, op)
                known = self._nodes.get(op.node_id)
                self._nodes[op.node_id] = NodeMeta(
                    op.node_id, op.epoch, None if known is None else known.wal_uid
                )
            case _:
                raise InvalidArgumentError(f"unknown metadata op {op!r}")

    def _commit(self, op: CommitObjects) -> None:
        # The streams as checked (this op changes none before its check ends): no second
        # lookup of each of an upload's streams.
        plan, checked = invariants.check_commit_streams(self, op)
        objects = self._objects
        for obj in op.objects:
            objects[obj.key] = obj
        indexes = self._index
        streams = self._streams
        for stream_id, pieces in plan.items():
            index = indexes.get(stream_id, _EMPTY_INDEX)
            for rng, obj in pieces:
                index = index.appended(rng.start_offset, rng.end_offset, obj)
            indexes[stream_id] = index
            streams[stream_id] = _replace(checked[stream_id], end_offset=pieces[-1][0].end_offset)

    def _compact(self, op: CompactObjects) -> None:
        plan = invariants.check_compact(self, op)
        for obj in plan.replaced:
            self._objects[obj.key] = _replace(obj, marked_deleted_ms=self._ts_ms)
        for obj in op.new_objects:
            self._objects[obj.key] = obj
        for stream_id, removed in plan.removed.items():
            added = [
                (rng.start_offset, rng.end_offset, obj)
                for rng, obj in plan.added.get(stream_id, [])
            ]
            index = self._index.get(stream_id, _EMPTY_INDEX).replaced(removed, added)
            if len(index):
                self._index[stream_id] = index
            else:
                del self._index[stream_id]

    def finish(self, seq: int) -> MetadataState:
        return MetadataState(
            seq=seq,
            next_stream_id=self._next_stream_id,
            streams=self._streams.finish(),
            objects=self._objects.finish(),
            nodes=self._nodes.finish(),
            index=self._index.finish(),
        )
