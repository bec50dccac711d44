"""A file WAL on a device that stops answering: every append, close and open returns or
raises within its deadline, and what was acknowledged survives the thaw.

Real fault: the WAL lives on a loop-mounted ext4 filesystem that ``fsfreeze`` freezes, so its
``pwritev`` and ``fdatasync`` block in the kernel (uninterruptibly) until it is thawed (root
only; skipped with the reason elsewhere).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import s3stream
from s3stream import ClientSettings, FileWalSettings, RecordBatch
from s3stream._bounded import within_deadline
from s3stream.clock import ManualClock, SystemClock
from s3stream.errors import NodeInUseError, UnavailableError
from s3stream.objectstore.local import LocalObjectStore
from s3stream.objectstore.registry import register_object_store
from s3stream.testing.disk_faults import Freezer, frozen_filesystem

CALL_S = 1.0
#: A call may overrun its deadline by scheduling noise, never by the frozen device's time.
SLACK_S = 1.5


def _open(store: Path, wal_dir: Path, **wal_params: str) -> s3stream.StreamClient:
    query = "&".join(["capacity_bytes=4MiB", *(f"{k}={v}" for k, v in wal_params.items())])
    return s3stream.open(
        str(store),
        wal=f"file://{wal_dir / 'node.wal'}?{query}",
        settings=ClientSettings(call_timeout_ms=int(CALL_S * 1000)),
        environ={},
    )


@pytest.mark.parametrize("how", ["sync", "timeout_s", "threads"])
def test_appends_keep_their_deadline_while_the_wal_device_is_frozen(
    tmp_path: Path, how: str
) -> None:
    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        client = _open(tmp_path / "store", freezer.path)
        try:
            stream = client.create_stream()
            acked = [stream.append(RecordBatch(b"before %d" % i)).base_offset for i in range(5)]
            freezer.freeze()
            timings: list[float] = []
            errors: list[BaseException] = []

            def one_append(i: int) -> None:
                started = time.monotonic()
                try:
                    if how == "timeout_s":
                        stream.append(RecordBatch(b"frozen %d" % i), timeout_s=CALL_S)
                    else:
                        stream.append(RecordBatch(b"frozen %d" % i))
                except UnavailableError as exc:
                    errors.append(exc)
                except BaseException as exc:  # anything else is a failure of the test
                    errors.append(exc)
                timings.append(time.monotonic() - started)

            if how == "threads":
                threads = [threading.Thread(target=one_append, args=(i,)) for i in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(CALL_S + SLACK_S + 5)
                assert not any(t.is_alive() for t in threads), "an append is still blocked"
            else:
                # In a thread, so a test that fails does not hang on the frozen device.
                t = threading.Thread(target=one_append, args=(0,))
                t.start()
                t.join(CALL_S + SLACK_S + 5)
                assert not t.is_alive(), "the append is blocked on the frozen device"
            assert timings and max(timings) <= CALL_S + SLACK_S, timings
            assert errors and all(isinstance(e, UnavailableError) for e in errors), errors
            freezer.thaw()
            # After the thaw the WAL goes on; the frozen appends may or may not have become
            # durable (the error said so), the acknowledged ones are there.
            after = stream.append(RecordBatch(b"after")).base_offset
            got = [b.payload for b in stream.fetch(0, after + 1).batches]
            assert got[: len(acked)] == [b"before %d" % i for i in range(5)]
            assert got[-1] == b"after"
        finally:
            freezer.thaw()
            client.close()


@pytest.mark.parametrize("pending", [True, False])
def test_close_keeps_its_deadline_while_the_wal_device_is_frozen(
    tmp_path: Path, pending: bool
) -> None:
    """`close(timeout_s)` raises `UnavailableError` by its deadline when the WAL cannot close
    (an append it waits for is stuck, or the WAL's own clean-shutdown write is); the WAL
    finishes closing after the thaw and the next client reads every acknowledged batch."""
    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        client = _open(tmp_path / "store", freezer.path)
        stream = client.create_stream()
        for i in range(5):
            stream.append(RecordBatch(b"before %d" % i))
        freezer.freeze()
        if pending:
            with pytest.raises(UnavailableError):
                stream.append(RecordBatch(b"frozen"))
        outcome: list[BaseException | None] = []
        started = time.monotonic()

        def close() -> None:
            try:
                client.close(timeout_s=2.0)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=close)
        t.start()
        t.join(2.0 + SLACK_S + 5)
        took = time.monotonic() - started
        alive = t.is_alive()
        freezer.thaw()
        t.join(30)
        assert not alive, "close() is blocked on the frozen device"
        assert took <= 2.0 + SLACK_S, took
        assert len(outcome) == 1 and isinstance(outcome[0], UnavailableError), outcome
        # The WAL finishes closing in the background once the device answers (it holds its
        # file's lock until then); the next client on it sees what was acknowledged.
        deadline = time.monotonic() + 20
        while True:
            try:
                again = _open(tmp_path / "store", freezer.path)
                break
            except s3stream.S3StreamError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with again:
            got = [b.payload for b in again.open_stream(stream.stream_id).fetch(0).batches]
            assert got[:5] == [b"before %d" % i for i in range(5)]


# ---------------------------------------------------------------------------------- open


def _open_on(layout: str, tmp_path: Path, device: Path, **kwargs: object) -> s3stream.StreamClient:
    """A client whose WAL is on `device`: ``embedded``, the default of a local directory (the
    store on the device, its file WAL inside it); ``wal``, a store elsewhere and the WAL on
    the device."""
    if layout == "wal":
        return _open(tmp_path / "store", device)
    return s3stream.open(
        str(device / "store"),
        settings=ClientSettings(
            call_timeout_ms=int(CALL_S * 1000),
            file_wal=FileWalSettings(capacity_bytes=4 << 20),
        ),
        environ={},
    )


def _opened_in_thread(
    open_client: Callable[[], s3stream.StreamClient],
) -> tuple[float, BaseException | None, bool]:
    """`open_client()` (then closed) in a thread, so that a test that fails does not hang on
    the device: (seconds it took, what it raised or None, whether it still runs)."""
    outcome: list[BaseException | None] = []
    started = time.monotonic()

    def run() -> None:
        try:
            open_client().close()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(CALL_S + SLACK_S + 5)
    return time.monotonic() - started, outcome[0] if outcome else None, t.is_alive()


def _open_while_frozen(layout: str, tmp_path: Path, freezer: Freezer) -> BaseException | None:
    """Open as `_open_on` does, in a thread (`_opened_in_thread`), with the device frozen:
    the open must end by its deadline; what it raised (None: nothing)."""
    freezer.freeze()
    try:
        took, error, alive = _opened_in_thread(lambda: _open_on(layout, tmp_path, freezer.path))
    finally:
        freezer.thaw()
    assert not alive, "open() is blocked on the frozen device"
    assert took <= CALL_S + SLACK_S, took
    return error


def _open_when_free(layout: str, tmp_path: Path, device: Path) -> s3stream.StreamClient:
    """Open once an open left behind at its deadline has finished in the background (until
    then it holds the WAL's lock: `NodeInUseError`)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return _open_on(layout, tmp_path, device)
        except NodeInUseError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _join_left_behind() -> None:
    """Wait for opens left behind at their deadline to finish (after the thaw)."""
    for t in threading.enumerate():
        if t.name.startswith("s3stream-open"):
            t.join(20)
            assert not t.is_alive(), f"{t.name} still runs after the thaw"


@pytest.mark.parametrize("layout", ["embedded", "wal"])
@pytest.mark.parametrize("before", ["closed", "abandoned"])
def test_open_keeps_its_deadline_while_the_wal_device_is_frozen(
    tmp_path: Path, layout: str, before: str
) -> None:
    """`s3stream.open` raises `UnavailableError` by `call_timeout_ms` when the WAL's device
    does not answer (whatever of the open is stuck in the kernel finishes in the background);
    after the thaw the next open succeeds and reads every acknowledged batch (an abandoned
    client's from its WAL)."""
    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        client = _open_on(layout, tmp_path, freezer.path)
        stream = client.create_stream()
        for i in range(5):
            stream.append(RecordBatch(b"before %d" % i))
        if before == "closed":
            client.close()
        else:
            client.abandon()
        error = _open_while_frozen(layout, tmp_path, freezer)
        assert isinstance(error, UnavailableError), error
        with _open_when_free(layout, tmp_path, freezer.path) as again:
            s = again.open_stream(stream.stream_id)
            after = s.append(RecordBatch(b"after")).base_offset
            got = [b.payload for b in s.fetch(0, after + 1).batches]
            assert got == [b"before %d" % i for i in range(5)] + [b"after"]
        # What was left behind ended without breaking the WAL: it opens, and holds it all.
        _join_left_behind()
        with _open_on(layout, tmp_path, freezer.path) as last:
            got = [b.payload for b in last.open_stream(stream.stream_id).fetch(0).batches]
            assert got == [b"before %d" % i for i in range(5)] + [b"after"]


@pytest.mark.parametrize("layout", ["embedded", "wal"])
def test_a_second_open_of_a_live_node_keeps_its_deadline_while_frozen(
    tmp_path: Path, layout: str
) -> None:
    """A second open of a node whose client is open, tried while the device is frozen, ends by
    its deadline: `UnavailableError` where it cannot even reach the WAL's lock file (creating
    the store's directory blocks), else `NodeInUseError`. After the thaw what it left behind
    fails on the lock (the node is in use) without fencing or disturbing the live client,
    which goes on and keeps every acknowledged append."""
    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        client = _open_on(layout, tmp_path, freezer.path)
        try:
            stream = client.create_stream()
            for i in range(5):
                stream.append(RecordBatch(b"before %d" % i))
            error = _open_while_frozen(layout, tmp_path, freezer)
            # `NodeInUseError` where the lock file's lock can be tried without a write (the
            # WAL's directory exists and is the mount point), else the deadline's error.
            assert isinstance(error, UnavailableError | NodeInUseError), error
            _join_left_behind()
            with pytest.raises(NodeInUseError):
                _open_on(layout, tmp_path, freezer.path)
            after = stream.append(RecordBatch(b"after")).base_offset
            client.flush()
            got = [b.payload for b in stream.fetch(0, after + 1).batches]
            assert got == [b"before %d" % i for i in range(5)] + [b"after"]
        finally:
            freezer.thaw()
            client.close()
        with _open_on(layout, tmp_path, freezer.path) as again:
            got = [b.payload for b in again.open_stream(stream.stream_id).fetch(0).batches]
            assert got == [b"before %d" % i for i in range(5)] + [b"after"]


class _FreezingStore(LocalObjectStore):
    """A local store (off the frozen device) that freezes the device once, right after the
    first write of a key under `trigger[0]` (a prefix; None: disarmed), so that a freeze
    lands in the middle of an open."""

    def __init__(self, root: Path, freezer: Freezer, trigger: list[str | None]) -> None:
        super().__init__(root, fsync=False)
        self._freezer = freezer
        self._trigger = trigger

    def _written(self, key: str) -> None:
        prefix = self._trigger[0]
        if prefix is not None and key.startswith(prefix):
            self._trigger[0] = None
            self._freezer.freeze()

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        self._written(key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created = super().put_if_absent(key, data)
        self._written(key)
        return created


@pytest.mark.parametrize(
    "when",
    [
        # The node's registration: the WAL then blocks claiming its header.
        "meta/",
        # Recovery's upload of the abandoned client's batches: then the WAL's reset blocks.
        "data/",
    ],
)
def test_open_keeps_its_deadline_when_the_device_freezes_during_it(
    tmp_path: Path, when: str
) -> None:
    """The WAL's device freezes in the middle of an open, past the WAL's lock: opening the
    WAL (its claim, a header write and sync) or recovering it (the reset's header) blocks
    in the kernel; `open` still raises `UnavailableError` by `call_timeout_ms`, and after the
    thaw the next open reads every batch the abandoned client acknowledged."""
    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        trigger: list[str | None] = [None]
        scheme = f"freezing-{uuid.uuid4().hex[:8]}"
        register_object_store(
            scheme, lambda url, **_: _FreezingStore(tmp_path / "store", freezer, trigger)
        )

        def open_client() -> s3stream.StreamClient:
            return s3stream.open(
                f"{scheme}://store",
                wal=f"file://{freezer.path / 'node.wal'}?capacity_bytes=4MiB",
                settings=ClientSettings(
                    call_timeout_ms=int(CALL_S * 1000), upload_interval_ms=600_000
                ),
                environ={},
            )

        client = open_client()
        stream = client.create_stream()
        for i in range(5):
            stream.append(RecordBatch(b"before %d" % i))
        client.abandon()  # the batches are in the WAL only
        trigger[0] = when
        took, error, alive = _opened_in_thread(open_client)
        frozen = trigger[0] is None
        freezer.thaw()
        assert frozen, "the device was not frozen during the open"
        assert not alive, "open() is blocked on the frozen device"
        assert took <= CALL_S + SLACK_S, took
        assert isinstance(error, UnavailableError), error
        deadline = time.monotonic() + 20
        while True:
            try:
                again = open_client()
                break
            except NodeInUseError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with again:
            got = [b.payload for b in again.open_stream(stream.stream_id).fetch(0).batches]
            assert got == [b"before %d" % i for i in range(5)]
        _join_left_behind()


# ------------------------------------------------------------------ within_deadline (no root)


def test_within_deadline_returns_or_raises_what_the_work_does() -> None:
    clock = SystemClock()

    def call(work: Callable[[], int]) -> int:
        return within_deadline(
            work,
            clock=clock,
            deadline=clock.monotonic() + 5,
            name="s3stream-test-quick",
            timeout_error=lambda: UnavailableError("late"),
        )

    def fails() -> int:
        raise KeyError("boom")

    assert call(lambda: 7) == 7
    with pytest.raises(KeyError, match="boom"):
        call(fails)


def test_within_deadline_leaves_stuck_work_behind_and_disposes_of_its_result() -> None:
    """Past the deadline (on the injected clock: a manual clock past it waits for nothing) the
    caller gets the timeout error at once; the work, once it ends, gives what it made to
    `abandoned`, and saw `given_up` set."""
    clock = ManualClock()
    release = threading.Event()
    disposed: list[str] = []
    saw_given_up: list[bool] = []
    given_up = threading.Event()

    def work() -> str:
        release.wait(10)
        saw_given_up.append(given_up.is_set())
        return "made"

    started = time.monotonic()
    with pytest.raises(UnavailableError, match="late"):
        within_deadline(
            work,
            clock=clock,
            deadline=clock.monotonic() - 1,
            name="s3stream-test-stuck",
            timeout_error=lambda: UnavailableError("late"),
            abandoned=disposed.append,
            given_up=given_up,
        )
    assert time.monotonic() - started < 1
    assert given_up.is_set() and not disposed
    release.set()
    for t in threading.enumerate():
        if t.name == "s3stream-test-stuck":
            t.join(5)
    assert disposed == ["made"] and saw_given_up == [True]


# ------------------------------------------------------------------------------- take-over


def test_take_over_keeps_its_deadline_while_the_wal_device_is_frozen(tmp_path: Path) -> None:
    """`take_over` of a node whose file WAL is on a frozen device raises `UnavailableError` by
    its deadline; what it left behind stops at its next step once the device answers, and a
    take-over after the thaw recovers every acknowledged append of the node."""
    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        failed = _open(tmp_path / "store", freezer.path)
        stream = failed.create_stream()
        for i in range(5):
            stream.append(RecordBatch(b"acked %d" % i))
        failed._storage.abandon()  # a crash: the appends are only in its WAL
        failed._wal._abandon()  # type: ignore[attr-defined]
        wal_url = f"file://{freezer.path / 'node.wal'}?capacity_bytes=4MiB"
        with s3stream.open(
            str(tmp_path / "store"), node_id="healthy", environ={}, wal="memory://"
        ) as healthy:
            freezer.freeze()
            outcome: list[BaseException | None] = []
            started = time.monotonic()

            def take_over() -> None:
                try:
                    healthy.take_over("local", wal=wal_url, timeout_s=CALL_S)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            t = threading.Thread(target=take_over, daemon=True)
            t.start()
            t.join(CALL_S + SLACK_S + 5)
            took = time.monotonic() - started
            alive = t.is_alive()
            freezer.thaw()
            assert not alive, "take_over() is blocked on the frozen device"
            assert took <= CALL_S + SLACK_S, took
            assert len(outcome) == 1 and isinstance(outcome[0], UnavailableError), outcome
            for left in threading.enumerate():
                if left.name.startswith("s3stream-take-over"):
                    left.join(20)
                    assert not left.is_alive(), f"{left.name} still runs after the thaw"
            report = healthy.take_over("local", wal=wal_url)
            assert report.released_streams == (stream.stream_id,)
            got = [b.payload for b in healthy.open_stream(stream.stream_id).fetch(0).batches]
            assert got == [b"acked %d" % i for i in range(5)]


def test_the_cli_take_over_keeps_its_deadline_on_a_frozen_store(tmp_path: Path) -> None:
    """`s3stream take-over` of a node of a local store on a frozen filesystem, with a 1 s
    call timeout: its read-only check that the store exists ran ``mkdir -p`` on the store's
    directory, which waited in the kernel until the thaw (25 s) before anything was said.
    Now it reports the open's timeout by its deadline. (The process itself cannot end before
    the thaw: the open it gave up waits in the kernel, in a thread that no signal stops.)"""
    import os
    import subprocess
    import sys

    with frozen_filesystem(tmp_path / "disk", max_frozen_s=30) as freezer:
        store = freezer.path / "store"
        wal = f"file://{tmp_path / 'w1.wal'}?capacity_bytes=4MiB"
        gone = s3stream.open(str(store), node_id="w1", wal=wal, environ={})
        gone.create_stream().append(RecordBatch(b"acked"))
        gone.abandon()
        env = {**os.environ, "S3STREAM_CALL_TIMEOUT_MS": "1000"}
        command = [sys.executable, "-m", "s3stream", "take-over", "--no-progress"]
        freezer.freeze()
        started = time.monotonic()
        proc = subprocess.Popen(
            [*command, str(store), "w1", "--wal", wal],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        said: list[tuple[float, str]] = []
        reader = threading.Thread(
            target=lambda: said.append((time.monotonic() - started, proc.stderr.readline())),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(20)
        freezer.thaw()
        proc.wait(30)
        assert said, "the command said nothing while the store was frozen"
        took, line = said[0]
        assert "did not finish within call_timeout_ms" in line, line
        # The interpreter's start and imports (about 1 s here) and one call deadline.
        assert took <= 2 * CALL_S + 3 * SLACK_S, (took, line)
