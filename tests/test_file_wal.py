"""The file / block-device WAL: round trips, crashes, torn writes, the ring, errors, fencing.

Crashes are simulated with `FileWal._abandon()` (writer stopped, no clean-shutdown header) and,
in `test_sigkill_crash_loop`, by SIGKILLing a child process in the middle of its appends.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from s3stream.clock import SystemClock
from s3stream.errors import (
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    NodeInUseError,
    S3StreamError,
    StreamClosedError,
    UnavailableError,
    WalFullError,
)
from s3stream.settings import FileWalSettings
from s3stream.testing import disk_faults
from s3stream.testing.disk_faults import failing_writes
from s3stream.testing.wal import WalTests
from s3stream.wal import FileWal, MemoryWal, WalRecord, open_wal
from s3stream.wal.base import WriteAheadLog
from s3stream.wal.file import read_wal_header
from s3stream.wal.file_scan import check_file_wal
from s3stream.wal.framing import DATA_START, FRAME_ALIGN, SLOT_BYTES, frame_size
from s3stream.wal.registry import open_file_wal, parse_size

KiB = 1 << 10
MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def small(capacity: int = 256 * KiB, **kw: object) -> FileWalSettings:
    return FileWalSettings(capacity_bytes=capacity, **kw)  # type: ignore[arg-type]


def data_for(i: int, size: int) -> bytes:
    """Deterministic, position-independent record contents."""
    block = hashlib.sha256(i.to_bytes(8, "little")).digest()
    return (block * (size // 32 + 1))[:size]


def recover_all(wal: FileWal) -> list[WalRecord]:
    return list(wal.recover())


def append_all(wal: FileWal, payloads: list[bytes]) -> list[WalRecord]:
    futures = [wal.append(p) for p in payloads]
    return [WalRecord(f.result(timeout=30), p) for f, p in zip(futures, payloads, strict=True)]


def direct_io_supported(directory: Path) -> bool:
    probe = directory / ".odirect-probe"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


@pytest.fixture(params=[False, True], ids=["buffered", "direct"])
def direct(request: pytest.FixtureRequest, tmp_path: Path) -> bool:
    if request.param and not direct_io_supported(tmp_path):
        pytest.skip("the filesystem of tmp_path does not support O_DIRECT")
    return bool(request.param)


@pytest.fixture
def wal_path(tmp_path: Path) -> Path:
    return tmp_path / "wal" / "node.wal"


# -- the conformance kit ----------------------------------------------------------------------


def tear_after_tail(path: Path, rng: random.Random) -> None:
    """Garble bytes right after the last complete frame, as a crash mid-write leaves them."""
    header = read_wal_header(path)
    cap = header.capacity
    at = check_file_wal(path).end + rng.randrange(0, 512)
    n = rng.randrange(1, 2048)
    junk = bytes(n) if rng.random() < 0.5 else rng.randbytes(n)
    with open(path, "r+b") as f:
        for i in range(n):
            f.seek(DATA_START + (at + i) % cap)
            f.write(junk[i : i + 1])


class TestFileWalConformance(WalTests):
    """The public WAL contract (`s3stream.testing.WalTests`) on the file WAL."""

    def make_medium(self, tmp_path: Path) -> Path:
        return tmp_path / "kit" / "file.wal"

    def open_wal(self, medium: Path) -> FileWal:
        return FileWal(medium, settings=small(4 * MiB))

    def raw_bytes(self, medium: Path) -> bytes:
        return medium.read_bytes()

    def tear_tail(self, medium: Path, rng: random.Random) -> None:
        tear_after_tail(medium, rng)

    def open_small_wal(self, medium: Path, capacity_bytes: int, full_wait_ms: int) -> FileWal:
        return FileWal(medium, settings=small(capacity_bytes, full_wait_ms=full_wait_ms))

    def open_wal_as(self, medium: Path, node_epoch: int) -> FileWal:
        # Another node taking this one over while it runs: past the holder lock, on purpose.
        return FileWal(medium, node_epoch=node_epoch, settings=small(4 * MiB), take_over=True)

    def transient_fault(
        self, medium: Path, wal: WriteAheadLog
    ) -> contextlib.AbstractContextManager[None]:
        assert isinstance(wal, FileWal)
        return failing_writes(wal)


class TestZeroFilledFileWalConformance(TestFileWalConformance):
    """The same contract on a WAL whose ring was written with zeros at creation
    (`FileWalSettings.zero_fill`): zeros where no frame is must read as the end of the log."""

    def open_wal(self, medium: Path) -> FileWal:
        return FileWal(medium, settings=small(4 * MiB, zero_fill=True))

    def open_small_wal(self, medium: Path, capacity_bytes: int, full_wait_ms: int) -> FileWal:
        return FileWal(
            medium, settings=small(capacity_bytes, full_wait_ms=full_wait_ms, zero_fill=True)
        )

    def open_wal_as(self, medium: Path, node_epoch: int) -> FileWal:
        return FileWal(
            medium,
            node_epoch=node_epoch,
            settings=small(4 * MiB, zero_fill=True),
            take_over=True,
        )


# -- round trips --------------------------------------------------------------------------------


def test_round_trip_after_close_and_after_crash(wal_path: Path, direct: bool) -> None:
    st_ = small(direct_io=direct)
    wal = FileWal(wal_path, settings=st_)
    assert wal.direct_io is direct
    assert recover_all(wal) == []
    sizes = [0, 1, 31, 32, 33, 4095, 4096, 4097, 20_000, 70_000]
    acked = append_all(wal, [data_for(i, s) for i, s in enumerate(sizes)])
    assert [r.position for r in acked] == sorted({r.position for r in acked})
    wal.close()
    assert read_wal_header(wal_path).clean

    wal = FileWal(wal_path, settings=st_)
    assert recover_all(wal) == acked
    more = append_all(wal, [data_for(100 + i, 500) for i in range(5)])
    assert more[0].position > acked[-1].position
    wal._abandon()
    assert not read_wal_header(wal_path).clean

    wal = FileWal(wal_path, settings=st_)
    assert recover_all(wal) == acked + more
    wal.close()


def test_recover_while_ready_replays_live_records(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    acked = append_all(wal, [data_for(i, 300) for i in range(10)])
    wal.trim(acked[3].position)
    assert recover_all(wal) == acked[4:]
    assert wal.append(b"still usable").result(timeout=10) > acked[-1].position
    wal.close()


def test_largest_record_fits_at_any_alignment(wal_path: Path, direct: bool) -> None:
    wal = FileWal(wal_path, settings=small(64 * KiB, direct_io=direct))
    recover_all(wal)
    biggest = wal.capabilities.max_record_bytes
    assert biggest == 64 * KiB - 2 * 4096 - 32
    with pytest.raises(InvalidArgumentError, match="exceeds"):
        wal.append(bytes(biggest + 1))
    first = append_all(wal, [b"x" * 100])  # leaves the tail unaligned
    wal.trim(first[0].position)
    big = append_all(wal, [data_for(7, biggest)])
    wal._abandon()
    wal = FileWal(wal_path, settings=small(64 * KiB, direct_io=direct))
    assert recover_all(wal) == big
    wal.close()


def test_trimmed_records_never_return(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    acked = append_all(wal, [data_for(i, 100 + i) for i in range(20)])
    wal.trim(acked[4].position)
    wal.trim(acked[2].position)  # lower: no effect
    # Between two records: drops exactly those at or below the point.
    wal.trim(acked[9].position + 1)
    with pytest.raises(InvalidArgumentError):
        wal.trim(acked[-1].position + frame_size(len(acked[-1].data)))
    with pytest.raises(InvalidArgumentError):
        wal.trim(1.5)  # type: ignore[arg-type]
    wal._abandon()
    wal = FileWal(wal_path, settings=small())
    assert recover_all(wal) == acked[10:]
    wal.trim(acked[-1].position)
    wal.close()
    wal = FileWal(wal_path, settings=small())
    assert recover_all(wal) == []
    nxt = append_all(wal, [b"after"])
    assert nxt[0].position > acked[-1].position
    wal.close()


def test_wrap_around_many_laps(wal_path: Path, direct: bool) -> None:
    rng = random.Random(1234)
    capacity = 128 * KiB
    st_ = small(capacity, direct_io=direct, full_wait_ms=1000)
    wal = FileWal(wal_path, settings=st_)
    recover_all(wal)
    live: list[WalRecord] = []
    n = 0
    while True:
        batch = [data_for(n + i, rng.choice([0, 5, 100, 999, 4000, 9000])) for i in range(6)]
        n += len(batch)
        live += append_all(wal, batch)
        last = live[-1].position
        keep = rng.randrange(0, 6)
        if len(live) > keep:
            wal.trim(live[-keep - 1].position)
            live = live[len(live) - keep :]
        if rng.random() < 0.15:
            wal._abandon() if rng.random() < 0.5 else wal.close()
            wal = FileWal(wal_path, settings=st_)
            assert recover_all(wal) == live
        if last > 40 * capacity:
            break
    wal._abandon()
    wal = FileWal(wal_path, settings=st_)
    assert recover_all(wal) == live
    wal.close()


def test_reset_before_recover_skips_past_every_old_record(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    old = append_all(wal, [data_for(i, 700) for i in range(30)])
    wal._abandon()  # dirty header: the tail is unknown without a scan
    wal = FileWal(wal_path, settings=small())
    wal.reset()
    new = append_all(wal, [b"new"])
    assert new[0].position > old[-1].position
    wal._abandon()
    wal = FileWal(wal_path, settings=small())
    assert recover_all(wal) == new
    wal.reset()
    wal.close()
    wal = FileWal(wal_path, settings=small())
    assert recover_all(wal) == []
    wal.close()


# -- torn writes and damage ---------------------------------------------------------------------


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=10),
    first_torn=st.integers(0, 9),
    offset=st.integers(0, 4000),
    mode=st.sampled_from(["zero", "random"]),
    near_ring_end=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_torn_writes_recover_exactly_a_prefix(
    tmp_path: Path,
    sizes: list[int],
    first_torn: int,
    offset: int,
    mode: str,
    near_ring_end: bool,
    seed: int,
) -> None:
    """A tail torn from anywhere in record k on leaves records [0, k) and nothing else odd.

    Records from k on were, in this story, one unfinished group commit (its group mark
    included): recovery returns a prefix of the written records, at least k long, never
    garbage and never an exception. A new session then writes over the torn region and none
    of its stale frames comes back. (Damage followed by later writes is not a torn tail:
    `test_damage_is_never_silent` and the tests after it.)
    """
    capacity = 64 * KiB
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "torn.wal"
    wal = FileWal(path, settings=small(capacity))
    recover_all(wal)
    if near_ring_end:  # make the records straddle the physical end of the ring
        filler = append_all(wal, [bytes(capacity // 2 - 2000)])
        wal.trim(filler[0].position)
    written = append_all(wal, [data_for(i, s) for i, s in enumerate(sizes)])
    wal._abandon()

    k = first_torn % len(written)
    first = written[0].position
    lo = min(written[k].position + offset, written[-1].position + frame_size(sizes[-1]))
    # To the end of the group mark after the last frame; never past one lap: that is [0, k).
    hi = min(written[-1].position + frame_size(sizes[-1]) + FRAME_ALIGN, first + capacity)
    rng = random.Random(seed)
    with open(path, "r+b") as f:
        for pos in range(lo, hi):
            phys = DATA_START + pos % capacity
            f.seek(phys)
            f.write(b"\0" if mode == "zero" else bytes([rng.randrange(256)]))

    wal = FileWal(path, settings=small(capacity))
    got = recover_all(wal)
    assert len(got) >= k
    assert got == written[: len(got)]
    again = append_all(wal, [data_for(999, sizes[0])])
    wal._abandon()
    wal = FileWal(path, settings=small(capacity))
    assert recover_all(wal) == got + again
    wal.close()


def test_header_slot_damage_falls_back_to_the_other_slot(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    acked = append_all(wal, [data_for(i, 2000) for i in range(12)])
    wal.close()
    newest = read_wal_header(wal_path)
    for slot in (newest.slot_index, 1 - newest.slot_index):
        image = wal_path.read_bytes()[: 2 * SLOT_BYTES]
        with open(wal_path, "r+b") as f:
            f.seek(slot * SLOT_BYTES + 20)
            f.write(b"\xff\x00\xff")  # inside the checksummed fields
        wal = FileWal(wal_path, settings=small())
        assert recover_all(wal) == acked, f"with slot {slot} damaged"
        wal.close()
        with open(wal_path, "r+b") as f:  # put both slots back as they were
            f.write(image)


def test_both_header_slots_damaged_is_corruption(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    wal.close()
    with open(wal_path, "r+b") as f:
        for slot in (0, 1):
            f.seek(slot * SLOT_BYTES + 30)
            f.write(b"\x55\xaa")
    with pytest.raises(CorruptionError, match="both header slots"):
        FileWal(wal_path, settings=small())


def test_damage_before_a_clean_tail_is_reported(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    acked = append_all(wal, [data_for(i, 1000) for i in range(5)])
    wal.close()
    bad = acked[2].position
    with open(wal_path, "r+b") as f:
        f.seek(DATA_START + bad + 100)
        f.write(b"\x00\x01\x02")
    wal = FileWal(wal_path, settings=small())
    got: list[WalRecord] = []
    with pytest.raises(CorruptionError, match=f"position {bad}") as info:
        got.extend(wal.recover())
    assert got == acked[:2]
    assert info.value.position == DATA_START + bad
    with pytest.raises(S3StreamError):
        wal.append(b"not ready")
    wal.close()


def crash_image(
    path: Path, groups: list[list[bytes]], *, capacity: int = 64 * KiB
) -> list[WalRecord]:
    """A WAL at `path` holding `groups` (each appended at once, so one or a few group commits),
    all acknowledged, left as a crash leaves it (no clean shutdown); the acknowledged records."""
    wal = FileWal(path, settings=small(capacity))
    recover_all(wal)
    acked: list[WalRecord] = []
    for group in groups:
        acked += append_all(wal, group)
    wal._abandon()
    return acked


def reopen(path: Path, *, accept: bool = False, capacity: int = 64 * KiB) -> list[WalRecord]:
    """Recover the WAL at `path` as a client of a node with open streams does (a missing or
    empty file is damage too), then close it."""
    wal = open_file_wal(
        str(path),
        node_id="",
        clock=SystemClock(),
        file_settings=small(capacity),
        must_exist=True,
        accept_wal_loss=accept,
    )
    try:
        return list(wal.recover())
    finally:
        wal.close()


def flip(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ (1 << bit)]))


def test_flip_in_the_first_of_many_groups_is_corruption(wal_path: Path) -> None:
    """The issue's case: 60 acknowledged appends, one flipped byte in the first record."""
    acked = crash_image(wal_path, [[data_for(i, 300)] for i in range(60)])
    flip(wal_path, DATA_START + acked[0].position + 40)
    with pytest.raises(CorruptionError, match="written after it") as info:
        reopen(wal_path)
    assert str(wal_path) in str(info.value)
    assert info.value.position == DATA_START + acked[0].position
    # Nothing was changed by the refusal: the same answer again.
    with pytest.raises(CorruptionError):
        reopen(wal_path)


def test_accepting_the_loss_goes_on_from_the_damage(
    wal_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acked = crash_image(wal_path, [[data_for(i, 300)] for i in range(10)])
    flip(wal_path, DATA_START + acked[4].position + 40)
    with caplog.at_level("WARNING", logger="s3stream.wal.file"):
        assert reopen(wal_path, accept=True) == acked[:4]
    assert "accept_wal_loss=True" in caplog.text
    # The new session wrote its header; the damaged region is now beyond its tail.
    assert reopen(wal_path) == acked[:4]


def test_flip_in_the_last_acknowledged_group_is_corruption(wal_path: Path) -> None:
    """The last group's mark, written with it, says the group was written whole."""
    acked = crash_image(wal_path, [[data_for(i, 300)] for i in range(3)] + [[b"x" * 500] * 4])
    flip(wal_path, DATA_START + acked[-1].position + 100)
    with pytest.raises(CorruptionError, match="written after it"):
        reopen(wal_path)


def test_a_torn_last_group_is_not_corruption(wal_path: Path) -> None:
    """Zeros from the middle of the last group to past its mark: a crash mid-write."""
    acked = crash_image(wal_path, [[data_for(i, 300)] for i in range(3)] + [[b"x" * 500] * 4])
    end = acked[-1].position + frame_size(500) + FRAME_ALIGN
    with open(wal_path, "r+b") as f:
        f.seek(DATA_START + acked[-2].position + 7)
        f.write(bytes(end - acked[-2].position - 7))
    assert reopen(wal_path) == acked[:-2]


def test_damaged_newest_header_with_frames_past_the_older_one(wal_path: Path) -> None:
    """The issue's case: the newest slot damaged, the older one says clean with tail 0."""
    wal = FileWal(wal_path, settings=small(64 * KiB))
    wal.close()  # a clean header, tail 0
    acked = crash_image(wal_path, [[data_for(i, 300)] for i in range(60)])
    newest = read_wal_header(wal_path)
    flip(wal_path, newest.slot_index * SLOT_BYTES + 20)
    older = read_wal_header(wal_path)
    assert older.generation < newest.generation and older.tail <= acked[0].position
    with pytest.raises(CorruptionError, match="header"):
        reopen(wal_path)


@pytest.mark.parametrize("size", [0, 100, DATA_START + 1000])
def test_missing_emptied_or_truncated_wal_is_corruption(wal_path: Path, size: int) -> None:
    crash_image(wal_path, [[data_for(i, 300)] for i in range(5)])
    os.truncate(wal_path, size)
    with pytest.raises(CorruptionError):
        reopen(wal_path)
    wal_path.unlink()
    with pytest.raises(CorruptionError, match="missing"):
        reopen(wal_path)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    groups=st.lists(st.lists(st.integers(0, 1500), min_size=1, max_size=4), min_size=1, max_size=8),
    near_ring_end=st.booleans(),
    # where in the file (0..1), which bit, truncate instead of flipping, aim at the frames
    damage=st.tuples(
        st.floats(0, 1, exclude_max=True), st.integers(0, 7), st.booleans(), st.booleans()
    ),
)
def test_damage_is_never_silent(
    tmp_path: Path,
    groups: list[list[int]],
    near_ring_end: bool,
    damage: tuple[float, int, bool, bool],
) -> None:
    """One flipped bit anywhere in the file, or the file cut anywhere, of a WAL holding
    acknowledged records: recovery returns every one of them, or raises `CorruptionError`.
    Never fewer records without an error."""
    capacity = 64 * KiB
    # One directory per example, gone after it (hundreds of examples share `tmp_path`).
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        check_recovery_after(Path(tmp) / "node.wal", capacity, groups, near_ring_end, damage)


def check_recovery_after(
    path: Path,
    capacity: int,
    groups: list[list[int]],
    near_ring_end: bool,
    damage: tuple[float, int, bool, bool],
) -> None:
    where, bit, truncate, in_records = damage
    wal = FileWal(path, settings=small(capacity))
    recover_all(wal)
    if near_ring_end:  # records straddle the physical end of the ring
        filler = append_all(wal, [bytes(capacity // 2 - 2000)])
        wal.trim(filler[0].position)
    acked: list[WalRecord] = []
    for i, group in enumerate(groups):
        acked += append_all(wal, [data_for(i * 10 + j, n) for j, n in enumerate(group)])
    wal._abandon()
    size = path.stat().st_size
    offset = int(where * size)
    if in_records and not truncate:  # aim at the written frames and the mark after them
        first, end = acked[0].position, acked[-1].position + frame_size(len(acked[-1].data))
        offset = DATA_START + (first + int(where * (end + FRAME_ALIGN - first))) % capacity
    if truncate:
        os.truncate(path, offset)
    else:
        flip(path, offset, bit)
    try:
        got = reopen(path, capacity=capacity)
    except CorruptionError:
        event("CorruptionError")
        return
    event("every acknowledged record recovered")
    assert got[: len(acked)] == acked or got[-len(acked) :] == acked, (
        f"lost acknowledged records silently: {len(got)} of {len(acked)}"
    )


# -- capacity and backpressure ------------------------------------------------------------------


def test_full_ring_blocks_until_trim_then_times_out(wal_path: Path) -> None:
    calls: list[float] = []
    wal = FileWal(
        wal_path,
        settings=small(16 * KiB, full_wait_ms=10_000),
        on_full=lambda: calls.append(time.monotonic()),
    )
    recover_all(wal)
    acked: list[WalRecord] = []
    blocked: Future[int] | None = None
    for i in range(64):
        data = data_for(i, 1000)
        box: list[Future[int]] = []
        t = threading.Thread(target=lambda d=data, b=box: b.append(wal.append(d)))
        t.start()
        t.join(timeout=0.3)
        if t.is_alive():  # waiting for space
            assert calls, "on_full was not called when the append started waiting"
            # Space comes back in whole 4 KiB blocks: trim past the first block.
            wal.trim(acked[4].position)
            t.join(timeout=10)
            assert not t.is_alive(), "the blocked append did not resume after trim"
            blocked = box[0]
            break
        acked.append(WalRecord(box[0].result(timeout=10), data))
    assert blocked is not None, "a 16 KiB ring never filled up"
    assert blocked.result(timeout=10) > acked[-1].position
    wal.close()

    wal = FileWal(wal_path, settings=small(16 * KiB, full_wait_ms=50))
    live = recover_all(wal)
    assert live[0] == acked[5]
    calls.clear()
    t0 = time.monotonic()
    with pytest.raises(WalFullError, match="full"):
        for i in range(64):
            wal.append(data_for(100 + i, 1000)).result(timeout=10)
    assert 0.04 <= time.monotonic() - t0 < 5
    wal._abandon()
    # Nothing untrimmed was overwritten to make room.
    wal = FileWal(wal_path, settings=small(16 * KiB))
    assert recover_all(wal)[: len(live)] == live
    wal.close()


# -- concurrency --------------------------------------------------------------------------------


def test_threads_group_commit_in_position_order(wal_path: Path) -> None:
    """8 threads append at once: the writer completes futures in position order."""
    wal = FileWal(wal_path, settings=small(8 * MiB))
    recover_all(wal)
    completed: list[int] = []
    lock = threading.Lock()
    local = threading.local()
    barrier = threading.Barrier(8)
    results: dict[int, list[WalRecord]] = {}

    def on_done(fut: Future[int]) -> None:
        # A callback added to a finished future runs at once in the adding thread, which says
        # nothing about completion order: count only completions by the writer.
        if not getattr(local, "adding", False):
            with lock:
                completed.append(fut.result())

    def worker(t: int) -> None:
        barrier.wait()
        futs = []
        payloads = [data_for(t * 1000 + i, (t * 37 + i * 11) % 3000) for i in range(150)]
        for p in payloads:
            fut = wal.append(p)
            local.adding = True
            fut.add_done_callback(on_done)
            local.adding = False
            futs.append(fut)
        results[t] = [
            WalRecord(f.result(timeout=30), p) for f, p in zip(futs, payloads, strict=True)
        ]

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert completed, "no completion was observed by the writer"
    assert all(a < b for a, b in itertools.pairwise(completed)), "completed out of order"
    for recs in results.values():
        assert all(a.position < b.position for a, b in itertools.pairwise(recs))
    acked = sorted(itertools.chain.from_iterable(results.values()))
    assert len({r.position for r in acked}) == 8 * 150
    wal._abandon()
    wal = FileWal(wal_path, settings=small(8 * MiB))
    assert recover_all(wal) == acked
    wal.close()


def test_completion_callbacks_fire_in_append_order(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small(8 * MiB))
    recover_all(wal)
    fired: list[int] = []
    futs = []
    for i in range(2000):
        fut = wal.append(data_for(i, i % 700))
        fut.add_done_callback(lambda f, i=i: fired.append(i))
        futs.append(fut)
    positions = [f.result(timeout=30) for f in futs]
    assert fired == list(range(2000))
    assert positions == sorted(set(positions))
    wal.close()


def test_trim_append_and_close_from_a_completion_callback(wal_path: Path) -> None:
    """Callbacks run on the writer thread; the WAL must not deadlock on itself."""
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    first = wal.append(b"one").result(timeout=10)
    seen: list[object] = []
    done = threading.Event()

    def callback(fut: Future[int]) -> None:
        wal.trim(first)
        seen.append(wal.append(b"from callback"))
        wal.close()
        done.set()

    wal.append(b"two").add_done_callback(callback)
    assert done.wait(10)
    follow_up = seen[0]
    assert isinstance(follow_up, Future)
    assert follow_up.result(timeout=10) > first
    deadline = time.monotonic() + 10
    while wal._fd >= 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    wal = FileWal(wal_path, settings=small())
    assert [r.data for r in recover_all(wal)] == [b"two", b"from callback"]
    wal.close()


# -- caller-driven commits (WriteAheadLog.drive) -------------------------------------------------


@pytest.fixture
def no_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """WALs opened from here on have no background writer: only `drive` commits."""
    monkeypatch.setattr(FileWal, "_writer_main", lambda self: None)


@pytest.mark.usefixtures("no_writer")
def test_drive_commits_pending_records_in_the_calling_thread(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small(caller_commits=True))
    recover_all(wal)
    payloads = [data_for(i, 300 * i) for i in range(3)]
    futs = [wal.append(p) for p in payloads]
    threads: list[int] = []
    for f in futs:
        f.add_done_callback(lambda _: threads.append(threading.get_ident()))
    assert not any(f.done() for f in futs)
    wal.drive(futs[0])  # one commit takes every pending record
    assert all(f.done() for f in futs)
    assert threads == [threading.get_ident()] * 3
    wal.drive(futs[0])  # done already: nothing to do
    acked = [WalRecord(f.result(), p) for f, p in zip(futs, payloads, strict=True)]
    wal._abandon()
    wal = FileWal(wal_path, settings=small(caller_commits=True))
    assert recover_all(wal) == acked
    wal.close()


@pytest.mark.usefixtures("no_writer")
def test_drive_leaves_the_commit_to_the_writer_unless_caller_commits_is_set(
    wal_path: Path,
) -> None:
    """By default `drive` commits nothing in the caller's thread (a caller inside a stalled
    ``fdatasync`` could not keep its deadline): with no writer thread the record stays
    pending; `caller_commits` lets the caller commit it."""
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    fut = wal.append(b"left to the writer", driven=True)
    wal.drive(fut)
    assert not fut.done()
    wal._abandon()
    wal = FileWal(wal_path, settings=small(caller_commits=True))
    recover_all(wal)
    fut = wal.append(b"committed by its caller", driven=True)
    wal.drive(fut)
    assert fut.done() and fut.result(timeout=0) >= 0
    wal.close()


@pytest.mark.usefixtures("no_writer")
def test_a_failed_driven_commit_fails_that_append_and_every_later_one(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small(caller_commits=True))
    recover_all(wal)
    first = wal.append(b"kept")
    wal.drive(first)
    with failing_writes(wal):
        doomed = wal.append(b"doomed")
        wal.drive(doomed)
        with pytest.raises(UnavailableError, match="write failed"):
            doomed.result(timeout=0)
        with pytest.raises(UnavailableError):
            wal.append(b"later").result(timeout=10)
        wal.close()
    wal = FileWal(wal_path, settings=small(caller_commits=True))
    assert [r.data for r in recover_all(wal)] == [b"kept"]
    wal.close()


def test_driving_threads_still_share_group_commits(
    wal_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends arriving while a caller commits are left to the writer, which commits them as
    one group: 8 threads appending synchronously need fewer fdatasyncs than appends."""
    syncs = [0]
    real = os.fdatasync

    def counting(fd: int) -> None:
        syncs[0] += 1
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    wal = FileWal(wal_path, settings=small(8 * MiB, caller_commits=True))
    recover_all(wal)
    barrier = threading.Barrier(8)
    acked: list[WalRecord] = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        barrier.wait()
        for i in range(100):
            p = data_for(t * 1000 + i, 200)
            fut = wal.append(p)
            wal.drive(fut)
            rec = WalRecord(fut.result(timeout=30), p)
            with lock:
                acked.append(rec)

    syncs[0] = 0
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(acked) == 800
    assert syncs[0] < 800, "every append paid its own fdatasync: no group commit"
    wal._abandon()
    wal = FileWal(wal_path, settings=small(8 * MiB, caller_commits=True))
    assert recover_all(wal) == sorted(acked)
    wal.close()


def test_close_from_a_callback_of_a_driven_commit(wal_path: Path) -> None:
    """Whichever thread commits (a driving caller or the writer), closing from a completion
    callback neither deadlocks nor loses the clean shutdown."""
    for _ in range(5):
        wal = FileWal(wal_path, settings=small(caller_commits=True))
        recover_all(wal)
        fut = wal.append(b"last")
        fut.add_done_callback(lambda _, wal=wal: wal.close())
        wal.drive(fut)
        assert fut.result(timeout=10) >= 0
        deadline = time.monotonic() + 10
        while wal._fd >= 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert wal._fd < 0, "the WAL never finished closing"
        assert read_wal_header(wal_path).clean


# -- opening errors -----------------------------------------------------------------------------


def test_missing_directories_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c" / "x.wal"
    wal = FileWal(path, settings=small(caller_commits=True))
    assert path.stat().st_size == DATA_START + 256 * KiB
    assert wal.data_start == DATA_START and wal.data_capacity == 256 * KiB
    assert wal.physical_offset(256 * KiB + 5) == DATA_START + 5
    wal.close()


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    afile = tmp_path / "plain"
    afile.write_bytes(b"x")
    with pytest.raises(InvalidArgumentError, match="plain"):
        FileWal(afile / "x.wal", settings=small())
    with pytest.raises(InvalidArgumentError, match=r"neither a regular file|Is a directory"):
        FileWal(tmp_path, settings=small())
    with pytest.raises(InvalidArgumentError, match="create=False"):
        FileWal(tmp_path / "missing.wal", settings=small(), create=False)
    empty = tmp_path / "empty.wal"
    empty.touch()
    with pytest.raises(InvalidArgumentError, match="create=False"):
        FileWal(empty, settings=small(), create=False)
    with pytest.raises(InvalidArgumentError, match="node_id"):
        FileWal(tmp_path / "n.wal", node_id="x" * 65)
    with pytest.raises(InvalidArgumentError, match="node_epoch"):
        FileWal(tmp_path / "n.wal", node_epoch=-1)


def test_foreign_files_are_never_overwritten(tmp_path: Path) -> None:
    junk = random.Random(5).randbytes(300 * KiB)
    for name, content in [("junk.wal", junk), ("tiny.wal", b"hello")]:
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(InvalidArgumentError, match="not an s3stream WAL"):
            FileWal(path, settings=small())
        assert path.read_bytes() == content


def test_resized_wal_is_refused(wal_path: Path) -> None:
    FileWal(wal_path, settings=small()).close()
    os.truncate(wal_path, DATA_START + 512 * KiB)
    with pytest.raises(CorruptionError, match="was resized"):
        FileWal(wal_path, settings=small())
    os.truncate(wal_path, DATA_START + 128 * KiB)
    with pytest.raises(CorruptionError, match="truncated to"):
        FileWal(wal_path, settings=small())
    os.truncate(wal_path, SLOT_BYTES + 100)
    with pytest.raises(CorruptionError, match="truncated to 4196 bytes"):
        FileWal(wal_path, settings=small())


def test_accepting_a_truncated_wal_keeps_what_is_left(wal_path: Path) -> None:
    acked = crash_image(wal_path, [[data_for(i, 3000)] for i in range(10)])
    os.truncate(wal_path, DATA_START + acked[5].position + 100)
    assert reopen(wal_path, accept=True) == acked[:5]
    assert wal_path.stat().st_size == DATA_START + 64 * KiB
    os.truncate(wal_path, 100)
    assert reopen(wal_path, accept=True) == []
    assert reopen(wal_path) == []


def test_header_capacity_wins_over_settings(wal_path: Path) -> None:
    FileWal(wal_path, settings=small(128 * KiB)).close()
    wal = FileWal(wal_path, settings=small(1 * MiB))
    assert wal.data_capacity == 128 * KiB
    assert wal_path.stat().st_size == DATA_START + 128 * KiB
    wal.close()


def test_wal_of_another_node_is_refused(wal_path: Path) -> None:
    FileWal(wal_path, node_id="node-a", settings=small()).close()
    with pytest.raises(InvalidArgumentError, match="belongs to node 'node-a'"):
        FileWal(wal_path, node_id="node-b", settings=small())
    FileWal(wal_path, node_id="node-a", settings=small()).close()


def first_hole(path: Path) -> int:
    """File offset of the first hole at or after the ring's start (the file's size if none).
    ext4 and XFS report preallocated blocks never written (unwritten extents) as holes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, DATA_START, os.SEEK_HOLE)
    finally:
        os.close(fd)


def test_zero_fill_writes_every_block_of_a_new_ring_once(tmp_path: Path) -> None:
    plain, filled = tmp_path / "plain.wal", tmp_path / "filled.wal"
    FileWal(plain, settings=small(1 * MiB)).close()
    if first_hole(plain) == plain.stat().st_size:
        pytest.skip("this filesystem does not report preallocated, unwritten blocks as holes")
    wal = FileWal(filled, settings=small(1 * MiB, zero_fill=True))
    size = filled.stat().st_size
    assert size == DATA_START + 1 * MiB
    assert first_hole(filled) == size, "a block of the ring was left unwritten"
    recover_all(wal)
    acked = append_all(wal, [data_for(i, 3000) for i in range(20)])
    wal.close()
    # An existing WAL is never filled again: its records survive a reopen with the setting.
    wal = FileWal(filled, settings=small(1 * MiB, zero_fill=True))
    assert recover_all(wal) == acked
    wal.close()
    # By URL too.
    url = f"file://{tmp_path / 'u.wal'}?capacity_bytes=64KiB&zero_fill=1"
    by_url = open_wal(url, node_id="", clock=SystemClock())
    assert isinstance(by_url, FileWal)
    assert first_hole(by_url.path) == by_url.path.stat().st_size
    by_url.close()


def test_a_creation_that_crashed_while_zero_filling_is_redone(tmp_path: Path) -> None:
    """A crash while the ring is being filled leaves a full-size file without a header:
    the next opener formats it again instead of refusing it, but does not fill it (such a file
    may also be a WAL whose header slots were damaged: its ring's bytes are left alone)."""
    path = tmp_path / "crashed.wal"
    settings = small(256 * KiB, zero_fill=True)
    with open(path, "wb") as f:
        f.truncate(DATA_START + settings.capacity_bytes)
        f.seek(DATA_START + 1000)
        f.write(b"bytes of an earlier ring")
    wal = FileWal(path, settings=settings)
    assert FileWal.read_raw(path, DATA_START + 1000, 24) == b"bytes of an earlier ring"
    recover_all(wal)
    acked = append_all(wal, [b"after the redo"])
    wal.close()
    wal = FileWal(path, settings=settings)
    assert recover_all(wal) == acked
    wal.close()


def test_settings_validation() -> None:
    with pytest.raises(InvalidArgumentError, match="multiple of 4096"):
        FileWalSettings(capacity_bytes=100_000)
    with pytest.raises(InvalidArgumentError, match="max_group_bytes"):
        FileWalSettings(max_group_bytes=100)
    with pytest.raises(InvalidArgumentError, match="recovery_read_bytes"):
        FileWalSettings(recovery_read_bytes=0)
    assert FileWalSettings(full_wait_ms=0).full_wait_ms == 0


def test_no_space_and_read_only_filesystems(tmp_path: Path) -> None:
    with disk_faults.tmpfs(tmp_path / "tiny", "size=1m") as mnt:
        path = mnt / "x.wal"
        with pytest.raises(UnavailableError, match="no space left"):
            FileWal(path, settings=small(2 * MiB))
        assert not path.exists(), "a half-created WAL file was left behind"
        # Through a dangling symlink (the user's): the file made through it is removed, the
        # link stays as it was (it was removed instead, the half-made file left).
        link = tmp_path / "link.wal"
        link.symlink_to(path)
        with pytest.raises(UnavailableError, match="no space left"):
            FileWal(link, settings=small(2 * MiB))
        assert link.is_symlink() and not path.exists()
        link.unlink()
        wal = FileWal(path, settings=small(256 * KiB))
        recover_all(wal)
        acked = append_all(wal, [b"on tmpfs"])
        wal.close()
        wal = FileWal(path, settings=small(256 * KiB))
        assert recover_all(wal) == acked
        wal.close()
    with (
        disk_faults.tmpfs(tmp_path / "ro", "ro,size=1m") as mnt,
        pytest.raises(InvalidArgumentError, match="permission denied"),
    ):
        FileWal(mnt / "x.wal", settings=small())


def test_failed_write_fails_that_append_and_every_later_one(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small())
    recover_all(wal)
    acked = append_all(wal, [data_for(i, 100) for i in range(5)])
    with failing_writes(wal):  # the next write fails as a dying disk's would
        first = wal.append(b"doomed")
        with pytest.raises(UnavailableError, match="write failed"):
            first.result(timeout=10)
        later = wal.append(b"also doomed")
        with pytest.raises(UnavailableError):
            later.result(timeout=10)
        with pytest.raises(UnavailableError):
            wal.trim(acked[0].position)
        wal.close()
    wal = FileWal(wal_path, settings=small())
    assert recover_all(wal) == acked
    wal.close()


# -- fencing ------------------------------------------------------------------------------------


def test_a_symlink_to_a_wal_in_use_finds_its_holder(wal_path: Path, tmp_path: Path) -> None:
    """The holder lock lay beside the path as given: a second opener through a symlink to
    the same WAL (or through a symlinked directory) locked a lock file of its own, claimed
    the WAL and fenced the live writer."""
    held = FileWal(wal_path, node_epoch=1, settings=small())
    recover_all(held)
    acked = append_all(held, [b"kept"])
    link = tmp_path / "alias.wal"
    link.symlink_to(wal_path)
    linked_dir = tmp_path / "alias-dir"
    linked_dir.symlink_to(wal_path.parent)
    for alias in (link, linked_dir / wal_path.name):
        with pytest.raises(NodeInUseError):
            FileWal(alias, node_epoch=2, settings=small())
    assert append_all(held, [b"still the owner"])
    held.close()
    again = FileWal(link, node_epoch=2, settings=small())
    assert recover_all(again)[: len(acked)] == acked
    again.close()


def test_a_wal_deleted_under_its_writer_stops_it(wal_path: Path) -> None:
    """Appends went on into the unlinked file and were acknowledged, although a crash would
    lose them and a new WAL made at the same path (a take-over's) could not fence them."""
    wal = FileWal(wal_path, node_epoch=1, settings=small())
    recover_all(wal)
    assert append_all(wal, [b"before"])
    wal_path.unlink()
    with pytest.raises(CorruptionError, match="deleted under this writer"):
        wal.append(b"after").result(timeout=10)
    wal.close()
    assert not wal_path.exists()  # nothing recreated behind the user's back


def test_a_newer_opener_fences_the_running_writer(wal_path: Path) -> None:
    old = FileWal(wal_path, node_epoch=1, settings=small())
    recover_all(old)
    acked = append_all(old, [b"before"])
    with pytest.raises(NodeInUseError):  # a live holder is taken over only on purpose
        FileWal(wal_path, node_epoch=2, settings=small())
    new = FileWal(wal_path, node_epoch=2, settings=small(), take_over=True)
    assert recover_all(new) == acked
    with pytest.raises(FencedError, match="taken over"):
        old.append(b"after the fence").result(timeout=10)
    with pytest.raises(FencedError):
        old.trim(acked[0].position)
    old.close()  # must not write its clean header over the new owner's
    mine = append_all(new, [b"new owner"])
    new.close()
    with pytest.raises(FencedError, match="older epoch 1"):
        FileWal(wal_path, node_epoch=1, settings=small())
    last = FileWal(wal_path, node_epoch=2, settings=small())
    assert recover_all(last) == acked + mine
    last.close()


def test_same_epoch_take_over_fences_the_earlier_instance(wal_path: Path) -> None:
    first = FileWal(wal_path, settings=small())
    recover_all(first)
    second = FileWal(wal_path, settings=small(), take_over=True)
    with pytest.raises(FencedError):
        first.append(b"x").result(timeout=10)
    assert recover_all(second) == []
    first.close()
    second.close()


@pytest.mark.parametrize("taker", ["thread", "process", "process-direct"])
def test_a_take_over_fences_the_old_writers_next_commit(wal_path: Path, taker: str) -> None:
    """A claim written by another open file description, another process, or with O_DIRECT
    (which bypasses the page cache the old writer reads through) fences the old writer's
    next commit, and nothing it appends after the claim is ever acknowledged."""
    if taker == "process-direct" and not direct_io_supported(wal_path.parent.parent):
        pytest.skip("the filesystem does not support O_DIRECT")
    old = FileWal(wal_path, node_epoch=1, settings=small())
    recover_all(old)
    acked = append_all(old, [b"before", b"still before"])
    old.trim(acked[0].position)
    if taker == "thread":
        FileWal(wal_path, node_epoch=2, settings=small(), take_over=True).close()
    else:
        direct = taker == "process-direct"
        code = textwrap.dedent(
            f"""
            from s3stream.settings import FileWalSettings
            from s3stream.wal import FileWal
            settings = FileWalSettings(capacity_bytes={256 * KiB}, direct_io={direct})
            wal = FileWal({str(wal_path)!r}, node_epoch=2, settings=settings, take_over=True)
            assert wal.direct_io == {direct}
            wal.close()
            """
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with pytest.raises(FencedError, match="taken over"):
        old.append(b"after the fence").result(timeout=10)
    old.close()
    new = FileWal(wal_path, node_epoch=2, settings=small())
    assert recover_all(new) == acked[1:]
    new.close()


def test_a_wal_file_cut_short_under_its_writer_stops_it_with_an_error(wal_path: Path) -> None:
    """Something other than s3stream truncating a live WAL below its header slots makes the
    next commit fail with `FencedError` naming the cut (the process lives on); the records
    are lost, and the next opener says so instead of starting afresh silently."""
    wal = FileWal(wal_path, node_epoch=1, settings=small())
    recover_all(wal)
    append_all(wal, [b"acknowledged"])
    os.truncate(wal_path, 100)
    with pytest.raises(FencedError, match="cut short"):
        wal.append(b"after the cut").result(timeout=10)
    wal.close()
    with pytest.raises(CorruptionError, match="truncated"):
        FileWal(wal_path, node_epoch=2, settings=small())


def count_wakeups(wal: FileWal) -> list[int]:
    """A one-item list counting the WAL's wake-ups of its threads (`notify_all` calls)."""
    woken = [0]
    real_notify = wal._cond.notify_all

    def counting() -> None:
        woken[0] += 1
        real_notify()

    wal._cond.notify_all = counting  # type: ignore[method-assign]
    return woken


@pytest.mark.usefixtures("no_writer")
def test_a_driven_append_whose_caller_never_drives_is_committed_by_the_next_append(
    wal_path: Path,
) -> None:
    """`append(driven=True)` leaves the writer asleep (its caller commits, `drive`); should
    that caller never come, the next append of anyone wakes the writer for both records."""
    wal = FileWal(wal_path, settings=small(caller_commits=True))
    recover_all(wal)
    woken = count_wakeups(wal)
    first = wal.append(b"driven", driven=True)
    assert woken[0] == 0
    wal.drive(first)  # the caller commits it: nobody was woken
    assert first.result(timeout=0) is not None and woken[0] == 0
    stranded = wal.append(b"no driver comes", driven=True)
    later = wal.append(b"next", driven=True)
    assert woken[0] == 1  # the second append woke the writer for the first one
    wal.drive(later)
    assert stranded.done() and later.done()
    wal.close()


def test_a_lone_driven_append_without_its_driver_is_written_at_close(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small(caller_commits=True))
    recover_all(wal)
    fut = wal.append(b"driven, never driven", driven=True)
    wal.close()
    wal = FileWal(wal_path, settings=small(caller_commits=True))
    assert recover_all(wal) == [WalRecord(fut.result(timeout=0), b"driven, never driven")]
    wal.close()


def test_a_synchronous_appender_commits_alone(wal_path: Path) -> None:
    """One thread appending and driving: every commit runs in that thread and the writer
    thread is never woken (it would cost two context switches and a GIL hand-off each)."""
    wal = FileWal(wal_path, settings=small(4 * MiB, caller_commits=True))
    recover_all(wal)
    committers: list[int] = []
    wal.observe_commits(lambda *_: committers.append(threading.get_ident()))
    woken = count_wakeups(wal)
    for i in range(50):
        fut = wal.append(data_for(i, 1000), driven=True)
        wal.drive(fut)
        fut.result(timeout=0)
    assert committers == [threading.get_ident()] * 50
    assert woken[0] == 0
    wal.close()


# -- lifecycle ----------------------------------------------------------------------------------


def test_lifecycle(wal_path: Path) -> None:
    wal = FileWal(wal_path, settings=small())
    with pytest.raises(S3StreamError, match="recover"):
        wal.append(b"early")
    with pytest.raises(S3StreamError, match="recover"):
        wal.trim(0)
    with pytest.raises(InvalidArgumentError, match="bytes"):
        wal.append(bytearray(b"mutable"))  # type: ignore[arg-type]
    recover_all(wal)
    assert wal.capabilities.persistent and wal.capabilities.durable_on_ack
    assert "node.wal" in wal.describe()
    futs = [wal.append(data_for(i, 5000)) for i in range(40)]
    wal.close()
    assert all(f.done() and f.exception() is None for f in futs)
    wal.close()  # idempotent
    for call in (lambda: wal.append(b"x"), lambda: wal.trim(0), wal.reset):
        with pytest.raises(StreamClosedError):
            call()
    with pytest.raises(StreamClosedError):
        list(wal.recover())


# -- a real crash -------------------------------------------------------------------------------

CRASH_RECORD = textwrap.dedent(
    """
    import hashlib

    def crash_record(it, j):
        # Record #j of crash run `it`: self-describing, sizes from 0 to 9 KB.
        size = 9000 if j % 17 == 0 else (j * 131 + it * 7) % 1500
        block = hashlib.sha256(f"{it}/{j}".encode()).digest()
        return f"{it}:{j}:".encode() + (block * (size // 32 + 1))[:size]
    """
)
CHILD = CRASH_RECORD + textwrap.dedent(
    """
    import sys
    from collections import deque
    from s3stream.settings import FileWalSettings
    from s3stream.wal.file import FileWal

    path, it = sys.argv[1], int(sys.argv[2])

    wal = FileWal(path, settings=FileWalSettings(capacity_bytes=1 << 20, max_group_bytes=1 << 16))
    for _ in wal.recover():
        pass
    out = sys.stdout
    out.write("READY\\n")
    out.flush()
    inflight = deque()
    acked = []
    for j in range(10**9):
        inflight.append((j, wal.append(crash_record(it, j))))
        if len(inflight) < 16:
            continue
        k, fut = inflight.popleft()
        pos = fut.result()
        acked.append(pos)
        out.write(f"A {it} {k} {pos}\\n")
        out.flush()
        if k % 50 == 49 and len(acked) > 40:
            target = acked[-40]
            out.write(f"R {target}\\n")
            out.flush()
            wal.trim(target)
            out.write(f"T {target}\\n")
            out.flush()
    """
)


_crash_namespace: dict[str, object] = {}
exec(CRASH_RECORD, _crash_namespace)
crash_record = _crash_namespace["crash_record"]


@pytest.mark.slow
def test_sigkill_crash_loop(tmp_path: Path) -> None:
    """SIGKILL a writer mid-append, ten times over one WAL: every acknowledged record survives
    byte for byte and in order; nothing trimmed comes back; nothing else but an in-order
    continuation of unacknowledged appends."""
    path = tmp_path / "crash.wal"
    rng = random.Random(99)
    acked: dict[int, tuple[int, int]] = {}  # position -> (run, index)
    trimmed_to = -1  # durable: the child printed it after trim() returned
    requested = -1
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for it in range(10):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(it)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        lines: list[str] = []
        ready = threading.Event()

        def pump(
            p: subprocess.Popen[str] = proc, out: list[str] = lines, ready: threading.Event = ready
        ) -> None:
            assert p.stdout is not None
            for line in p.stdout:
                if line.startswith("READY"):
                    ready.set()
                out.append(line)

        reader = threading.Thread(target=pump)
        reader.start()
        assert ready.wait(60), f"child did not start: {proc.stderr.read() if proc.stderr else ''}"
        time.sleep(rng.uniform(0.05, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        reader.join(timeout=30)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
        for line in lines:
            kind, *fields = line.split()
            if kind == "A":
                acked[int(fields[2])] = (int(fields[0]), int(fields[1]))
            elif kind == "R":
                requested = max(requested, int(fields[0]))
            elif kind == "T":
                trimmed_to = max(trimmed_to, int(fields[0]))

        wal = FileWal(path, settings=FileWalSettings(capacity_bytes=1 << 20))
        got = recover_all(wal)
        positions = [r.position for r in got]
        assert positions == sorted(set(positions))
        ids = []
        for rec in got:
            run, j = (int(x) for x in rec.data.split(b":", 2)[:2])
            assert rec.data == crash_record(run, j), f"garbage at {rec.position}"
            assert acked.get(rec.position, (run, j)) == (run, j)
            ids.append((run, j))
        assert all(p > trimmed_to for p in positions), "a trimmed record came back"
        first = positions[0] if positions else 1 << 62
        live = sorted(p for p in acked if p > trimmed_to)
        missing = [p for p in live if p not in set(positions)]
        # Acknowledged records may be missing only below the start, and only if a trim up to
        # them had been requested (it may have become durable before the kill).
        assert all(p < first and p <= requested for p in missing), f"lost {missing[:5]}"
        # Unacknowledged survivors only continue, in order, the last run's appends.
        for a, b in itertools.pairwise(ids):
            assert b == (a[0], a[1] + 1) or (b[0] > a[0] and b[1] == 0), f"hole: {a} -> {b}"
        for pos in [p for p in acked if p < first]:
            del acked[pos]
        # What recovery returned is durable now; later runs must keep it too.
        acked.update(zip(positions, ids, strict=True))
        trimmed_to = max(trimmed_to, first - 1)
        if it % 2:
            wal.close()
        else:
            wal._abandon()


# -- the registry -------------------------------------------------------------------------------


def test_open_wal_by_url(tmp_path: Path) -> None:
    clock = SystemClock()
    target = tmp_path / "u" / "a b.wal"
    url = f"file://{str(target).replace(' ', '%20')}?capacity=64KiB&max_group=16KiB&full_wait_ms=5"
    wal = open_wal(url, node_id="n1", clock=clock, node_epoch=3)
    assert isinstance(wal, FileWal)
    assert wal.data_capacity == 64 * KiB and wal.path == target
    assert wal.header.node_epoch == 3 and wal.header.node_id == "n1"
    wal.close()
    plain = open_wal(str(target), node_id="n1", clock=clock, node_epoch=3)
    assert isinstance(plain, FileWal) and plain.data_capacity == 64 * KiB
    plain.close()
    assert isinstance(open_wal("memory://", node_id="n1", clock=clock), MemoryWal)
    with pytest.raises(InvalidArgumentError, match="unknown file WAL setting 'speed'"):
        open_wal(f"file://{target}?speed=9", node_id="n1", clock=clock)
    with pytest.raises(InvalidArgumentError, match="capacity"):
        open_wal(f"file://{target}?capacity=lots", node_id="n1", clock=clock)
    with pytest.raises(InvalidArgumentError, match="no WAL for URL scheme 'nope'"):
        open_wal("nope://x", node_id="n1", clock=clock)


def test_parse_size() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("64MiB") == 64 * MiB
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("16kib") == 16 * KiB
    assert parse_size("1 GiB") == 1 << 30
    # Decimal-looking units are refused: 1000- or 1024-based is the doubt the rule removes.
    for bad in ("", "1.5G", "-1", "10 parsecs", "16k", "1 GB", "2M"):
        with pytest.raises(InvalidArgumentError):
            parse_size(bad)


def test_a_failed_header_write_is_retryable_with_direct_io_too(
    wal_path: Path, direct: bool
) -> None:
    """A header write that fails (here: one extending the window, then reset's own) fails the
    appends retryably and `reset()` resumes once writes work again. With O_DIRECT the header
    goes through an mmap buffer, which once turned the error into a fatal BufferError."""
    settings = small(256 * KiB, direct_io=direct, recovery_window_bytes=4096)
    wal = FileWal(wal_path, settings=settings)
    recover_all(wal)
    with failing_writes(wal):
        fut = wal.append(b"x" * 5000)  # crosses the 4 KiB window: a header write comes first
        with pytest.raises(UnavailableError) as info:
            fut.result(timeout=30)
        assert info.value.retryable
        with pytest.raises(UnavailableError):
            wal.reset()  # its header write fails too: retryable, may be called again
    wal.reset()
    assert wal.append(b"y").result(timeout=30) >= 0
    wal.close()


def test_an_older_copy_of_a_block_is_corruption(wal_path: Path) -> None:
    """A block put back as it was earlier (its old group mark included): the frames written
    after that mark are found, so the records there are not taken for a torn tail."""
    wal = FileWal(wal_path, settings=small(64 * KiB))
    recover_all(wal)
    first = append_all(wal, [data_for(i, 700) for i in range(3)])
    end = first[-1].position + frame_size(700)
    block = DATA_START + end - end % 4096
    with open(wal_path, "rb") as f:
        f.seek(block)
        old = f.read(4096)
    append_all(wal, [data_for(10 + i, 700) for i in range(8)])
    wal._abandon()
    with open(wal_path, "r+b") as f:
        f.seek(block)
        f.write(old)
    with pytest.raises(CorruptionError, match="written after it"):
        reopen(wal_path)


def test_headers_rolled_back_behind_a_lap_of_the_ring_are_corruption(wal_path: Path) -> None:
    """Both header slots put back as they were before the ring wrapped: their start now holds
    frames of a later lap, so the header is older than the data."""
    wal = FileWal(wal_path, settings=small(64 * KiB))
    recover_all(wal)
    old_headers = wal_path.read_bytes()[:DATA_START]
    acked: list[WalRecord] = []
    for i in range(30):  # about 1.9 laps of 4 KiB frames, trimmed as it goes
        acked += append_all(wal, [data_for(i, 4096 - 32)])
        if len(acked) > 4:
            wal.trim(acked[-5].position)
    wal._abandon()
    with open(wal_path, "r+b") as f:
        f.write(old_headers)
    with pytest.raises(CorruptionError, match="later lap"):
        reopen(wal_path)


def test_check_of_a_preallocated_wal_without_a_header(tmp_path: Path) -> None:
    """A creation that crashed after preallocating: not a WAL yet, not damage."""
    path = tmp_path / "n.wal"
    path.write_bytes(bytes(DATA_START + 64 * KiB))
    check = check_file_wal(path)
    assert check.ok and not check.formatted


def test_check_of_a_short_file_judges_it_as_an_opening_does(tmp_path: Path) -> None:
    """A file shorter than the headers is a cut WAL when it starts like the header magic,
    and otherwise not a WAL at all (``verify --wal /etc/passwd`` reported it DAMAGED), as
    `FileWal` judges it when opening."""
    text = tmp_path / "passwd"
    text.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(InvalidArgumentError, match="not an s3stream WAL"):
        check_file_wal(text)
    with pytest.raises(InvalidArgumentError, match="not an s3stream WAL"):
        FileWal(text, settings=small(256 * KiB))
    cut = tmp_path / "cut.wal"
    cut.write_bytes(b"S3SWA")
    check = check_file_wal(cut)
    assert check.damage is not None and "truncated to 5 bytes" in check.damage


def test_zeroed_headers_over_a_ring_of_records_are_damage_not_a_new_wal(tmp_path: Path) -> None:
    """Both header slots read as zeros while the ring holds records (the headers were wiped):
    a damaged WAL, refused unless the loss is accepted; never formatted again silently, as a
    crash during creation (zeros everywhere) may be."""
    path = tmp_path / "w.wal"
    acked = crash_image(path, [[b"a" * 100, b"b" * 200], [b"c" * 50]])
    assert acked
    with open(path, "r+b") as f:
        f.write(bytes(DATA_START))
    assert check_file_wal(path).damage is not None
    with pytest.raises(CorruptionError, match="ring holds records"):
        reopen(path)
    assert reopen(path, accept=True) == []  # accepted: formatted, the records gone
    # Zeros everywhere (a creation that crashed before its first header): formatted quietly.
    fresh = tmp_path / "fresh.wal"
    fresh.write_bytes(bytes(DATA_START + 64 * KiB))
    wal = FileWal(fresh, settings=small(64 * KiB))
    assert recover_all(wal) == []
    wal.close()


def test_a_wal_never_writes_through_or_over_a_file_that_is_not_its_lock(tmp_path: Path) -> None:
    """The lock file beside a WAL: an existing file of that name that is no lock file of ours
    is refused and left as it was; a symlink there is never followed (its target would be
    overwritten with the holder's pid)."""
    user = tmp_path / "notes.wal.lock"
    user.write_text("my notes\n")
    with pytest.raises(InvalidArgumentError, match="not the lock file"):
        FileWal(tmp_path / "notes.wal", settings=small(64 * KiB))
    assert user.read_text() == "my notes\n"
    victim = tmp_path / "victim.cfg"
    victim.write_text("config\n")
    (tmp_path / "w.wal.lock").symlink_to(victim)
    with pytest.raises(InvalidArgumentError, match="symlink"):
        FileWal(tmp_path / "w.wal", settings=small(64 * KiB))
    assert victim.read_text() == "config\n"
    # A lock file a holder left (a crash): taken over as before.
    wal = FileWal(tmp_path / "ok.wal", settings=small(64 * KiB))
    recover_all(wal)
    wal._abandon()
    again = FileWal(tmp_path / "ok.wal", settings=small(64 * KiB))
    recover_all(again)
    again.close()


def test_a_fifo_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    """Opening, inspecting or verifying a FIFO as a WAL would wait for a writer forever; it is
    refused at once, and no lock file is made beside it."""
    fifo = tmp_path / "x.wal"
    os.mkfifo(fifo)
    for call in (
        lambda: FileWal(fifo, settings=small(64 * KiB)),
        lambda: check_file_wal(fifo),
        lambda: read_wal_header(fifo),
    ):
        outcome: list[object] = []
        t = threading.Thread(target=lambda c=call, out=outcome: out.append(_raised(c)), daemon=True)
        t.start()
        t.join(5)
        assert not t.is_alive(), "blocked on the FIFO"
        assert isinstance(outcome[0], InvalidArgumentError), outcome
    assert not (tmp_path / "x.wal.lock").exists()


def _raised(call: object) -> object:
    try:
        call()  # type: ignore[operator]
    except Exception as exc:
        return exc
    return None


@pytest.mark.parametrize("content", [b"", b"\0" * 16, b"4242\nnod", b"4242\n", b"4242"])
def test_a_lock_file_a_crash_left_half_written_is_still_ours(
    tmp_path: Path, content: bytes
) -> None:
    """A lock file emptied and not yet written by a holder that just won it, or cut short
    (a crash, NULs after a power loss): still a lock file of ours, taken as before."""
    path = tmp_path / "w.wal"
    wal = FileWal(path, settings=small(64 * KiB))
    recover_all(wal)
    wal.close()
    (tmp_path / "w.wal.lock").write_bytes(content)
    again = FileWal(path, settings=small(64 * KiB))
    recover_all(again)
    again.close()


def test_wiped_headers_are_found_behind_a_record_straddling_the_ring_end(tmp_path: Path) -> None:
    """The ring's first bytes may be the tail of a record that straddles its end: the frames
    after it still show that the ring was used."""
    path = tmp_path / "w.wal"
    capacity = 64 * KiB
    wal = FileWal(path, settings=small(capacity))
    recover_all(wal)
    for i in range(12):  # past the end of the ring, records of odd sizes
        wal.trim(wal.append(data_for(i, 9_000 + 7 * i)).result(10))
    acked = wal.append(data_for(99, 5_000)).result(10)
    assert acked > capacity
    wal._abandon()
    with open(path, "r+b") as f:
        f.write(bytes(DATA_START))
    with pytest.raises(CorruptionError, match="ring holds records"):
        FileWal(path, settings=small(capacity))
