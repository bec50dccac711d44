"""Compaction: fewer, larger objects; retention; deletion of garbage.

Roles:

- `planner` — which live objects to replace by which new ones: stream-set compaction (merge
  stream-set objects, split streams with enough data out into stream objects, split old ones
  completely) and stream object compaction (merge small adjacent stream objects, drop data
  below the start offset). Pure: reads metadata and object indexes only.
- `executor` — runs one task: read (throttled), copy whole blocks into the outputs (decoding
  only blocks that straddle a stream's start offset), verify, PUT, check coverage, commit one
  `CompactObjects` after re-checking the replaced objects are still live; aborts cleanly.
- `retention` — `RetentionPolicy` (stream tags ``retention.ms`` / ``retention.bytes``) and
  the start offset it asks for.
- `sweeper` — physical deletion: purge objects marked deleted after the deletion delay, and
  the rare, bounded orphan sweep for objects that were PUT but never committed.
- `compactor` — `Compactor`: a pass of all of the above, in a client's background thread or
  as a standalone job (``s3stream compact URL``).

See ``docs/compaction.md``.
"""

from .compactor import CompactionMetrics, CompactionReport, Compactor, Progress
from .executor import CompactionExecutor, TaskResult, WriterOptions
from .planner import (
    CompactionTask,
    OutputObject,
    Piece,
    plan_stream_object_compaction,
    plan_stream_set_compaction,
)
from .retention import TAG_BYTES, TAG_MS, RetentionPolicy, retention_start
from .sweeper import OrphanSweeper, purge_deleted

__all__ = [
    "TAG_BYTES",
    "TAG_MS",
    "CompactionExecutor",
    "CompactionMetrics",
    "CompactionReport",
    "CompactionTask",
    "Compactor",
    "OrphanSweeper",
    "OutputObject",
    "Piece",
    "Progress",
    "RetentionPolicy",
    "TaskResult",
    "WriterOptions",
    "plan_stream_object_compaction",
    "plan_stream_set_compaction",
    "purge_deleted",
    "retention_start",
]
