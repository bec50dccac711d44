"""The WAL core (`s3stream.wal.pipeline`) shared by the file and object WALs: one semantics for
room and backpressure, in-order completion, callbacks, trims and the lifecycle.

Each test runs on both WALs where the behaviour is the core's; what the conformance kit
(`WalTests`) checks already is not repeated here.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from s3stream.clock import SystemClock
from s3stream.errors import InvalidArgumentError, S3StreamError, StreamClosedError, WalFullError
from s3stream.objectstore.base import ObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.wrappers import ForwardingObjectStore
from s3stream.settings import FileWalSettings, ObjectWalSettings
from s3stream.wal import FileWal, MemoryWal, ObjectWal, WalPosition
from s3stream.wal.object import HEADER
from s3stream.wal.pipeline import Pending, PipelinedWal, _complete

KiB = 1 << 10
#: Capacity of the small WALs: an 8 KB record, then a 1 KB one fit; another 8 KB does not.
CAPACITY = 16 * KiB


class CountingClock(SystemClock):
    """The system clock, counting how often `monotonic` is read (a poller reads it often)."""

    def __init__(self) -> None:
        self.reads = 0

    def monotonic(self) -> float:  # type: ignore[override]
        self.reads += 1
        return time.monotonic()


class GatedStore(ForwardingObjectStore):
    """Holds every conditional create of a WAL data object until `gate` is set."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.gate.set()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if len(data) > HEADER.size:
            assert self.gate.wait(10), "the gate never opened"
        return self.inner.put_if_absent(key, data)


Opener = Callable[..., PipelinedWal]


@pytest.fixture(params=["file", "object"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a WAL of the parameter's kind; every call opens the same medium again."""
    store = MemoryObjectStore()
    opened: list[PipelinedWal] = []

    def open_it(
        *,
        full_wait_ms: int = 20_000,
        clock: SystemClock | None = None,
        on_full: Callable[[], None] | None = None,
    ) -> PipelinedWal:
        wal: PipelinedWal
        if request.param == "file":
            settings = FileWalSettings(capacity_bytes=CAPACITY, full_wait_ms=full_wait_ms)
            wal = FileWal(
                tmp_path / "core.wal", node_id="n1", settings=settings, clock=clock, on_full=on_full
            )
        else:
            object_settings = ObjectWalSettings(
                wal_batch_interval_ms=1, max_unflushed_bytes=CAPACITY, full_wait_ms=full_wait_ms
            )
            wal = ObjectWal(
                store,
                node_id="n1",
                node_epoch=1,
                prefix="wal",
                settings=object_settings,
                clock=clock,
                on_full=on_full,
            )
        opened.append(wal)
        return wal

    yield open_it
    for wal in opened:
        with contextlib.suppress(S3StreamError):
            wal.close()


def _ready(wal: PipelinedWal) -> PipelinedWal:
    assert list(wal.recover()) == []
    return wal


def _block_on_room(wal: PipelinedWal) -> tuple[list[int], threading.Thread, list[object]]:
    """Append 1000-byte records until one waits for room: the positions acknowledged, the
    thread of the waiting append and the box its outcome lands in."""
    acked: list[int] = []
    for _ in range(64):
        box: list[object] = []

        def run(box: list[object] = box) -> None:
            try:
                box.append(wal.append(b"r" * 1000).result(timeout=30))
            except Exception as exc:
                box.append(exc)

        t = threading.Thread(target=run)
        t.start()
        t.join(timeout=0.5)
        if t.is_alive():
            return acked, t, box
        assert isinstance(box[0], int), box
        acked.append(box[0])
    raise AssertionError(f"{wal.describe()} never filled up")


# -- room and backpressure ------------------------------------------------------------------------


def test_a_full_wal_waits_on_a_deadline_not_by_polling(opener: Opener) -> None:
    clock = CountingClock()
    asked: list[int] = []
    wal = _ready(opener(clock=clock, on_full=lambda: asked.append(1)))
    acked, waiting, box = _block_on_room(wal)
    assert asked == [1], "on_full is called once, when the append starts waiting"
    reads = clock.reads
    time.sleep(0.5)
    # A waiter re-reading the clock every 50 ms would have read it about ten times.
    assert clock.reads - reads <= 1, f"the clock was read {clock.reads - reads} times"
    wal.trim(acked[-1])  # makes room: the waiter goes on at once
    waiting.join(timeout=10)
    assert not waiting.is_alive() and isinstance(box[0], int) and box[0] > acked[-1]


def test_an_on_full_that_raises_is_logged_and_the_append_still_waits(
    opener: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("on_full broke")

    wal = _ready(opener(full_wait_ms=100, on_full=broken))
    with caplog.at_level(logging.ERROR), pytest.raises(WalFullError, match="is full"):
        for _ in range(64):
            wal.append(b"r" * 1000).result(timeout=10)
    assert "the on_full callback failed" in caplog.text


def test_an_append_from_a_callback_never_waits_for_room(opener: Opener) -> None:
    """The thread completing futures must not wait for a trim: it raises at once."""
    wal = _ready(opener(full_wait_ms=20_000))
    wal.append(b"b" * 8_000).result(timeout=10)
    outcome: list[object] = []

    def callback(_: Future[WalPosition]) -> None:
        started = time.monotonic()
        try:
            wal.append(b"c" * 8_000)
        except WalFullError as exc:
            outcome.append(exc)
        outcome.append(time.monotonic() - started)

    fut = wal.append(b"s" * 1_000)
    fut.add_done_callback(callback)
    fut.result(timeout=10)
    deadline = time.monotonic() + 10
    while len(outcome) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(outcome[0], WalFullError), outcome
    assert isinstance(outcome[1], float) and outcome[1] < 5


# -- callbacks and close --------------------------------------------------------------------------


def test_close_from_a_completion_callback_is_finished_by_the_writer(opener: Opener) -> None:
    wal = _ready(opener())
    fut = wal.append(b"last")
    fut.add_done_callback(lambda _: wal.close())
    pos = fut.result(timeout=10)
    deadline = time.monotonic() + 10
    while not wal._closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wal._closed, "the WAL never finished closing"
    with pytest.raises(StreamClosedError):
        wal.append(b"late")
    again = opener()
    assert [(r.position, r.data) for r in again.recover()] == [(pos, b"last")]


def test_every_close_returns_only_once_the_wal_is_closed() -> None:
    gated = GatedStore(MemoryObjectStore())
    wal = ObjectWal(
        gated, node_id="n1", prefix="wal", settings=ObjectWalSettings(max_hedged_puts=0)
    )
    list(wal.recover())
    gated.gate.clear()
    fut = wal.append(b"held")
    closers = [threading.Thread(target=wal.close) for _ in range(2)]
    for t in closers:
        t.start()
    time.sleep(0.2)
    assert all(t.is_alive() for t in closers), "a close() returned with a PUT in flight"
    assert not fut.done()
    gated.gate.set()
    for t in closers:
        t.join(timeout=10)
        assert not t.is_alive()
    assert fut.result(timeout=0) >= 0 and wal._closed


# -- trim -----------------------------------------------------------------------------------------


def test_trim_above_the_last_acknowledged_position_is_refused_in_every_wal(
    tmp_path: Path,
) -> None:
    """A record in flight may still fail: it cannot be trimmed. Nor can its future be
    cancelled (completing it could then fail)."""
    file_wal = FileWal(tmp_path / "trim.wal", settings=FileWalSettings(capacity_bytes=CAPACITY))
    gated = GatedStore(MemoryObjectStore())
    object_wal = ObjectWal(
        gated, node_id="n1", prefix="wal", settings=ObjectWalSettings(max_hedged_puts=0)
    )
    for wal in (file_wal, object_wal):
        list(wal.recover())
        with _writes_held(wal, gated):
            fut = wal.append(b"in flight")
            assert not fut.cancel()
            with pytest.raises(InvalidArgumentError, match="last acknowledged position"):
                wal.trim(0)
        wal.trim(fut.result(timeout=10))
        wal.close()


@contextlib.contextmanager
def _writes_held(wal: PipelinedWal, gated: GatedStore) -> Iterator[None]:
    """No write of `wal` completes while inside: the file WAL's committer role is held (as
    `s3stream.testing.disk_faults` does), the object WAL's PUTs wait at `gated`."""
    if not isinstance(wal, FileWal):
        gated.gate.clear()
        try:
            yield
        finally:
            gated.gate.set()
        return
    with wal._cond:
        while wal._committer is not None:
            wal._cond.wait()
        wal._committer = -1
    try:
        yield
    finally:
        with wal._cond:
            wal._committer = None
            wal._cond.notify_all()


def test_memory_wal_trim_needs_a_ready_wal_too() -> None:
    wal = MemoryWal()
    with pytest.raises(S3StreamError, match="recover"):
        wal.trim(0)
    list(wal.recover())
    pos = wal.append(b"x").result()
    with pytest.raises(InvalidArgumentError, match="last acknowledged position is 0"):
        wal.trim(pos + 1)
    wal.trim(pos)


# -- lifecycle and messages -----------------------------------------------------------------------


def test_every_wal_words_its_refusals_the_same_way(tmp_path: Path) -> None:
    wals = [
        MemoryWal(),
        FileWal(tmp_path / "words.wal", settings=FileWalSettings(capacity_bytes=CAPACITY)),
        ObjectWal(MemoryObjectStore(), node_id="n1", prefix="wal"),
    ]
    for wal in wals:
        name = wal.describe()
        assert repr(wal) == name
        with pytest.raises(S3StreamError) as early:
            wal.append(b"x")
        assert str(early.value) == f"{name}: recover() or reset() must run before append()"
        list(wal.recover())
        with pytest.raises(InvalidArgumentError, match="must be bytes, not str"):
            wal.append("x")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError) as big:
            wal.append(bytes(wal.capabilities.max_record_bytes + 1))
        assert f"exceeds the largest {name} takes" in str(big.value)
        with pytest.raises(InvalidArgumentError, match="trim position must be an int"):
            wal.trim(True)
        wal.close()
        with pytest.raises(StreamClosedError) as late:
            wal.append(b"x")
        assert str(late.value) == f"{name} is closed"


def test_an_interrupt_in_a_callback_still_completes_the_rest() -> None:
    futures: list[Future[WalPosition]] = [Future() for _ in range(3)]
    for f in futures:
        f.set_running_or_notify_cancel()

    def interrupt(_: Future[WalPosition]) -> None:
        raise KeyboardInterrupt

    futures[0].add_done_callback(interrupt)
    records = [Pending(i, 32, (b"",), f) for i, f in enumerate(futures)]
    with pytest.raises(KeyboardInterrupt):
        _complete(records, None)
    assert [f.result(timeout=0) for f in futures] == [0, 1, 2]
