"""Stream and object metadata, kept as an append-only log in the object store itself.

Roles:

- `model` — the records: `StreamMeta`, `ObjectMeta`, `NodeMeta`, the ops that change them
  (`CreateStream` ... `RegisterNode`), `LogEntry` and `Checkpoint` (frozen msgspec Structs).
- `codec` — their bytes: msgpack bodies in a checksummed, versioned frame.
- `base` — `MetadataLogStore`: the ABC of where the log's records live (read an entry, create
  one if absent with exactly one winner, checkpoints, the pointer); `ExternalMetadataLog` for
  logs kept outside the object store.
- `log` — `MetadataLog`: the default, the records as keys of the object store itself; reads
  and conditional creates, never a LIST.
- `postgres` — `PostgresMetadataLog`: the records as rows of PostgreSQL tables (the
  ``postgres`` extra; imported only when a ``postgresql://`` URL is opened), with
  ``postgres_url``, ``postgres_session`` and ``postgres_schema`` beside it.
- `registry` — `open_metadata_log`: a log by URL (``metadata=`` of `s3stream.open`);
  `binding` — `bind_log`: one object store to one external log, and back.
- `invariants` — the checks every op passes before it is applied or written (I1..I13).
- `state` — `MetadataState`: immutable snapshots derived purely by applying entries, with a
  per-stream offset index for `objects_for`.
- `manager` — `MetadataManager`: load via checkpoint + replay, refresh, and optimistic
  commits through the store's create-if-absent, so several processes share one log safely.

See ``docs/metadata.md`` for the layout, formats, invariants and concurrency protocol.
"""

from .base import ExternalMetadataLog, MetadataLogStore
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
from .registry import open_metadata_log, register_metadata_store
from .state import MetadataState

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CloseStream",
    "CommitObjects",
    "CompactObjects",
    "CreateStream",
    "DeleteStream",
    "ExternalMetadataLog",
    "LogEntry",
    "MetadataLog",
    "MetadataLogStore",
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
    "open_metadata_log",
    "register_metadata_store",
]
