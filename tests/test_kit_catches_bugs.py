"""The conformance kit must fail broken WALs and object stores, and pass correct ones.

Each broken implementation below has exactly one deliberate bug. The kit's tests are run on it
by calling them directly (the same methods pytest would collect from a ``TestXxx`` subclass),
its state machine through Hypothesis; the named tests must fail. Correct counterparts with the
same capabilities pass the whole kit, so the failures are the bugs' doing and not the kit's.
Two end-to-end runs in a subprocess show what a user sees through pytest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from s3stream.errors import (
    FencedError,
    InvalidArgumentError,
    S3StreamError,
    StreamClosedError,
    WalFullError,
)
from s3stream.objectstore.base import ObjectInfo, ObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.testing.faults import FaultyWal
from s3stream.testing.objectstore import ObjectStoreTests, make_object_store_state_machine
from s3stream.testing.storage import FaultyStorageStateMachine
from s3stream.testing.wal import WalTests, make_wal_state_machine
from s3stream.wal.base import WalCapabilities, WalPosition, WalRecord, WriteAheadLog
from s3stream.wal.memory import MemoryWal, MemoryWalMedium

REPO = Path(__file__).resolve().parent.parent
_MEMORY_CAPS = MemoryWal().capabilities

# -- running the kit by hand ---------------------------------------------------------------------


def run_kit(kit: WalTests | ObjectStoreTests, tmp_path: Path) -> dict[str, str]:
    """Run every example test of `kit` (not the state machine): name -> outcome."""
    outcomes: dict[str, str] = {}
    for name in sorted(dir(kit)):
        if not name.startswith("test_") or name == "test_state_machine":
            continue
        directory = tmp_path / name
        directory.mkdir()
        try:
            getattr(kit, name)(directory)
            outcomes[name] = "passed"
        except AssertionError:
            outcomes[name] = "failed"
        except pytest.skip.Exception:
            outcomes[name] = "skipped"
        except Exception as exc:
            outcomes[name] = f"error: {type(exc).__name__}: {exc}"
        finally:
            if isinstance(kit, WalTests):
                kit.close_opened_wals()
    return outcomes


def failed(outcomes: dict[str, str]) -> set[str]:
    return {
        name for name, outcome in outcomes.items() if outcome != "passed" and "skip" not in outcome
    }


#: Quick, deterministic, no shrinking: enough to find each bug, and the same run every time.
FIND_BUGS = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)
#: For correct implementations: a smaller run that must pass.
NO_BUGS = settings(FIND_BUGS, max_examples=10)


def wal_machine_fails(kit: WalTests, tmp_path: Path, expect_bug: bool = True) -> bool:
    machine = make_wal_state_machine(kit, tmp_path)
    try:
        run_state_machine_as_test(machine, settings=FIND_BUGS if expect_bug else NO_BUGS)
    except (AssertionError, S3StreamError):  # a check failed, or the WAL raised where it may not
        return True
    return False


def store_machine_fails(kit: ObjectStoreTests, tmp_path: Path, expect_bug: bool = True) -> bool:
    machine = make_object_store_state_machine(kit, tmp_path)
    try:
        run_state_machine_as_test(machine, settings=FIND_BUGS if expect_bug else NO_BUGS)
    except AssertionError:
        return True
    return False


# -- broken WALs -----------------------------------------------------------------------------------


class CheckedMemoryWal(MemoryWal):
    """MemoryWal plus the two argument checks it lacks (the kit flags those in
    test_conformance_wal), so that each WAL below has exactly its one deliberate bug."""

    def append(self, data: bytes) -> Future[WalPosition]:
        if type(data) is bytes and len(data) > self.capabilities.max_record_bytes:
            raise InvalidArgumentError("record too large")
        return super().append(data)

    def trim(self, position: WalPosition) -> None:
        if type(position) is not int:
            raise InvalidArgumentError("position must be an int")
        super().trim(position)


class AckBeforeDurableWal(CheckedMemoryWal):
    """BUG: acknowledges at once but keeps records in process memory, writing them to the
    medium only every fourth append (or at close); a crash loses the buffered ones."""

    def __init__(self, medium: MemoryWalMedium) -> None:
        super().__init__(medium)
        self._buffer: list[WalRecord] = []

    def append(self, data: bytes) -> Future[WalPosition]:
        if type(data) is not bytes or len(data) > self.capabilities.max_record_bytes:
            raise InvalidArgumentError("data must be bytes, not too many")
        m = self.medium
        with m.lock:
            self._check_open()
            if not self._ready:
                raise S3StreamError("not ready")
            pos = m.next_position
            m.next_position += 1
            self._buffer.append(WalRecord(pos, data))
            if len(self._buffer) >= 4:
                m.records.extend(self._buffer)
                self._buffer.clear()
        fut: Future[WalPosition] = Future()
        fut.set_result(pos)
        return fut

    def close(self) -> None:
        with self.medium.lock:
            self.medium.records.extend(self._buffer)
            self._buffer.clear()
        super().close()


class ReorderingWal(CheckedMemoryWal):
    """BUG: stores records in order but completes their futures from a background thread,
    each batch in reverse order."""

    def __init__(self, medium: MemoryWalMedium) -> None:
        super().__init__(medium)
        self._held: list[tuple[Future[WalPosition], WalPosition]] = []
        self._held_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._complete_loop, daemon=True)
        self._thread.start()

    def append(self, data: bytes) -> Future[WalPosition]:
        pos = super().append(data).result()
        outer: Future[WalPosition] = Future()
        with self._held_lock:
            self._held.append((outer, pos))
        return outer

    def _complete_loop(self) -> None:
        while not self._stop.wait(0.002):
            self._release()

    def _release(self) -> None:
        with self._held_lock:
            batch, self._held = self._held, []
        for fut, pos in reversed(batch):
            fut.set_result(pos)

    def _abandon(self) -> None:
        self._stop.set()
        self._thread.join()

    def close(self) -> None:
        self._abandon()
        self._release()
        super().close()


class ResurrectingWal(CheckedMemoryWal):
    """BUG: remembers the trim point only in process memory; after a restart trimmed records
    come back."""

    def __init__(self, medium: MemoryWalMedium) -> None:
        super().__init__(medium)
        self._trim_point = -1

    def trim(self, position: WalPosition) -> None:
        if type(position) is not int:
            raise InvalidArgumentError("position must be an int")
        self._check_open()
        self._trim_point = max(self._trim_point, position)

    def recover(self) -> Iterator[WalRecord]:
        for record in super().recover():
            if record.position > self._trim_point:
                yield record


class FencingMedium(MemoryWalMedium):
    """A memory medium that also records the epoch of its current owner."""

    def __init__(self) -> None:
        super().__init__()
        self.owner_epoch = -1


class FencingMemoryWal(CheckedMemoryWal):
    """A correct memory WAL with fencing: the newest epoch to recover or reset owns it."""

    check_fence = True

    def __init__(self, medium: FencingMedium, node_epoch: int) -> None:
        super().__init__(medium)
        self._fencing_medium = medium
        self._epoch = node_epoch

    @property
    def capabilities(self) -> WalCapabilities:
        return dataclasses.replace(_MEMORY_CAPS, fencing=True)

    def _claim(self) -> None:
        m = self._fencing_medium
        with m.lock:
            if self._epoch < m.owner_epoch:
                raise FencedError(f"epoch {self._epoch} < owner epoch {m.owner_epoch}")
            m.owner_epoch = self._epoch

    def recover(self) -> Iterator[WalRecord]:
        self._claim()
        yield from super().recover()

    def reset(self) -> None:
        self._claim()
        super().reset()

    def append(self, data: bytes) -> Future[WalPosition]:
        if self.check_fence and self._fencing_medium.owner_epoch != self._epoch:
            raise FencedError(f"epoch {self._epoch} was fenced")
        return super().append(data)


class IgnoresFencingWal(FencingMemoryWal):
    """BUG: claims fencing, but a fenced writer keeps appending."""

    check_fence = False


class BoundedMemoryWal(CheckedMemoryWal):
    """A correct memory WAL of bounded capacity: appends wait for room, then fail."""

    overwrite_when_full = False

    def __init__(self, medium: MemoryWalMedium, capacity_bytes: int, full_wait_ms: int) -> None:
        super().__init__(medium)
        self._capacity = capacity_bytes
        self._wait_s = full_wait_ms / 1000
        self._room = threading.Condition(medium.lock)

    @property
    def capabilities(self) -> WalCapabilities:
        return dataclasses.replace(
            _MEMORY_CAPS, bounded_capacity=True, max_record_bytes=self._capacity
        )

    def append(self, data: bytes) -> Future[WalPosition]:
        if type(data) is not bytes:
            raise InvalidArgumentError("data must be bytes")
        if len(data) > self._capacity:
            raise InvalidArgumentError("record larger than the WAL")
        m = self.medium
        deadline = time.monotonic() + self._wait_s
        with self._room:
            self._check_open()
            if not self._ready:
                raise S3StreamError("not ready")
            while sum(len(r.data) for r in m.records) + len(data) > self._capacity:
                if self.overwrite_when_full:
                    del m.records[0]
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WalFullError("the WAL stayed full")
                self._room.wait(remaining)
            pos = m.next_position
            m.next_position += 1
            m.records.append(WalRecord(pos, data))
            fut: Future[WalPosition] = Future()
            fut.set_result(pos)
        return fut

    def trim(self, position: WalPosition) -> None:
        super().trim(position)
        with self._room:
            self._room.notify_all()


class OverwritingWal(BoundedMemoryWal):
    """BUG: when full, it makes room by dropping the oldest untrimmed records."""

    overwrite_when_full = True


_FRAME = struct.Struct("<II")  # length, crc32c of the body


class FileLogWal(WriteAheadLog):
    """A correct append-only file WAL that can see torn writes: frames of length + crc32c +
    body, fsynced per append; recovery keeps the valid prefix and cuts the rest off.
    Positions are byte offsets; the trim point lives in a side file replaced atomically."""

    verify_crc = True

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._log = directory / "log"
        self._trim_file = directory / "trim"
        self._fd = os.open(self._log, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self._ready = False
        self._closed = False
        self._end = 0
        self._trim = int(self._trim_file.read_text()) if self._trim_file.exists() else -1

    @property
    def capabilities(self) -> WalCapabilities:
        return WalCapabilities(
            persistent=True,
            durable_on_ack=True,
            torn_writes=True,
            bounded_capacity=False,
            fencing=False,
            max_record_bytes=1 << 20,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosedError("closed")

    def recover(self) -> Iterator[WalRecord]:
        self._check_open()
        data = self._log.read_bytes()
        records, pos = [], 0
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            body = data[pos + _FRAME.size : pos + _FRAME.size + length]
            if len(body) < length or (self.verify_crc and crc32c.crc32c(body) != crc):
                break
            records.append(WalRecord(pos, body))
            pos += _FRAME.size + length
        os.truncate(self._log, pos)  # a torn tail must not sit between old and new frames
        os.fsync(self._fd)
        self._end = pos
        yield from (r for r in records if r.position > self._trim)
        self._ready = True

    def append(self, data: bytes) -> Future[WalPosition]:
        if type(data) is not bytes:
            raise InvalidArgumentError("data must be bytes")
        if len(data) > self.capabilities.max_record_bytes:
            raise InvalidArgumentError("record too large")
        with self._lock:
            self._check_open()
            if not self._ready:
                raise S3StreamError("recover() or reset() first")
            pos = self._end
            os.write(self._fd, _FRAME.pack(len(data), crc32c.crc32c(data)) + data)
            os.fsync(self._fd)
            self._end += _FRAME.size + len(data)
        fut: Future[WalPosition] = Future()
        fut.set_result(pos)
        return fut

    def _persist_trim(self, position: int) -> None:
        tmp = self._trim_file.with_suffix(".tmp")
        tmp.write_text(str(position))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self._trim_file)
        self._trim = position

    def trim(self, position: WalPosition) -> None:
        if type(position) is not int:
            raise InvalidArgumentError("position must be an int")
        with self._lock:
            self._check_open()
            if position > self._trim:
                self._persist_trim(position)

    def reset(self) -> None:
        with self._lock:
            self._check_open()
            if not self._ready:
                self._end = os.fstat(self._fd).st_size
            self._persist_trim(max(self._trim, self._end - 1))
            self._ready = True

    def _abandon(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)

    def close(self) -> None:
        with self._lock:
            self._abandon()


class AcceptsTornRecordWal(FileLogWal):
    """BUG: does not check the crc32c, so a torn frame comes back as a record."""

    verify_crc = False


def tear_file_log(directory: Path, seed: int) -> None:
    """A torn append of a `FileLogWal`: the frame header landed, the body is still zeros
    (a file extended by the write whose data blocks never made it to disk)."""
    log = directory / "log"
    data = log.read_bytes()
    pos = 0
    while pos + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, pos)
        body = data[pos + _FRAME.size : pos + _FRAME.size + length]
        if len(body) < length or crc32c.crc32c(body) != crc:
            break
        pos += _FRAME.size + length
    intended = seed.to_bytes(8, "little") * 4
    with open(log, "r+b") as f:
        f.truncate(pos)
        f.seek(pos)
        f.write(_FRAME.pack(len(intended), crc32c.crc32c(intended)) + bytes(len(intended)))


class HarmedByOversizedWal(CheckedMemoryWal):
    """BUG: refuses an oversized record, but then fails every later append, as if the
    refusal were a failure of the medium."""

    def __init__(self, medium: MemoryWalMedium) -> None:
        super().__init__(medium)
        self._broken = False

    def append(self, data: bytes) -> Future[WalPosition]:
        if self._broken:
            raise S3StreamError("the WAL failed earlier")
        try:
            return super().append(data)
        except InvalidArgumentError:
            self._broken = True
            raise


class NeverResumesWal(FaultyWal):
    """BUG: after a transient fault, `reset()` returns but the WAL keeps failing appends."""

    def reset(self) -> None:
        failure = self._failure
        super().reset()
        self._failure = failure


# -- kits for them (no Test prefix: pytest does not collect these) -----------------------------


class MemoryKit(WalTests):
    wal_class: type[MemoryWal] = CheckedMemoryWal
    ack_timeout_s = 5.0

    def make_medium(self, tmp_path: Path) -> MemoryWalMedium:
        return MemoryWalMedium()

    def open_wal(self, medium: MemoryWalMedium) -> WriteAheadLog:
        return self.wal_class(medium)

    def raw_bytes(self, medium: MemoryWalMedium) -> bytes:
        with medium.lock:
            return b"".join(r.data for r in medium.records)


class HarmedByOversizedKit(MemoryKit):
    wal_class = HarmedByOversizedWal


class FaultyMemoryKit(MemoryKit):
    """A memory WAL behind a `FaultyWal`, whose faults `transient_fault` switches on."""

    faulty_class: type[FaultyWal] = FaultyWal

    def open_wal(self, medium: MemoryWalMedium) -> WriteAheadLog:
        return self.faulty_class(super().open_wal(medium), rng=random.Random(5))

    @contextlib.contextmanager
    def transient_fault(self, medium: MemoryWalMedium, wal: WriteAheadLog) -> Iterator[None]:
        assert isinstance(wal, FaultyWal)
        wal.failing = True
        try:
            yield
        finally:
            wal.failing = False


class NeverResumesKit(FaultyMemoryKit):
    faulty_class = NeverResumesWal


class AckBeforeDurableKit(MemoryKit):
    wal_class = AckBeforeDurableWal


class ReorderingKit(MemoryKit):
    wal_class = ReorderingWal


class ResurrectingKit(MemoryKit):
    wal_class = ResurrectingWal


class FencingKit(WalTests):
    wal_class: type[FencingMemoryWal] = FencingMemoryWal

    def make_medium(self, tmp_path: Path) -> FencingMedium:
        return FencingMedium()

    def open_wal(self, medium: FencingMedium) -> WriteAheadLog:
        return self.wal_class(medium, node_epoch=max(0, medium.owner_epoch))

    def open_wal_as(self, medium: FencingMedium, node_epoch: int) -> WriteAheadLog:
        return self.wal_class(medium, node_epoch)


class IgnoresFencingKit(FencingKit):
    wal_class = IgnoresFencingWal


class BoundedKit(MemoryKit):
    bounded_class: type[BoundedMemoryWal] = BoundedMemoryWal
    small_capacity_bytes = 64 << 10

    def open_wal(self, medium: MemoryWalMedium) -> WriteAheadLog:
        return self.bounded_class(medium, 16 << 20, 1000)

    def open_small_wal(
        self, medium: MemoryWalMedium, capacity_bytes: int, full_wait_ms: int
    ) -> WriteAheadLog:
        return self.bounded_class(medium, capacity_bytes, full_wait_ms)


class OverwritingKit(BoundedKit):
    bounded_class = OverwritingWal


class FileLogKit(WalTests):
    wal_class: type[FileLogWal] = FileLogWal
    ack_timeout_s = 5.0

    def make_medium(self, tmp_path: Path) -> Path:
        return tmp_path / "filelog"

    def open_wal(self, medium: Path) -> WriteAheadLog:
        return self.wal_class(medium)

    def raw_bytes(self, medium: Path) -> bytes:
        return (medium / "log").read_bytes()

    def tear_tail(self, medium: Path, rng: Any) -> None:
        tear_file_log(medium, rng.randrange(1 << 30))


class AcceptsTornRecordKit(FileLogKit):
    wal_class = AcceptsTornRecordWal


# -- broken object stores --------------------------------------------------------------------------


class RacyPutIfAbsentStore(MemoryObjectStore):
    """BUG: checks, then writes: two racing creators can both win."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.head(key) is not None:
            return False
        time.sleep(0.001)  # the window any network round trip would open
        self.put(key, data)
        return True


class UnsortedListStore(MemoryObjectStore):
    """BUG: lists objects in the order they were written, not in key order."""

    def __init__(self) -> None:
        super().__init__()
        self._order: dict[str, None] = {}

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        self._order.pop(key, None)
        self._order[key] = None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        by_key = {i.key: i for i in super().list(prefix)}
        return iter([by_key[k] for k in self._order if k in by_key])


class StoreKit(ObjectStoreTests):
    store_class: type[ObjectStore] = MemoryObjectStore
    many_keys = 1005

    def make_store(self, tmp_path: Path) -> ObjectStore:
        return self.store_class()


class RacyKit(StoreKit):
    store_class = RacyPutIfAbsentStore


class UnsortedKit(StoreKit):
    store_class = UnsortedListStore


# -- the reference implementations pass everything -------------------------------------------------


@pytest.mark.parametrize(
    ("kit", "claimed"),
    [
        (MemoryKit, None),
        (FencingKit, "fencing"),
        (BoundedKit, "capacity"),
        (FileLogKit, "torn"),
        (FaultyMemoryKit, "failure"),
    ],
    ids=["memory", "fencing", "bounded", "filelog", "faulty"],
)
def test_correct_wals_pass_the_whole_kit(
    kit: type[WalTests], claimed: str | None, tmp_path: Path
) -> None:
    outcomes = run_kit(kit(), tmp_path)
    assert not failed(outcomes), {n: o for n, o in outcomes.items() if n in failed(outcomes)}
    if claimed is not None:
        # The claim unlocked its tests: nothing passed vacuously by being skipped.
        group = {n: o for n, o in outcomes.items() if n.startswith(f"test_{claimed}_")}
        assert len(group) >= 2 and set(group.values()) == {"passed"}, group
    assert not wal_machine_fails(kit(), tmp_path / "machine", expect_bug=False)


def test_reference_store_passes_the_whole_kit(tmp_path: Path) -> None:
    outcomes = run_kit(StoreKit(), tmp_path)
    assert not failed(outcomes), outcomes
    assert not store_machine_fails(StoreKit(), tmp_path / "machine", expect_bug=False)


# -- each bug is caught ----------------------------------------------------------------------------


def test_kit_catches_acknowledging_before_durable(tmp_path: Path) -> None:
    caught = failed(run_kit(AckBeforeDurableKit(), tmp_path))
    assert {
        "test_recovery_acknowledged_records_survive_crash",
        "test_recovery_acknowledged_record_is_on_the_medium",
        "test_recovery_round_trips_edge_sizes",
    } <= caught
    assert wal_machine_fails(AckBeforeDurableKit(), tmp_path / "machine")


def test_kit_catches_reordered_completions(tmp_path: Path) -> None:
    caught = failed(run_kit(ReorderingKit(), tmp_path))
    assert {
        "test_append_futures_complete_in_append_order",
        "test_concurrency_callbacks_fire_in_position_order",
    } <= caught


def test_kit_catches_resurrected_trimmed_records(tmp_path: Path) -> None:
    caught = failed(run_kit(ResurrectingKit(), tmp_path))
    assert {
        "test_trim_trimmed_records_never_return",
        "test_trim_is_idempotent_and_monotonic",
        "test_trim_everything_then_append",
        "test_concurrency_append_while_trimming",
    } <= caught
    assert wal_machine_fails(ResurrectingKit(), tmp_path / "machine")


def test_kit_catches_accepted_torn_record(tmp_path: Path) -> None:
    caught = failed(run_kit(AcceptsTornRecordKit(), tmp_path))
    assert {"test_torn_tail_is_never_recovered", "test_torn_tail_after_trim_and_reset"} <= caught
    assert wal_machine_fails(AcceptsTornRecordKit(), tmp_path / "machine")


def test_kit_catches_ignored_fencing(tmp_path: Path) -> None:
    caught = failed(run_kit(IgnoresFencingKit(), tmp_path))
    assert "test_fencing_newer_epoch_fences_older_writer" in caught


def test_kit_catches_overwriting_when_full(tmp_path: Path) -> None:
    caught = failed(run_kit(OverwritingKit(), tmp_path))
    assert {
        "test_capacity_full_wal_fails_with_wal_full_error",
        "test_capacity_blocked_append_resumes_after_trim",
    } <= caught


def test_kit_catches_a_refused_record_that_harms_the_wal(tmp_path: Path) -> None:
    caught = failed(run_kit(HarmedByOversizedKit(), tmp_path))
    assert "test_input_oversized_record_is_rejected" in caught


def test_kit_catches_a_wal_that_never_resumes_after_a_fault(tmp_path: Path) -> None:
    caught = failed(run_kit(NeverResumesKit(), tmp_path))
    assert {
        "test_failure_transient_fault_then_reset_resumes",
        "test_failure_appends_in_flight_fail_in_order_without_holes",
    } <= caught
    assert wal_machine_fails(NeverResumesKit(), tmp_path / "machine")


class NeverResumesModel(FaultyStorageStateMachine):
    """The client-level machine over a WAL that never resumes after a fault."""

    wal_class = NeverResumesWal
    wal_error_rate = 0.3  # faults of its own at appends: every run meets one
    progress_timeout_s = 2.0


def test_fault_model_catches_a_client_that_cannot_resume() -> None:
    """`FaultyStorageStateMachine` fails a client that needs a reopen to make progress
    after a fault (here, because its WAL never resumes)."""
    with pytest.raises(AssertionError, match="no append succeeded"):
        run_state_machine_as_test(NeverResumesModel, settings=settings(FIND_BUGS, max_examples=50))


def test_kit_catches_racy_conditional_create(tmp_path: Path) -> None:
    assert failed(run_kit(RacyKit(), tmp_path)) == {"test_conditional_create_race"}


def test_kit_catches_unsorted_listing(tmp_path: Path) -> None:
    caught = failed(run_kit(UnsortedKit(), tmp_path))
    assert {"test_list_is_in_key_order_with_sizes", "test_list_prefix_is_a_string_prefix"} <= caught
    assert store_machine_fails(UnsortedKit(), tmp_path / "machine")


# -- end to end, through pytest ----------------------------------------------------------------


def _pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "S3STREAM_HYPOTHESIS_PROFILE"}
    env["PYTHONPATH"] = str(Path(__file__).parent)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_broken_wal_fails_when_collected_by_pytest(tmp_path: Path) -> None:
    (tmp_path / "test_broken.py").write_text(
        textwrap.dedent(
            """
            from test_kit_catches_bugs import ResurrectingKit

            class TestResurrecting(ResurrectingKit):
                pass
            """
        )
    )
    # The example tests only: a failing state machine spends its time shrinking.
    result = _pytest(tmp_path, "-rfs", "-k", "trim_trimmed or fencing")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "FAILED test_broken.py::TestResurrecting::test_trim_trimmed_records_never_return" in out
    assert "was never acknowledged or was trimmed" in out
    assert "does not claim fencing" in out  # honest skips, with the reason


def test_example_third_party_wal_passes_from_its_directory() -> None:
    result = _pytest(REPO / "examples" / "custom_wal")
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout


# -- the pytest plugin and the optional dependencies ----------------------------------------------

_PROFILE_PROBE = """
import os
from hypothesis import settings
from s3stream.testing.profiles import kit_settings

def test_profile(pytestconfig):
    assert kit_settings(pytestconfig).max_examples == int(os.environ["EXPECT_KIT"])
    assert settings.default.max_examples == int(os.environ["EXPECT_DEFAULT"])
"""


@pytest.mark.parametrize(
    ("args", "env", "kit_examples", "default_examples"),
    [
        ((), {}, 20, 100),  # the kit runs quick; other Hypothesis tests keep their defaults
        (("--s3stream-profile", "s3stream-long"), {}, 400, 400),
        ((), {"S3STREAM_HYPOTHESIS_PROFILE": "s3stream-long"}, 400, 400),
        (("-o", "s3stream_hypothesis_profile=s3stream-quick"), {}, 20, 20),
    ],
)
def test_plugin_selects_profiles(
    tmp_path: Path,
    args: tuple[str, ...],
    env: dict[str, str],
    kit_examples: int,
    default_examples: int,
) -> None:
    (tmp_path / "test_probe.py").write_text(_PROFILE_PROBE)
    environ = {k: v for k, v in os.environ.items() if k != "S3STREAM_HYPOTHESIS_PROFILE"}
    environ.update(env, EXPECT_KIT=str(kit_examples), EXPECT_DEFAULT=str(default_examples))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    expected = "s3stream-long" if kit_examples == 400 else "s3stream-quick"
    assert f"s3stream.testing: hypothesis profile {expected}" in result.stdout


def test_plugin_refuses_an_unknown_profile(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text("def test_nothing():\n    pass\n")
    result = _pytest(tmp_path, "--s3stream-profile", "no-such-profile")
    assert result.returncode != 0
    assert "unknown Hypothesis profile 'no-such-profile'" in result.stderr


_WITHOUT_HYPOTHESIS = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hypothesis", "_hypothesis_pytestplugin"):
            raise ImportError(f"No module named {name!r}")

sys.meta_path.insert(0, Block())
import s3stream.testing.seaweedfs  # the launcher needs neither pytest nor hypothesis
from s3stream.testing import FaultyObjectStore  # nor does fault injection
try:
    from s3stream.testing import WalTests
except ImportError as exc:
    print("ImportError:", exc)
import pytest
# Without hypothesis installed its own plugin would not be there either.
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *sys.argv[1:]]))
"""


def test_without_hypothesis_the_plugin_stays_out_of_the_way(tmp_path: Path) -> None:
    (tmp_path / "run.py").write_text(_WITHOUT_HYPOTHESIS)
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "run.py", "test_plain.py", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    plain = run()
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "1 passed" in plain.stdout
    assert (
        "ImportError: s3stream.testing needs pytest and hypothesis: "
        "pip install 's3stream[testing]'" in plain.stdout
    )
    asked = run("--s3stream-profile", "s3stream-long")
    assert asked.returncode != 0
    assert "--s3stream-profile needs hypothesis" in asked.stderr
