"""The Spark data source: planning and offsets in-process, then a real local SparkSession.

Spark tests (marked ``spark``) share one session-scoped `SparkSession` (``local[2]``, UI off,
UTC). Every check compares what Spark returns with what the library itself reads back
(`Stream.read_records`), for several streams, offset ranges, a trimmed stream and both batch
kinds, against a local directory and against SeaweedFS.
"""

from __future__ import annotations

import itertools
import json
import pickle
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import (
    ClientSettings,
    CorruptionError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    Record,
    RecordBatch,
)
from s3stream.records import CREATE_TIME, LOG_APPEND_TIME

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from s3stream.spark import S3StreamDataSource, spark_schema  # noqa: E402
from s3stream.spark.arrow import arrow_schema  # noqa: E402
from s3stream.spark.offsets import StreamOffsets, admit  # noqa: E402
from s3stream.spark.options import parse_options  # noqa: E402
from s3stream.spark.source import S3StreamBatchReader, S3StreamStreamReader  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL = ClientSettings(
    upload_threshold_bytes=48 * 1024,
    stream_split_bytes=16 * 1024,
    block_target_bytes=4 * 1024,
    max_pending_bytes=1 << 20,
    upload_interval_ms=0,
)
T0 = 1_700_000_000_000

Row = tuple[Any, ...]


# ---------------------------------------------------------------------------------------------
# Test data: streams of both batch kinds, written through the library, with a ledger of what
# Spark must report for timestampType and record_count.


@dataclass
class Dataset:
    url: str
    client: s3stream.StreamClient
    storage_options: dict[str, Any] = field(default_factory=dict)
    streams: dict[int, s3stream.Stream] = field(default_factory=dict)
    #: (stream_id, offset) -> (timestampType, record_count) of the row at that offset.
    ledger: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)

    def options(self) -> dict[str, str]:
        if not self.storage_options:
            return {}
        return {"storageOptions": json.dumps(self.storage_options)}

    def append_records(
        self, stream: s3stream.Stream, records: Sequence[Record], zstd: bool = False
    ) -> None:
        r = stream.append_records(records, compression="zstd" if zstd else "none")
        for i, rec in enumerate(records):
            kind = CREATE_TIME if rec.timestamp is not None else LOG_APPEND_TIME
            self.ledger[(stream.stream_id, r.base_offset + i)] = (kind, 1)

    def append_raw(self, stream: s3stream.Stream, payload: bytes, count: int) -> None:
        r = stream.append(RecordBatch(payload, count=count))
        self.ledger[(stream.stream_id, r.base_offset)] = (CREATE_TIME, count)

    def expected(
        self, stream_id: int, start: int | None = None, end: int | None = None
    ) -> list[Row]:
        """Rows as the library reads them back, in the column order of `rows`."""
        s = self.streams[stream_id]
        topic = s.tags.get("topic")
        part = int(s.tags["partition"]) if "partition" in s.tags else None
        out = []
        for off, rec in s.read_records(s.start_offset if start is None else start, end):
            kind, count = self.ledger[(stream_id, off)]
            out.append(
                (
                    rec.key,
                    rec.value,
                    topic,
                    part,
                    off,
                    rec.timestamp,
                    kind,
                    rec.headers,
                    stream_id,
                    count,
                )
            )
        return out


def _records(n: int, seed: int) -> list[Record]:
    out = []
    for i in range(n):
        j = seed * 1000 + i
        out.append(
            Record(
                value=None if j % 17 == 0 else b"value-%d-" % j + b"x" * (j % 50),
                key=None if j % 3 == 0 else b"key-%d" % (j % 7),
                timestamp=None if j % 4 == 0 else T0 + j,
                headers=(("h", b"%d" % j), ("n", None)) if j % 5 == 0 else (),
            )
        )
    return out


def write_dataset(url: str, storage_options: dict[str, Any] | None = None) -> Dataset:
    client = s3stream.open(url, wal="memory://", settings=SMALL, storage_options=storage_options)
    ds = Dataset(url, client, dict(storage_options or {}))
    orders0 = client.create_stream(tags={"topic": "orders", "partition": "0"})
    orders1 = client.create_stream(tags={"topic": "orders", "partition": "1"})
    payments = client.create_stream(tags={"topic": "payments", "partition": "0"})
    untagged = client.create_stream()
    for s in (orders0, orders1, payments, untagged):
        ds.streams[s.stream_id] = s
    for b in range(12):
        ds.append_records(orders0, _records(60, b), zstd=b % 2 == 1)
        if b % 3 == 0:
            ds.append_raw(orders1, b"opaque-%d" % b + b"y" * 300, count=7)
        ds.append_records(orders1, _records(25, 100 + b))
        ds.append_raw(payments, b"payment-%d" % b + b"z" * 500, count=3)
        ds.append_records(untagged, _records(10, 200 + b), zstd=True)
    client.flush()
    payments.trim(8)  # mid-batch: the raw batch at offset 6 is now partly trimmed
    orders1.trim(40)
    client.flush()
    return ds


def rows(df: Any) -> list[Row]:
    """Rows of a DataFrame of the source, with timestamps as epoch milliseconds."""
    from pyspark.sql import functions as F

    cols = ["key", "value", "topic", "partition", "offset"]
    has_headers = "headers" in df.columns
    df = df.select(
        *cols,
        F.unix_millis("timestamp").alias("ts"),
        "timestampType",
        *(["headers"] if has_headers else []),
        "stream_id",
        "record_count",
    )
    out = []
    for r in df.collect():
        headers = (
            tuple((h["key"], h["value"]) for h in r["headers"])
            if has_headers and r["headers"]
            else ()
        )
        out.append(
            (
                r["key"],
                r["value"],
                r["topic"],
                r["partition"],
                r["offset"],
                r["ts"],
                r["timestampType"],
                headers,
                r["stream_id"],
                r["record_count"],
            )
        )
    return sorted(out, key=lambda row: (row[8], row[4]))


def no_headers(expected: list[Row]) -> list[Row]:
    return [(*r[:7], (), *r[8:]) for r in expected]


# ---------------------------------------------------------------------------------------------
# In-process: schema, offsets, planning and the readers, without a SparkSession


def test_arrow_schema_is_what_spark_expects() -> None:
    for headers in (False, True):
        assert to_arrow_schema(spark_schema(headers), timezone="UTC").equals(arrow_schema(headers))


def test_admission_control_shares_by_backlog() -> None:
    begin = StreamOffsets(3, {0: 10, 1: 0})
    latest = {0: 110, 1: 300, 2: 100}  # stream 2 is new: starts at 0
    assert admit(begin, latest, None).streams == {0: 110, 1: 300, 2: 100}
    end = admit(begin, latest, 50)
    assert sum(end.streams[s] - begin.streams.get(s, 0) for s in end.streams) == 50
    assert end.streams == {0: 10 + 10, 1: 30, 2: 10}
    assert admit(begin, {0: 10, 1: 0}, 5).streams == begin.streams
    assert admit(begin, {0: 11}, 1).streams == {0: 11, 1: 0}
    with pytest.raises(InvalidArgumentError, match="start offset"):
        StreamOffsets.from_json({"seq": 1, "streams": {"x": 1}}, "start offset")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"startingOffsets": "{not json"}, "option startingOffsets: .*not valid JSON"),
        ({"startingOffsets": "earliset"}, "did you mean 'earliest'"),
        ({"startingOffsets": '{"0": "a"}'}, "option startingOffsets: offset of stream 0"),
        ({"endingOffsets": "earliest"}, "option endingOffsets"),
        ({"minPartitions": "0"}, "option minPartitions"),
        ({"failOnDataLoss": "maybe"}, "option failOnDataLoss"),
        ({"streamIds": "1", "subscribe": "x"}, "streamIds and subscribe conflict"),
        ({"subscribePattern": "("}, "option subscribePattern"),
        ({"assign": "[1]"}, "option assign"),
        ({"startingOffset": "earliest"}, "unknown option.*startingoffset"),
        ({"maxOffsetsPerTrigger": "10"}, "streaming queries only"),
        # Found by review: two spellings of one stream's offset (the last won without a
        # word), a storage option without a name (ignored, though unknown options are
        # refused), a stream id too large (an error that did not name the option).
        ({"startingOffsets": '{"0": 2, " 0": 3}'}, "names stream 0 twice"),
        ({"startingOffsets": '{"0": 1, "0": 2}'}, "key '0' appears twice"),
        ({"storage.": "1"}, "names no storage option"),
        ({"streamIds": "99999999999999999999999"}, "option streamIds: stream id is too large"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        parse_options({"path": "/tmp/x", **options}, streaming=False)


def test_storage_options_given_one_by_one_are_typed_as_the_clis() -> None:
    """Spark hands every option over as text: ``storage.read_timeout_s=2.5`` failed with
    "read_timeout_s must be a number, got '2.5'" (the same in ``storageOptions`` worked)."""
    opts = parse_options(
        {
            "path": "s3://b/p",
            "storage.read_timeout_s": "2.5",
            "storage.max_attempts": "3",
            "storage.endpoint_url": "http://127.0.0.1:1",
            "storage.region_name": "1",
            # Names of text options of other stores (review: project=123456789012 became
            # an int, which the GCS store refused).
            "storage.project": "123456789012",
            "storage.account_name": "123456",
            "storage.account_key": "1e5",
            "storage.password": "12",
            "storage.max_pool_connections": "64",
        },
        streaming=False,
    )
    assert opts.storage_options == {
        "read_timeout_s": 2.5,
        "max_attempts": 3,
        "endpoint_url": "http://127.0.0.1:1",
        "region_name": "1",
        "project": "123456789012",
        "account_name": "123456",
        "account_key": "1e5",
        "password": "12",
        "max_pool_connections": 64,
    }


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dataset]:
    ds = write_dataset(str(tmp_path_factory.mktemp("spark-local")))
    yield ds
    ds.client.close()


def _batch_reader(ds: Dataset, **options: str) -> S3StreamBatchReader:
    return S3StreamBatchReader(
        parse_options({"path": ds.url, **ds.options(), **options}, streaming=False)
    )


def _read_all(reader: Any, partitions: Sequence[Any]) -> list[Row]:
    out: list[Row] = []
    for p in partitions:
        for batch in reader.read(p):
            for r in batch.to_pylist():
                ts = r["timestamp"]
                ms = None if ts is None else (ts - _EPOCH) // _MS
                headers = tuple((h["key"], h["value"]) for h in r.get("headers") or ())
                out.append(
                    (
                        r["key"],
                        r["value"],
                        r["topic"],
                        r["partition"],
                        r["offset"],
                        ms,
                        r["timestampType"],
                        headers,
                        r["stream_id"],
                        r["record_count"],
                    )
                )
    return sorted(out, key=lambda row: (row[8], row[4]))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def test_planning_honours_min_partitions_exactly(local_ds: Dataset) -> None:
    expected = sorted(
        (r for sid in local_ds.streams for r in local_ds.expected(sid)), key=lambda r: (r[8], r[4])
    )
    for n in (1, 2, 7, 50, 400):
        reader = _batch_reader(local_ds, minPartitions=str(n), includeHeaders="true")
        parts = reader.partitions()
        assert len(parts) == n
        assert _read_all(reader, parts) == expected
        # Offsets are covered exactly once, in order, by the slices of all partitions.
        spans = sorted(
            (s.stream_id, s.start_offset, s.end_offset) for p in parts for s in p.plan.slices
        )
        for (sa, _, ea), (sb, sb_start, _) in itertools.pairwise(spans):
            assert sa != sb or ea == sb_start
    # Readers and partitions travel to executors: small, picklable, no credentials.
    reader = _batch_reader(local_ds, minPartitions="4")
    parts = reader.partitions()
    assert len(pickle.dumps(reader)) < 2048
    assert all(len(pickle.dumps(p)) < 16 * 1024 for p in parts)
    assert pickle.loads(pickle.dumps(parts[0])).plan == parts[0].plan
    # Without minPartitions the partition count follows maxPartitionBytes.
    few = _batch_reader(local_ds).partitions()
    many = _batch_reader(local_ds, maxPartitionBytes=str(8 * 1024)).partitions()
    assert len(few) == 1 and len(many) > 5
    # With enough blocks, every slice starts on a block boundary or at the stream's start.
    for p in many:
        for sl in p.plan.slices:
            assert sl.start_offset in (
                sl.blocks[0].start_offset,
                local_ds.streams[sl.stream_id].start_offset,
            )


def test_stream_reader_replays_exactly(local_ds: Dataset) -> None:
    opts = parse_options(
        {"path": local_ds.url, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "200"},
        streaming=True,
    )
    reader = S3StreamStreamReader(opts)
    try:
        start = reader.initialOffset()
        assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
        seen: list[Row] = []
        steps = 0
        while True:
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            if end == start:
                break
            first = _read_all(reader, reader.partitions(start, end))
            again = _read_all(reader, reader.partitions(start, end))  # a replay
            assert first == again
            seen += first
            start = end
            steps += 1
        expected = [r for sid in local_ds.streams for r in no_headers(local_ds.expected(sid))]
        assert sorted(seen, key=lambda r: (r[8], r[4])) == sorted(
            expected, key=lambda r: (r[8], r[4])
        )
        assert steps >= 5
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        clone = pickle.loads(pickle.dumps(reader))
        assert clone._driver is None
    finally:
        reader.stop()


def test_stream_reader_data_loss(tmp_path: Path) -> None:
    ds = write_dataset(str(tmp_path))
    try:
        opts = {"path": ds.url, "startingOffsets": "earliest", "streamIds": "0"}
        strict = S3StreamStreamReader(parse_options(opts, streaming=True))
        lenient = S3StreamStreamReader(
            parse_options({**opts, "failOnDataLoss": "false"}, streaming=True)
        )
        start = strict.initialOffset()
        end = strict.latestOffset(start, ReadAllAvailable())
        ds.streams[0].trim(100)
        with pytest.raises(OffsetOutOfRangeError, match="failOnDataLoss"):
            strict.partitions(start, end)
        got = _read_all(lenient, lenient.partitions(start, end))
        assert got == no_headers(ds.expected(0, 100))
        strict.stop()
        lenient.stop()
    finally:
        ds.client.close()


def test_available_now_pins_its_target(tmp_path: Path) -> None:
    client = s3stream.open(str(tmp_path), wal="memory://", settings=SMALL)
    ds = Dataset(str(tmp_path), client)
    try:
        s = client.create_stream(tags={"topic": "t"})
        ds.streams = {s.stream_id: s}
        ds.append_records(s, _records(100, 700))
        client.flush()
        opts = {"path": ds.url, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "30"}
        reader = S3StreamStreamReader(parse_options(opts, streaming=True))
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        ds.append_records(s, _records(100, 701))  # committed after the run began: not read
        client.flush()
        seen: list[Row] = []
        while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
            assert end["streams"][str(s.stream_id)] - start["streams"][str(s.stream_id)] <= 30
            seen += _read_all(reader, reader.partitions(start, end))
            start = end
        assert seen == no_headers(ds.expected(s.stream_id, 0, 100))
        reader.stop()
        # The next run (a new reader, as after a restart) picks up the rest.
        again = S3StreamStreamReader(parse_options(opts, streaming=True))
        again.prepareForTriggerAvailableNow()
        end = again.latestOffset(start, ReadAllAvailable())
        assert _read_all(again, again.partitions(start, end)) == no_headers(
            ds.expected(s.stream_id, 100)
        )
        again.stop()
    finally:
        client.close()


def _compact(
    client: s3stream.StreamClient, stream_id: int, keep_from: int, *, lose_from: int | None = None
) -> list[str]:
    """Replace every live object of the stream by one holding its batches from the batch
    containing `keep_from` on (as compaction does), delete the old objects' bytes (as after
    the retention delay); return the old keys. With `lose_from`, a broken compaction: the new
    object lacks the batches from `lose_from` on, though its metadata claims them."""
    from s3stream.format.objects import ObjectWriter, read_blocks, read_index
    from s3stream.metadata import CompactObjects, ObjectKind, ObjectMeta, StreamRange

    store = client.object_store
    state = client.metadata.state
    old = state.objects_for(stream_id, 0)
    assert all(len(o.ranges) == 1 for o in old)
    writer = ObjectWriter(block_target_bytes=16 * 1024)
    claimed = 0
    for obj in old:
        for b in read_blocks(store, obj.key, read_index(store, obj.key).find(stream_id, 0)):
            claimed = max(claimed, b.next_offset)
            if b.next_offset > keep_from and (lose_from is None or b.base_offset < lose_from):
                writer.add_fetched(b)
    ((_, start, end),) = writer.ranges()
    if lose_from is not None:
        end = claimed
    data = writer.finish()
    key = f"data/compacted/{uuid.uuid4().hex}.s3o"
    store.put(key, data)
    meta = ObjectMeta(
        key=key,
        kind=ObjectKind.STREAM,
        size=len(data),
        ranges=(StreamRange(stream_id, start, end),),
        committed_ms=0,
        node_id="test",
        level=1,
    )
    keys = tuple(o.key for o in old)
    client.metadata.commit(lambda _state: [CompactObjects(new_objects=(meta,), replaced_keys=keys)])
    store.delete_many(keys)
    return list(keys)


def test_tasks_follow_compaction_and_report_trimmed_data(tmp_path: Path) -> None:
    client = s3stream.open(str(tmp_path), wal="memory://", settings=SMALL)
    ds = Dataset(str(tmp_path), client)
    try:
        s = client.create_stream(tags={"topic": "solo"})
        ds.streams = {s.stream_id: s}
        for b in range(20):
            ds.append_records(s, _records(40, 600 + b), zstd=b % 2 == 0)
            if b % 4 == 0:
                ds.append_raw(s, b"blob", count=5)
                client.flush()  # several objects
        client.flush()
        expected = no_headers(ds.expected(s.stream_id))
        reader = _batch_reader(ds, minPartitions="3")
        parts = reader.partitions()
        assert len(client.metadata.state.objects_for(s.stream_id, 0)) > 1
        _compact(client, s.stream_id, 0)
        # Every planned object is gone; the tasks find the same records in the new one.
        assert _read_all(reader, parts) == expected

        strict = _batch_reader(ds, minPartitions="3")
        lenient = _batch_reader(ds, minPartitions="3", failOnDataLoss="false")
        parts = strict.partitions()
        s.trim(300)
        _compact(client, s.stream_id, 300)
        with pytest.raises(OffsetOutOfRangeError, match="failOnDataLoss"):
            _read_all(strict, parts)
        got = _read_all(lenient, parts)
        assert got == [r for r in expected if r[4] >= 300]
    finally:
        client.close()


def test_a_relocated_range_the_new_object_does_not_hold_is_an_error_not_fewer_rows(
    tmp_path: Path,
) -> None:
    """A task whose planned objects are gone reads the range from the live ones; if those
    hold less than their metadata says, the task fails with `CorruptionError` (as every
    read does) instead of returning fewer rows."""
    client = s3stream.open(str(tmp_path), wal="memory://", settings=SMALL)
    ds = Dataset(str(tmp_path), client)
    try:
        s = client.create_stream(tags={"topic": "solo"})
        ds.streams = {s.stream_id: s}
        for b in range(8):
            ds.append_records(s, _records(40, 600 + b))
            client.flush()
        reader = _batch_reader(ds, minPartitions="2")
        parts = reader.partitions()
        _compact(client, s.stream_id, 0, lose_from=200)
        with pytest.raises(CorruptionError, match="missing"):
            _read_all(reader, parts)
    finally:
        client.close()


@pytest.mark.parametrize("trim", [False, True])
def test_a_relocation_follows_a_compaction_during_its_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trim: bool
) -> None:
    """A task relocating a range read every page on the one snapshot it took: a compaction
    committed and purged between that snapshot and its GETs failed the task with
    `ObjectNotFoundError`, the data intact in the new object. It reads on fresh snapshots
    while objects are gone, as the readers do. With a trim before that compaction, the
    range begins at the new start (the caller then reports or skips the offsets lost), not
    an `OffsetOutOfRangeError` failing the task whatever `failOnDataLoss` says."""
    from s3stream.reader import open_reader_store
    from s3stream.spark.source import _Relocator

    client = s3stream.open(str(tmp_path), wal="memory://", settings=SMALL)
    try:
        s = client.create_stream()
        for b in range(6):
            s.append(RecordBatch(b"batch %d " % b * 500, count=10))
            client.flush()
        expected = [
            (b.base_offset, bytes(b.payload)) for b in s.fetch(0, max_bytes=1 << 30).batches
        ]
        assert len(expected) == 6
        store = open_reader_store(str(tmp_path))
        armed = [True]

        def compacting(real: Any) -> Any:
            def call(key: str, *args: Any) -> Any:
                if armed and key.startswith("data/"):
                    armed.clear()  # another process's compaction lands right now
                    if trim:
                        s.trim(20)
                    _compact(client, s.stream_id, 20 if trim else 0)
                return real(key, *args)

            return call

        monkeypatch.setattr(store, "get", compacting(store.get))
        monkeypatch.setattr(store, "get_suffix", compacting(store.get_suffix))
        relocate = _Relocator(store, parse_options({"path": str(tmp_path)}, streaming=False))
        try:
            batches, first = relocate(s.stream_id, 0, s.confirm_offset)
        finally:
            relocate.close()
        assert not armed, "the compaction did not run during the relocation"
        assert first == (20 if trim else 0)
        assert [(b.base_offset, bytes(b.payload)) for b in batches] == [
            e for e in expected if e[0] >= first
        ]
    finally:
        client.close()


def test_driver_and_tasks_read_a_read_only_mount_and_relocate_there(tmp_path: Path) -> None:
    """Planning (batch and streaming) and tasks, relocation included, all read: on a store
    bind-mounted read-only they give what the library reads back, while a writer compacts
    the store underneath."""
    from s3stream.testing import disk_faults

    root = tmp_path / "store"
    client = s3stream.open(str(root), wal="memory://", settings=SMALL)
    try:
        s = client.create_stream(tags={"topic": "solo"})
        written = Dataset(str(root), client, streams={s.stream_id: s})
        for b in range(8):
            written.append_records(s, _records(40, 800 + b), zstd=b % 2 == 0)
            if b % 2 == 1:
                client.flush()  # several objects
        with disk_faults.read_only_bind(root, tmp_path / "ro") as ro:
            ds = Dataset(str(ro), client, streams=written.streams, ledger=written.ledger)
            expected = no_headers(ds.expected(s.stream_id))
            batch = _batch_reader(ds, minPartitions="3")
            parts = batch.partitions()
            stream = S3StreamStreamReader(
                parse_options({"path": ds.url, "startingOffsets": "earliest"}, streaming=True)
            )
            try:
                start = stream.initialOffset()
                end = stream.latestOffset(start, ReadAllAvailable())
                micro = stream.partitions(start, end)
                # Every planned object is gone: the tasks open a reader on the mount to find
                # the same records in the new object.
                _compact(client, s.stream_id, 0)
                assert _read_all(batch, parts) == expected
                assert _read_all(stream, micro) == expected
                assert _read_all(stream, stream.partitions(start, end)) == expected
            finally:
                stream.stop()
    finally:
        client.close()


def test_a_missing_local_directory_is_refused_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    batch = S3StreamBatchReader(parse_options({"path": str(missing)}, streaming=False))
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        batch.partitions()
    stream = S3StreamStreamReader(parse_options({"path": str(missing)}, streaming=True))
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        stream.initialOffset()
    assert not missing.exists()


# ---------------------------------------------------------------------------------------------
# A real SparkSession


# The session is tests/conftest.py's ``spark`` fixture (shared with the GCS and Azure tests).


def _check_batch_reads(spark: Any, ds: Dataset) -> None:
    def read(**options: str) -> Any:
        r = spark.read.format("s3stream")
        for k, v in {**ds.options(), **options}.items():
            r = r.option(k, v)
        return r.load(ds.url)

    everything = sorted(
        (r for sid in ds.streams for r in ds.expected(sid)), key=lambda r: (r[8], r[4])
    )
    assert rows(read(includeHeaders="true", minPartitions="5")) == everything
    assert rows(read(useArrow="false", includeHeaders="true")) == everything
    assert rows(read()) == no_headers(everything)

    ids = sorted(ds.streams)
    o0, o1, pay = ids[0], ids[1], ids[2]
    ranges = {str(o0): 100, str(o1): 50, str(pay): 12}
    ends = {str(o0): 421, str(o1): 57, str(pay): 30}
    got = rows(
        read(
            streamIds=f"{o0},{o1},{pay}",
            startingOffsets=json.dumps(ranges),
            endingOffsets=json.dumps(ends),
            includeHeaders="true",
        )
    )
    assert got == ds.expected(o0, 100, 421) + ds.expected(o1, 50, 57) + ds.expected(pay, 12, 30)
    got = rows(
        read(
            subscribe="orders",
            startingOffsets='{"orders": {"0": 600}}',
            endingOffsets='{"orders": {"1": 80}}',
        )
    )
    assert got == no_headers(ds.expected(o0, 600) + ds.expected(o1, 40, 80))
    assert rows(read(assign='{"payments": [0]}')) == no_headers(ds.expected(pay))
    # A raw batch belongs to the range holding its base offset: offset 9..11 of `payments`
    # lie in the raw batch at 9, 12.. in the next one.
    assert [
        r[4] for r in rows(read(streamIds=str(pay), endingOffsets=json.dumps({str(pay): 13})))
    ] == [9, 12]


@pytest.mark.spark
def test_batch_read_local_directory(spark: Any, local_ds: Dataset) -> None:
    _check_batch_reads(spark, local_ds)


@pytest.mark.spark
def test_explicit_registration_and_starting_timestamp(spark: Any, tmp_path: Path) -> None:
    spark.dataSource.register(S3StreamDataSource)
    client = s3stream.open(str(tmp_path), wal="memory://", settings=SMALL)
    ds = Dataset(str(tmp_path), client)
    try:
        s = client.create_stream(tags={"topic": "timed"})
        raw = client.create_stream(tags={"topic": "timed-raw"})
        ds.streams = {s.stream_id: s, raw.stream_id: raw}
        for b in range(10):
            ds.append_records(
                s, [Record(b"%d" % i, timestamp=T0 + 1000 * b + i) for i in range(50)]
            )
            r = raw.append(RecordBatch(b"blob", count=2, base_timestamp=T0 + 1000 * b))
            ds.ledger[(raw.stream_id, r.base_offset)] = (CREATE_TIME, 2)
        client.flush()
        df = spark.read.format("s3stream").option("startingTimestamp", str(T0 + 5030)).load(ds.url)
        assert df.schema == spark_schema(False)
        assert rows(df) == no_headers(
            ds.expected(s.stream_id, 280) + ds.expected(raw.stream_id, 12)
        )
        late = spark.read.format("s3stream").option("startingTimestamp", str(T0 + 10**6))
        assert rows(late.load(ds.url)) == []
    finally:
        client.close()


@pytest.mark.spark
def test_bad_options_fail_the_query(spark: Any, local_ds: Dataset) -> None:
    def load(**options: str) -> Any:
        r = spark.read.format("s3stream")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load(local_ds.url).collect()

    pay = sorted(local_ds.streams)[2]
    with pytest.raises(Exception, match="option streamIds: no stream 99"):
        load(streamIds="99")
    with pytest.raises(Exception, match=r"option startingOffsets: .*not valid JSON"):
        load(startingOffsets='{"0": ')
    with pytest.raises(Exception, match=r"option startingOffsets: offset 2 of stream .*trimmed"):
        load(streamIds=str(pay), startingOffsets=json.dumps({str(pay): 2}))
    lenient = (
        spark.read.format("s3stream")
        .option("streamIds", str(pay))
        .option("startingOffsets", json.dumps({str(pay): 2}))
        .option("failOnDataLoss", "false")
        .load(local_ds.url)
    )
    assert rows(lenient) == no_headers(local_ds.expected(pay))


@pytest.mark.spark
@pytest.mark.s3
def test_batch_read_seaweedfs(spark: Any, seaweedfs: Any) -> None:
    url = f"s3://{seaweedfs.bucket}/spark-{uuid.uuid4().hex[:8]}"
    ds = write_dataset(url, seaweedfs.storage_options())
    try:
        _check_batch_reads(spark, ds)
    finally:
        ds.client.close()


@pytest.mark.spark
def test_streaming_available_now_reads_each_record_once(spark: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    client = s3stream.open(str(store), wal="memory://", settings=SMALL)
    ds = Dataset(str(store), client)
    s = client.create_stream(tags={"topic": "events", "partition": "0"})
    raw = client.create_stream(tags={"topic": "blobs", "partition": "0"})
    ds.streams = {s.stream_id: s, raw.stream_id: raw}
    batches: list[tuple[int, list[Row]]] = []

    def run() -> list[Row]:
        before = len(batches)
        q = (
            spark.readStream.format("s3stream")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "150")
            .load(ds.url)
            .writeStream.foreachBatch(lambda df, bid: batches.append((bid, rows(df))))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None
        got = [r for _, batch in batches[before:] for r in batch]
        return sorted(got, key=lambda r: (r[8], r[4]))

    try:
        for b in range(4):
            ds.append_records(s, _records(100, 300 + b))
            ds.append_raw(raw, b"blob-%d" % b, count=40)
        client.flush()
        first = run()
        assert first == no_headers(ds.expected(s.stream_id) + ds.expected(raw.stream_id))
        assert len(batches) >= 4  # 560 offsets at most 150 per micro-batch

        for b in range(2):
            ds.append_records(s, _records(50, 400 + b))
        client.flush()
        ds.append_records(s, _records(30, 500))  # acknowledged, not uploaded: invisible
        second = run()
        assert second == no_headers(ds.expected(s.stream_id, 400, 500))

        client.flush()
        third = run()
        assert third == no_headers(ds.expected(s.stream_id, 500))
        assert run() == []
        ids = [bid for bid, _ in batches]
        assert ids == sorted(set(ids))
    finally:
        client.close()


@pytest.mark.spark
def test_spark_reads_a_store_on_a_read_only_mount(
    spark: Any, local_ds: Dataset, tmp_path: Path
) -> None:
    """The data source only reads: a store bind-mounted read-only reads the same rows."""
    from s3stream.testing import disk_faults

    with disk_faults.read_only_bind(Path(local_ds.url), tmp_path / "ro") as ro:
        got = rows(spark.read.format("s3stream").load(str(ro)))
        assert got == rows(spark.read.format("s3stream").load(local_ds.url))
        assert got


def test_assign_refuses_a_topic_partition_two_streams_carry(tmp_path: Path) -> None:
    """Tags are not unique: two live streams labelled orders/0 (the partition tags "0" and
    "00" both read as 0) made ``assign`` read one of them and drop the other's rows without a
    word; it now names both and points at streamIds (``subscribe`` reads both)."""
    root = str(tmp_path / "store")
    with s3stream.open(root, wal="memory://") as c:
        a = c.create_stream(tags={"topic": "orders", "partition": "0"})
        b = c.create_stream(tags={"topic": "orders", "partition": "00"})
        a.append(RecordBatch(b"a"))
        b.append(RecordBatch(b"b"))
    ds = S3StreamDataSource({"path": root, "assign": '{"orders": [0]}'})
    with pytest.raises(InvalidArgumentError, match="orders-0 names more than one stream"):
        ds.reader(ds.schema()).partitions()
    ds = S3StreamDataSource({"path": root, "subscribe": "orders"})
    assert len(ds.reader(ds.schema()).partitions()) >= 1


def test_planning_goes_on_when_compaction_purges_an_object_it_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner read object indexes from a snapshot loaded just before; compaction that
    purged one of those objects meanwhile (a snapshot older than the deletion delay) failed
    the query with ObjectNotFoundError. It plans again on a fresh snapshot now, as the
    library's readers do."""
    import dataclasses

    import s3stream.spark.source as source_module
    from s3stream.settings import CompactionSettings

    settings = dataclasses.replace(
        ClientSettings(upload_threshold_bytes=4096, upload_interval_ms=0),
        compaction=CompactionSettings(deletion_delay_ms=0, stream_set_max_age_ms=0),
    )
    client = s3stream.open(str(tmp_path / "s"), wal="memory://", settings=settings)
    stream = client.create_stream(tags={"topic": "t"})
    for i in range(5):
        stream.append_records([Record(b"v%d-%d" % (i, j)) for j in range(50)])
        client.flush()
    loaded = source_module._Driver.__init__
    purged: list[int] = []

    def compact_right_after_the_snapshot(self: Any, opts: Any) -> None:
        loaded(self, opts)
        if not purged:
            purged.append(client.compact().objects_purged)

    monkeypatch.setattr(source_module._Driver, "__init__", compact_right_after_the_snapshot)
    reader = S3StreamBatchReader(parse_options({"path": str(tmp_path / "s")}, streaming=False))
    rows = _read_all(reader, reader.partitions())
    assert purged and purged[0] > 0
    assert [r[4] for r in rows] == list(range(250))
    assert rows[0][1] == b"v0-0" and rows[-1][1] == b"v4-49"
    client.close()
