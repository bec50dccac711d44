"""The PySpark data source: ``spark.read.format("s3stream")`` and ``spark.readStream``.

`S3StreamDataSource` builds a `S3StreamBatchReader` or `S3StreamStreamReader`. Planning
(metadata log, object indexes, partitions) runs on the driver; `read` runs on executors and
opens its own object store from the options, so readers and partitions stay small and
picklable and no client object crosses the wire.

Both sides read through `s3stream.reader` (`open_reader`, `open_reader_store`), the one
read-only view of a store: the source never writes, so it reads stores on read-only media or
with read-only credentials.

Streaming offsets are JSON objects ``{"seq": N, "streams": {"<stream id>": end_offset}}``:
the end offset of every stream as committed in metadata-log entry ``N``. Committed data is
immutable (objects are never rewritten; compaction replaces objects with ones holding the
same records), so a micro-batch ``[start, end)`` is planned from the latest metadata and
reads exactly the same records whenever it is replayed, unless they were trimmed meanwhile
(then ``failOnDataLoss`` decides). ``seq`` records where the offsets came from and guards
against a metadata log that went backwards.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..cache.block_cache import BlockCache
from ..errors import (
    CorruptionError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    StreamNotFoundError,
)
from ..metadata import MetadataState, StreamState
from ..objectstore.base import ObjectStore
from ..reader import StreamReader, open_reader, open_reader_store
from ..storage.reader import ObjectDataReader, on_fresh_snapshots
from ..types import FetchedBatch
from .arrow import arrow_batches, tuple_rows
from .fetch import fetch_slices
from .offsets import StreamOffsets, admit
from .options import SourceOptions, include_headers, parse_options
from .planning import (
    IndexReader,
    PartitionPlan,
    StreamTarget,
    plan_partitions,
    resolve_offsets,
    select_streams,
    stream_target,
)

__all__ = [
    "S3StreamBatchReader",
    "S3StreamDataSource",
    "S3StreamInputPartition",
    "S3StreamStreamReader",
    "spark_schema",
]

T = TypeVar("T")


def spark_schema(include_headers: bool) -> StructType:
    """The row schema: Spark's Kafka source columns, plus ``stream_id`` and ``record_count``."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    fields += [StructField("stream_id", LongType()), StructField("record_count", IntegerType())]
    return StructType(fields)


class S3StreamInputPartition(InputPartition):
    """One Spark task's work: a `PartitionPlan` (object keys and blocks, no credentials)."""

    def __init__(self, plan: PartitionPlan) -> None:
        super().__init__(plan)
        self.plan = plan


def _retry_rng(opts: SourceOptions) -> random.Random:
    # Seeded per store URL (the reader's default seed is one constant for every store).
    return random.Random(f"s3stream-spark:{opts.url}")


def _check_schema(schema: StructType, opts: SourceOptions) -> None:
    expected = spark_schema(opts.include_headers)
    if schema != expected:
        raise InvalidArgumentError(
            "the s3stream source has a fixed schema (set includeHeaders for the headers "
            f"column); expected {expected.simpleString()}, got {schema.simpleString()}"
        )


#: Bytes per read of a relocated range (the task holds the range's batches anyway).
_RELOCATE_PAGE_BYTES = 64 << 20


class _Relocator:
    """Finds offsets in the live objects when a planned object is gone (see `fetch`).

    Opens its `StreamReader` (which loads the metadata log) on first use only: a task
    normally never needs it.
    """

    def __init__(self, store: ObjectStore, opts: SourceOptions) -> None:
        self._store = store
        self._opts = opts
        self._reader: StreamReader | None = None
        # The readers' own object reading (coverage checked: a hole is an error, not fewer
        # rows); no cache, the task reads each block once.
        self._objects = ObjectDataReader(BlockCache(store, capacity_bytes=0, readahead_workers=1))

    def __call__(self, stream_id: int, start: int, end: int) -> tuple[list[FetchedBatch], int]:
        if self._reader is None:
            self._reader = StreamReader(
                self._store,
                metadata_prefix=self._opts.metadata_prefix,
                metadata=self._opts.metadata,
            )
            state = self._reader.snapshot(refresh=False)  # just loaded
        else:
            state = self._reader.snapshot()
        try:
            first = max(start, state.get_stream(stream_id).start_offset)
        except StreamNotFoundError:
            return [], end
        batches: list[FetchedBatch] = []
        pos = first
        while pos < end:
            # On the newest snapshot each page, and on fresher ones while objects it lists are
            # gone: another compaction may commit and purge during a long relocation.
            try:
                got = self._objects.read_latest(
                    self._reader.metadata, stream_id, pos, end, _RELOCATE_PAGE_BYTES
                )
            except OffsetOutOfRangeError:
                # Trimmed past `pos` meanwhile: what was read so far is below the new start
                # too, so the range now begins there (the caller says what was lost).
                try:
                    now = self._reader.metadata.state.get_stream(stream_id).start_offset
                except StreamNotFoundError:
                    return [], end
                if now <= pos:
                    raise
                batches, first = [], min(max(start, now), end)
                pos = first
                continue
            if not got:
                break  # nothing committed at `pos`
            batches += got
            pos = got[-1].next_offset
        return batches, min(first, end)

    def close(self) -> None:
        self._objects.cache.close()
        # The reader closes the task's store with it; the task closes it again, harmlessly.
        if self._reader is not None:
            self._reader.close()


def _read(opts: SourceOptions, partition: InputPartition) -> Iterator[Any]:
    plan = partition.plan if isinstance(partition, S3StreamInputPartition) else partition.value
    if plan is None:
        # Spark reads one placeholder partition when planning found no data.
        return
    if not isinstance(plan, PartitionPlan):
        raise InvalidArgumentError(f"not an s3stream partition: {partition!r}")
    store = open_reader_store(opts.url, storage_options=opts.storage_options, rng=_retry_rng(opts))
    relocate = _Relocator(store, opts)
    try:
        fetched = fetch_slices(
            store,
            plan.slices,
            concurrency=opts.fetch_concurrency,
            fail_on_data_loss=opts.fail_on_data_loss,
            relocate=relocate,
        )
        if opts.use_arrow:
            yield from arrow_batches(
                fetched, include_headers=opts.include_headers, batch_rows=opts.arrow_batch_rows
            )
        else:
            yield from tuple_rows(fetched, include_headers=opts.include_headers)
    finally:
        relocate.close()
        store.close()


class _Driver:
    """Driver-side handles: a `StreamReader` (store and metadata log) and cached object
    indexes."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.reader = open_reader(
            opts.url,
            storage_options=opts.storage_options,
            metadata_prefix=opts.metadata_prefix,
            rng=_retry_rng(opts),
            metadata=opts.metadata,
        )
        self.store = self.reader.object_store
        self.indexes = IndexReader(self.store)

    def refresh(self) -> MetadataState:
        return self.reader.snapshot()

    def plan(self, state: MetadataState, targets: list[StreamTarget]) -> list[InputPartition]:
        plans = plan_partitions(
            state,
            self.indexes,
            targets,
            min_partitions=self.opts.min_partitions,
            max_partition_bytes=self.opts.max_partition_bytes,
        )
        return [S3StreamInputPartition(p) for p in plans]

    def close(self) -> None:
        self.reader.close()


def _on_fresh_snapshot_if_moved(
    driver: _Driver, work: Callable[[MetadataState], T], state: MetadataState
) -> T:
    """`work` on `state`, and on fresh snapshots while objects it lists were deleted
    meanwhile (compaction purged them), as the library's readers do
    (`storage.reader.on_fresh_snapshots`)."""
    return on_fresh_snapshots(work, state, driver.refresh)


class S3StreamBatchReader(DataSourceReader):
    """Batch reads: plans partitions once from the latest metadata."""

    def __init__(self, opts: SourceOptions) -> None:
        self._opts = opts

    def partitions(self) -> list[InputPartition]:
        """Partitions over the selected streams between starting and ending offsets."""
        driver = _Driver(self._opts)

        def plan(state: MetadataState) -> list[InputPartition]:
            streams = select_streams(state, self._opts)
            targets = resolve_offsets(
                state, driver.store, driver.indexes, streams, self._opts, with_ending=True
            )
            return driver.plan(state, targets)

        try:
            # The snapshot was just loaded: no refresh before the first try.
            return _on_fresh_snapshot_if_moved(driver, plan, driver.reader.snapshot(refresh=False))
        finally:
            driver.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Rows of one partition (Arrow record batches, or tuples with useArrow=false)."""
        return _read(self._opts, partition)


class S3StreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reads with admission control (``maxOffsetsPerTrigger``) and
    ``Trigger.AvailableNow``."""

    def __init__(self, opts: SourceOptions) -> None:
        self._opts = opts
        self._driver: _Driver | None = None
        self._target: dict[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; the driver handles stay where they were made.
        return {"_opts": self._opts, "_driver": None, "_target": None}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self._opts = state["_opts"]
        self._driver = None
        self._target = None

    def _d(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver(self._opts)
        return self._driver

    def _latest(self, state: MetadataState) -> dict[int, int]:
        return {m.stream_id: m.end_offset for m in select_streams(state, self._opts)}

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts: ``startingOffsets`` / ``startingTimestamp`` resolved now."""
        d = self._d()

        def start(state: MetadataState) -> dict[str, Any]:
            streams = select_streams(state, self._opts)
            targets = resolve_offsets(
                state, d.store, d.indexes, streams, self._opts, with_ending=False
            )
            starts = {t.stream_id: t.start_offset for t in targets}
            return StreamOffsets(state.seq, starts).to_json()

        return _on_fresh_snapshot_if_moved(d, start, d.refresh())

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as a row limit, else everything available."""
        if self._opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self._opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Pin the end offsets of this ``availableNow`` run: data appended later waits."""
        self._target = self._latest(self._d().refresh())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch: the latest committed offsets, capped by the
        availableNow target and the read limit; `start` itself when there is nothing new."""
        begin = StreamOffsets.from_json(start, "start offset")
        state = self._d().refresh()
        latest = self._latest(state)
        if self._target is not None:
            latest = {
                sid: min(e, self._target[sid]) for sid, e in latest.items() if sid in self._target
            }
        if isinstance(limit, ReadAllAvailable):
            max_rows = None
        elif isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        elif isinstance(limit, ReadMinRows):
            max_rows = None
            if self._target is None and _available(begin, latest) < limit.min_rows:
                return start
        else:
            raise InvalidArgumentError(f"unsupported read limit {limit!r}")
        end = admit(begin, latest, max_rows)
        if end.streams == begin.streams:
            return start
        return StreamOffsets(state.seq, end.streams).to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The latest committed offsets, for the query's progress report."""
        state = self._d().refresh()
        return StreamOffsets(state.seq, self._latest(state)).to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """Partitions of the micro-batch ``[start, end)``; the same records on every replay."""
        begin = StreamOffsets.from_json(start, "start offset")
        finish = StreamOffsets.from_json(end, "end offset")
        d = self._d()
        return _on_fresh_snapshot_if_moved(
            d, lambda state: self._plan(state, begin, finish), d.refresh()
        )

    def _plan(
        self, state: MetadataState, begin: StreamOffsets, finish: StreamOffsets
    ) -> list[InputPartition]:
        d = self._d()
        if state.seq < finish.seq:
            raise CorruptionError(
                f"metadata log of {self._opts.url} ends at entry {state.seq}, but the "
                f"checkpointed offsets name entry {finish.seq}: wrong store or lost entries"
            )
        targets: list[StreamTarget] = []
        for sid, stop in sorted(finish.streams.items()):
            first = begin.streams.get(sid, 0)
            if first >= stop:
                continue
            meta = state.streams.get(sid)
            if meta is None or meta.state is StreamState.DELETED:
                self._data_loss(f"stream {sid} was deleted; offsets {first}..{stop} are lost")
                continue
            if stop > meta.end_offset:
                raise CorruptionError(
                    f"stream {sid} ends at {meta.end_offset} but the checkpointed end offset "
                    f"is {stop}"
                )
            if first < meta.start_offset:
                self._data_loss(
                    f"offsets {first}..{min(stop, meta.start_offset)} of stream {sid} were "
                    f"trimmed (start offset is now {meta.start_offset})"
                )
                first = meta.start_offset
                if first >= stop:
                    continue
            targets.append(stream_target(meta, self._opts, first, stop))
        return d.plan(state, targets)

    def _data_loss(self, what: str) -> None:
        if self._opts.fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"{what}; set failOnDataLoss=false to skip lost data and continue"
            )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Rows of one partition (Arrow record batches, or tuples with useArrow=false)."""
        return _read(self._opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, not in the store."""

    def stop(self) -> None:
        """Close the driver-side store."""
        if self._driver is not None:
            self._driver.close()
            self._driver = None


def _available(begin: StreamOffsets, latest: Mapping[int, int]) -> int:
    return sum(max(0, e - begin.streams.get(sid, 0)) for sid, e in latest.items())


class S3StreamDataSource(DataSource):
    """``format("s3stream")``: Kafka-like rows of s3stream streams, batch and streaming.

    ``load(url)`` takes the store URL (``s3://bucket/prefix``, a local directory, any
    supported URL); storage options come as ``storageOptions`` (JSON) or ``storage.<name>``
    options. See ``docs/spark.md`` for every option.
    """

    @classmethod
    def name(cls) -> str:
        """The format name: ``s3stream``."""
        return "s3stream"

    def schema(self) -> StructType:
        """Kafka's columns (``headers`` with ``includeHeaders``), stream_id, record_count."""
        return spark_schema(include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader."""
        opts = parse_options(self.options, streaming=False)
        _check_schema(schema, opts)
        return S3StreamBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The micro-batch stream reader."""
        opts = parse_options(self.options, streaming=True)
        _check_schema(schema, opts)
        return S3StreamStreamReader(opts)
