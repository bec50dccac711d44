"""Seek by time: `Stream.offset_for_timestamp`, `StreamReader.offset_for_timestamp` and the
Spark options over it, against a model of every offset's timestamp; across many objects, in
the LogCache tail, after compaction, on objects without a time-range table, and the GETs a
call costs."""

from __future__ import annotations

import random
import struct
from typing import Any

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import s3stream
from s3stream import (
    ClientSettings,
    CompactionSettings,
    InvalidArgumentError,
    Record,
    RecordBatch,
    StreamClient,
)
from s3stream.format.objects import FOOTER_SIZE, read_index
from s3stream.format.timestamps import offset_timestamps, time_range
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.reader import StreamReader
from s3stream.records import NO_TIMESTAMP, decode_columns, decode_timestamps, encode_records
from s3stream.types import BatchKind
from s3stream.wal.memory import MemoryWal

KiB = 1024
T0 = 1_700_000_000_000


class CountingStore(MemoryObjectStore):
    """A memory store that counts GETs of data objects: index reads (a range ending at the
    object's end) apart from block reads."""

    def __init__(self) -> None:
        super().__init__()
        self.index_gets = 0
        self.block_gets = 0

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = super().get(key, start, end)
        if key.endswith(".s3o"):
            size = len(super().get(key))
            if end is None or end >= size:
                self.index_gets += 1
            else:
                self.block_gets += 1
        return data

    def get_suffix(self, key: str, length: int) -> bytes:
        if key.endswith(".s3o"):
            self.index_gets += 1
        return super().get_suffix(key, length)

    def reset(self) -> None:
        self.index_gets = self.block_gets = 0


def small_settings(**kw: Any) -> ClientSettings:
    """Uploads only on flush (each flush: one object), small blocks, nothing kept in the
    LogCache once uploaded (so committed offsets are searched in objects)."""
    compaction = CompactionSettings(
        deletion_delay_ms=0,
        stream_set_split_bytes=16 * KiB,
        stream_object_target_bytes=64 * KiB,
        orphan_sweep_interval_ms=0,
    )
    defaults: dict[str, Any] = {
        "upload_threshold_bytes": 1 << 20,
        "stream_split_bytes": 1 << 20,
        "block_target_bytes": 256,
        "upload_interval_ms": 600_000,
        "log_cache_bytes": 0,
        "compaction": compaction,
    }
    return ClientSettings(**{**defaults, **kw})


def client_on(store: MemoryObjectStore, **kw: Any) -> StreamClient:
    return StreamClient(store, MemoryWal(), node_id="n1", settings=small_settings(**kw))


class Model:
    """The timestamp of every offset of a stream, as appended (the documented rule)."""

    def __init__(self) -> None:
        self.stamps: list[int] = []

    def append(self, stream: s3stream.Stream, batch: RecordBatch) -> None:
        result = stream.append(batch)
        assert result.base_offset == len(self.stamps)
        assert batch.base_timestamp is not None
        if batch.kind is BatchKind.RAW:
            self.stamps += [batch.base_timestamp] * batch.count
        else:
            own = decode_columns(batch.payload).timestamps.tolist()
            self.stamps += [batch.base_timestamp if t == NO_TIMESTAMP else t for t in own]

    def answer(self, ts: int, start: int = 0) -> int | None:
        for off in range(start, len(self.stamps)):
            if self.stamps[off] >= ts:
                return off
        return None

    def probes(self, rng: random.Random, n: int) -> list[int]:
        lo, hi = min(self.stamps), max(self.stamps)
        picks = [rng.randint(lo - 5, hi + 5) for _ in range(n)]
        return [lo - 1000, lo, hi, hi + 1, *picks, *rng.sample(self.stamps, min(n, 20))]


def records_batch(stamps: list[int | None], base: int, *, zstd: bool = False) -> RecordBatch:
    payload = encode_records(
        [Record(b"v%d" % i, timestamp=t) for i, t in enumerate(stamps)],
        compression="zstd" if zstd else "none",
    )
    return RecordBatch(payload, count=len(stamps), base_timestamp=base, kind=BatchKind.RECORDS)


def fill(
    client: StreamClient,
    stream: s3stream.Stream,
    model: Model,
    rng: random.Random,
    *,
    batches: int,
    flush_every: int,
    monotonic: bool = True,
) -> None:
    """`batches` batches of both kinds (records with all, some or no own timestamps; raw
    batches of several offsets), a flush (one object) every `flush_every`."""
    t = model.stamps[-1] if model.stamps else T0
    for i in range(batches):
        t += rng.randint(0, 40)
        step = (lambda: rng.randint(0, 15)) if monotonic else (lambda: rng.randint(-3000, 3000))
        kind = rng.random()
        if kind < 0.2:
            batch = RecordBatch(b"raw-%d" % i, count=rng.randint(1, 4), base_timestamp=t)
        else:
            n = rng.randint(1, 6)
            stamps: list[int | None] = []
            for _ in range(n):
                t += step() if monotonic else 0
                stamps.append(None if kind < 0.35 else t + (0 if monotonic else step()))
            batch = records_batch(stamps, t, zstd=rng.random() < 0.3)
        model.append(stream, batch)
        if (i + 1) % flush_every == 0:
            client.flush()


def rewrite_without_time_tables(store: MemoryObjectStore) -> int:
    """Clear the time-range flag of every data object, as objects written before the table
    existed look (the table stays behind as a gap, which such readers ignore)."""
    n = 0
    for info in list(store.list("")):
        if not info.key.endswith(".s3o"):
            continue
        data = bytearray(store.get(info.key))
        struct.pack_into("<H", data, len(data) - 14, 0)
        struct.pack_into("<I", data, len(data) - 12, crc32c.crc32c(data[-FOOTER_SIZE:][:28]))
        store.put(info.key, bytes(data))
        n += 1
    return n


def data_objects(client: StreamClient, stream_id: int) -> list[str]:
    return [o.key for o in client.metadata.state.objects_for(stream_id, 0)]


# ---------------------------------------------------------------------------------------------
# The rule


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(
        st.one_of(st.none(), st.integers(-(2**62), 2**62), st.integers(T0, T0 + 10**6)),
        min_size=1,
        max_size=20,
    ),
    st.integers(-(2**62), 2**62),
    st.booleans(),
)
def test_partial_timestamp_decode_matches_the_full_one(
    stamps: list[int | None], base: int, zstd: bool
) -> None:
    payload = encode_records(
        [Record(b"x" * 50, timestamp=t) for t in stamps], compression=("zstd" if zstd else "none")
    )
    n = len(stamps)
    full = decode_columns(payload, expected_count=n).timestamps
    partial = decode_timestamps(payload, expected_count=n)
    if all(t is None for t in stamps):
        assert partial is None and (full == NO_TIMESTAMP).all()
    else:
        assert partial is not None and np.array_equal(partial, full)
    resolved = offset_timestamps(int(BatchKind.RECORDS), n, base, payload)
    want = [base if t is None else t for t in stamps]
    if all(t is None for t in stamps):
        assert resolved is None
    else:
        assert resolved is not None and resolved.tolist() == want
    assert time_range(int(BatchKind.RECORDS), n, base, payload) == (min(want), max(want))
    # Not a records payload (or the wrong count): every offset has the base timestamp.
    assert offset_timestamps(int(BatchKind.RECORDS), n + 1, base, payload) is None
    assert offset_timestamps(int(BatchKind.RECORDS), 1, base, b"junk") is None
    assert offset_timestamps(int(BatchKind.RAW), n, base, payload) is None


def test_unreadable_timestamps_count_as_the_base_timestamp() -> None:
    top = 2**63 - 1
    payload = bytearray(
        encode_records([Record(b"a", timestamp=top - 5), Record(b"b", timestamp=top)])
    )
    assert decode_timestamps(bytes(payload), expected_count=2) is not None
    struct.pack_into("<I", payload, 24, 0xFFFF_FFFF)  # a delta past the largest i64
    for decode in (decode_timestamps, decode_columns):
        with pytest.raises(s3stream.CorruptionError, match="overflows"):
            decode(bytes(payload), expected_count=2, location="x")
    assert offset_timestamps(int(BatchKind.RECORDS), 2, 7, bytes(payload)) is None
    assert time_range(int(BatchKind.RECORDS), 2, 7, bytes(payload)) == (7, 7)
    for bad in (b"", bytes([2]) + bytes(payload[1:]), bytes(payload[:30])):
        with pytest.raises(s3stream.CorruptionError):
            decode_timestamps(bad, expected_count=2)
        assert time_range(int(BatchKind.RECORDS), 2, 7, bad) == (7, 7)


# ---------------------------------------------------------------------------------------------
# The in-process stream: objects and the LogCache tail


def test_seek_across_many_objects_and_the_log_cache_tail() -> None:
    rng = random.Random(1)
    store = MemoryObjectStore()
    with client_on(store) as client:
        stream = client.create_stream()
        model = Model()
        fill(client, stream, model, rng, batches=300, flush_every=10)
        committed = stream.confirm_offset
        assert len(data_objects(client, stream.stream_id)) >= 25
        # Appended after the last flush: in the LogCache only.
        fill(client, stream, model, rng, batches=25, flush_every=10**9)
        assert stream.confirm_offset > committed
        assert client.stream_info(stream.stream_id).end_offset == committed
        probes = model.probes(rng, 150)
        probes += [model.stamps[o] for o in range(committed, len(model.stamps), 3)]
        for ts in probes:
            assert stream.offset_for_timestamp(ts) == model.answer(ts), ts
        # The tail answers come from the LogCache: past the committed end.
        tail_ts = model.stamps[-1]
        assert stream.offset_for_timestamp(tail_ts) == model.answer(tail_ts)
        assert model.answer(tail_ts) is not None and model.answer(tail_ts) >= committed
        # A reader sees the committed part only.
        with StreamReader(store) as reader:
            for ts in probes:
                want = model.answer(ts)
                got = reader.offset_for_timestamp(stream.stream_id, ts)
                assert got == (want if want is not None and want < committed else None), ts


def test_before_the_start_past_the_end_and_after_a_trim() -> None:
    store = MemoryObjectStore()
    with client_on(store) as client:
        stream = client.create_stream()
        assert stream.offset_for_timestamp(0) is None  # an empty stream
        model = Model()
        fill(client, stream, model, random.Random(2), batches=60, flush_every=6)
        first, last = min(model.stamps), max(model.stamps)
        assert stream.offset_for_timestamp(first - 10**9) == 0
        assert stream.offset_for_timestamp(-(2**63)) == 0
        assert stream.offset_for_timestamp(last + 1) is None
        assert stream.offset_for_timestamp(2**63 - 1) is None
        assert stream.offset_for_timestamp(last) == model.answer(last)
        # After a trim the start moves: an early time finds the new start offset.
        stream.trim(37)
        assert stream.offset_for_timestamp(first - 1) == 37
        assert stream.offset_for_timestamp(model.stamps[40]) == model.answer(model.stamps[40], 37)
        with StreamReader(store) as reader:
            assert reader.offset_for_timestamp(stream.stream_id, first - 1) == 37


def test_timestamps_out_of_order_give_the_first_offset_that_qualifies() -> None:
    rng = random.Random(3)
    store = MemoryObjectStore()
    with client_on(store) as client:
        stream = client.create_stream()
        model = Model()
        fill(client, stream, model, rng, batches=120, flush_every=8, monotonic=False)
        # An old record far along, a new one early: neither fools the search.
        model.append(stream, records_batch([T0 - 10**6, T0 + 10**7], T0))
        client.flush()
        fill(client, stream, model, rng, batches=20, flush_every=10**9, monotonic=False)
        assert model.stamps != sorted(model.stamps)
        with StreamReader(store) as reader:
            committed = client.stream_info(stream.stream_id).end_offset
            for ts in [*model.probes(rng, 120), T0 + 10**7]:
                want = model.answer(ts)
                assert stream.offset_for_timestamp(ts) == want, ts
                got = reader.offset_for_timestamp(stream.stream_id, ts)
                assert got == (want if want is not None and want < committed else None), ts


def test_bad_arguments() -> None:
    with client_on(MemoryObjectStore()) as client:
        stream = client.create_stream()
        stream.append(RecordBatch(b"x", base_timestamp=-5))  # before 1970: fine
        assert stream.offset_for_timestamp(-10) == 0 and stream.offset_for_timestamp(-5) == 0
        assert stream.offset_for_timestamp(-4) is None
        for bad in ("1000", 1.5, True, None, 2**63, -(2**63) - 1, np.int64(3)):
            with pytest.raises(InvalidArgumentError, match="ts_ms"):
                stream.offset_for_timestamp(bad)  # type: ignore[arg-type]
        client.flush()
        with StreamReader(client.object_store) as reader:
            with pytest.raises(InvalidArgumentError, match="ts_ms"):
                reader.offset_for_timestamp(stream.stream_id, "0")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match="stream_id"):
                reader.offset_for_timestamp(-1, 0)
            with pytest.raises(s3stream.StreamNotFoundError):
                reader.offset_for_timestamp(stream.stream_id + 100, 0)
        stream.close()
        with pytest.raises(s3stream.StreamClosedError):
            stream.offset_for_timestamp(0)


def test_open_reader_on_a_directory(tmp_path: Any) -> None:
    model = Model()
    with s3stream.open(tmp_path, settings=small_settings()) as client:
        stream = client.create_stream()
        fill(client, stream, model, random.Random(7), batches=40, flush_every=5)
        client.flush()
        sid = stream.stream_id
    with s3stream.open_reader(tmp_path) as reader:
        for ts in model.probes(random.Random(8), 30):
            assert reader.offset_for_timestamp(sid, ts) == model.answer(ts), ts


# ---------------------------------------------------------------------------------------------
# Compaction, and objects without a time-range table


@pytest.mark.parametrize("old_objects", [False, True])
def test_compaction_keeps_the_answers(old_objects: bool) -> None:
    rng = random.Random(4)
    store = MemoryObjectStore()
    with client_on(store) as client:
        streams = [client.create_stream() for _ in range(2)]
        models = [Model(), Model()]
        for _ in range(12):
            for s, m in zip(streams, models, strict=True):
                fill(client, s, m, rng, batches=6, flush_every=10**9)
            client.flush()
        if old_objects:
            assert rewrite_without_time_tables(store) >= 12
        probes = {s.stream_id: m.probes(rng, 60) for s, m in zip(streams, models, strict=True)}
        before = {
            sid: [s.offset_for_timestamp(ts) for ts in probes[sid]]
            for sid, s in ((s.stream_id, s) for s in streams)
        }
        keys_before = set(data_objects(client, streams[0].stream_id))
        report = client.compact()
        assert report is not None
        keys_after = set(data_objects(client, streams[0].stream_id))
        assert keys_after and not keys_after & keys_before  # all replaced
        for key in keys_after:
            index = read_index(store, key)
            assert index.has_time_ranges  # also those copied from old objects
        for s, m in zip(streams, models, strict=True):
            after = [s.offset_for_timestamp(ts) for ts in probes[s.stream_id]]
            assert after == before[s.stream_id] == [m.answer(ts) for ts in probes[s.stream_id]]
        with StreamReader(store) as reader:
            for s in streams:
                got = [reader.offset_for_timestamp(s.stream_id, ts) for ts in probes[s.stream_id]]
                assert got == before[s.stream_id]


# ---------------------------------------------------------------------------------------------
# What a call costs


def test_gets_per_call() -> None:
    rng = random.Random(5)
    store = CountingStore()
    with client_on(store) as client:
        stream = client.create_stream()
        model = Model()
        fill(client, stream, model, rng, batches=200, flush_every=10)
        sid = stream.stream_id
        objects = client.metadata.state.objects_for(sid, 0)
        assert len(objects) == 20
        n_blocks = sum(len(read_index(store, o.key).find(sid, 0)) for o in objects)
        assert n_blocks > 2 * len(objects)  # so that skipping blocks shows
        probes = model.probes(rng, 40)

    # A cold reader: the metadata's time ranges name the object holding the answer, so one
    # index (none past the end) and one block at most.
    for ts in [*probes, max(model.stamps) + 1]:
        store.reset()
        with StreamReader(store) as reader:
            answer = reader.offset_for_timestamp(sid, ts)
            assert answer == model.answer(ts)
            assert store.index_gets == (0 if answer is None else 1), ts
            assert store.block_gets <= 1, ts
    # A warm one: indexes cached, so one block GET at most per call, none for a block it has.
    with StreamReader(store) as reader:
        for ts in probes:
            reader.offset_for_timestamp(sid, ts)  # caches the indexes the probes need
        for ts in probes:
            store.reset()
            assert reader.offset_for_timestamp(sid, ts) == model.answer(ts)
            assert (store.index_gets, store.block_gets <= 1) == (0, True), ts
        store.reset()
        reader.offset_for_timestamp(sid, probes[-1])
        assert (store.index_gets, store.block_gets) == (0, 0)
    # Through the client's metrics: the owning client pays one index (until cached) and one
    # block GET at most per call.
    with client_on(store) as client:
        s = client.open_stream(sid)
        for ts in probes:
            gets = client.metrics.object_store.gets
            assert s.offset_for_timestamp(ts) == model.answer(ts)
            assert client.metrics.object_store.gets - gets <= 2, ts
        # Objects without a time-range table: each block visited is read (the fallback).
        rewrite_without_time_tables(store)
    last = max(model.stamps)
    answer = model.answer(last)
    assert answer is not None
    # The metadata's time ranges still name the object; in it, every block up to the answer.
    holder = next(
        o
        for o in objects
        if (r := o.range_of(sid)) is not None and r.max_timestamp is not None
        and r.max_timestamp >= last
    )  # fmt: skip
    upto = sum(1 for b in read_index(store, holder.key).find(sid, 0) if b.start_offset <= answer)
    assert upto > 1
    store.reset()
    with StreamReader(store) as reader:
        assert reader.offset_for_timestamp(sid, last) == answer
        assert (store.index_gets, store.block_gets) == (1, upto)


# ---------------------------------------------------------------------------------------------
# Spark options: the same lookup


def test_spark_options_use_the_same_lookup() -> None:
    pytest.importorskip("pyspark")
    from s3stream.spark.options import parse_options
    from s3stream.spark.planning import IndexReader, resolve_offsets, select_streams

    rng = random.Random(6)
    store = MemoryObjectStore()
    with client_on(store) as client:
        stream = client.create_stream()
        model = Model()
        fill(client, stream, model, rng, batches=80, flush_every=8)
        client.flush()
        end = stream.confirm_offset
    reader = StreamReader(store)
    state = reader.snapshot()
    streams = select_streams(state, parse_options({"path": "x"}, streaming=False))
    lo, hi = sorted(rng.sample(model.stamps, 2))

    def targets(**options: str) -> tuple[int, int]:
        opts = parse_options({"path": "x", **options}, streaming=False)
        (t,) = resolve_offsets(state, store, IndexReader(store), streams, opts, with_ending=True)
        return t.start_offset, t.end_offset

    want_start, want_end = model.answer(lo), model.answer(hi)
    assert want_start is not None and want_end is not None
    assert reader.offset_for_timestamp(stream.stream_id, lo) == want_start
    assert targets(startingTimestamp=str(lo)) == (want_start, end)
    assert targets(endingTimestamp=str(hi)) == (0, want_end)
    assert targets(startingTimestamp=str(lo), endingTimestamp=str(hi)) == (want_start, want_end)
    late = str(max(model.stamps) + 1)
    assert targets(startingTimestamp=late) == (end, end)
    assert targets(endingTimestamp=late) == (0, end)
    for options, match in [
        ({"endingTimestamp": "5", "endingOffsets": "latest"}, "conflict"),
        ({"startingTimestamp": "9", "endingTimestamp": "5"}, "below startingTimestamp"),
        ({"endingTimestamp": "soon"}, "endingTimestamp"),
        ({"endingTimestamp": str(2**63)}, "endingTimestamp"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            parse_options({"path": "x", **options}, streaming=False)
    with pytest.raises(InvalidArgumentError, match="streaming"):
        parse_options({"path": "x", "endingTimestamp": "5"}, streaming=True)
    reader.close()
