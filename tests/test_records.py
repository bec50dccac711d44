"""The records codec (`s3stream.records`) and `Stream.append_records` / `read_records`."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import s3stream
from s3stream import (
    BatchKind,
    ClientSettings,
    CorruptionError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    Record,
    RecordBatch,
)
from s3stream.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    RECORDS_HEADER,
    batch_records,
    decode_columns,
    decode_records,
    encode_records,
    records_batch,
)
from s3stream.types import FetchedBatch

I64 = st.integers(min_value=-(1 << 63) + 1, max_value=(1 << 63) - 1)
maybe_bytes = st.none() | st.binary(max_size=40)
records_st = st.builds(
    Record,
    value=maybe_bytes,
    key=maybe_bytes,
    timestamp=st.none()
    | I64
    | st.integers(min_value=1_600_000_000_000, max_value=1_700_000_000_000),
    headers=st.lists(st.tuples(st.text(max_size=8), maybe_bytes), max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(records_st, min_size=1, max_size=30), zstd=st.booleans())
def test_round_trip(records: list[Record], zstd: bool) -> None:
    payload = encode_records(records, compression="zstd" if zstd else "none")
    assert decode_records(payload, expected_count=len(records)) == records
    cols = decode_columns(payload)
    assert cols.count == len(records)
    assert cols.key_lengths.tolist() == [-1 if r.key is None else len(r.key) for r in records]
    assert bytes(cols.value_data) == b"".join(r.value for r in records if r.value)


def test_timestamps_resolve_against_the_batch() -> None:
    records = [Record(b"a", timestamp=5), Record(b"b"), Record(b"c", timestamp=-7)]
    cols = decode_columns(encode_records(records))
    ts, kinds = cols.resolve_timestamps(1000)
    assert ts.tolist() == [5, 1000, -7]
    assert kinds.tolist() == [CREATE_TIME, LOG_APPEND_TIME, CREATE_TIME]
    assert decode_records(encode_records(records), base_timestamp=1000)[1].timestamp == 1000
    assert decode_records(encode_records(records))[1].timestamp is None


@pytest.mark.parametrize("size", [0, 254, 255, 65534, 65535, 70_000])
def test_wide_lengths(size: int) -> None:
    records = [Record(b"x" * size, key=b"k" * (size // 2)), Record(None, key=b""), Record(b"")]
    assert decode_records(encode_records(records)) == records


def test_wide_timestamp_range_and_zstd_saves_space() -> None:
    records = [Record(b"v" * 100, timestamp=t) for t in (-(1 << 62), 0, (1 << 62))]
    assert decode_records(encode_records(records)) == records
    same = [Record(b"abc" * 50, key=b"key") for _ in range(200)]
    plain, packed = encode_records(same), encode_records(same, compression="zstd")
    assert len(packed) < len(plain) // 5
    assert decode_records(packed) == same


def test_columnar_layout_is_compact() -> None:
    records = [Record(b"v" * 10, key=b"k" * 5, timestamp=1_700_000_000_000 + i) for i in range(100)]
    # header + 4-byte timestamp deltas + 1-byte key and value sizes + the bytes themselves
    assert len(encode_records(records)) == RECORDS_HEADER.size + 100 * (4 + 1 + 1) + 100 * 15


def test_records_batch_base_timestamp() -> None:
    b = records_batch([Record(b"a", timestamp=3), Record(b"b", timestamp=9)])
    assert (b.kind, b.count, b.base_timestamp) == (BatchKind.RECORDS, 2, 9)
    assert records_batch([Record(b"a", timestamp=3), Record(b"b")]).base_timestamp is None


def test_record_validation() -> None:
    r = Record(bytearray(b"v"), key=memoryview(b"k"), headers=[["h", bytearray(b"x")]])  # type: ignore[arg-type]
    assert r == Record(b"v", b"k", None, (("h", b"x"),))
    for bad in (
        lambda: Record("text"),  # type: ignore[arg-type]
        lambda: Record(b"v", key=1),  # type: ignore[arg-type]
        lambda: Record(b"v", timestamp=1.5),  # type: ignore[arg-type]
        lambda: Record(b"v", timestamp=-(1 << 63)),
        lambda: Record(b"v", headers=(("h",),)),  # type: ignore[arg-type]
        lambda: Record(b"v", headers=((1, b"x"),)),  # type: ignore[arg-type]
        lambda: Record(b"v", headers="hx"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgumentError):
            bad()
    with pytest.raises(InvalidArgumentError, match="records"):
        encode_records([])
    with pytest.raises(InvalidArgumentError, match="compression"):
        encode_records([Record(b"v")], compression="lz4")
    with pytest.raises(InvalidArgumentError, match=r"records\[1\]"):
        encode_records([Record(b"v"), b"v"])  # type: ignore[list-item]


# ---------------------------------------------------------------------------------------------
# Corrupt payloads


def _sample() -> bytes:
    return encode_records(
        [
            Record(
                b"value-%d" % i,
                key=None if i % 2 else b"k%d" % i,
                timestamp=i or None,
                headers=(("h", b"x"),) if i % 3 == 0 else (),
            )
            for i in range(20)
        ]
    )


def test_every_truncation_is_corruption() -> None:
    payload = _sample()
    for n in range(len(payload)):
        with pytest.raises(CorruptionError):
            decode_columns(payload[:n], location="obj-1")


def test_corruption_names_the_location() -> None:
    with pytest.raises(CorruptionError, match="obj-7") as info:
        decode_columns(b"\x09" + _sample()[1:], location="obj-7")
    assert info.value.location == "obj-7"


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        (0, 2, "version"),
        (1, 0x80, "flags"),
        (2, 9, "timestamp mode"),
        (3, 3, "width"),
        (5, 0, "header columns without header counts"),
    ],
)
def test_bad_header_fields(field: int, value: int, match: str) -> None:
    payload = bytearray(_sample())
    payload[field] = value
    with pytest.raises(CorruptionError, match=match):
        decode_columns(bytes(payload))


def test_count_mismatch_trailing_bytes_and_bad_zstd() -> None:
    payload = _sample()
    with pytest.raises(CorruptionError, match="20 records"):
        decode_columns(payload, expected_count=21)
    fields = list(RECORDS_HEADER.unpack_from(payload))
    fields[9] += 1  # body length one longer than the body
    with pytest.raises(CorruptionError):
        decode_columns(RECORDS_HEADER.pack(*fields) + payload[RECORDS_HEADER.size :])
    fields[9] -= 1
    fields[1] = 1  # claims zstd, holds plain bytes
    with pytest.raises(CorruptionError, match="decompress"):
        decode_columns(RECORDS_HEADER.pack(*fields) + payload[RECORDS_HEADER.size :])
    # Column sizes that add up to less than the body: trailing bytes.
    body = bytearray(payload)
    fields = list(RECORDS_HEADER.unpack_from(payload))
    fields[9] += 3
    with pytest.raises(CorruptionError, match="trailing"):
        decode_columns(RECORDS_HEADER.pack(*fields) + bytes(body[RECORDS_HEADER.size :]) + b"abc")


def test_header_key_not_utf8() -> None:
    payload = bytearray(encode_records([Record(b"v", headers=(("\u00e9", b"x"),))]))
    i = payload.index("\u00e9".encode())
    payload[i] = 0xFF
    with pytest.raises(CorruptionError, match="UTF-8"):
        decode_records(bytes(payload))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_damage_never_crashes(data: st.DataObject) -> None:
    payload = bytearray(_sample())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] = data.draw(st.integers(0, 255))
    with contextlib.suppress(CorruptionError):
        decode_records(bytes(payload), base_timestamp=0)


# ---------------------------------------------------------------------------------------------
# Batches of both kinds


def _fetched(kind: BatchKind, payload: bytes, base: int, count: int) -> FetchedBatch:
    return FetchedBatch(7, base, count, payload, 500, kind=kind)


def test_batch_records_clips_records_and_places_raw_at_its_base() -> None:
    recs = [Record(b"%d" % i) for i in range(5)]
    b = _fetched(BatchKind.RECORDS, encode_records(recs), 10, 5)
    assert [o for o, _ in batch_records(b, 12, 14)] == [12, 13]
    assert [r.value for _, r in batch_records(b)] == [r.value for r in recs]
    assert all(r.timestamp == 500 for _, r in batch_records(b))
    raw = _fetched(BatchKind.RAW, b"opaque", 20, 4)
    assert list(batch_records(raw, 20, 21)) == [(20, Record(b"opaque", timestamp=500))]
    assert list(batch_records(raw, 21, 30)) == []  # owned by the range holding offset 20
    with pytest.raises(CorruptionError, match="stream 7 batch at offset 10"):
        list(batch_records(_fetched(BatchKind.RECORDS, encode_records(recs), 10, 6)))


SMALL = ClientSettings(
    upload_threshold_bytes=64 * 1024,
    stream_split_bytes=32 * 1024,
    block_target_bytes=8 * 1024,
    max_pending_bytes=1 << 20,
    upload_interval_ms=0,
)


def test_stream_append_and_read_records(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), wal="memory://", settings=SMALL) as client:
        stream = client.create_stream(tags={"topic": "t"})
        first = stream.append_records(
            [Record(b"a", key=b"k", headers=(("h", None),)), Record(b"b", timestamp=42)]
        )
        assert (first.base_offset, first.count) == (0, 2)
        stream.append(RecordBatch(b"raw", count=3, base_timestamp=7))
        fut = stream.append_records_async(
            [Record(b"%d" % i) for i in range(200)], compression="zstd"
        )
        assert fut.result().base_offset == 5
        expected = list(stream.read_records(0))
        client.flush()  # now read back from objects, not the log cache
        got = list(stream.read_records(0, max_bytes=100))
        assert got == expected
        assert [o for o, _ in got[:4]] == [0, 1, 2, 5]
        assert got[0][1].headers == (("h", None),)
        assert got[1][1].timestamp == 42
        assert got[2][1] == Record(b"raw", timestamp=7)
        assert [o for o, _ in stream.read_records(3, 7)] == [5, 6]
        assert list(stream.read_records(205)) == []
        fetched = client.read(stream.stream_id, 5).batches[0]
        assert fetched.kind is BatchKind.RECORDS and fetched.count == 200
        stream.trim(5)
        with pytest.raises(OffsetOutOfRangeError):
            stream.read_records(4)
        with pytest.raises(InvalidArgumentError, match="end_offset"):
            stream.read_records(6, 5)
        with pytest.raises(InvalidArgumentError):
            stream.append_records([])


def test_numpy_columns_are_views_of_the_payload() -> None:
    payload = encode_records([Record(b"x" * 1000) for _ in range(10)])
    cols = decode_columns(payload)
    assert isinstance(cols.value_lengths, np.ndarray) and cols.value_lengths.dtype == np.int64
    assert cols.value_data.obj is not None and len(cols.value_data) == 10_000
    assert struct.calcsize("<BBBBBBBBIIq") == RECORDS_HEADER.size


def test_a_hand_made_records_batch_that_is_not_one_is_refused_at_append(tmp_path: Path) -> None:
    """A batch labelled RECORDS whose payload is not a records payload (or holds another
    number of records than `count` says) is refused at the append with
    `InvalidArgumentError`, writing nothing: stored, it would make every later scan of the
    store (Arrow, Polars, `read_records`) fail. A valid hand-made one is taken."""
    with s3stream.open(tmp_path, wal="memory://") as client:
        s = client.create_stream()
        one = encode_records([Record(value=b"a")])
        for bad in (
            RecordBatch(b"\x00not records", kind=BatchKind.RECORDS),
            RecordBatch(one, count=2, kind=BatchKind.RECORDS),
            RecordBatch(one[:-1], kind=BatchKind.RECORDS),
        ):
            with pytest.raises(InvalidArgumentError, match="must hold a records payload"):
                s.append(bad)
            with pytest.raises(InvalidArgumentError, match="must hold a records payload"):
                s.append_async(bad)
        assert s.next_offset == 0
        s.append(RecordBatch(one, kind=BatchKind.RECORDS))
        s.append_records([Record(value=b"b")])
        client.flush()
        assert [r.value for _, r in s.read_records(0)] == [b"a", b"b"]


def test_a_verified_records_batch_changed_since_is_checked_again(tmp_path: Path) -> None:
    """`records_batch` marks its batch as a records payload of `count` records; a copy with
    another payload or count (`dataclasses.replace`) is decoded at the append like any
    hand-made RECORDS batch."""
    import dataclasses

    good = records_batch([Record(value=b"a")])
    assert good.records_verified()
    with s3stream.open(tmp_path, wal="memory://") as client:
        s = client.create_stream()
        for bad in (
            dataclasses.replace(good, payload=b"\x00not records"),
            dataclasses.replace(good, count=2),
        ):
            assert not bad.records_verified()
            with pytest.raises(InvalidArgumentError, match="must hold a records payload"):
                s.append(bad)
        s.append(good)
        assert s.next_offset == 1
