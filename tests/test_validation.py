"""Every bad input is an `InvalidArgumentError` at the call, naming the argument, and changes
nothing: settings (checked when constructed), the `s3stream.open` / `StreamClient` / `Stream`
entry points, the value types and the record codec. See ``s3stream/validation.py``."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import s3stream
from s3stream import (
    ClientSettings,
    CompactionSettings,
    FileWalSettings,
    InvalidArgumentError,
    ManualClock,
    ObjectWalSettings,
    Record,
    RecordBatch,
    RetentionPolicy,
    Stream,
    StreamClient,
)
from s3stream.format.objects import ObjectWriter
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.records import (
    batch_records,
    decode_columns,
    decode_records,
    encode_records,
    records_batch,
)
from s3stream.settings import MAX_BLOCK_TARGET_BYTES, MAX_OBJECT_WAL_UNFLUSHED_BYTES
from s3stream.types import FetchedBatch
from s3stream.validation import (
    I64_MAX,
    MAX_DURATION_MS,
    ZSTD_MAX_LEVEL,
    ZSTD_MIN_LEVEL,
    check_node_id,
)
from s3stream.wal.file import FileWal
from s3stream.wal.memory import MemoryWal
from s3stream.wal.object import SESSION_GAP, ObjectWal

SURROGATE = "\ud800"
BAD_TIMEOUTS = ["x", math.nan, math.inf, -math.inf, -1, -0.5, True, 1e300, [1]]

# ==============================================================================================
# Settings: every field against its annotation, ranges, cross-field limits
# ==============================================================================================

SETTINGS_CLASSES = [ClientSettings, CompactionSettings, FileWalSettings, ObjectWalSettings]


def _fields(kind: str) -> list[tuple[type, str]]:
    return [
        (cls, f.name) for cls in SETTINGS_CLASSES for f in dataclasses.fields(cls) if f.type == kind
    ]


def test_every_settings_field_has_a_rule() -> None:
    # A field of a type the checker has no rule for fails construction (TypeError), so a new
    # field cannot slip by unchecked: the defaults must construct.
    for cls in SETTINGS_CLASSES:
        cls()
    kinds = {f.type for cls in SETTINGS_CLASSES for f in dataclasses.fields(cls)}
    assert kinds <= {
        "int",
        "bool",
        "str",
        "CompactionSettings",
        "FileWalSettings | None",
        "ObjectWalSettings | None",
    }


@pytest.mark.parametrize(("cls", "name"), _fields("int"), ids=lambda x: getattr(x, "__name__", x))
@pytest.mark.parametrize("bad", [True, False, 1.0, 1.5, "1", None, -1, I64_MAX + 1, 10**30])
def test_int_fields_refuse_non_ints_and_out_of_range(cls: type, name: str, bad: object) -> None:
    if name == "zstd_level" and bad == -1:
        bad = ZSTD_MIN_LEVEL - 1  # negative zstd levels are valid ("fast" levels)
    with pytest.raises(InvalidArgumentError, match=rf"{cls.__name__}\.{name}"):
        cls(**{name: bad})


@pytest.mark.parametrize(("cls", "name"), _fields("int"), ids=lambda x: getattr(x, "__name__", x))
def test_int_fields_zero_is_accepted_or_refused_cleanly(cls: type, name: str) -> None:
    try:
        cls(**{name: 0})
    except InvalidArgumentError as exc:
        assert name in str(exc)


@pytest.mark.parametrize(
    ("cls", "name"),
    [(c, n) for c, n in _fields("int") if n.endswith("_ms")],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_durations_fit_the_platform_timers(cls: type, name: str) -> None:
    # Larger waits raise OverflowError inside a lock or condition wait (a background thread).
    cls(**{name: MAX_DURATION_MS})
    with pytest.raises(InvalidArgumentError, match=name):
        cls(**{name: MAX_DURATION_MS + 1})


@pytest.mark.parametrize(("cls", "name"), _fields("bool"), ids=lambda x: getattr(x, "__name__", x))
@pytest.mark.parametrize("bad", [0, 1, "yes", "", None, 1.0])
def test_bool_fields_refuse_non_bools(cls: type, name: str, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"{cls.__name__}\.{name}"):
        cls(**{name: bad})


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"zstd_level": ZSTD_MAX_LEVEL + 1}, "zstd_level"),
        ({"zstd_level": ZSTD_MIN_LEVEL - 1}, "zstd_level"),
        ({"zstd_level": 3.0}, "zstd_level"),
        ({"zstd_level": True}, "zstd_level"),
        ({"block_compression": "lz4"}, "block_compression"),
        ({"block_compression": None}, "block_compression"),
        ({"block_compression": b"zstd"}, "block_compression"),
        ({"compaction": None}, "compaction"),
        ({"compaction": {}}, "compaction"),
        ({"block_target_bytes": MAX_BLOCK_TARGET_BYTES + 1}, "block_target_bytes"),
        ({"max_pending_bytes": 10, "upload_threshold_bytes": 11}, "max_pending_bytes"),
        ({"call_timeout_ms": 0}, "call_timeout_ms"),
        ({"call_timeout_ms": 1.5}, "call_timeout_ms"),
        ({"store_timeout_ms": 0}, "store_timeout_ms"),
        ({"store_timeout_ms": "30s"}, "store_timeout_ms"),
    ],
)
def test_client_settings_ranges_and_cross_field_limits(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=name):
        ClientSettings(**kwargs)


@pytest.mark.parametrize(
    ("cls", "kwargs", "name"),
    [
        (FileWalSettings, {"capacity_bytes": 16 * 1024 + 1}, "capacity_bytes"),
        (FileWalSettings, {"capacity_bytes": 8 * 1024}, "capacity_bytes"),
        (FileWalSettings, {"max_group_bytes": 100}, "max_group_bytes"),
        (
            ObjectWalSettings,
            {"max_unflushed_bytes": MAX_OBJECT_WAL_UNFLUSHED_BYTES + 1},
            "max_unflushed_bytes",
        ),
        (CompactionSettings, {"stream_set_min_objects": 0}, "stream_set_min_objects"),
    ],
)
def test_wal_and_compaction_settings_limits(cls: type, kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=name):
        cls(**kwargs)


def test_settings_limits_match_the_code_they_protect() -> None:
    assert MAX_OBJECT_WAL_UNFLUSHED_BYTES == SESSION_GAP // 2
    ObjectWriter(block_target_bytes=MAX_BLOCK_TARGET_BYTES)
    with pytest.raises(InvalidArgumentError, match="block_target_bytes"):
        ObjectWriter(block_target_bytes=MAX_BLOCK_TARGET_BYTES + 1)
    # The zstd range is exactly what libzstd takes: both ends compress, one past the top fails.
    for level in (ZSTD_MIN_LEVEL, -1, 0, 1, ZSTD_MAX_LEVEL):
        ClientSettings(zstd_level=level, block_compression="zstd")
        zstandard.ZstdCompressor(level=level).compress(b"abc" * 100)
    with pytest.raises((ValueError, zstandard.ZstdError)):
        zstandard.ZstdCompressor(level=ZSTD_MAX_LEVEL + 1)


def test_replace_revalidates() -> None:
    with pytest.raises(InvalidArgumentError, match="zstd_level"):
        dataclasses.replace(ClientSettings(), zstd_level=99)


def test_a_settings_value_that_killed_the_uploader_now_fails_at_construction() -> None:
    # Used to be accepted: the uploader thread died on its first upload and close() hung.
    with pytest.raises(InvalidArgumentError, match="zstd_level"):
        ClientSettings(zstd_level=23, block_compression="zstd")
    with pytest.raises(InvalidArgumentError, match="zstd_level"):
        ClientSettings(zstd_level=23)  # refused even with compression off
    # The extreme levels that are accepted really upload: append, flush, read back, close.
    for level in (ZSTD_MAX_LEVEL, ZSTD_MIN_LEVEL):
        settings = ClientSettings(block_compression="zstd", zstd_level=level, upload_interval_ms=0)
        client = s3stream.open("memory://", settings=settings)
        try:
            stream = client.create_stream()
            stream.append(RecordBatch(b"payload " * 100, count=2), timeout_s=10)
            client.flush(timeout_s=10)
            assert client.stream_info(stream.stream_id).end_offset == 2
            got = client.read(stream.stream_id, 0)
            assert [b.payload for b in got.batches] == [b"payload " * 100]
        finally:
            client.close(timeout_s=10)


# ==============================================================================================
# The client and stream entry points: refused at the call, nothing written or changed
# ==============================================================================================


@pytest.fixture
def opened() -> Iterator[tuple[StreamClient, Stream]]:
    client = s3stream.open("memory://", settings=ClientSettings(upload_interval_ms=0))
    stream = client.create_stream({"topic": "t"})
    stream.append(RecordBatch(b"abc", count=3))
    client.flush()
    stream.append(RecordBatch(b"de", count=2))
    try:
        yield client, stream
    finally:
        client.close()


def _snapshot(client: StreamClient, stream: Stream) -> tuple[object, ...]:
    keys = sorted(info.key for info in client.object_store.list(""))
    return (
        keys,
        client.metadata.seq,
        stream.start_offset,
        stream.confirm_offset,
        stream.next_offset,
        stream.closed,
        client.closed,
    )


REC = [Record(b"v", key=b"k")]

# Any: the cases pass wrong types on purpose.
Call = Callable[[Any, Any], object]

CLIENT_CASES: list[tuple[str, str, Call]] = [
    # create_stream
    ("create_stream-str", "tags", lambda c, s: c.create_stream("topic=t")),
    ("create_stream-key", "tags", lambda c, s: c.create_stream({1: "a"})),
    ("create_stream-value", "tags", lambda c, s: c.create_stream({"a": 1})),
    ("create_stream-surrogate-v", "tags", lambda c, s: c.create_stream({"a": SURROGATE})),
    ("create_stream-surrogate-k", "tags", lambda c, s: c.create_stream({SURROGATE: "a"})),
    ("create_stream-list", "tags", lambda c, s: c.create_stream([("a", "b")])),
    (
        "create_stream-retention",
        "retention.ms",
        lambda c, s: c.create_stream({"retention.ms": "1d"}),
    ),
    (
        "create_stream-retention-bytes",
        "retention.bytes",
        lambda c, s: c.create_stream({"retention.bytes": "1.5"}),
    ),
    # open_stream
    ("open_stream-str", "stream_id", lambda c, s: c.open_stream("0")),
    ("open_stream-neg", "stream_id", lambda c, s: c.open_stream(-1)),
    ("open_stream-bool", "stream_id", lambda c, s: c.open_stream(True)),
    ("open_stream-float", "stream_id", lambda c, s: c.open_stream(0.0)),
    ("open_stream-force", "force", lambda c, s: c.open_stream(0, force="yes")),
    ("open_stream-force-int", "force", lambda c, s: c.open_stream(0, force=1)),
    # list_streams / stream_info
    ("list_streams-list", "tags", lambda c, s: c.list_streams(["t"])),
    ("list_streams-value", "tags", lambda c, s: c.list_streams({"topic": 1})),
    ("list_streams-surrogate", "tags", lambda c, s: c.list_streams({"topic": SURROGATE})),
    ("stream_info-str", "stream_id", lambda c, s: c.stream_info("0")),
    ("stream_info-neg", "stream_id", lambda c, s: c.stream_info(-1)),
    # read
    ("read-stream_id", "stream_id", lambda c, s: c.read("0", 0)),
    ("read-start-neg", "start_offset", lambda c, s: c.read(0, -1)),
    ("read-start-str", "start_offset", lambda c, s: c.read(0, "0")),
    ("read-end-neg", "end_offset", lambda c, s: c.read(0, 0, -1)),
    ("read-end-below", "end_offset", lambda c, s: c.read(0, 2, 1)),
    ("read-max_bytes-0", "max_bytes", lambda c, s: c.read(0, 0, max_bytes=0)),
    ("read-max_bytes-bool", "max_bytes", lambda c, s: c.read(0, 0, max_bytes=True)),
    ("read-max_bytes-float", "max_bytes", lambda c, s: c.read(0, 0, max_bytes=1.5)),
    # compact
    ("compact-progress", "progress", lambda c, s: c.compact(progress=5)),
    ("compact-sweep", "sweep_orphans", lambda c, s: c.compact(sweep_orphans="yes")),
    ("compact-sweep-int", "sweep_orphans", lambda c, s: c.compact(sweep_orphans=1)),
    # take_over
    ("take_over-newline", "node_id", lambda c, s: c.take_over("local\n")),
    ("take_over-empty", "node_id", lambda c, s: c.take_over("")),
    ("take_over-int", "node_id", lambda c, s: c.take_over(5)),
    ("take_over-slash", "node_id", lambda c, s: c.take_over("a/b")),
    ("take_over-surrogate", "node_id", lambda c, s: c.take_over("a" + SURROGATE)),
    ("take_over-wal", "wal", lambda c, s: c.take_over("other", wal=5)),
    (
        "take_over-storage_options",
        "storage_options",
        lambda c, s: c.take_over("other", wal="memory://", storage_options=[1]),
    ),
    # Stream: appends
    ("append-bytes", "batch", lambda c, s: s.append(b"x")),
    ("append_async-str", "batch", lambda c, s: s.append_async("x")),
    (
        "append_records-compression",
        "compression",
        lambda c, s: s.append_records(REC, compression="lz4"),
    ),
    ("append_records-empty", "records", lambda c, s: s.append_records([])),
    ("append_records-bytes", "records", lambda c, s: s.append_records([b"x"])),
    ("append_records-one", "records", lambda c, s: s.append_records(REC[0])),
    (
        "append_records_async-compression",
        "compression",
        lambda c, s: s.append_records_async(REC, compression=5),
    ),
    # Stream: reads
    ("fetch-neg", "start_offset", lambda c, s: s.fetch(-1)),
    ("fetch-str", "start_offset", lambda c, s: s.fetch("0")),
    ("fetch-bool", "start_offset", lambda c, s: s.fetch(False)),
    ("fetch-end-neg", "end_offset", lambda c, s: s.fetch(0, -1)),
    ("fetch-end-below", "end_offset", lambda c, s: s.fetch(2, 1)),
    ("fetch-max_bytes", "max_bytes", lambda c, s: s.fetch(0, max_bytes=0)),
    ("fetch-max_bytes-float", "max_bytes", lambda c, s: s.fetch(0, max_bytes=1e6)),
    ("read_records-neg", "start_offset", lambda c, s: s.read_records(-1)),
    ("read_records-end-below", "end_offset", lambda c, s: s.read_records(2, 1)),
    ("read_records-max_bytes", "max_bytes", lambda c, s: s.read_records(0, max_bytes=0)),
    # Stream: trim
    ("trim-neg", "new_start_offset", lambda c, s: s.trim(-1)),
    ("trim-str", "new_start_offset", lambda c, s: s.trim("1")),
    ("trim-bool", "new_start_offset", lambda c, s: s.trim(True)),
    ("trim-float", "new_start_offset", lambda c, s: s.trim(1.0)),
]


def _timeout_cases(bad: object) -> list[tuple[str, str, Call]]:
    return [
        (f"flush-{bad!r}", "timeout_s", lambda c, s: c.flush(timeout_s=bad)),
        (f"close-{bad!r}", "timeout_s", lambda c, s: c.close(timeout_s=bad)),
        (f"append-{bad!r}", "timeout_s", lambda c, s: s.append(RecordBatch(b"x"), timeout_s=bad)),
        (f"append_records-{bad!r}", "timeout_s", lambda c, s: s.append_records(REC, timeout_s=bad)),
    ]


for _bad in BAD_TIMEOUTS:
    CLIENT_CASES += _timeout_cases(_bad)


@pytest.mark.parametrize(
    ("name", "call"), [(n, c) for _, n, c in CLIENT_CASES], ids=[i for i, _, _ in CLIENT_CASES]
)
def test_client_and_stream_refuse_bad_input_without_side_effects(
    opened: tuple[StreamClient, Stream], name: str, call: Call
) -> None:
    client, stream = opened
    before = _snapshot(client, stream)
    with pytest.raises(InvalidArgumentError, match=name):
        call(client, stream)
    assert _snapshot(client, stream) == before
    # Still fully usable: the refusal failed that call only.
    r = stream.append(RecordBatch(b"f", count=1))
    assert r.base_offset == 5
    client.flush()
    assert client.stream_info(stream.stream_id).end_offset == 6


def test_rejected_create_stream_writes_no_metadata_entry(
    opened: tuple[StreamClient, Stream],
) -> None:
    client, _ = opened
    seq = client.metadata.seq
    bad_tags: list[Any] = [{"a": SURROGATE}, {"retention.ms": "x"}, {"a": None}]
    for tags in bad_tags:
        with pytest.raises(InvalidArgumentError, match="tag"):
            client.create_stream(tags)
    assert client.metadata.seq == seq
    assert [i.stream_id for i in client.list_streams()] == [0]


# ==============================================================================================
# s3stream.open and StreamClient construction: refused before anything is opened or created
# ==============================================================================================

OPEN_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("node_id-newline", "node_id", {"node_id": "n1\n"}),
    ("node_id-empty", "node_id", {"node_id": ""}),
    ("node_id-long", "node_id", {"node_id": "a" * 65}),
    ("node_id-dash", "node_id", {"node_id": "-a"}),
    ("node_id-space", "node_id", {"node_id": "a b"}),
    ("node_id-surrogate", "node_id", {"node_id": "a" + SURROGATE}),
    ("node_id-int", "node_id", {"node_id": 1}),
    ("wal-int", "wal", {"wal": 5}),
    ("wal-empty", "wal", {"wal": ""}),
    ("storage_options-list", "storage_options", {"storage_options": [("a", 1)]}),
    ("storage_options-keys", "storage_options", {"storage_options": {1: "a"}}),
    ("settings-dict", "settings", {"settings": {"zstd_level": "fast"}}),
    ("settings-dict-unknown", "settings", {"settings": {"zstd": 3}}),
    ("settings-wrong", "settings", {"settings": CompactionSettings()}),
    ("file_wal_settings", "file_wal_settings", {"file_wal_settings": ClientSettings()}),
    ("object_wal_settings", "object_wal_settings", {"object_wal_settings": FileWalSettings()}),
    ("clock", "clock", {"clock": 5}),
    ("rng", "rng", {"rng": 5}),
]


@pytest.mark.parametrize(
    ("name", "kwargs"), [(n, k) for _, n, k in OPEN_CASES], ids=[i for i, _, _ in OPEN_CASES]
)
def test_open_refuses_bad_input_before_creating_anything(
    tmp_path: Path, name: str, kwargs: dict[str, Any]
) -> None:
    target = tmp_path / "store"
    with pytest.raises(InvalidArgumentError, match=name):
        s3stream.open(target, **kwargs)
    assert not target.exists()


@pytest.mark.parametrize("url", [5, None, b"memory://", ""])
def test_open_refuses_bad_urls(url: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="url"):
        s3stream.open(url)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("store", {"store": 5}),
        ("wal", {"wal": "memory://"}),
        ("node_id", {"node_id": "x\n"}),
        ("settings", {"settings": {}}),
        ("clock", {"clock": "now"}),
        ("rng", {"rng": 1}),
        ("metadata_prefix", {"metadata_prefix": ""}),
        ("metadata_prefix", {"metadata_prefix": 5}),
        ("retry", {"retry": 1}),
    ],
)
def test_stream_client_refuses_bad_input_before_registering(
    name: str, kwargs: dict[str, Any]
) -> None:
    store = MemoryObjectStore()
    args: dict[str, Any] = {"store": store, "wal": MemoryWal()}
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=name):
        StreamClient(args.pop("store"), args.pop("wal"), **args)
    assert list(store.list("")) == []


def test_wal_node_ids(tmp_path: Path) -> None:
    path = tmp_path / "w.wal"
    with pytest.raises(InvalidArgumentError, match="node_id"):
        FileWal(path, node_id="a" + SURROGATE)
    assert not path.exists()
    for bad in ("n1\n", "", "a" * 65, "a" + SURROGATE):
        with pytest.raises(InvalidArgumentError, match="node_id"):
            ObjectWal(MemoryObjectStore(), node_id=bad)
    for good in ("a", "A.b-c_9", "9" * 64):
        assert check_node_id(good) == good


# ==============================================================================================
# Value types and the record codec
# ==============================================================================================

# Wrong types are the point of these cases: call through Any so that type checkers pass them.
_RecordBatch: Any = RecordBatch
_Record: Any = Record
_encode_records: Any = encode_records
_records_batch: Any = records_batch
_decode_columns: Any = decode_columns
_decode_records: Any = decode_records
_batch_records: Any = batch_records
_RetentionPolicy: Any = RetentionPolicy
_ManualClock: Any = ManualClock

VALUE_CASES: list[tuple[str, str, Callable[[], object]]] = [
    ("batch-payload", "payload", lambda: _RecordBatch("x")),
    ("batch-count-0", "count", lambda: _RecordBatch(b"x", count=0)),
    ("batch-count-bool", "count", lambda: _RecordBatch(b"x", count=True)),
    ("batch-count-float", "count", lambda: _RecordBatch(b"x", count=1.0)),
    ("batch-count-big", "count", lambda: _RecordBatch(b"x", count=1 << 31)),
    ("batch-ts-float", "base_timestamp", lambda: _RecordBatch(b"x", base_timestamp=1.5)),
    ("batch-ts-bool", "base_timestamp", lambda: _RecordBatch(b"x", base_timestamp=True)),
    ("batch-ts-big", "base_timestamp", lambda: _RecordBatch(b"x", base_timestamp=1 << 63)),
    ("batch-props-list", "properties", lambda: _RecordBatch(b"x", properties=[("a", "b")])),
    ("batch-props-falsy", "properties", lambda: _RecordBatch(b"x", properties="")),
    ("batch-props-zero", "properties", lambda: _RecordBatch(b"x", properties=0)),
    ("batch-props-value", "properties", lambda: _RecordBatch(b"x", properties={"a": 1})),
    (
        "batch-props-surrogate",
        "properties",
        lambda: _RecordBatch(b"x", properties={SURROGATE: "a"}),
    ),
    ("batch-kind-int", "kind", lambda: _RecordBatch(b"x", kind=7)),
    ("batch-kind-bool", "kind", lambda: _RecordBatch(b"x", kind=True)),
    ("batch-kind-float", "kind", lambda: _RecordBatch(b"x", kind=1.0)),
    ("batch-kind-str", "kind", lambda: _RecordBatch(b"x", kind="raw")),
    ("record-value", "value", lambda: _Record("v")),
    ("record-key", "key", lambda: _Record(b"v", key="k")),
    ("record-ts-bool", "timestamp", lambda: _Record(b"v", timestamp=True)),
    ("record-ts-float", "timestamp", lambda: _Record(b"v", timestamp=1.5)),
    ("record-ts-min", "timestamp", lambda: _Record(b"v", timestamp=-(1 << 63))),
    ("record-headers-str", "headers", lambda: _Record(b"v", headers="ab")),
    ("record-headers-none", "headers", lambda: _Record(b"v", headers=None)),
    ("record-header-pair", "headers", lambda: _Record(b"v", headers=[("a",)])),
    ("record-header-name", "headers", lambda: _Record(b"v", headers=[(1, b"")])),
    ("record-header-surrogate", "headers", lambda: _Record(b"v", headers=[(SURROGATE, b"")])),
    ("record-header-value", "headers", lambda: _Record(b"v", headers=[("a", "s")])),
    ("encode-compression", "compression", lambda: _encode_records(REC, compression="lz4")),
    (
        "encode-zstd_level",
        "zstd_level",
        lambda: _encode_records(REC, compression="zstd", zstd_level=23),
    ),
    ("encode-zstd_level-bool", "zstd_level", lambda: _encode_records(REC, zstd_level=True)),
    ("records_batch-empty", "records", lambda: _records_batch([])),
    ("records_batch-gen", "records", lambda: _records_batch(r for r in REC)),
    ("decode-payload", "payload", lambda: _decode_columns("abc")),
    (
        "decode-count",
        "expected_count",
        lambda: _decode_columns(_encode_records(REC), expected_count=0),
    ),
    ("decode-location", "location", lambda: _decode_columns(_encode_records(REC), location=5)),
    (
        "decode_records-ts",
        "base_timestamp",
        lambda: _decode_records(_encode_records(REC), base_timestamp="0"),
    ),
    ("batch_records-batch", "batch", lambda: _batch_records("x")),
    (
        "batch_records-start",
        "start_offset",
        lambda: _batch_records(FetchedBatch(0, 0, 1, b"x", 0), start_offset=-1),
    ),
    ("retention-bool", "retention_ms", lambda: _RetentionPolicy(retention_ms=True)),
    ("retention-float", "retention_bytes", lambda: _RetentionPolicy(retention_bytes=1.5)),
    ("clock-start", "start_ms", lambda: _ManualClock(start_ms=1.5)),
    ("clock-advance-nan", "seconds", lambda: _ManualClock().advance(math.nan)),
    ("clock-advance-neg", "seconds", lambda: _ManualClock().advance(-1)),
    ("clock-advance-str", "seconds", lambda: _ManualClock().advance("1")),
]


@pytest.mark.parametrize(
    ("name", "call"), [(n, c) for _, n, c in VALUE_CASES], ids=[i for i, _, _ in VALUE_CASES]
)
def test_value_types_and_codec_refuse_bad_input(name: str, call: Callable[[], object]) -> None:
    with pytest.raises(InvalidArgumentError, match=name):
        call()


def test_properties_none_means_none() -> None:
    assert _RecordBatch(b"x", properties=None).properties == {}


def test_long_values_are_cut_short_in_messages() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        RecordBatch(b"x", properties={"a": "b" * 10_000 + SURROGATE})
    assert len(str(err.value)) < 300


# ==============================================================================================
# Property: arbitrary text either round-trips or is refused, never anything else
# ==============================================================================================

_chars = st.one_of(
    st.characters(codec=None, exclude_categories=()),  # surrogates too, though rarely
    st.sampled_from([SURROGATE, "\udfff", "\x00", "\n", "é", "\U0001f600", "="]),
)
_text = st.text(_chars, max_size=12)
_keys = st.one_of(_text, st.sampled_from(["retention.ms", "retention.bytes"]))
_values = st.one_of(_text, st.integers(-5, 10**6).map(str))
_maps = st.dictionaries(_keys, _values, max_size=4)
_fast = hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_arbitrary_tags_round_trip_or_are_refused() -> None:
    client = s3stream.open("memory://")
    try:

        @_fast
        @given(tags=_maps)
        def run(tags: dict[str, str]) -> None:
            before = client.metadata.seq
            try:
                stream = client.create_stream(tags)
            except InvalidArgumentError:
                assert client.metadata.seq == before
                assert not all(_encodable(k) and _encodable(v) for k, v in tags.items()) or any(
                    k in ("retention.ms", "retention.bytes") for k in tags
                )
                return
            assert dict(stream.tags) == tags
            assert dict(client.stream_info(stream.stream_id).tags) == tags
            found = client.list_streams(tags)
            assert stream.stream_id in [i.stream_id for i in found]
            assert all(dict(i.tags).items() >= tags.items() for i in found)
            stream.close()

        run()
    finally:
        client.close()


def test_arbitrary_batch_properties_and_header_names_round_trip_or_are_refused() -> None:
    client = s3stream.open("memory://", settings=ClientSettings(upload_interval_ms=0))
    try:
        stream = client.create_stream()

        @_fast
        @given(props=_maps, name=_text, upload=st.booleans())
        def run(props: dict[str, str], name: str, upload: bool) -> None:
            try:
                batch = RecordBatch(b"p", properties=props)
            except InvalidArgumentError:
                assert not all(_encodable(k) and _encodable(v) for k, v in props.items())
            else:
                r = stream.append(batch)
                if upload:
                    client.flush()
                (got,) = stream.fetch(r.base_offset, r.next_offset).batches
                assert dict(got.properties) == props
                if upload:
                    (committed,) = client.read(stream.stream_id, r.base_offset).batches[:1]
                    assert dict(committed.properties) == props
            try:
                record = Record(b"v", headers=((name, b"h"),))
            except InvalidArgumentError:
                assert not _encodable(name)
            else:
                r = stream.append_records([record])
                ((_, back),) = list(stream.read_records(r.base_offset, r.next_offset))
                assert back.headers == ((name, b"h"),)

        run()
    finally:
        client.close()


# ==============================================================================================
# The module itself
# ==============================================================================================


def test_validation_module_depends_on_errors_only() -> None:
    import s3stream.validation as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    relative = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert relative == ["errors"]


def test_random_settings_values_never_escape_as_other_errors() -> None:
    rng = random.Random(7)
    pool: list[object] = [
        -1,
        0,
        1,
        3,
        22,
        23,
        True,
        False,
        1.5,
        math.nan,
        "1",
        None,
        10**20,
        b"x",
        [],
        {},
    ]
    for cls in SETTINGS_CLASSES:
        names = [f.name for f in dataclasses.fields(cls)]
        for _ in range(300):
            kwargs = {n: rng.choice(pool) for n in rng.sample(names, rng.randint(1, 3))}
            with contextlib.suppress(InvalidArgumentError):
                cls(**kwargs)


@pytest.mark.parametrize("raw", [" 5", "5 ", "1_000", "\u0663", "+5", "5.0", "", "0x10"])
def test_retention_tags_are_plain_integers(tmp_path: Path, raw: str) -> None:
    with (
        s3stream.open(tmp_path, wal="memory://") as client,
        pytest.raises(InvalidArgumentError, match=r"retention\.bytes"),
    ):
        client.create_stream({"retention.bytes": raw})


@pytest.mark.parametrize("endpoint", [5, "not a url", "ftp://host", "http://", b"http://x"])
def test_endpoint_url_must_be_an_http_url(endpoint: object) -> None:
    from s3stream.objectstore.s3 import S3ObjectStore

    with pytest.raises(InvalidArgumentError, match="endpoint_url"):
        S3ObjectStore(
            "bucket", endpoint_url=endpoint, aws_access_key_id="a", aws_secret_access_key="b"
        )


def test_an_int_beyond_any_float_is_a_clear_error_as_a_duration(tmp_path: Path) -> None:
    """``10**400`` seconds as a timeout, a tail's wait or a reader's poll escaped as a bare
    OverflowError (float() of it)."""
    with s3stream.open(str(tmp_path), wal="memory://") as client:
        s = client.create_stream()
        for call in (
            lambda: s.append(RecordBatch(b"x"), timeout_s=10**400),
            lambda: s.tail(0, wait_s=10**400),
            lambda: s.fetch(0, wait_s=-(10**400)),
        ):
            with pytest.raises(InvalidArgumentError, match="seconds"):
                call()
