"""BlockReader: the one merge rule for ranged GETs of blocks, the GET's length check, decoding.

The rule is tested on hand-made index entries (no I/O); the reads against real stores
(`LocalObjectStore` on disk, counted by `MetricsObjectStore`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from s3stream.errors import CorruptionError, InvalidArgumentError, ObjectNotFoundError
from s3stream.format.batch import encode_batch
from s3stream.format.block import BlockInfo, decode_block
from s3stream.format.block_reader import BlockReader, coalesce, read_blocks
from s3stream.format.objects import ObjectIndex, ObjectWriter, read_index
from s3stream.objectstore.local import LocalObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.metered import MetricsObjectStore
from s3stream.types import FetchedBatch

KEY = "data/obj"


def blk(position: int, size: int) -> BlockInfo:
    """An index entry at `position` of `size` stored bytes (offsets do not matter here)."""
    return BlockInfo(1, position, position + 1, position, size, size, 1, 0, 0, False, 0)


def spans(runs: list[list[BlockInfo]]) -> list[list[tuple[int, int]]]:
    return [[(b.position, b.stored_size) for b in run] for run in runs]


# ---------------------------------------------------------------------------------------------
# The merge rule


def test_no_blocks_no_runs() -> None:
    assert coalesce([]) == []
    assert coalesce([], 100, max_run_bytes=1) == []


def test_adjacent_blocks_make_one_run() -> None:
    blocks = [blk(0, 10), blk(10, 10), blk(20, 10)]
    assert spans(coalesce(blocks)) == [[(0, 10), (10, 10), (20, 10)]]


def test_a_gap_is_read_through_only_up_to_max_gap() -> None:
    blocks = [blk(0, 10), blk(15, 10)]  # 5 bytes apart
    assert len(coalesce(blocks)) == 2
    assert len(coalesce(blocks, max_gap_bytes=4)) == 2
    assert len(coalesce(blocks, max_gap_bytes=5)) == 1


def test_max_run_bytes_cuts_runs_but_never_a_block() -> None:
    blocks = [blk(0, 10), blk(10, 10), blk(20, 10)]
    assert spans(coalesce(blocks, max_run_bytes=25)) == [[(0, 10), (10, 10)], [(20, 10)]]
    assert len(coalesce(blocks, max_run_bytes=30)) == 1
    # A block larger than a run is a run of its own; its neighbours do not join it.
    huge = [blk(0, 10), blk(10, 100), blk(110, 10)]
    assert spans(coalesce(huge, max_run_bytes=25)) == [[(0, 10)], [(10, 100)], [(110, 10)]]
    # The gap counts towards the run's size.
    assert len(coalesce([blk(0, 10), blk(15, 10)], 5, max_run_bytes=24)) == 2
    assert len(coalesce([blk(0, 10), blk(15, 10)], 5, max_run_bytes=25)) == 1


def test_order_is_kept_so_backwards_blocks_are_separate_runs() -> None:
    a, b = blk(0, 10), blk(10, 10)
    assert spans(coalesce([b, a], max_gap_bytes=1000)) == [[(10, 10)], [(0, 10)]]
    # Overlapping entries (a duplicate) never share a run either.
    assert len(coalesce([a, a])) == 2


def test_bad_limits_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="max_gap_bytes"):
        coalesce([], -1)
    with pytest.raises(InvalidArgumentError, match="max_run_bytes"):
        coalesce([], max_run_bytes=0)
    with pytest.raises(InvalidArgumentError, match="max_run_bytes"):
        BlockReader(MemoryObjectStore(), max_run_bytes=0)
    with pytest.raises(InvalidArgumentError, match="max_gap_bytes"):
        BlockReader(MemoryObjectStore(), max_gap_bytes=-1)


# ---------------------------------------------------------------------------------------------
# Reading from a real store


def make_object(streams: dict[int, list[int]]) -> bytes:
    """One block per batch: stream id -> the payload size of each of its batches."""
    w = ObjectWriter(block_target_bytes=1)
    for sid, sizes in streams.items():
        for i, size in enumerate(sizes):
            payload = bytes([(sid * 7 + i) % 251]) * size
            w.add(sid, i, 1, 1000 + i, encode_batch(sid, i, 1, 0, 1000 + i, {}, payload))
    return w.finish()


def on_disk(tmp_path: Path, data: bytes) -> tuple[MetricsObjectStore, ObjectIndex]:
    inner = LocalObjectStore(tmp_path / "store", fsync=False)
    inner.put(KEY, data)
    return MetricsObjectStore(inner), read_index(inner, KEY)


def decoded(data: bytes, blocks: Sequence[BlockInfo]) -> list[tuple[int, int, bytes]]:
    return rows(
        [b for x in blocks for b in decode_block(data[x.position : x.end_position], x, KEY)]
    )


def rows(batches: list[FetchedBatch]) -> list[tuple[int, int, bytes]]:
    return [(b.stream_id, b.base_offset, b.payload) for b in batches]


def test_reads_one_get_per_run_by_the_readers_limits(tmp_path: Path) -> None:
    data = make_object({1: [300] * 4, 2: [500] * 2, 3: [300] * 4})
    store, index = on_disk(tmp_path, data)
    wanted = [*index.find(1, 0), *index.find(3, 0)]
    expected = decoded(data, wanted)
    # Adjacent only: stream 2's blocks lie between streams 1 and 3.
    assert rows(BlockReader(store).read(KEY, wanted)) == expected
    assert store.metrics.gets == 2
    # A gap as large as stream 2's bytes is read through: one GET.
    store.reset()
    gap = index.stream_bytes(2)
    assert rows(BlockReader(store, max_gap_bytes=gap).read(KEY, wanted)) == expected
    assert store.metrics.gets == 1
    store.reset()
    assert rows(BlockReader(store, max_gap_bytes=gap - 1).read(KEY, wanted)) == expected
    assert store.metrics.gets == 2
    # A cap of about two blocks per GET.
    store.reset()
    cap = wanted[0].stored_size * 2
    assert rows(BlockReader(store, max_run_bytes=cap).read(KEY, wanted)) == expected
    assert store.metrics.gets == 4
    # read_blocks is the adjacent-only reader.
    store.reset()
    assert rows(read_blocks(store, KEY, wanted)) == expected
    assert store.metrics.gets == 2


def test_empty_block_list_sends_no_request(tmp_path: Path) -> None:
    store, _ = on_disk(tmp_path, make_object({1: [10]}))
    assert BlockReader(store).read(KEY, []) == []
    assert store.metrics.gets == 0
    with pytest.raises(InvalidArgumentError, match="at least one block"):
        BlockReader(store).fetch(KEY, [])


def test_a_block_larger_than_max_run_is_fetched_whole(tmp_path: Path) -> None:
    data = make_object({1: [100, 5000, 100]})
    store, index = on_disk(tmp_path, data)
    blocks = index.find(1, 0)
    reader = BlockReader(store, max_run_bytes=1000)
    assert [len(run) for run in reader.runs(blocks)] == [1, 1, 1]
    assert rows(reader.read(KEY, blocks)) == decoded(data, blocks)
    assert store.metrics.gets == 3


def test_truncated_object_names_key_and_range(tmp_path: Path) -> None:
    data = make_object({1: [200] * 3})
    store, index = on_disk(tmp_path, data)
    blocks = list(index.find(1, 0))
    start, end = blocks[0].position, blocks[-1].end_position
    cut = blocks[1].position + 7
    store.inner.put(KEY, data[:cut])
    seen: list[int] = []
    with pytest.raises(CorruptionError, match="ends before") as err:
        BlockReader(store).fetch(KEY, blocks, on_response=seen.append)
    e = err.value
    assert e.location == KEY and e.position == cut
    assert KEY in str(e) and f"[{start}, {end})" in str(e) and f"returned {cut - start}" in str(e)
    assert seen == [cut - start]  # told before the check: meters count the short GET too
    with pytest.raises(CorruptionError, match="ends before"):
        BlockReader(store).read(KEY, blocks)
    # The blocks that are whole still read.
    assert rows(BlockReader(store).read(KEY, blocks[:1])) == decoded(data, blocks[:1])


def test_a_missing_object_is_not_corruption(tmp_path: Path) -> None:
    store, index = on_disk(tmp_path, make_object({1: [10]}))
    store.delete_many([KEY])
    with pytest.raises(ObjectNotFoundError):
        BlockReader(store).read(KEY, index.blocks)


class WholeObjectStore(MemoryObjectStore):
    """A backend that ignores the end of a range (as an HTTP server that answers a Range
    request with the whole body does)."""

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return super().get(key, start, None)


def test_more_bytes_than_asked_is_corruption() -> None:
    data = make_object({1: [100, 100]})
    store = WholeObjectStore()
    store.put(KEY, data)
    first = read_index(store, KEY).blocks[0]
    with pytest.raises(CorruptionError, match="more than asked") as err:
        BlockReader(store).read(KEY, [first])
    assert err.value.location == KEY and err.value.position == first.position
    assert f"[{first.position}, {first.end_position})" in str(err.value)


def test_corrupt_block_in_a_run_names_the_block(tmp_path: Path) -> None:
    data = bytearray(make_object({1: [300] * 3}))
    store, index = on_disk(tmp_path, bytes(data))
    bad = index.blocks[1]
    data[bad.position + 60] ^= 0x01
    store.inner.put(KEY, bytes(data))
    with pytest.raises(CorruptionError, match="crc32c") as err:
        BlockReader(store).read(KEY, index.blocks)
    assert err.value.position == bad.position
