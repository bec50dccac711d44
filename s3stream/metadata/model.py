"""The metadata model: streams, objects, nodes, the ops that change them, and log records.

Everything here is a frozen msgspec Struct so that entries and checkpoints encode to msgpack
without hand-written codecs, and decoding validates every field's type and range. Ops form a
tagged union (tag field ``"op"``). New fields may be added later only with defaults, at the end,
so that old entries keep decoding.
"""

from __future__ import annotations

import bisect
import enum
from operator import attrgetter, itemgetter
from typing import Annotated, TypeAlias

import msgspec

from ..types import StreamInfo, StreamState

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointPointer",
    "CloseStream",
    "CommitObjects",
    "CompactObjects",
    "CreateStream",
    "DeleteStream",
    "LogEntry",
    "NodeMeta",
    "ObjectKind",
    "ObjectMeta",
    "Op",
    "OpenStream",
    "PurgeObjects",
    "RegisterNode",
    "StreamMeta",
    "StreamRange",
    "StreamState",
    "TrimStream",
]

#: Version of the entry/checkpoint encoding; readers refuse anything newer.
FORMAT_VERSION = 1

# 64-bit everywhere: AutoMQ once lost data to an int32 offset delta.
NonNeg = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
Epoch = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
Key = Annotated[str, msgspec.Meta(min_length=1)]

_stream_id_of = attrgetter("stream_id")
_first = itemgetter(0)


class ObjectKind(enum.Enum):
    """What an object holds: data of many streams, or of exactly one."""

    #: Data of several streams, written by one upload (AutoMQ's "stream set object").
    STREAM_SET = "stream_set"
    #: Data of one stream only (made by an upload of a big stream, or by compaction).
    STREAM = "stream"


class StreamRange(msgspec.Struct, frozen=True, array_like=True):
    """Records ``[start_offset, end_offset)`` of one stream held by an object.

    `min_timestamp`/`max_timestamp`: the smallest and largest timestamp of those records
    (docs/consuming.md, "Seek by time"), so seek by time can skip the object without reading
    its index; None in entries written before they were recorded (trailing fields of the
    array: older readers ignore them, and read older entries as None).

    `commits`: when the records were first committed, for a range written by compaction:
    ``(offset, committed_ms)`` pairs by ascending offset, the first at `start_offset`; the
    records from each offset up to the next pair's (or `end_offset`) were committed at that
    time or earlier (compaction may join neighbours, keeping the later time). The object's
    `committed_ms` is its oldest source's (the data's age, for compaction's aging), which
    would make a producer whose last batch was merged with older data look idle since then:
    the idempotent producers' rebuild at a reopen reads these times instead
    (storage/producers.py). None for a range committed by an upload (every record at the
    object's `committed_ms`), and in entries written before it was recorded (a trailing
    field: older readers ignore it; the rebuild then falls back to `committed_ms`).
    """

    stream_id: NonNeg
    start_offset: NonNeg
    end_offset: NonNeg
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    commits: tuple[tuple[NonNeg, int], ...] | None = None

    def commit_times(self, committed_ms: int) -> tuple[tuple[int, int], ...]:
        """`commits`, or for a range without them (`committed_ms`: its object's) one pair."""
        commits = self.commits
        if not commits:
            return ((self.start_offset, committed_ms),)
        return commits

    def committed_at(self, offset: int, committed_ms: int) -> int:
        """When the record at `offset` was committed (at the latest): see `commits`."""
        commits = self.commits
        if not commits:
            return committed_ms
        i = bisect.bisect_right(commits, offset, key=_first) - 1
        return commits[max(i, 0)][1]

    def newest_commit(self, committed_ms: int) -> int:
        """When its newest record was committed (at the latest): see `commits`."""
        commits = self.commits
        if not commits:
            return committed_ms
        return max(t for _, t in commits)


class ObjectMeta(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A data object in the store; `key` is its identity.

    `ranges` has at most one range per stream, sorted by stream id. `marked_deleted_ms` is set
    when compaction replaced the object: it is no longer read, but stays in the metadata (and
    in the store) until purged, because readers holding an older snapshot may still read it.

    Not tracked by the cyclic garbage collector (``gc=False``): it holds only scalars and
    a tuple of `StreamRange`, so it cannot be part of a cycle, and a client of many streams
    keeps many (each full collection walked them all).
    """

    key: Key
    kind: ObjectKind
    size: NonNeg
    ranges: tuple[StreamRange, ...]
    committed_ms: int
    node_id: str
    level: NonNeg = 0
    marked_deleted_ms: int | None = None

    def range_of(self, stream_id: int) -> StreamRange | None:
        """The range of `stream_id` held by this object, or None (a bisect, not a scan)."""
        ranges = self.ranges
        i = bisect.bisect_left(ranges, stream_id, key=_stream_id_of)
        if i < len(ranges) and ranges[i].stream_id == stream_id:
            return ranges[i]
        return None

    @property
    def live(self) -> bool:
        """Whether readers may use the object (it has not been replaced by compaction)."""
        return self.marked_deleted_ms is None


class StreamMeta(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Committed metadata of one stream.

    `end_offset` is what is committed to object storage; records ``[start_offset,
    end_offset)`` are readable from objects. `epoch` grows by one at every open and fences
    every older owner. `tags` must not be mutated (the struct is shared by snapshots).

    Not tracked by the cyclic garbage collector (``gc=False``): its fields are scalars and a
    dict of str to str, which cannot lead back to it, and an upload of 10,000 streams makes
    10,000 new ones (the collector walked every one of them in each full collection).
    """

    stream_id: NonNeg
    epoch: Epoch
    start_offset: NonNeg
    end_offset: NonNeg
    state: StreamState
    tags: dict[str, str]
    created_ms: int
    owner: str | None = None

    def to_info(self) -> StreamInfo:
        """The public `StreamInfo` view of this stream."""
        return StreamInfo(
            stream_id=self.stream_id,
            epoch=self.epoch,
            start_offset=self.start_offset,
            end_offset=self.end_offset,
            state=self.state,
            tags=dict(self.tags),
        )


class NodeMeta(msgspec.Struct, frozen=True, omit_defaults=True):
    """A node (a client writing a WAL) and its epoch; a bump fences the previous holder.

    `wal_uid`: the identity of the WAL the node last opened a stream through (a file WAL's
    header ``wal_uid``; `WriteAheadLog.identity`), or None (unknown: a WAL without an
    identity, or an open by a client that records none). The node's next open refuses a WAL
    of another identity that holds records: another store's or another node's, whose records
    would be replayed into the wrong streams (docs/file-wal.md, "One WAL, one store").
    """

    node_id: Key
    epoch: Epoch
    wal_uid: NonNeg | None = None


class _Op(msgspec.Struct, frozen=True, tag_field="op"):
    """Base of all ops (a msgpack map tagged with ``"op"``)."""


class CreateStream(_Op, frozen=True, tag="create_stream"):
    """Create stream `stream_id` (must be the state's `next_stream_id`), closed, epoch 0."""

    stream_id: NonNeg
    tags: dict[str, str]
    created_ms: int


class OpenStream(_Op, frozen=True, tag="open_stream", omit_defaults=True):
    """Open a stream for `node_id` at `epoch`, which must be exactly the previous epoch + 1.

    `wal_uid` is the identity of the WAL the node writes the stream's appends to, None when
    it has none: it becomes the node's `NodeMeta.wal_uid`. (Left out of the encoding when
    None, so an entry without it, from a client before identities, reads the same.)"""

    stream_id: NonNeg
    epoch: Epoch
    node_id: Key
    wal_uid: NonNeg | None = None


class CloseStream(_Op, frozen=True, tag="close_stream"):
    """Close a stream; `epoch` must be the current one."""

    stream_id: NonNeg
    epoch: Epoch


class TrimStream(_Op, frozen=True, tag="trim_stream"):
    """Move a stream's start offset forward (never back, never past its end offset)."""

    stream_id: NonNeg
    epoch: Epoch
    start_offset: NonNeg


class DeleteStream(_Op, frozen=True, tag="delete_stream"):
    """Delete a stream; its data becomes garbage for compaction to drop."""

    stream_id: NonNeg
    epoch: Epoch


class CommitObjects(_Op, frozen=True, tag="commit_objects"):
    """The upload commit: new objects whose ranges extend their streams exactly at the end.

    `epochs` maps every stream with a range in `objects` to the epoch the uploader holds.
    `node_epoch`, when set, is the epoch the uploader holds of the node named by the objects'
    `node_id`: a node taken over by another client cannot commit any more.
    """

    objects: tuple[ObjectMeta, ...]
    epochs: dict[NonNeg, Epoch]
    node_epoch: Epoch | None = None


class CompactObjects(_Op, frozen=True, tag="compact_objects"):
    """Replace live objects by new ones holding exactly the same live data.

    Data wholly below a stream's start offset (all data of a deleted stream) may be dropped.
    The replaced objects are marked deleted at the entry's timestamp.
    """

    new_objects: tuple[ObjectMeta, ...]
    replaced_keys: tuple[Key, ...]


class PurgeObjects(_Op, frozen=True, tag="purge_objects"):
    """Forget objects already marked deleted (after their data was deleted from the store)."""

    keys: tuple[Key, ...]


class RegisterNode(_Op, frozen=True, tag="register_node"):
    """Claim node `node_id` at `epoch`: 1 for a new node, else exactly the previous + 1."""

    node_id: Key
    epoch: Epoch


Op: TypeAlias = (
    CreateStream
    | OpenStream
    | CloseStream
    | TrimStream
    | DeleteStream
    | CommitObjects
    | CompactObjects
    | PurgeObjects
    | RegisterNode
)


class LogEntry(msgspec.Struct, frozen=True, kw_only=True):
    """Entry `seq` of the metadata log: ops applied atomically, in order, by `writer`."""

    seq: Annotated[int, msgspec.Meta(ge=1, le=(1 << 63) - 1)]
    ops: tuple[Op, ...]
    writer: str
    ts_ms: int


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """The whole state after entry `seq` (0: the empty state), sorted for a stable encoding."""

    seq: NonNeg
    next_stream_id: NonNeg
    streams: tuple[StreamMeta, ...]
    objects: tuple[ObjectMeta, ...]
    nodes: tuple[NodeMeta, ...]
    format_version: int = FORMAT_VERSION


class CheckpointPointer(msgspec.Struct, frozen=True):
    """Body of the pointer object: which checkpoint to load first."""

    seq: NonNeg
