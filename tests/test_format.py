"""Object format: golden files, round trips, index search, corruption and request counts."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import struct
import types
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import s3stream.format as fmt
from s3stream.errors import CorruptionError, InvalidArgumentError, StreamClosedError
from s3stream.format import (
    DEFAULT_TAIL_READ_BYTES,
    FOOTER_SIZE,
    FORMAT_VERSION,
    INDEX_ENTRY_SIZE,
    MAGIC,
    BlockInfo,
    ObjectIndex,
    ObjectWriter,
    coalesce,
    decode_block,
    encode_batch,
    parse_tail,
    read_blocks,
    read_index,
)
from s3stream.format.objects import FLAG_TIME_RANGES, TIME_ENTRY_SIZE, time_table_size
from s3stream.format.timestamps import time_range
from s3stream.objectstore.base import ObjectInfo
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.records import Record, encode_records
from s3stream.types import BatchKind, FetchedBatch

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_NAMES = ["plain", "zstd", "big_offsets", "empty"]
# (generation, name): v1 = version 1 without a time-range table, v1t = with one.
GOLDEN_FILES = [("v1", n) for n in GOLDEN_NAMES] + [("v1t", n) for n in [*GOLDEN_NAMES, "records"]]
KEY = "objects/test.s3o"


class CountingStore(MemoryObjectStore):
    """A real in-memory store that counts the requests a reader makes."""

    def __init__(self) -> None:
        super().__init__()
        self.gets: list[tuple[int, int | None]] = []
        self.suffix_gets = 0
        self.heads = 0

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self.gets.append((start, end))
        return super().get(key, start, end)

    def get_suffix(self, key: str, length: int) -> bytes:
        self.suffix_gets += 1
        return super().get_suffix(key, length)

    def head(self, key: str) -> ObjectInfo | None:
        self.heads += 1
        return super().head(key)

    @property
    def requests(self) -> int:
        return len(self.gets) + self.suffix_gets + self.heads

    def reset_counts(self) -> None:
        self.gets.clear()
        self.suffix_gets = 0
        self.heads = 0


def fetched(sid: int, off: int, count: int, payload: bytes, **kw: Any) -> FetchedBatch:
    return FetchedBatch(
        sid,
        off,
        count,
        payload,
        kw.get("ts", 1000 + off),
        kw.get("props", {}),
        BatchKind(kw.get("kind", 0)),
    )


def write(batches: list[FetchedBatch], **writer_kw: Any) -> bytes:
    w = ObjectWriter(**writer_kw)
    for b in batches:
        w.add_fetched(b)
    return w.finish()


def stored(data: bytes) -> CountingStore:
    store = CountingStore()
    store.put(KEY, data)
    return store


def sample_batches(rng: random.Random, streams: dict[int, int], n: int) -> list[FetchedBatch]:
    """`n` batches over `streams` (id -> first offset), interleaved, contiguous per stream."""
    nxt = dict(streams)
    out = []
    for i in range(n):
        sid = rng.choice(sorted(nxt))
        count = rng.randint(1, 4)
        payload = rng.randbytes(rng.randint(0, 200))
        out.append(fetched(sid, nxt[sid], count, payload, ts=rng.randint(-5, 5) + i))
        nxt[sid] += count
    return out


def by_stream(batches: list[FetchedBatch]) -> list[FetchedBatch]:
    return sorted(batches, key=lambda b: (b.stream_id, b.base_offset))


# ---------------------------------------------------------------------------------------------
# Golden files: these bytes must keep decoding forever.


def load_golden(name: str, generation: str = "v1") -> tuple[bytes, dict[str, Any]]:
    data = (GOLDEN / f"{generation}_{name}.s3o").read_bytes()
    meta = json.loads((GOLDEN / f"{generation}_{name}.json").read_text())
    return data, meta


def golden_batches(meta: dict[str, Any]) -> list[FetchedBatch]:
    out = []
    for b in meta["batches"]:
        payload = bytes.fromhex(b["payload_hex"])
        assert hashlib.sha256(payload).hexdigest() == b["payload_sha256"]
        out.append(
            FetchedBatch(
                b["stream_id"],
                b["base_offset"],
                b["count"],
                payload,
                b["base_timestamp"],
                b["properties"],
                BatchKind(b["kind"]),
            )
        )
    return out


@pytest.mark.parametrize(("generation", "name"), GOLDEN_FILES)
def test_golden_file_decodes(generation: str, name: str) -> None:
    data, meta = load_golden(name, generation)
    assert hashlib.sha256(data).hexdigest() == meta["object_sha256"]
    assert len(data) == meta["object_size"]
    assert meta["format_version"] == 1
    assert struct.unpack_from("<H", data, len(data) - 14)[0] == meta.get("footer_flags", 0)
    store = stored(data)
    index = read_index(store, KEY)
    assert store.requests == 1
    assert index.has_time_ranges is (generation == "v1t" or not index.blocks)
    assert [
        {
            "stream_id": b.stream_id,
            "start_offset": b.start_offset,
            "end_offset": b.end_offset,
            "position": b.position,
            "stored_size": b.stored_size,
            "raw_size": b.raw_size,
            "batch_count": b.batch_count,
            "first_timestamp": b.first_timestamp,
            "max_timestamp": b.max_timestamp,
            "compressed": b.compressed,
            "crc": b.crc,
            **({"time_range": list(b.time_range)} if b.time_range is not None else {}),
        }
        for b in index.blocks
    ] == meta["blocks"]
    expected = by_stream(golden_batches(meta))
    got = read_blocks(store, KEY, index.blocks)
    assert got == expected
    assert [dict(b.properties) for b in got] == [dict(b.properties) for b in expected]
    for sid in index.stream_ids():
        from_find = read_blocks(store, KEY, index.find(sid, 0))
        assert from_find == [b for b in expected if b.stream_id == sid]


def test_golden_files_cover_the_features() -> None:
    kinds, props, compressed, raw_in_zstd, big, negative_ts = (
        set(),
        False,
        False,
        False,
        False,
        False,
    )
    for name in GOLDEN_NAMES:
        _, meta = load_golden(name)
        for b in meta["batches"]:
            kinds.add(b["kind"])
            props |= bool(b["properties"])
            big |= b["base_offset"] + b["count"] > 2**32
            negative_ts |= b["base_timestamp"] < 0
        for blk in meta["blocks"]:
            compressed |= blk["compressed"]
            raw_in_zstd |= meta["writer"]["compression"] == "zstd" and not blk["compressed"]
    assert kinds == {0, 1} and props and compressed and raw_in_zstd and big and negative_ts


@pytest.mark.parametrize("name", ["plain", "big_offsets", "empty", "records"])
def test_writer_still_produces_uncompressed_golden_bytes(name: str) -> None:
    # Catches an accidental change of the writer's layout that the reader would also accept.
    # The writer makes the newest generation; the v1 files are only read.
    data, meta = load_golden(name, "v1t")
    w = ObjectWriter(**meta["writer"])
    for b in golden_batches(meta):
        w.add(
            b.stream_id,
            b.base_offset,
            b.count,
            b.base_timestamp,
            encode_batch(
                b.stream_id,
                b.base_offset,
                b.count,
                int(b.kind),
                b.base_timestamp,
                b.properties,
                b.payload,
            ),
        )
    assert w.finish() == data


def test_golden_footer_layout() -> None:
    data, meta = load_golden("plain")
    index_pos, index_len, count, index_crc, version, flags, footer_crc, magic = struct.unpack(
        "<QQIIHHI8s", data[-FOOTER_SIZE:]
    )
    assert (magic, version, flags) == (b"S3STREAM", 1, 0)
    assert count == len(meta["blocks"]) and index_len == count * 72
    assert index_pos + index_len + 40 == len(data)
    assert crc32c.crc32c(data[index_pos : index_pos + index_len]) == index_crc
    assert crc32c.crc32c(data[-FOOTER_SIZE : -FOOTER_SIZE + 28]) == footer_crc
    assert (MAGIC, FORMAT_VERSION, FOOTER_SIZE, INDEX_ENTRY_SIZE) == (b"S3STREAM", 1, 40, 72)


def test_golden_time_table_layout() -> None:
    data, meta = load_golden("records", "v1t")
    index_pos, index_len, count, _, version, flags, _, _ = struct.unpack(
        "<QQIIHHI8s", data[-FOOTER_SIZE:]
    )
    assert (version, flags, FLAG_TIME_RANGES, TIME_ENTRY_SIZE) == (1, 0x0100, 0x0100, 16)
    assert index_pos + index_len + FOOTER_SIZE == len(data)
    table_pos = index_pos - time_table_size(count)
    assert table_pos == max(b["position"] + b["stored_size"] for b in meta["blocks"])
    entries = data[table_pos : table_pos + 16 * count]
    assert [list(e) for e in struct.iter_unpack("<qq", entries)] == [
        b["time_range"] for b in meta["blocks"]
    ]
    assert struct.unpack_from("<II", data, table_pos + 16 * count) == (
        crc32c.crc32c(entries),
        count,
    )


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_the_time_table_is_a_compatible_addition(name: str) -> None:
    # The same inputs written with and without the table: the same blocks at the same
    # positions and byte-identical index entries; the table sits in the gap between the
    # last block and the index, which version-1 readers allow.
    old, _ = load_golden(name, "v1")
    new, _ = load_golden(name, "v1t")
    old_index_pos = struct.unpack_from("<Q", old, len(old) - FOOTER_SIZE)[0]
    new_index_pos = struct.unpack_from("<Q", new, len(new) - FOOTER_SIZE)[0]
    assert new[:old_index_pos] == old[:old_index_pos]
    assert new[new_index_pos:-FOOTER_SIZE] == old[old_index_pos:-FOOTER_SIZE]
    # A reader that does not know the flag (here: the flag cleared) reads the same blocks.
    plain = rewrite(new, flags=0)
    without = read_index(stored(plain), KEY)
    with_table = read_index(stored(new), KEY)
    assert [dataclasses.replace(b, time_range=None) for b in with_table.blocks] == list(
        without.blocks
    )
    assert list(read_index(stored(old), KEY).blocks) == list(without.blocks)
    assert read_blocks(stored(plain), KEY, without.blocks) == read_blocks(
        stored(new), KEY, with_table.blocks
    )
    assert with_table.data_size == old_index_pos


# ---------------------------------------------------------------------------------------------
# Round trips


@st.composite
def objects(draw: st.DrawFn) -> tuple[list[FetchedBatch], dict[str, Any]]:
    stream_ids = draw(
        st.lists(
            st.sampled_from([0, 1, 2, 17, 2**32 + 1, 2**63, 2**64 - 1]),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    nxt = {sid: draw(st.sampled_from([0, 5, 2**31 - 1, 2**32 - 2, 2**62])) for sid in stream_ids}
    order = draw(st.lists(st.sampled_from(stream_ids), min_size=1, max_size=40))
    batches = []
    for sid in order:
        count = draw(st.integers(1, 2**20))
        payload = draw(
            st.one_of(st.binary(max_size=300), st.integers(0, 2000).map(lambda n: b"z" * n))
        )
        props = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2))
        ts = draw(st.integers(-(2**63), 2**63 - 1))
        kind = draw(st.sampled_from([0, 1]))
        batches.append(fetched(sid, nxt[sid], count, payload, ts=ts, props=props, kind=kind))
        nxt[sid] += count
    writer_kw = {
        "block_target_bytes": draw(st.integers(1, 3000)),
        "compression": draw(st.sampled_from(["none", "zstd"])),
        "zstd_level": draw(st.integers(1, 5)),
    }
    return batches, writer_kw


@settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(objects(), st.integers(FOOTER_SIZE, 4000))
def test_round_trip(case: tuple[list[FetchedBatch], dict[str, Any]], tail: int) -> None:
    batches, writer_kw = case
    w = ObjectWriter(**writer_kw)
    for b in batches:
        w.add_fetched(b)
    ranges = w.ranges()
    estimate = w.size_estimate
    data = w.finish()
    if writer_kw["compression"] == "none":
        assert estimate == len(data)
    store = stored(data)
    index = read_index(store, KEY, tail_read_bytes=tail)
    n = len(index.blocks)
    fits = time_table_size(n) + n * INDEX_ENTRY_SIZE + FOOTER_SIZE <= tail or len(data) <= tail
    assert (store.suffix_gets, len(store.gets), store.heads) == (1, 0 if fits else 1, 0)
    assert index.object_size == len(data)
    assert index.stream_ranges() == ranges
    expected = by_stream(batches)
    for sid in index.stream_ids():
        mine = [b for b in expected if b.stream_id == sid]
        blocks = index.find(sid, mine[0].base_offset)
        assert list(blocks) == [b for b in index.blocks if b.stream_id == sid]
        store.reset_counts()
        assert read_blocks(store, KEY, blocks) == mine
        assert store.requests == 1  # a stream's blocks are adjacent: one GET
        assert index.stream_bytes(sid) == sum(b.stored_size for b in blocks)
        # Each block's time range is that of the timestamps of its offsets.
        for blk in blocks:
            inside = [b for b in mine if blk.start_offset <= b.base_offset < blk.end_offset]
            ranges = [time_range(int(b.kind), b.count, b.base_timestamp, b.view) for b in inside]
            assert blk.time_range == (min(r[0] for r in ranges), max(r[1] for r in ranges))
        # Pick a batch in the middle: find must start at the block holding it.
        probe = mine[len(mine) // 2]
        got = read_blocks(store, KEY, index.find(sid, probe.last_offset, probe.last_offset + 1))
        assert probe in got
    for blk in index.blocks:
        assert blk.raw_size <= writer_kw["block_target_bytes"] or blk.batch_count == 1
        if blk.compressed:
            assert blk.stored_size < blk.raw_size


def test_blocks_close_at_target_and_big_batches_stand_alone() -> None:
    rec = 40 + 60  # header + payload
    batches = [fetched(1, i, 1, b"x" * 60) for i in range(10)]
    batches.append(fetched(1, 10, 1, b"y" * 1000))
    batches += [fetched(1, 11 + i, 1, b"x" * 60) for i in range(3)]
    data = write(batches, block_target_bytes=350)
    index = parse_tail(data, len(data), "k")
    assert isinstance(index, ObjectIndex)
    assert [(b.start_offset, b.end_offset, b.raw_size) for b in index.blocks] == [
        (0, 3, 3 * rec),
        (3, 6, 3 * rec),
        (6, 9, 3 * rec),
        (9, 10, rec),
        (10, 11, 1040),
        (11, 14, 3 * rec),
    ]
    assert index.blocks[0].record_count == 3


def test_compression_only_when_it_shrinks() -> None:
    rng = random.Random(7)
    batches = [fetched(1, 0, 1, bytes(5000)), fetched(2, 0, 1, rng.randbytes(5000))]
    data = write(batches, compression="zstd", block_target_bytes=1 << 20)
    index = read_index(stored(data), KEY)
    assert [b.compressed for b in index.blocks] == [True, False]
    assert index.blocks[0].stored_size < 200 and index.blocks[1].stored_size == 5040
    assert read_blocks(stored(data), KEY, index.blocks) == batches


def test_empty_object() -> None:
    w = ObjectWriter()
    assert w.is_empty() and w.ranges() == []
    data = w.finish()
    assert len(data) == FOOTER_SIZE + time_table_size(0) == FOOTER_SIZE + 8
    index = read_index(stored(data), KEY)
    assert list(index.blocks) == [] and index.stream_ids() == [] and index.stream_ranges() == []
    assert index.find(1, 0) == [] and index.stream_range(1) is None and index.stream_bytes(1) == 0


def test_writer_lifecycle_and_ranges() -> None:
    w = ObjectWriter()
    w.add_fetched(fetched(9, 100, 5, b"a"))
    w.add_fetched(fetched(3, 0, 1, b"b"))
    w.add_fetched(fetched(9, 105, 2, b"c"))
    assert not w.is_empty()
    assert w.ranges() == [(3, 0, 1), (9, 100, 107)]
    w.finish()
    assert w.ranges() == [(3, 0, 1), (9, 100, 107)]
    with pytest.raises(StreamClosedError):
        w.add_fetched(fetched(9, 107, 1, b"d"))
    with pytest.raises(StreamClosedError):
        w.finish()


def test_writer_rejects_bad_input() -> None:
    w = ObjectWriter()
    w.add_fetched(fetched(1, 10, 2, b"a"))
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        w.add_fetched(fetched(1, 13, 1, b"gap"))
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        w.add_fetched(fetched(1, 11, 1, b"overlap"))
    rec = encode_batch(1, 12, 1, 0, 5, {}, b"x")
    with pytest.raises(InvalidArgumentError, match="header"):
        w.add(1, 12, 2, 5, rec)  # count disagrees with the record
    with pytest.raises(InvalidArgumentError, match="header"):
        w.add(2, 12, 1, 5, rec)
    with pytest.raises(InvalidArgumentError, match="batch_record"):
        w.add(1, 12, 1, 5, rec[:-1])
    with pytest.raises(InvalidArgumentError, match="batch_record"):
        w.add(1, 12, 1, 5, b"short")
    with pytest.raises(InvalidArgumentError, match="stream_id"):
        w.add(-1, 12, 1, 5, rec)
    with pytest.raises(InvalidArgumentError, match="base_offset"):
        w.add(1, -1, 1, 5, rec)
    with pytest.raises(InvalidArgumentError, match="count"):
        w.add(1, 12, 0, 5, rec)
    w.add(1, 12, 1, 5, memoryview(rec))  # the rejected calls changed nothing
    assert w.ranges() == [(1, 10, 13)]
    with pytest.raises(InvalidArgumentError, match="compression"):
        ObjectWriter(compression="lz4")
    with pytest.raises(InvalidArgumentError, match="block_target_bytes"):
        ObjectWriter(block_target_bytes=0)
    with pytest.raises(InvalidArgumentError, match="zstd_level"):
        ObjectWriter(compression="zstd", zstd_level=99)
    with pytest.raises(InvalidArgumentError, match="max_gap_bytes"):
        coalesce([], max_gap_bytes=-1)
    with pytest.raises(InvalidArgumentError, match="tail_read_bytes"):
        read_index(MemoryObjectStore(), KEY, tail_read_bytes=FOOTER_SIZE - 1)


# ---------------------------------------------------------------------------------------------
# Index search


def test_find_at_every_offset() -> None:
    rng = random.Random(11)
    batches = sample_batches(rng, {4: 0, 8: 2**32 - 20, 2**64 - 1: 2**62}, 120)
    data = write(batches, block_target_bytes=400)
    index = read_index(stored(data), KEY)
    for sid, start, end in index.stream_ranges():
        mine = [b for b in index.blocks if b.stream_id == sid]
        assert len(mine) > 3
        for lo in range(start - 2, end + 2):
            for hi in [None, *range(lo - 1, min(lo + 40, end + 3))]:
                expected = [
                    b
                    for b in mine
                    if b.end_offset > lo and (hi is None or (b.start_offset < hi and lo < hi))
                ]
                assert index.find(sid, lo, hi) == expected, (sid, lo, hi)
        assert index.stream_range(sid) == (start, end)
    assert index.find(5, 0) == []
    assert index.stream_range(5) is None


def test_find_first_block_may_begin_before_start() -> None:
    batches = [fetched(1, 0, 10, b"a" * 100), fetched(1, 10, 10, b"b" * 100)]
    index = read_index(stored(write(batches, block_target_bytes=100)), KEY)
    (blk,) = index.find(1, 15, 16)
    assert (blk.start_offset, blk.end_offset) == (10, 20)


# ---------------------------------------------------------------------------------------------
# Request counts


def test_one_request_when_index_fits_the_tail() -> None:
    batches = sample_batches(random.Random(3), {1: 0, 2: 0}, 50)
    data = write(batches, block_target_bytes=300)
    store = stored(data)
    read_index(store, KEY)
    assert (store.suffix_gets, store.gets, store.heads) == (1, [], 0)
    store.reset_counts()
    read_index(store, KEY, object_size=len(data))
    assert (store.suffix_gets, store.gets, store.heads) == (0, [(0, len(data))], 0)


def test_large_index_needs_exactly_two_gets() -> None:
    # One block per batch: 1200 entries of 72 + 16 bytes do not fit a 64 KiB tail.
    batches = [fetched(i % 3, i // 3, 1, b"p") for i in range(1200)]
    data = write(batches, block_target_bytes=1)
    index_len = 1200 * INDEX_ENTRY_SIZE + time_table_size(1200)
    assert index_len + FOOTER_SIZE > DEFAULT_TAIL_READ_BYTES
    store = stored(data)
    index = read_index(store, KEY)
    assert len(index.blocks) == 1200
    assert store.suffix_gets == 1 and store.heads == 0 and len(store.gets) == 1
    start, end = store.gets[0]
    assert start == len(data) - index_len - FOOTER_SIZE
    assert end == len(data) - DEFAULT_TAIL_READ_BYTES
    store.reset_counts()
    index2 = read_index(store, KEY, object_size=len(data), tail_read_bytes=FOOTER_SIZE)
    assert store.requests == 2 and index2.blocks == index.blocks
    assert parse_tail(data[-DEFAULT_TAIL_READ_BYTES:], len(data), KEY) == index_len + FOOTER_SIZE
    assert parse_tail(data[-10:], len(data), KEY) == FOOTER_SIZE


def test_adjacent_blocks_merge_into_one_get() -> None:
    batches = sample_batches(random.Random(5), {1: 0, 2: 0, 3: 0}, 90)
    data = write(batches, block_target_bytes=300)
    store = stored(data)
    index = read_index(store, KEY)
    b1, b3 = index.find(1, 0), index.find(3, 0)
    store.reset_counts()
    got = read_blocks(store, KEY, [*b1, *b3])
    assert got == [b for b in by_stream(batches) if b.stream_id in (1, 3)]
    assert len(store.gets) == 2  # stream 2 lies between them
    assert len(coalesce([*b1, *b3])) == 2
    gap = index.stream_bytes(2)
    assert len(coalesce([*b1, *b3], max_gap_bytes=gap)) == 1
    assert len(coalesce([*b1, *b3], max_gap_bytes=gap - 1)) == 2
    # Out of order: each block its own GET, batches in the given order.
    store.reset_counts()
    rev = list(reversed(b1))
    got = read_blocks(store, KEY, rev)
    assert len(store.gets) == len(b1)
    assert [b.base_offset for b in got] == [
        b.base_offset
        for blk in rev
        for b in decode_block(data[blk.position : blk.end_position], blk, KEY)
    ]


# ---------------------------------------------------------------------------------------------
# Corruption: every flipped byte is detected, named by object and position, never garbage.


def corrupted_object() -> tuple[bytes, list[FetchedBatch]]:
    rng = random.Random(9)
    batches = sample_batches(rng, {1: 0, 2: 2**40}, 12)
    batches += [fetched(3, 0, 1, b"compress me " * 40, props={"a": "b"})]
    batches += [fetched(4, 0, 1, rng.randbytes(3000))]  # incompressible: stored raw
    return write(batches, block_target_bytes=400, compression="zstd"), batches


def read_everything(store: CountingStore, **kw: Any) -> list[FetchedBatch]:
    index = read_index(store, KEY, **kw)
    return read_blocks(store, KEY, index.blocks)


@pytest.mark.parametrize("known_size", [False, True])
def test_every_flipped_byte_is_detected(known_size: bool) -> None:
    data, batches = corrupted_object()
    index = parse_tail(data, len(data), KEY)
    assert isinstance(index, ObjectIndex)
    assert any(b.compressed for b in index.blocks) and any(not b.compressed for b in index.blocks)
    index_pos = len(data) - FOOTER_SIZE - len(index.blocks) * INDEX_ENTRY_SIZE
    table_pos = index_pos - time_table_size(len(index.blocks))
    assert index.data_size == table_pos
    assert read_everything(stored(data)) == by_stream(batches)
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x10
        kw = {"object_size": len(data)} if known_size else {}
        with pytest.raises(CorruptionError) as err:
            read_everything(stored(bytes(bad)), **kw)
        e = err.value
        assert e.location == KEY and KEY in str(e)
        assert e.position is not None and str(e.position) in str(e)
        if i >= len(data) - FOOTER_SIZE:
            assert e.position >= len(data) - FOOTER_SIZE, i
        elif i >= index_pos:
            assert e.position == index_pos, i
        elif i >= table_pos:
            assert e.position == table_pos, i
        else:
            (blk,) = [b for b in index.blocks if b.position <= i < b.end_position]
            assert e.position == blk.position, i


def test_truncated_objects() -> None:
    data, _ = corrupted_object()
    for cut in (1, 7, FOOTER_SIZE, 500, len(data) - 1):
        store = stored(data[:-cut])
        with pytest.raises(CorruptionError) as err:
            read_everything(store)
        assert err.value.location == KEY
        # Metadata says the object is bigger than what is stored: the error names where the
        # stored bytes end (it said a negative byte for objects smaller than the tail read).
        with pytest.raises(CorruptionError, match="shorter than expected") as short:
            read_index(store, KEY, object_size=len(data))
        assert short.value.position == len(data) - cut
    index = read_index(stored(data), KEY)
    short = stored(data[: index.blocks[-1].position + 1])
    with pytest.raises(CorruptionError, match="ends before"):
        read_blocks(short, KEY, index.blocks[-1:])


def rewrite(data: bytes, entries: list[tuple[Any, ...]] | None = None, **footer: int) -> bytes:
    """Rebuild index and footer with valid CRCs, to reach the structural checks."""
    index_pos, _, _, _, version, flags, _, magic = struct.unpack("<QQIIHHI8s", data[-FOOTER_SIZE:])
    if entries is None:
        raw = data[index_pos : len(data) - FOOTER_SIZE]
        entries = list(struct.iter_unpack("<QqqQIIIIqqB7x", raw))
    index = b"".join(struct.pack("<QqqQIIIIqqB7x", *e) for e in entries)
    head = struct.pack(
        "<QQIIHH",
        index_pos,
        len(index),
        footer.get("count", len(entries)),
        crc32c.crc32c(index),
        footer.get("version", version),
        footer.get("flags", flags),
    )
    return b"".join((data[:index_pos], index, head, struct.pack("<I", crc32c.crc32c(head)), magic))


def entry_list(data: bytes) -> list[list[Any]]:
    index_pos = struct.unpack_from("<Q", data, len(data) - FOOTER_SIZE)[0]
    raw = data[index_pos : len(data) - FOOTER_SIZE]
    return [list(e) for e in struct.iter_unpack("<QqqQIIIIqqB7x", raw)]


def test_structural_checks_behind_valid_crcs() -> None:
    data, _ = corrupted_object()
    assert rewrite(data) == data  # the helper itself is faithful

    def assert_corrupt(bad: bytes, match: str) -> None:
        with pytest.raises(CorruptionError, match=match) as err:
            read_everything(stored(bad))
        assert err.value.location == KEY and err.value.position is not None

    assert_corrupt(rewrite(data, version=2), "version 2")
    assert_corrupt(rewrite(data, flags=0x0101), "footer flags")
    assert read_everything(stored(rewrite(data, flags=0x0300)))  # unknown compatible bit: ignored
    assert_corrupt(rewrite(data, count=3), "footer places")
    # The time-range table: checked by its own crc, then entry by entry.
    index_pos = struct.unpack_from("<Q", data, len(data) - FOOTER_SIZE)[0]
    n = len(entry_list(data))
    table_pos = index_pos - time_table_size(n)

    def with_table(entries: list[tuple[int, int]], count: int = n) -> bytes:
        raw = b"".join(struct.pack("<qq", *e) for e in entries)
        table = raw + struct.pack("<II", crc32c.crc32c(raw), count)
        return data[:table_pos] + table + data[index_pos:]

    times = [tuple(e) for e in struct.iter_unpack("<qq", data[table_pos : table_pos + 16 * n])]
    assert with_table(times) == data  # faithful
    assert_corrupt(with_table(times, count=n + 1), "time-range table has")
    assert_corrupt(with_table([(5, 4), *times[1:]]), "min 5 above max 4")
    # Without the flag the table is just a gap: no time ranges, blocks as before.
    assert not read_index(stored(rewrite(data, flags=0)), KEY).has_time_ranges

    def mutate(i: int, field: int, value: Any, match: str) -> None:
        entries = entry_list(data)
        entries[i][field] = value
        assert_corrupt(rewrite(data, [tuple(e) for e in entries]), match)

    mutate(0, 10, 0x80, "block flags")
    mutate(1, 1, 0, "out of order|gap")
    mutate(0, 2, 0, "offset range")
    mutate(1, 3, 0, "overlaps")
    mutate(0, 6, 0, "batch count")
    mutate(0, 9, -(2**63), "max_timestamp")
    entries = entry_list(data)
    entries[0], entries[1] = entries[1], entries[0]
    entries[0][3], entries[1][3] = entries[1][3], entries[0][3]  # positions stay ascending
    entries[0][4], entries[1][4] = entries[1][4], entries[0][4]
    assert_corrupt(rewrite(data, [tuple(e) for e in entries]), "out of order")
    entries = entry_list(data)
    uncompressed = next(i for i, e in enumerate(entries) if not e[10])
    entries[uncompressed][5] += 1
    assert_corrupt(rewrite(data, [tuple(e) for e in entries]), "sizes")


def test_decode_block_checks_coverage_behind_valid_crc() -> None:
    data, _ = corrupted_object()
    index = read_index(stored(data), KEY)
    plain = next(b for b in index.blocks if not b.compressed)
    packed = next(b for b in index.blocks if b.compressed)
    raw = data[plain.position : plain.end_position]
    decode_block(raw, plain, KEY)  # intact
    fields = {f: getattr(plain, f) for f in BlockInfo.__slots__}
    for change, match in [
        ({"end_offset": plain.end_offset + 1}, "holds"),
        ({"start_offset": plain.start_offset - 1}, "expected stream"),
        ({"stream_id": plain.stream_id + 100}, "expected stream"),
        ({"batch_count": plain.batch_count + 1}, "holds"),
        ({"crc": plain.crc ^ 1}, "crc32c"),
        ({"stored_size": plain.stored_size + 1}, "bytes"),
    ]:
        with pytest.raises(CorruptionError, match=match) as err:
            decode_block(raw, BlockInfo(**{**fields, **change}), KEY)
        assert (err.value.location, err.value.position) == (KEY, plain.position)
    # Garbage that is not a zstd frame, with a matching CRC, must not decode.
    junk = b"not a zstd frame" * 3
    fake = BlockInfo(
        **{
            **{f: getattr(packed, f) for f in BlockInfo.__slots__},
            "stored_size": len(junk),
            "crc": crc32c.crc32c(junk),
        }
    )
    with pytest.raises(CorruptionError, match="decompress") as err:
        decode_block(junk, fake, KEY)
    assert err.value.position == packed.position
    # A block whose batch records are damaged (header lengths wrong) but CRC recomputed.
    bad = bytearray(raw)
    struct.pack_into("<I", bad, 36, 10**6)
    fake = BlockInfo(**{**fields, "crc": crc32c.crc32c(bytes(bad))})
    with pytest.raises(CorruptionError, match="batch at byte 0") as err:
        decode_block(bytes(bad), fake, KEY)
    assert (err.value.location, err.value.position) == (KEY, plain.position)


def test_tiny_objects_are_corrupt() -> None:
    for blob in (b"", b"x", MAGIC, b"\0" * (FOOTER_SIZE - 1)):
        with pytest.raises(CorruptionError):
            read_index(stored(blob), KEY)
    with pytest.raises(CorruptionError, match="magic"):
        read_index(stored(b"\0" * 100), KEY)


# ---------------------------------------------------------------------------------------------
# Copying blocks between objects (compaction)


def blocks_of(data: bytes) -> list[tuple[BlockInfo, bytes]]:
    index = parse_tail(data, len(data), KEY)
    assert isinstance(index, ObjectIndex)
    return [(b, data[b.position : b.end_position]) for b in index.blocks]


@st.composite
def copies(draw: st.DrawFn) -> tuple[list[FetchedBatch], list[dict[str, Any]], dict[str, Any]]:
    """Batches of a few streams, spread over 1-4 source objects (each stream's batches in
    offset order across them), the sources' writer settings and the copy's."""
    batches, _ = draw(objects())
    ordered = by_stream(batches)
    cuts = sorted(draw(st.lists(st.integers(0, len(ordered)), max_size=3)))
    parts = [ordered[a:b] for a, b in zip([0, *cuts], [*cuts, len(ordered)], strict=True)]

    def writer_kw() -> dict[str, Any]:
        return {
            "block_target_bytes": draw(st.integers(1, 3000)),
            "compression": draw(st.sampled_from(["none", "zstd"])),
        }

    # Sources are filled in stream order: a stream's later batches go to later sources.
    sources = [writer_kw() for _ in parts]
    return (
        ordered,
        [{"part": part, **kw} for part, kw in zip(parts, sources, strict=True)],
        (writer_kw()),
    )


@settings(
    max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(copies())
def test_add_block_round_trip(
    case: tuple[list[FetchedBatch], list[dict[str, Any]], dict[str, Any]],
) -> None:
    batches, sources, copy_kw = case
    source_blocks: list[tuple[BlockInfo, bytes]] = []
    for src in sources:
        kw = {k: v for k, v in src.items() if k != "part"}
        if src["part"]:
            source_blocks += blocks_of(write(src["part"], **kw))
    w = ObjectWriter(**copy_kw)
    # Copy per stream, in offset order (blocks of one stream may come from several sources).
    for blk, raw in sorted(
        source_blocks, key=lambda item: (item[0].stream_id, item[0].start_offset)
    ):
        w.add_block(blk, raw, location="src")
    estimate = w.size_estimate
    data = w.finish()
    if copy_kw["compression"] == "none":
        assert estimate == len(data)
    index = read_index(stored(data), KEY)
    assert read_blocks(stored(data), KEY, index.blocks) == batches
    # Blocks never shrink: every boundary of the copy is a boundary of the sources, and a
    # block is either copied verbatim or merged from small ones within the target.
    starts = {(b.stream_id, b.start_offset) for b, _ in source_blocks}
    verbatim = {(b.stream_id, b.start_offset, b.end_offset, b.crc) for b, _ in source_blocks}
    target = copy_kw["block_target_bytes"]
    for blk in index.blocks:
        assert (blk.stream_id, blk.start_offset) in starts
        key = (blk.stream_id, blk.start_offset, blk.end_offset, blk.crc)
        assert key in verbatim or blk.raw_size <= target
    assert len(index.blocks) <= len(source_blocks)


def test_add_block_merges_small_blocks_and_keeps_big_ones_verbatim() -> None:
    rec = 40 + 60
    # Ten single-batch sources of one stream, then one source holding a big compressed block.
    sources = [write([fetched(1, i, 1, b"x" * 60)]) for i in range(10)]
    big = write([fetched(1, 10, 1, bytes(4000))], compression="zstd", block_target_bytes=1 << 20)
    w = ObjectWriter(block_target_bytes=350)
    for data in [*sources, big]:
        for blk, raw in blocks_of(data):
            w.add_block(blk, raw)
    w.add_fetched(fetched(1, 11, 1, b"y" * 60))
    out = w.finish()
    got = blocks_of(out)
    assert [(b.start_offset, b.end_offset, b.raw_size, b.batch_count) for b, _ in got] == [
        (0, 3, 3 * rec, 3),
        (3, 6, 3 * rec, 3),
        (6, 9, 3 * rec, 3),
        (9, 10, rec, 1),
        (10, 11, 4040, 1),
        (11, 12, rec, 1),
    ]
    (src_big, src_raw), (copied, copied_raw) = blocks_of(big)[0], got[4]
    assert copied.compressed and copied_raw == src_raw and copied.crc == src_big.crc
    assert got[0][0].first_timestamp == 1000 and got[0][0].max_timestamp == 1002
    expected = [fetched(1, i, 1, b"x" * 60) for i in range(10)]
    expected += [fetched(1, 10, 1, bytes(4000)), fetched(1, 11, 1, b"y" * 60)]
    assert read_blocks(stored(out), KEY, read_index(stored(out), KEY).blocks) == expected


def test_add_block_decompresses_small_compressed_blocks_to_merge_them() -> None:
    sources = [write([fetched(7, 2 * i, 2, bytes(300))], compression="zstd") for i in range(4)]
    blocks = [bb for data in sources for bb in blocks_of(data)]
    assert all(b.compressed for b, _ in blocks)
    for compression in ("zstd", "none"):
        w = ObjectWriter(block_target_bytes=4096, compression=compression)
        for blk, raw in blocks:
            w.add_block(blk, raw)
        out = w.finish()
        ((merged, _),) = blocks_of(out)
        assert (merged.start_offset, merged.end_offset, merged.batch_count) == (0, 8, 4)
        assert merged.compressed is (compression == "zstd")
        assert read_blocks(stored(out), KEY, [merged]) == [
            fetched(7, 2 * i, 2, bytes(300)) for i in range(4)
        ]


def test_add_block_rejects_damaged_or_misplaced_blocks() -> None:
    ((blk, raw),) = blocks_of(write([fetched(3, 5, 2, b"p" * 100)]))
    w = ObjectWriter()
    flipped = bytearray(raw)
    flipped[50] ^= 1
    with pytest.raises(CorruptionError, match="crc32c mismatch") as exc:
        w.add_block(blk, bytes(flipped), location="data/src.s3o")
    assert exc.value.location == "data/src.s3o" and exc.value.position == blk.position
    with pytest.raises(CorruptionError, match="bytes, index says"):
        w.add_block(blk, raw[:-1])
    assert w.is_empty()  # nothing of a refused block stays behind
    # An entry that does not describe its (intact) bytes: caught by the header check.
    wrong = BlockInfo(
        3, 9, 11, blk.position, blk.stored_size, blk.raw_size, 1, 0, 0, False, blk.crc
    )
    with pytest.raises(CorruptionError, match="begins with stream 3 offset 5"):
        w.add_block(wrong, raw)
    assert w.is_empty()
    with pytest.raises(InvalidArgumentError, match="BlockInfo"):
        w.add_block((3, 5), raw)  # type: ignore[arg-type]
    w.add_block(blk, raw)
    with pytest.raises(InvalidArgumentError, match="not contiguous"):
        w.add_block(blk, raw)
    assert w.ranges() == [(3, 5, 7)]
    w.finish()
    with pytest.raises(StreamClosedError):
        w.add_block(blk, raw)


# ---------------------------------------------------------------------------------------------
# Time ranges (the time-range table)


def records_batch_at(off: int, base_ts: int, stamps: list[int | None], **kw: Any) -> FetchedBatch:
    payload = encode_records([Record(b"v", timestamp=t) for t in stamps], **kw)
    return fetched(1, off, len(stamps), payload, ts=base_ts, kind=1)


def test_block_time_ranges_come_from_record_timestamps() -> None:
    batches = [
        records_batch_at(0, 100, [50, 70, 60]),  # all own: 50..70, whatever the base says
        records_batch_at(3, 100, [500, None]),  # the one without takes the base: 100..500
        records_batch_at(5, 100, [None, None]),  # none own: all 100
        records_batch_at(7, 9, [-3, 2**40], compression="zstd"),  # body read partly
        fetched(1, 9, 4, b"raw", ts=42),  # raw: its base timestamp
        fetched(1, 13, 2, b"not records", ts=43, kind=1),  # unreadable: as raw
    ]
    data = write(batches, block_target_bytes=1)  # a block per batch
    index = read_index(stored(data), KEY)
    assert [b.time_range for b in index.blocks] == [
        (50, 70),
        (100, 500),
        (100, 100),
        (-3, 2**40),
        (42, 42),
        (43, 43),
    ]
    # first/max_timestamp stay what version 1 defined: batch base timestamps.
    assert [(b.first_timestamp, b.max_timestamp) for b in index.blocks][:2] == [
        (100, 100),
        (100, 100),
    ]
    merged = read_index(stored(write(batches, block_target_bytes=1 << 20)), KEY)
    assert [b.time_range for b in merged.blocks] == [(-3, 2**40)]


def test_add_block_keeps_merges_and_computes_time_ranges() -> None:
    src = write(
        [records_batch_at(0, 5, [30, 10]), records_batch_at(2, 5, [None]), fetched(1, 3, 1, b"r")],
        block_target_bytes=1,
    )
    ranges = [b.time_range for b, _ in blocks_of(src)]
    assert ranges == [(10, 30), (5, 5), (1003, 1003)]
    # Verbatim copies keep their range; merged ones combine.
    for target, want in ((1, ranges), (1 << 20, [(5, 1003)])):
        w = ObjectWriter(block_target_bytes=target)
        for blk, raw in blocks_of(src):
            w.add_block(blk, raw)
        assert [b.time_range for b, _ in blocks_of(w.finish())] == want
    # A block without a range (from an object written before the table) is decoded for one,
    # also when it is compressed and copied verbatim.
    for generation in ("v1", "v1t"):
        old, _ = load_golden("zstd", generation)
        expected = [b.time_range for b, _ in blocks_of(load_golden("zstd", "v1t")[0])]
        w = ObjectWriter(block_target_bytes=1)
        for blk, raw in blocks_of(old):
            w.add_block(blk, raw)
        copied = blocks_of(w.finish())
        assert any(b.compressed for b, _ in copied)
        assert [b.time_range for b, _ in copied] == expected


# ---------------------------------------------------------------------------------------------
# Package surface


def test_format_all_is_sorted_and_complete() -> None:
    # isort-style order, as ruff's RUF022 keeps it: CONSTANTS, Classes, functions.
    def rank(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert fmt.__all__ == sorted(fmt.__all__, key=rank)
    # Submodules (format.batch, format.objects, any loaded later) are not part of __all__.
    public = {
        n
        for n, v in vars(fmt).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    public -= {"annotations"}
    assert set(fmt.__all__) == public
    for name in ("ObjectWriter", "read_index", "encode_batch", "decode_wal_record"):
        assert name in fmt.__all__


# ------------------------------------------------------------------------------------------
# Zero-copy payloads


def test_decoded_payloads_are_views_of_the_block_buffer() -> None:
    batches = [fetched(3, i * 2, 2, bytes([i]) * 5000) for i in range(6)]
    obj = write(batches, block_target_bytes=1 << 20)
    st = MemoryObjectStore()
    st.put("o", obj)
    idx = read_index(st, "o")
    (blk,) = idx.find(3, 0)
    buf = bytearray(obj)  # writable: the views handed out must still be read-only
    got = decode_block(memoryview(buf)[blk.position : blk.end_position], blk, "o")
    assert got == batches
    for b, want in zip(got, batches, strict=True):
        assert b.view.readonly and b.view.obj is buf  # no copy was made
        assert b.size == len(want.payload)
    # Mutating the buffer shows through the view: proof that no copy was taken ...
    first = got[0]
    buf[blk.position + 40] ^= 0xFF
    assert first.view.tobytes() != batches[0].payload
    # ... while `payload` takes its copy once, and then keeps it.
    buf[blk.position + 40] ^= 0xFF
    p = first.payload
    assert type(p) is bytes and p == batches[0].payload
    buf[blk.position + 40] ^= 0xFF
    assert first.payload is p and first.payload == batches[0].payload


def test_fetched_batch_equality_hash_pickle_and_immutability() -> None:
    import pickle

    raw = b"x" * 100
    a = FetchedBatch(1, 5, 2, raw, 7, {"k": "v"}, BatchKind.RECORDS)
    b = FetchedBatch(1, 5, 2, memoryview(bytearray(raw)), 7, {"k": "v"}, BatchKind.RECORDS)
    assert a == b and hash(a) == hash(b)
    assert a != FetchedBatch(1, 5, 2, b"y" * 100, 7, {"k": "v"}, BatchKind.RECORDS)
    c = pickle.loads(pickle.dumps(b))
    assert c == a and type(c._payload) is bytes
    assert "100 bytes" in repr(b)
    with pytest.raises(AttributeError):
        a.count = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del a.count  # type: ignore[misc]
    with pytest.raises(InvalidArgumentError):
        FetchedBatch(1, 5, 2, "text", 7)  # type: ignore[arg-type]
