"""Write-ahead logs: where appends become durable before they move to object storage.

Roles:

- `WriteAheadLog` (`base`): the contract every WAL keeps (ordered, durable-on-ack appends,
  trim, recovery, reset, close), with `WalCapabilities`, `WalPosition` and `WalRecord`; the
  refusals every WAL words the same way are in `checks`.
- `PipelinedWal` (`pipeline`): the WAL core of the file and object WALs: the pending queue,
  room and backpressure, in-order acknowledgement, failure and lifecycle, one semantics for
  both; each WAL supplies only its medium and its recovery.
- `MemoryWal` over a `MemoryWalMedium` (`memory`): the contract without durability; the model
  for tests and demos.
- `FileWal` (`file`, codecs in `framing`): the embedded default; a ring buffer on a
  preallocated file or a raw block device, with group commit, torn-write detection and
  fencing.
- `ObjectWal` (`object`): the object-store ("S3") WAL; records PUT in batches as WAL objects,
  fenced by conditional creates, recovered with one LIST.
- `open_wal` (`registry`): opens a WAL from a URL (``memory://``, ``file:///path?...``, a
  path); third parties add schemes through the ``s3stream.wals`` entry-point group.
"""

from __future__ import annotations

from .base import WalCapabilities, WalPosition, WalRecord, WriteAheadLog
from .file import FileWal
from .memory import MemoryWal, MemoryWalMedium
from .object import ObjectWal
from .registry import open_wal

__all__ = [
    "FileWal",
    "MemoryWal",
    "MemoryWalMedium",
    "ObjectWal",
    "WalCapabilities",
    "WalPosition",
    "WalRecord",
    "WriteAheadLog",
    "open_wal",
]
