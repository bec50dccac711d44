"""`StreamReader.read_arrow`: the Spark source's rows as Arrow, equal to `read_records`."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow", reason="read_arrow needs pyarrow (extra 'arrow')")

import s3stream  # noqa: E402
from s3stream import (  # noqa: E402
    InvalidArgumentError,
    Record,
    RecordBatch,
    StreamClosedError,
    StreamNotFoundError,
)
from s3stream.arrow import arrow_schema  # noqa: E402
from s3stream.objectstore import LocalObjectStore, MetricsObjectStore  # noqa: E402
from s3stream.objectstore.forwarding import ForwardingObjectStore  # noqa: E402

#: Offsets of the RAW batch of stream 0 (count 3), between its records.
RAW_AT = 5
OWN_TS = 1_700_000_000_000


def _records(n: int, first: int = 0) -> list[Record]:
    out = []
    for i in range(first, first + n):
        out.append(
            Record(
                None if i % 11 == 10 else b"value-%d" % i,
                key=None if i % 5 == 4 else b"key-%d" % (i % 3),
                timestamp=OWN_TS + i if i % 2 else None,
                headers=[("h", b"%d" % i), ("empty", None)] if i % 3 == 0 else (),
            )
        )
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five streams in several objects: records (plain and zstd) and RAW batches, tagged and
    untagged, one trimmed."""
    path = tmp_path_factory.mktemp("arrow-store")
    with s3stream.open(str(path), wal="memory://") as client:
        s0 = client.create_stream(tags={"topic": "orders", "partition": "0"})
        s0.append_records(_records(5))
        s0.append(RecordBatch(b"raw-payload", count=3))  # offsets 5..7, one row at 5
        s0.append_records(_records(10, 8), compression="zstd")
        client.flush()
        s1 = client.create_stream(tags={"topic": "orders", "partition": "1"})
        for first in range(0, 2000, 250):  # eight objects of 250 records
            s1.append_records(_records(250, first))
            client.flush()
        s2 = client.create_stream()
        for i in range(4):
            s2.append(RecordBatch(b"r%d" % i, count=2, base_timestamp=OWN_TS))
        s3 = client.create_stream(tags={"topic": "audit", "partition": "not a number"})
        s3.append_records(_records(30))
        client.flush()
        s3.trim(12)
        s4 = client.create_stream(tags={"topic": "audit", "partition": "7"})
        s4.append_records([Record(b"x", headers=[("k", b"v")])])
    return path


@pytest.fixture
def reader(store: Path) -> Any:
    with s3stream.open_reader(str(store)) as r:
        yield r


def _rows(table: Any) -> list[dict[str, Any]]:
    """Rows with timestamps as ms since the epoch (exact, unlike datetimes)."""
    micros = table.column("timestamp").cast(pa.int64())
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", micros)
    rows = table.to_pylist()
    for row in rows:
        row["timestamp"] = None if row["timestamp"] is None else row["timestamp"] // 1000
    return rows


def _expected(
    reader: Any, stream_id: int, start: int, end: int | None, *, headers: bool
) -> list[dict[str, Any]]:
    """The rows `read_records` implies, labelled as the Spark source labels them."""
    info = reader.stream_info(stream_id)
    raw = {}  # base offset -> count, of the RAW batches
    pos = info.start_offset
    while pos < info.end_offset:
        page = reader.read(stream_id, pos)
        for b in page.batches:
            if b.kind is s3stream.BatchKind.RAW:
                raw[b.base_offset] = b.count
        pos = page.next_offset
    try:
        partition: int | None = int(info.tags.get("partition", ""))
    except ValueError:
        partition = None
    rows = []
    for offset, rec in reader.read_records(stream_id, start, end):
        row: dict[str, Any] = {
            "key": rec.key,
            "value": rec.value,
            "topic": info.tags.get("topic"),
            "partition": partition,
            "offset": offset,
            "timestamp": rec.timestamp,
            # A record's own timestamp is CreateTime (0), a batch's append time LogAppendTime (1);
            # a RAW batch reports its time as CreateTime. Own ones are OWN_TS + offset here.
            "timestampType": 0 if offset in raw or rec.timestamp == OWN_TS + offset else 1,
        }
        if headers:
            row["headers"] = [{"key": k, "value": v} for k, v in rec.headers] or None
        row["stream_id"] = stream_id
        row["record_count"] = raw.get(offset, 1)
        rows.append(row)
    return rows


@pytest.mark.parametrize("headers", [False, True])
def test_rows_are_read_records_with_the_spark_sources_columns(reader: Any, headers: bool) -> None:
    result = reader.read_arrow(include_headers=headers)
    assert result.schema.equals(arrow_schema(headers))
    rows = _rows(result.read_all())
    expected = []
    for info in reader.list_streams():
        expected += _expected(reader, info.stream_id, info.start_offset, None, headers=headers)
    assert rows == expected
    assert {r["stream_id"] for r in rows} == {0, 1, 2, 3, 4}
    # The fixture's corner cases are there: RAW rows, tombstones, null keys, trimmed head.
    raw = next(r for r in rows if r["stream_id"] == 0 and r["offset"] == RAW_AT)
    assert (raw["key"], raw["value"], raw["record_count"]) == (None, b"raw-payload", 3)
    assert any(r["value"] is None for r in rows) and any(r["key"] is None for r in rows)
    assert min(r["offset"] for r in rows if r["stream_id"] == 3) == 12
    assert {r["partition"] for r in rows if r["stream_id"] == 3} == {None}


def test_offset_ranges(reader: Any) -> None:
    def offsets(**kwargs: Any) -> list[tuple[int, int]]:
        table = reader.read_arrow(**kwargs).read_all()
        return list(zip(table["stream_id"].to_pylist(), table["offset"].to_pylist(), strict=True))

    # A RAW batch belongs to the range holding its base offset, as in read_records.
    assert offsets(stream_ids=0, start=4, end=9) == [(0, 4), (0, 5), (0, 8)]
    assert offsets(stream_ids=0, start=6, end=9) == [(0, 8)]
    assert offsets(stream_ids=[2], start=3) == [(2, 4), (2, 6)]
    # Per-stream offsets; streams left out read from their start to their end.
    got = offsets(stream_ids=[0, 1], start={1: 1995}, end={0: 2})
    assert got == [(0, 0), (0, 1)] + [(1, o) for o in range(1995, 2000)]
    # Clipped to what each stream holds: trimmed and future offsets are no error.
    assert offsets(stream_ids=3, start=0, end=14) == [(3, 12), (3, 13)]
    assert offsets(stream_ids=3, start=500) == []
    assert offsets(stream_ids=[], start=0) == []
    # Each range equals read_records over it.
    for sid, start, end in ((1, 240, 760), (0, 0, 18), (3, 12, 30), (1, 1999, 5000)):
        table = reader.read_arrow(stream_ids=sid, start=start, end=end).read_all()
        assert _rows(table) == _expected(reader, sid, start, end, headers=False)
    # Streams by tags (with or without ids).
    assert {s for s, _ in offsets(tags={"topic": "audit"})} == {3, 4}
    assert {s for s, _ in offsets(stream_ids=[0, 3], tags={"topic": "audit"})} == {3}


def test_timestamp_ranges(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), wal="memory://") as client:
        for _ in range(2):
            s = client.create_stream()
            for first in (0, 50):  # two objects; timestamps OWN_TS + 10 * offset
                s.append_records(
                    [Record(b"%d" % i, timestamp=OWN_TS + 10 * i) for i in range(first, first + 50)]
                )
                client.flush()
    with s3stream.open_reader(str(tmp_path)) as reader:

        def offsets(**kwargs: Any) -> list[int]:
            table = reader.read_arrow(stream_ids=0, **kwargs).read_all()
            return list(table["offset"].to_pylist())

        assert offsets(start_timestamp=OWN_TS + 105, end_timestamp=OWN_TS + 300) == list(
            range(11, 30)
        )
        assert offsets(start_timestamp=OWN_TS + 105, start=20, end=25) == list(range(20, 25))
        assert offsets(start_timestamp=OWN_TS + 10_000) == []  # nothing that late
        assert offsets(end_timestamp=OWN_TS) == []  # nothing before
        assert offsets(end_timestamp=OWN_TS + 10_000) == list(range(100))
        both = reader.read_arrow(start_timestamp=OWN_TS + 985).read_all()
        assert both["stream_id"].to_pylist() == [0, 1] and both["offset"].to_pylist() == [99, 99]
        for bad in ("x", 1.5, True):
            with pytest.raises(InvalidArgumentError):
                reader.read_arrow(start_timestamp=bad)


def test_timestamps_outside_datetime_range_are_null_in_arrow_and_tuple_rows(
    tmp_path: Path,
) -> None:
    """Spark's two row paths (``useArrow`` on: `arrow_batches`; off: `tuple_rows`) give the
    same timestamps: inside Python's `datetime` range (years 1 to 9999) the value, outside it
    null in both (the tuple rows cannot hold it, nor can pyarrow's ``to_pylist``)."""
    from s3stream.arrow import (
        MAX_TIMESTAMP_MS,
        MIN_TIMESTAMP_MS,
        RangeSlice,
        arrow_batches,
        tuple_rows,
    )

    stamps = [
        1 << 50,
        MAX_TIMESTAMP_MS + 1,
        MAX_TIMESTAMP_MS,
        MIN_TIMESTAMP_MS,
        MIN_TIMESTAMP_MS - 1,
        -(1 << 50),
        1_700_000_000_000,
        0,
    ]
    with s3stream.open(str(tmp_path), wal="memory://") as client:
        s = client.create_stream()
        s.append_records([Record(b"v", timestamp=t) for t in stamps])
        client.flush()
    with s3stream.open_reader(str(tmp_path)) as reader:
        fetched = reader.read(0, 0)
    piece = [(RangeSlice(0, None, None, "t", 0, len(stamps)), fetched.batches)]
    (batch,) = arrow_batches(piece, include_headers=False)
    as_arrow = batch.column("timestamp").to_pylist()  # datetimes: must not overflow
    as_tuples = [row[5] for row in tuple_rows(piece, include_headers=False)]
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    expected = [
        epoch + timedelta(milliseconds=t) if MIN_TIMESTAMP_MS <= t <= MAX_TIMESTAMP_MS else None
        for t in stamps
    ]
    assert as_tuples == expected
    assert as_arrow == expected
    assert [e is None for e in expected] == [True, True, False, False, True, True, False, False]


def test_record_batches_hold_one_stream_and_about_batch_rows(reader: Any) -> None:
    # A record batch closes at the first appended batch that reaches batch_rows, and at a
    # change of stream: stream 0 has 3 appended batches, stream 1 four of 250 below 1000.
    for batch_rows, sizes in (
        (1, [5, 1, 10, 250, 250, 250, 250]),
        (260, [16, 500, 500]),
        (65536, [16, 1000]),
    ):
        batches = list(reader.read_arrow(stream_ids=[0, 1], end=1000, batch_rows=batch_rows))
        assert [b.num_rows for b in batches] == sizes
        for b in batches:
            assert len(set(b.column("stream_id").to_pylist())) == 1


def test_argument_errors(reader: Any) -> None:
    with pytest.raises(StreamNotFoundError):
        reader.read_arrow(stream_ids=[0, 99])
    with pytest.raises(InvalidArgumentError, match="not read"):
        reader.read_arrow(stream_ids=0, start={1: 5})
    for kwargs in (
        {"stream_ids": "0"},
        {"stream_ids": [0, -1]},
        {"start": -1},
        {"end": 1.5},
        {"start": {0: "x"}},
        {"batch_rows": 0},
        {"include_headers": 1},
        {"tags": {"topic": 1}},
    ):
        with pytest.raises(InvalidArgumentError):
            reader.read_arrow(**kwargs)


def test_reads_only_the_objects_holding_the_range(store: Path) -> None:
    def get_bytes(**kwargs: Any) -> int:
        with s3stream.open_reader(str(store)) as r:
            before = r.object_store.metrics.get_bytes  # the metadata log's reads
            assert r.read_arrow(**kwargs).read_all().num_rows > 0
            return int(r.object_store.metrics.get_bytes - before)

    everything = get_bytes(stream_ids=1)
    last = get_bytes(stream_ids=1, start=1750)  # the last of its eight objects
    assert last * 4 < everything


def test_a_snapshot_at_the_call_and_a_closed_reader(store: Path, tmp_path: Path) -> None:
    path = tmp_path / "s"
    with s3stream.open(str(path), wal="memory://") as client:
        client.create_stream().append_records(_records(10))
    with s3stream.open_reader(str(path)) as r:
        pending = r.read_arrow()
        with s3stream.open(str(path), wal="memory://") as client:
            client.open_stream(0).append_records(_records(5))
        assert pending.read_all().num_rows == 10  # the end as of the call
        assert r.read_arrow().read_all().num_rows == 15
        later = r.read_arrow()
    with pytest.raises(StreamClosedError):
        later.read_all()


def test_a_missing_pyarrow_names_the_extra(reader: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "s3stream.arrow")
    with pytest.raises(ImportError, match=r"pip install 's3stream\[arrow\]'"):
        reader.read_arrow()


def test_one_decoder_importable_without_pyspark() -> None:
    code = (
        "import sys, s3stream.arrow\n"
        "assert 'pyspark' not in sys.modules\n"
        "try:\n"
        "    import pyspark\n"
        "except ImportError:\n"
        "    raise SystemExit(0)\n"
        "import s3stream.spark.arrow as spark_arrow\n"
        "assert spark_arrow.arrow_batches is s3stream.arrow.arrow_batches\n"
        "assert spark_arrow.tuple_rows is s3stream.arrow.tuple_rows\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_duckdb(reader: Any) -> None:
    duckdb = pytest.importorskip(
        "duckdb", reason="the DuckDB example needs duckdb (extra 'duckdb')"
    )
    con = duckdb.connect()
    con.register("orders", reader.read_arrow(tags={"topic": "orders"}, include_headers=True))
    rows = con.sql(
        'SELECT stream_id, partition, count(*), min("offset"), max("offset"), '
        "count(headers), count(*) FILTER (WHERE key IS NULL) "
        "FROM orders GROUP BY ALL ORDER BY stream_id"
    ).fetchall()
    expected = []
    for sid in (0, 1):
        records = list(reader.read_records(sid, 0))
        expected.append(
            (
                sid,
                sid,
                len(records),
                records[0][0],
                records[-1][0],
                sum(1 for _, r in records if r.headers),
                sum(1 for _, r in records if r.key is None),
            )
        )
    assert rows == expected


def test_polars(reader: Any) -> None:
    pl = pytest.importorskip("polars", reason="the Polars example needs polars (extra 'polars')")
    frame = pl.from_arrow(reader.read_arrow(stream_ids=1, start=100, end=200))
    assert frame.height == 100
    assert frame["offset"].to_list() == list(range(100, 200))
    assert frame["value"].to_list() == [r.value for _, r in reader.read_records(1, 100, 200)]
    summary = (
        pl.from_arrow(reader.read_arrow())
        .lazy()
        .filter(pl.col("topic") == "orders")
        .group_by("stream_id")
        .agg(pl.len().alias("rows"), pl.col("record_count").sum().alias("records"))
        .sort("stream_id")
        .collect()
    )
    assert summary.to_dicts() == [
        {"stream_id": 0, "rows": 16, "records": 18},
        {"stream_id": 1, "rows": 2000, "records": 2000},
    ]


# --- s3stream.polars_scan: a lazy scan that reads only what the filter keeps ---------------


def _at(ms: int) -> Any:
    """A time-zone-aware datetime at `ms` since the epoch (what Polars compares exactly)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


class _KeyLog(ForwardingObjectStore):
    """Records the key of every GET."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.keys: list[str] = []

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.keys.append(key)
        return super().get(key, start, end)

    def get_suffix(self, key: str, length: int) -> bytes:
        self.keys.append(key)
        return super().get_suffix(key, length)


def _polars_predicates(pl: Any) -> dict[str, Any]:
    ts, offset, sid = pl.col("timestamp"), pl.col("offset"), pl.col("stream_id")
    ms = pl.Datetime("ms", "UTC")
    return {
        "stream ==": sid == 1,
        "stream == (literal first)": pl.lit(3) == sid,
        "stream is_in": sid.is_in([0, 3, 99]),
        "no such stream": sid == 99,
        "topic ==": pl.col("topic") == "audit",
        "topic is_in": pl.col("topic").is_in(["audit", "nothing"]),
        "offset ==": offset == RAW_AT,
        "offset <": offset < 6,
        "offset <=": offset <= 6,
        "offset >": offset > 1990,
        "offset >=": offset >= 1990,
        "offset (literal first)": pl.lit(3) > offset,
        "offset is_between": offset.is_between(240, 760, closed="right"),
        "stream and offsets": (sid == 1) & (offset >= 1750) & (offset < 1800),
        "either": (sid == 0) | ((sid == 1) & (offset >= 1995)),
        "contradiction": (sid == 1) & (sid == 2),
        "negative offsets": offset > -5,
        # Even offsets of the fixture have their append time (now), odd ones OWN_TS + offset:
        # timestamps go back and forth along the offsets.
        "timestamp >=": ts >= _at(OWN_TS + 1001),
        "timestamp >": ts > _at(OWN_TS + 1001),
        "timestamp <": ts < _at(OWN_TS + 1001),
        "timestamp <=": ts <= _at(OWN_TS + 1001),
        "timestamp ==": ts == _at(OWN_TS + 7),
        "timestamp in ms": ts.is_between(
            pl.lit(OWN_TS + 100).cast(ms), pl.lit(OWN_TS + 200).cast(ms), closed="left"
        ),
        "timestamp between microseconds": ts > _at(OWN_TS + 1) + timedelta(microseconds=500),
        "timestamp and stream": (ts < _at(OWN_TS + 300)) & (sid == 1),
        # At int64's edge: an end of offset + 1 must not pass the largest end there is.
        "offset == int64 max": offset == (1 << 63) - 1,
        "offset <= int64 max": offset <= (1 << 63) - 1,
        "offset > int64 max": offset > (1 << 63) - 1,
        "unsupported column": pl.col("key") == b"key-1",
        "unsupported !=": offset != 3,
        "unsupported ~": ~(sid == 1),
        "unsupported integer against timestamp": ts.cast(pl.Int64) < (OWN_TS + 5) * 1000,
        "partly supported": (sid == 1) & (pl.col("value").bin.ends_with(b"7")),
    }


@pytest.mark.parametrize("engine", ["in-memory", "streaming"])
def test_polars_scan_gives_the_rows_of_read_arrow(reader: Any, engine: str) -> None:
    pl = pytest.importorskip("polars", reason="the Polars scan needs polars (extra 'polars')")
    from s3stream.polars_scan import scan

    full = pl.from_arrow(reader.read_arrow().read_all())
    frame = scan(reader)
    assert frame.collect_schema() == full.schema
    for name, predicate in _polars_predicates(pl).items():
        got = frame.filter(predicate).collect(engine=engine)
        assert got.equals(full.filter(predicate)), name
    # Rows Polars asks for (n_rows), columns it keeps (with_columns), small batches.
    assert frame.head(7).collect(engine=engine).equals(full.head(7))
    assert frame.head(0).collect(engine=engine).equals(full.head(0))
    query = frame.filter(pl.col("key") == b"key-2").select("offset", "stream_id")
    assert query.collect(engine=engine).equals(
        full.filter(pl.col("key") == b"key-2").select("offset", "stream_id")
    )
    tail = frame.filter(pl.col("offset") >= 1990).select("stream_id", "offset").head(3)
    assert tail.collect(engine=engine).to_dicts() == [
        {"stream_id": 1, "offset": o} for o in (1990, 1991, 1992)
    ]
    small = scan(reader, batch_rows=7).filter(pl.col("stream_id") <= 1).collect(engine=engine)
    assert small.equals(full.filter(pl.col("stream_id") <= 1))


def test_polars_scan_pruning_reads_the_predicate() -> None:
    pl = pytest.importorskip("polars", reason="the Polars scan needs polars (extra 'polars')")
    from s3stream import polars_scan
    from s3stream.polars_scan import Pruning, pruning

    sid, offset, ts = pl.col("stream_id"), pl.col("offset"), pl.col("timestamp")
    assert pruning(None) == Pruning() and not Pruning().empty
    assert pruning((sid == 1) & (offset >= 2500)) == Pruning(
        stream_ids=frozenset({1}), min_offset=2500
    )
    assert pruning(sid.is_in([4, 2]) & (offset < 10)) == Pruning(
        stream_ids=frozenset({2, 4}), max_offset=9
    )
    assert pruning(offset.is_between(3, 8, closed="none")) == Pruning(min_offset=4, max_offset=7)
    assert pruning((sid == 1) | (sid == 2) & (offset > 5)) == Pruning(stream_ids=frozenset({1, 2}))
    assert pruning(pl.col("topic") == "orders") == Pruning(topics=frozenset({"orders"}))
    # Timestamps: rows hold whole milliseconds, so microsecond bounds round inwards.
    at = _at(OWN_TS) + timedelta(microseconds=1)
    assert pruning(ts > at) == Pruning(min_timestamp=OWN_TS + 1)
    assert pruning(ts < at) == Pruning(max_timestamp=OWN_TS)
    assert pruning(ts == at).empty
    assert pruning(ts.is_between(_at(5), _at(9))) == Pruning(min_timestamp=5, max_timestamp=9)
    assert pruning((sid == 1) & (sid == 2)).empty
    # What it does not understand prunes nothing (the scan filters the rows it read).
    for predicate in (
        pl.col("key") == b"k",
        sid != 1,
        ~(sid == 1),
        sid > 3,
        offset > 1.5,
        ts < 5,  # Polars compares an integer with the column's microseconds: not pruned
        ts < pl.lit(_at(5).replace(tzinfo=None)),  # naive: Polars refuses it
        pl.col("topic").is_in(["a", None], nulls_equal=True),
        offset.cast(pl.Float64) > 3,
        offset.map_batches(lambda o: o > 3, return_dtype=pl.Boolean),  # may not serialize
    ):
        assert pruning(predicate) == Pruning(), predicate
    assert pruning((sid == 2) & (pl.col("key") == b"k")) == Pruning(stream_ids=frozenset({2}))
    # Defensive about the serialized form: surprises prune nothing.
    weird = {"BinaryExpr": {"left": {"Column": "offset"}, "op": "Eq", "right": {"New": 1}}}
    assert polars_scan._prune(weird) == Pruning()
    assert polars_scan._prune({"BinaryExpr": {"op": "And"}}) == Pruning()
    assert polars_scan._prune([1, 2]) == Pruning()


def test_polars_scan_reads_only_the_objects_a_filter_keeps(store: Path) -> None:
    pl = pytest.importorskip("polars", reason="the Polars scan needs polars (extra 'polars')")
    from s3stream.polars_scan import scan

    def reads(predicate: Any) -> tuple[int, int, int]:
        """(rows, GETs of data objects, data objects read) of a fresh reader's scan."""
        log = _KeyLog(LocalObjectStore(store, fsync=False))
        with s3stream.StreamReader(MetricsObjectStore(log)) as r:
            data = set(r.snapshot().objects)
            log.keys.clear()
            frame = scan(r) if predicate is None else scan(r).filter(predicate)
            rows = frame.collect().height
        gets = [k for k in log.keys if k in data]
        return rows, len(gets), len(set(gets))

    everything = reads(None)
    one_stream = reads(pl.col("stream_id") == 1)
    tail = reads((pl.col("stream_id") == 1) & (pl.col("offset") >= 1750))
    unsupported = reads(pl.col("key") == b"key-1")
    assert everything[0] == 2000 + 16 + 4 + 18 + 1 and one_stream[0] == 2000 and tail[0] == 250
    assert one_stream[2] == 8 < everything[2]  # stream 1's eight objects, of all of them
    assert tail[2] == 1  # stream 1's last object only
    assert tail[1] < one_stream[1] < everything[1]
    assert unsupported[1:] == everything[1:]  # read everything, filtered after


def test_polars_scan_prunes_by_time_even_when_time_goes_back(tmp_path: Path) -> None:
    pl = pytest.importorskip("polars", reason="the Polars scan needs polars (extra 'polars')")
    from s3stream.polars_scan import scan

    # Two streams in four objects of 100 records each: stream 0's timestamps grow with its
    # offsets (OWN_TS + offset); stream 1's records in the last object are its earliest.
    with s3stream.open(str(tmp_path), wal="memory://") as client:
        streams = [client.create_stream(), client.create_stream()]
        for first in range(0, 400, 100):
            for s in streams:
                late = s.stream_id == 1 and first == 300
                s.append_records(
                    [
                        Record(b"%d" % i, timestamp=OWN_TS + (i - 1000 if late else i))
                        for i in range(first, first + 100)
                    ]
                )
            client.flush()

    def reads(predicate: Any) -> tuple[Any, int]:
        log = _KeyLog(LocalObjectStore(tmp_path, fsync=False))
        with s3stream.StreamReader(MetricsObjectStore(log)) as r:
            data = set(r.snapshot().objects)
            log.keys.clear()
            got = scan(r).filter(predicate).select("stream_id", "offset").collect()
            objects = len({k for k in log.keys if k in data})
            full = pl.from_arrow(r.read_arrow().read_all()).filter(predicate)
        assert got.equals(full.select("stream_id", "offset")), predicate
        return got, objects

    ts, sid = pl.col("timestamp"), pl.col("stream_id")
    early, objects = reads((ts < _at(OWN_TS + 50)) & (sid == 0))
    assert early["offset"].to_list() == list(range(50)) and objects == 1
    late, objects = reads((ts >= _at(OWN_TS + 350)) & (sid == 0))
    assert late["offset"].to_list() == list(range(350, 400)) and objects == 1
    # Stream 1's first and last objects both hold timestamps below OWN_TS + 50.
    back, objects = reads((ts < _at(OWN_TS + 50)) & (sid == 1))
    assert back["offset"].to_list() == list(range(50)) + list(range(300, 400))
    assert objects == 4  # the end is its last object's: every object up to it
    between, objects = reads(ts.is_between(_at(OWN_TS + 120), _at(OWN_TS + 130)))
    assert between.to_dicts() == [
        {"stream_id": s, "offset": o} for s in (0, 1) for o in range(120, 131)
    ]
    assert objects == 3  # stream 0: its second; stream 1: from its second to its last


def test_polars_scan_without_polars_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "polars", None)  # import polars -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "s3stream.polars_scan", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 's3stream\[polars\]'"):
        import s3stream.polars_scan  # noqa: F401


def test_polars_scan_is_imported_on_first_use() -> None:
    pytest.importorskip("polars", reason="the Polars scan needs polars (extra 'polars')")
    code = (
        "import sys, s3stream\n"
        "assert 'polars' not in sys.modules and 's3stream.polars_scan' not in sys.modules\n"
        "assert s3stream.polars_scan.scan.__doc__ and 'polars' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_header_bytes_count_towards_an_arrow_batchs_size(tmp_path: Path) -> None:
    """An Arrow batch closes near `max_batch_bytes` counting its headers too: counted by
    keys and values only, records with large headers filled one column chunk past Arrow's
    2 GiB (66,500 records of 33 KB headers raised "exceed 2 GiB" on intact data)."""
    from s3stream.arrow import RangeSlice, arrow_batches

    with s3stream.open(str(tmp_path), wal="memory://") as client:
        s = client.create_stream()
        for _ in range(20):
            s.append_records([Record(b"v", headers=(("h", b"x" * 10_000),)) for _ in range(5)])
        client.flush()
    with s3stream.open_reader(str(tmp_path)) as reader:
        fetched = reader.read(0, 0, max_bytes=1 << 30)
    piece = [(RangeSlice(0, None, None, "t", 0, 100), fetched.batches)]
    batches = list(arrow_batches(piece, include_headers=True, max_batch_bytes=100_000))
    assert sum(b.num_rows for b in batches) == 100
    assert max(b.num_rows for b in batches) <= 15  # ~100 kB of headers each
