"""Stream and object metadata, kept as an append-only log in the object store itself.

Roles:

- `model` — the records: `StreamMeta`, `ObjectMeta`, `NodeMeta`, the ops that change them
  (`CreateStream` ... `RegisterNode`), `LogEntry` and `Checkpoint` (frozen msgspec Structs).
- `codec` — their bytes: msgpack bodies in a checksummed, versioned frame.
- `log` — `MetadataLog`: where entries, checkpoints and the checkpoint pointer live in the
  store; reads and conditional creates, never a LIST.
- `invariants` — the checks every op passes before it is applied or written (I1..I13).
- `state` — `MetadataState`: immutable snapshots derived purely by applying entries, with a
  per-stream offset index for `objects_for`.
- `manager` — `MetadataManager`: load via checkpoint + replay, refresh, and optimistic
  commits through `put_if_absent`, so several processes can share one bucket safely.

See ``docs/metadata.md`` for the layout, formats, invariants and concurrency protocol.
"""

from .codec import decode_checkpoint, decode_entry, encode_checkpoint, encode_entry
from .invariants import check_state
from .log import MetadataLog
from .manager import MetadataManager
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
    ObjectKind,
    ObjectMeta,
    Op,
    OpenStream,
    PurgeObjects,
    RegisterNode,
    StreamMeta,
    StreamRange,
    StreamState,
    TrimStream,
)
from .state import MetadataState

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CloseStream",
    "CommitObjects",
    "CompactObjects",
    "CreateStream",
    "DeleteStream",
    "LogEntry",
    "MetadataLog",
    "MetadataManager",
    "MetadataState",
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
    "check_state",
    "decode_checkpoint",
    "decode_entry",
    "encode_checkpoint",
    "encode_entry",
]
