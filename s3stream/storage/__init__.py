"""The storage pipeline of a client.

- `engine.Storage`: append path (offsets, WAL, LogCache), uploader (pack, PUT, commit, trim),
  read path (LogCache, then objects) and WAL recovery.
- `packing`: which pending batches go into which object; unique object keys.
- `reader`: reading committed batches from objects through their (cached) indexes.
"""

from .engine import RecoveryReport, Storage, StorageMetrics, WriterState

__all__ = ["RecoveryReport", "Storage", "StorageMetrics", "WriterState"]
