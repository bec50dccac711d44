"""s3stream: embeddable stream storage on object storage.

Applications append record batches to streams and fetch them by offset, in-process. An append
is acknowledged once durable in a write-ahead log; data then moves in large batched objects to
object storage (S3, any fsspec URL, or a local directory), is cached for readers and compacted
in the background. Spark reads the objects directly (``spark.read.format("s3stream")``).

Roles of the public names:

- entry point: `open` (URLs) or `StreamClient` (components); `open_reader` for a read-only
  `StreamReader`, which never writes to the store;
- handles: `StreamClient`, `Stream`, `StreamReader`;
- values: `RecordBatch` (in), `FetchedBatch`, `AppendResult`, `FetchResult`, `StreamInfo`,
  `TakeOverReport` (out);
- settings: `ClientSettings`, `CompactionSettings`, `FileWalSettings`, `ObjectWalSettings`,
  `RetentionPolicy` (per-stream, as stream tags);
- reports: `CompactionReport` (`StreamClient.compact`);
- observability: `ClientMetrics` (`StreamClient.metrics`), its `MetricsRegistry` (exporters in
  `s3stream.metrics.prometheus` and `s3stream.metrics.otel`), `CostReport` priced at a
  `PriceTable` (docs/observability.md);
- components: `WriteAheadLog`, `ObjectStore`, `Clock` (and their implementations in
  `s3stream.wal`, `s3stream.objectstore`, `s3stream.clock`);
- errors: `S3StreamError` and its kinds;
- asyncio: `s3stream.aio` (`await s3stream.aio.open(...)`: async handles over these,
  docs/consuming.md), imported on first use;
- Polars: `s3stream.polars_scan` (`scan(reader)`: a lazy frame that reads only what a
  query's filter keeps, docs/arrow.md; extra ``polars``), imported on first use.
"""

import typing as _typing

from .client import ClientMetrics, StreamClient
from .clock import Clock, ManualClock, SystemClock
from .compaction import CompactionReport, RetentionPolicy
from .errors import (
    BackpressureError,
    ContendedError,
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    NodeInUseError,
    ObjectNotFoundError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    S3StreamError,
    SequenceError,
    StreamClosedError,
    StreamNotFoundError,
    StreamOwnedError,
    UnavailableError,
    WalFullError,
)
from .failover import TakeOverReport
from .metrics import CostReport, MetricsRegistry, PriceTable
from .objectstore.base import ObjectStore
from .opening import open
from .reader import ObjectSummary, StreamReader, open_reader
from .records import Record
from .settings import ClientSettings, CompactionSettings, FileWalSettings, ObjectWalSettings
from .stream import Stream
from .types import (
    AppendResult,
    BatchKind,
    FetchedBatch,
    FetchResult,
    RecordBatch,
    StreamInfo,
    StreamState,
)
from .wal.base import WriteAheadLog

if _typing.TYPE_CHECKING:
    from . import aio as aio
    from . import polars_scan as polars_scan

__version__ = "0.1.0"

__all__ = [
    "AppendResult",
    "BackpressureError",
    "BatchKind",
    "ClientMetrics",
    "ClientSettings",
    "Clock",
    "CompactionReport",
    "CompactionSettings",
    "ContendedError",
    "CorruptionError",
    "CostReport",
    "FencedError",
    "FetchResult",
    "FetchedBatch",
    "FileWalSettings",
    "InvalidArgumentError",
    "ManualClock",
    "MetricsRegistry",
    "NodeInUseError",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectSummary",
    "ObjectWalSettings",
    "OffsetMismatchError",
    "OffsetOutOfRangeError",
    "PriceTable",
    "Record",
    "RecordBatch",
    "RetentionPolicy",
    "S3StreamError",
    "SequenceError",
    "Stream",
    "StreamClient",
    "StreamClosedError",
    "StreamInfo",
    "StreamNotFoundError",
    "StreamOwnedError",
    "StreamReader",
    "StreamState",
    "SystemClock",
    "TakeOverReport",
    "UnavailableError",
    "WalFullError",
    "WriteAheadLog",
    "open",
    "open_reader",
]


def __getattr__(name: str) -> object:
    """`s3stream.aio` and `s3stream.polars_scan` on first use: only programs that use them
    pay for importing asyncio or polars."""
    if name in ("aio", "polars_scan"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
