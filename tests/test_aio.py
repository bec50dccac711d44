"""`s3stream.aio`: the asyncio front end over the thread-based client (plain `asyncio.run`)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import s3stream
import s3stream.aio as aio
from s3stream import (
    ClientSettings,
    InvalidArgumentError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    Record,
    RecordBatch,
    StreamClosedError,
    StreamNotFoundError,
    StreamState,
)

SMALL = ClientSettings(upload_threshold_bytes=16 * 1024, upload_interval_ms=0)


async def open_dir(path: Path, **kwargs: int) -> aio.AsyncStreamClient:
    # The default file WAL: an append's future resolves in the WAL's thread, not at the call.
    if kwargs:
        return aio.AsyncStreamClient(s3stream.open(str(path), settings=SMALL), **kwargs)
    return await aio.open(str(path), settings=SMALL)


def pool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("s3stream-aio-")]


def test_open_takes_the_arguments_of_the_sync_open() -> None:
    for async_fn, sync_fn in ((aio.open, s3stream.open), (aio.open_reader, s3stream.open_reader)):
        assert inspect.iscoroutinefunction(async_fn)
        assert list(inspect.signature(async_fn).parameters.values()) == list(
            inspect.signature(sync_fn).parameters.values()
        )
        assert inspect.getdoc(async_fn)
    assert s3stream.aio is aio  # the facade's attribute, imported on first use


def test_create_streams_in_one_call(tmp_path: Path) -> None:
    async def main() -> None:
        async with await open_dir(tmp_path) as client:
            seq = client.sync.metadata.seq
            streams = await client.create_streams([{"p": "0"}, None, {"p": "2"}])
            assert client.sync.metadata.seq == seq + 1  # one metadata entry
            assert [s.stream_id for s in streams] == [0, 1, 2]
            assert [dict(s.tags) for s in streams] == [{"p": "0"}, {}, {"p": "2"}]
            assert all(isinstance(s, aio.AsyncStream) for s in streams)
            assert (await streams[1].append(RecordBatch(b"x"))).base_offset == 0
            with pytest.raises(InvalidArgumentError):
                await client.create_streams([])

    asyncio.run(main())


def test_append_fetch_tail_and_close(tmp_path: Path) -> None:
    async def main() -> None:
        async with await open_dir(tmp_path) as client:
            s = await client.create_stream(tags={"topic": "t"})
            assert s.tags == {"topic": "t"} and s.stream_id == s.sync.stream_id
            r = await s.append(RecordBatch(b"first", count=2))
            assert (r.base_offset, r.count) == (0, 2)
            r = await s.append_records([Record(b"v0", key=b"k"), Record(b"v1")])
            assert r.base_offset == 2 and s.confirm_offset == 4 == s.next_offset
            got = await s.fetch(0)
            assert got.batches[0].payload == b"first" and got.next_offset == 4
            assert [(o, rec.value) async for o, rec in s.read_records(0)] == [
                (0, b"first"),
                (2, b"v0"),
                (3, b"v1"),
            ]
            assert [i.stream_id for i in await client.list_streams({"topic": "t"})] == [0]
            assert await s.offset_for_timestamp(0) == 0
            assert await s.offset_for_timestamp(2**62) is None
            assert (await client.stream_info(s.stream_id)).tags == {"topic": "t"}

            seen: list[int] = []

            async def consume() -> None:
                async for batch in s.tail(0, wait_s=0.2):
                    seen.append(batch.base_offset)

            tail = asyncio.create_task(consume())
            for i in range(3):
                await s.append(RecordBatch(b"%d" % i))
            await client.flush()
            assert (await client.read(s.stream_id, 0)).next_offset == 7
            while len(seen) < 5:
                await asyncio.sleep(0.01)
            await client.close()  # ends the tail, cleanly
            await asyncio.wait_for(tail, 10)
            assert seen == [0, 2, 4, 5, 6]
            assert client.closed and s.closed
        assert pool_threads() == []  # the client's threads stopped with it

        async with await open_dir(tmp_path) as again:
            s = await again.open_stream(0)
            records = s.tail_records(1, wait_s=0.1)
            # A RAW batch is one record at its base offset: the one at 0 is not in the tail.
            assert [(await anext(records))[0] for _ in range(4)] == [2, 3, 4, 5]
            await s.append_records([Record(b"new")])
            assert (await anext(records))[0] == 6  # the RAW batch appended before
            offset, record = await anext(records)
            assert (offset, record.value) == (7, b"new")

    asyncio.run(main())


def test_a_long_poll_waits_without_blocking_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        async with await open_dir(tmp_path) as client:
            s = await client.create_stream()
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            t0 = time.monotonic()
            assert (await s.fetch(0, wait_s=0.3)).batches == []
            assert time.monotonic() - t0 >= 0.25
            assert ticks >= 5, "the loop ran other tasks while the poll waited"

            async def late_append() -> None:
                await asyncio.sleep(0.1)
                await s.append(RecordBatch(b"late"))

            appender = asyncio.create_task(late_append())
            t0 = time.monotonic()
            got = await s.fetch(0, wait_s=30)
            assert [b.payload for b in got.batches] == [b"late"]
            assert time.monotonic() - t0 < 10, "the append woke the poll"
            await appender
            ticker.cancel()

    asyncio.run(main())


def test_cancelling_a_tail_frees_its_thread_within_one_poll(tmp_path: Path) -> None:
    async def main() -> None:
        # One poll thread: a tail left blocked would keep every other tail waiting forever.
        client = await open_dir(tmp_path, poll_threads=1)
        async with client:
            idle = await client.create_stream()
            busy = await client.create_stream()
            await busy.append(RecordBatch(b"x"))
            started = asyncio.Event()

            async def follow_idle() -> None:
                started.set()
                async for _ in idle.tail(0, wait_s=0.5):
                    raise AssertionError("nothing was appended")

            task = asyncio.create_task(follow_idle())
            await started.wait()
            await asyncio.sleep(0.1)  # its poll is waiting in the thread now
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            t0 = time.monotonic()
            batch = await asyncio.wait_for(anext(aiter(busy.tail(0, wait_s=0.5))), 10)
            assert batch.payload == b"x"
            assert time.monotonic() - t0 < 5, "the cancelled tail's poll returned"
        assert pool_threads() == []

    asyncio.run(main())


def test_concurrent_appends_from_many_tasks(tmp_path: Path) -> None:
    tasks, per_task = 40, 25

    async def main() -> None:
        async with await open_dir(tmp_path) as client:
            s = await client.create_stream()

            async def writer(t: int) -> list[int]:
                offsets = []
                for i in range(per_task):
                    r = await s.append_records([Record(b"%d-%d" % (t, i))])
                    offsets.append(r.base_offset)
                return offsets

            results = await asyncio.gather(*(writer(t) for t in range(tasks)))
            for offsets in results:
                assert offsets == sorted(offsets)  # each task's appends land in its order
            every = sorted(o for offsets in results for o in offsets)
            assert every == list(range(tasks * per_task))
            values = {rec.value async for _, rec in s.read_records(0)}
            assert values == {b"%d-%d" % (t, i) for t in range(tasks) for i in range(per_task)}

    asyncio.run(main())


def test_conditional_appends(tmp_path: Path) -> None:
    async def main() -> None:
        async with await open_dir(tmp_path) as client:
            s = await client.create_stream()
            assert (await s.append(RecordBatch(b"a"), expected_offset=0)).base_offset == 0
            with pytest.raises(OffsetMismatchError) as err:
                await s.append(RecordBatch(b"a"), expected_offset=0)
            assert err.value.actual == 1
            # Two tasks racing for the same offset: exactly one wins.
            outcomes = await asyncio.gather(
                *(s.append(RecordBatch(b"b"), expected_offset=1) for _ in range(5)),
                return_exceptions=True,
            )
            assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
            assert all(
                isinstance(o, OffsetMismatchError) for o in outcomes if isinstance(o, BaseException)
            )
            assert s.next_offset == 2
            first = await s.append(RecordBatch(b"c"), producer_id="p", sequence=0)
            assert await s.append(RecordBatch(b"c"), producer_id="p", sequence=0) == first
            assert s.next_offset == 3  # the resend wrote nothing

    asyncio.run(main())


def test_errors_are_the_sync_exceptions(tmp_path: Path) -> None:
    async def main() -> None:
        client = await open_dir(tmp_path)
        s = await client.create_stream()
        with pytest.raises(StreamNotFoundError):
            await client.open_stream(999)
        with pytest.raises(OffsetOutOfRangeError):
            await s.fetch(5)
        with pytest.raises(InvalidArgumentError):
            s.tail(0, wait_s=0)  # checked at the call, as the sync tail does
        with pytest.raises(InvalidArgumentError):
            await s.append(b"not a batch")  # type: ignore[arg-type]
        await s.append(RecordBatch(b"x"))
        await s.trim(1)
        assert s.start_offset == 1
        with pytest.raises(OffsetOutOfRangeError):
            await s.fetch(0)
        await s.close()
        with pytest.raises(StreamClosedError):
            await s.append(RecordBatch(b"y"))
        await client.close()
        await client.close()  # again: reports how the first one ended (fine)
        with pytest.raises(StreamClosedError):
            await client.create_stream()
        with pytest.raises(InvalidArgumentError):
            aio.AsyncStreamClient(object())  # type: ignore[arg-type]

    asyncio.run(main())


def test_reader(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), wal="memory://") as client:
        s = client.create_stream(tags={"topic": "orders"})
        s.append_records([Record(b"%d" % i) for i in range(3000)])

    async def main() -> None:
        async with await aio.open_reader(str(tmp_path)) as reader:
            assert [i.end_offset for i in await reader.list_streams()] == [3000]
            assert (await reader.stream_info(0)).tags == {"topic": "orders"}
            assert (await reader.read(0, 0)).next_offset == 3000
            records = [(o, r.value) async for o, r in reader.read_records(0, 0, 10)]
            assert records == [(i, b"%d" % i) for i in range(10)]
            assert len([o async for o, _ in reader.read_records(0, 0)]) == 3000  # several hops
            assert len(await reader.objects()) >= 1
            assert (await reader.snapshot()).get_stream(0).end_offset == 3000
            assert await reader.offset_for_timestamp(0, 0) == 0
            with pytest.raises(StreamNotFoundError):
                await reader.stream_info(7)
        await reader.close()  # idempotent
        with pytest.raises(StreamClosedError):
            await reader.read(0, 0)
        with pytest.raises(InvalidArgumentError):
            await aio.open_reader(str(tmp_path / "missing"))

    asyncio.run(main())
    assert pool_threads() == []


def test_a_reader_tails_what_a_writer_commits_and_cancels_within_one_poll(
    tmp_path: Path,
) -> None:
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()

        async def main() -> None:
            async with await aio.open_reader(str(tmp_path)) as reader:

                async def collect(n: int) -> list[bytes]:
                    got: list[bytes] = []
                    async for b in reader.tail(s.stream_id, 0, poll_s=0.05):
                        got.append(b.payload)
                        if len(got) == n:
                            break
                    return got

                task = asyncio.create_task(collect(30))
                for i in range(30):
                    await asyncio.to_thread(s.append, RecordBatch(b"%d" % i))
                    if i % 10 == 9:
                        await asyncio.to_thread(client.flush)  # commit: the reader sees it
                assert await asyncio.wait_for(task, 30) == [b"%d" % i for i in range(30)]

                idle = asyncio.create_task(collect(31))  # waits at the end for ever
                await asyncio.sleep(0.2)
                idle.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await idle
                with pytest.raises(InvalidArgumentError):
                    reader.tail(s.stream_id, 0, poll_s=0)

        asyncio.run(main())
    assert pool_threads() == []


def test_a_cancelled_open_closes_what_it_opened() -> None:
    closed = threading.Event()

    class Slow:
        def close(self) -> None:
            closed.set()

    def slow_open() -> Slow:
        time.sleep(0.3)
        return Slow()

    async def main() -> None:
        task = asyncio.create_task(aio._opened(slow_open))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(closed.wait, 10)

    asyncio.run(main())


def test_an_append_held_back_waits_in_a_thread_not_on_the_loop(
    stuck_uploads_client: Callable[[int], Any],
) -> None:
    """Data PUTs fail, so the backlog fills to max_pending_bytes: an append then waits for
    room (up to backpressure_timeout_ms) in a thread, while the loop goes on ticking."""
    from s3stream import BackpressureError

    sync, faulty = stuck_uploads_client(1000)

    async def main() -> None:
        client = aio.AsyncStreamClient(sync)
        stream = await client.create_stream()
        with pytest.raises(BackpressureError):
            for i in range(1000):
                await stream.append(RecordBatch(bytes([i % 256]) * 1000))
        assert stream.sync.append_would_wait()
        gaps: list[float] = []
        ticker = _ticker(gaps)
        t0 = time.monotonic()
        with pytest.raises(BackpressureError):
            await stream.append(RecordBatch(b"held back"))
        assert time.monotonic() - t0 >= 0.5  # it did wait for room
        ticker.cancel()
        assert gaps and max(gaps) < 0.3, "the loop was blocked while the append waited"
        with faulty.healthy():
            await client.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# Appends held back: the loop never waits for room, `timeout_s` bounds the whole call


class _RefusingStore:
    """Wraps an object store: data PUTs fail while `full` is set (uploads then retry)."""

    @staticmethod
    def make(root: Path) -> Any:
        from s3stream.errors import UnavailableError
        from s3stream.objectstore.local import LocalObjectStore
        from s3stream.objectstore.wrappers import ForwardingObjectStore

        class Refusing(ForwardingObjectStore):
            full = True

            def put(self, key: str, data: bytes) -> None:
                if self.full and key.startswith("data"):
                    raise UnavailableError("no space left (test)")
                super().put(key, data)

        return Refusing(LocalObjectStore(root))


def _ticker(gaps: list[float]) -> asyncio.Task[None]:
    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    return asyncio.create_task(tick())


def test_appends_while_the_file_wal_is_full_never_block_the_loop(tmp_path: Path) -> None:
    """Uploads fail, so the file WAL fills. Appends that do not fit are sent to threads
    before they reach the WAL (its room is checked with each batch's size), where they
    wait for room: the loop goes on ticking. Uploads then work again and every append that
    was not refused ends up durable."""
    from s3stream.settings import FileWalSettings
    from s3stream.wal.file import FileWal

    store = _RefusingStore.make(tmp_path / "store")
    # full_wait_ms: how long a WAL append waits for room (the loop, before the fix).
    wal = FileWal(
        tmp_path / "n.wal",
        node_id="local",
        settings=FileWalSettings(capacity_bytes=1 << 20, full_wait_ms=5000),
    )
    settings = ClientSettings(
        upload_threshold_bytes=64 * 1024, upload_interval_ms=20, call_timeout_ms=20_000
    )
    sync = s3stream.StreamClient(store, wal, settings=settings)

    async def main() -> None:
        client = aio.AsyncStreamClient(sync)
        stream = await client.create_stream()
        gaps: list[float] = []
        ticker = _ticker(gaps)
        heal = threading.Timer(1.5, lambda: setattr(store, "full", False))
        heal.start()
        t0 = time.monotonic()

        async def one(i: int) -> int | None:
            try:
                return (await stream.append(RecordBatch(bytes([i]) * 100_000))).base_offset
            except s3stream.BackpressureError:
                return None

        offsets = await asyncio.gather(*(one(i) for i in range(30)))
        took = time.monotonic() - t0
        ticker.cancel()
        heal.join()
        assert took >= 1.0, "some appends did wait for room"
        assert max(gaps) < 0.5, f"the loop was blocked {max(gaps):.2f} s while the WAL was full"
        acked = sorted(o for o in offsets if o is not None)
        assert acked == list(range(len(acked))) and len(acked) >= 20
        await client.flush()
        assert stream.confirm_offset == len(acked)
        read = await client.read(stream.stream_id, 0, max_bytes=16 << 20)
        assert read.next_offset == len(acked)
        await client.close()

    asyncio.run(main())


def test_append_timeout_covers_the_wait_for_room_and_for_a_thread(
    stuck_uploads_client: Callable[[int], Any],
) -> None:
    """Uploads fail, the backlog is full: appends wait for room in threads (two of them, so
    most wait for a thread first). Each `append(timeout_s=...)` ends by its deadline, as
    the sync `append` does, though room would be waited for 4 s; one refused with
    `BackpressureError` wrote nothing."""
    from s3stream import BackpressureError, UnavailableError

    sync, faulty = stuck_uploads_client(4000)
    timeout = 0.5

    async def main() -> None:
        client = aio.AsyncStreamClient(sync, poll_threads=2)
        stream = await client.create_stream()
        for i in range(1000):  # fill the backlog (max_pending_bytes)
            try:
                await stream.append(RecordBatch(bytes([i % 256]) * 1000), timeout_s=0.2)
            except BackpressureError:
                break
            except UnavailableError:
                # On a loaded machine the await's deadline may pass a hair before the
                # thread's wait for room reports BackpressureError at the same deadline.
                continue
        else:
            pytest.fail("the backlog never filled")
        before = stream.next_offset
        gaps: list[float] = []
        ticker = _ticker(gaps)

        async def one(i: int) -> tuple[float, str]:
            t0 = time.monotonic()
            try:
                await stream.append(RecordBatch(b"late %d" % i), timeout_s=timeout)
                outcome = "ok"
            except (BackpressureError, UnavailableError) as exc:
                outcome = type(exc).__name__
            return time.monotonic() - t0, outcome

        results = await asyncio.gather(*(one(i) for i in range(12)))
        ticker.cancel()
        took = max(t for t, _ in results)
        # Slack for a loaded machine (the suite runs beside other processes); waiting for
        # room would take 4 s.
        assert took < timeout + 1.0, f"an append took {took:.2f} s (timeout_s={timeout})"
        # UnavailableError: that same race, on a loaded machine (nothing is written either way).
        outcomes = {"BackpressureError", "WalFullError", "UnavailableError"}
        assert {o for _, o in results} <= outcomes, results
        assert max(gaps) < 0.45  # below the 0.5 s an append blocking the loop would take
        assert stream.next_offset == before, "a refused append wrote nothing"
        with faulty.healthy():
            await client.close()

    asyncio.run(main())


def test_a_cancelled_open_closes_the_client_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`asyncio.run` ends (shutting the default executor down) right after a cancelled
    `aio.open`: the client the open still made is closed all the same, so its WAL writer
    and uploader threads end and the directory opens again."""
    from s3stream import opening

    real_open = opening.open

    def slow_open(*args: Any, **kwargs: Any) -> s3stream.StreamClient:
        time.sleep(0.3)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(opening, "open", slow_open)
    before = set(threading.enumerate())

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(aio.open(str(tmp_path), settings=SMALL), 0.05)

    asyncio.run(main())
    started = [t for t in threading.enumerate() if t not in before]
    for t in started:
        t.join(10)
    assert [t.name for t in started if t.is_alive()] == []
    monkeypatch.setattr(opening, "open", real_open)
    with s3stream.open(str(tmp_path)) as again:  # the node is free: the close has ended
        assert again.list_streams() == []


def test_large_record_lists_are_encoded_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from s3stream import records

    threads: list[str] = []

    def records_batch(*args: Any, **kwargs: Any) -> RecordBatch:
        threads.append(threading.current_thread().name)
        return records.records_batch(*args, **kwargs)

    monkeypatch.setattr(aio, "records_batch", records_batch)

    async def main() -> None:
        async with await open_dir(tmp_path) as client:
            s = await client.create_stream()
            await s.append_records([Record(b"small")])
            await s.append_records([Record(b"%d" % i) for i in range(5000)], compression="zstd")
            await s.append_records([Record(b"x" * 100_000)] * 2)
            assert s.confirm_offset == 5003
            assert [(o, r.value) async for o, r in s.read_records(1, 3)] == [
                (1, b"0"),
                (2, b"1"),
            ]

    asyncio.run(main())
    main_thread = threading.main_thread().name
    assert threads[0] == main_thread  # a few small records: on the loop
    assert main_thread not in threads[1:]


def _has_room(wal: Any, length: int) -> bool:
    """`wal.has_room(length)`, asked up to three times: it also says False while the WAL's
    writer thread holds the state lock for a moment (it never waits for it), which is not
    what these tests look at."""
    for _ in range(3):
        if wal.has_room(length):
            return True
        time.sleep(0.01)
    return False


def test_the_wal_says_before_an_append_whether_it_would_wait_for_room(tmp_path: Path) -> None:
    """`PipelinedWal.has_room`, which `Stream.append_would_wait` (and so the aio append)
    asks: False once a record of that size no longer fits, and for every size while an
    append waits for room; True again once a trim made room."""
    from s3stream.settings import FileWalSettings
    from s3stream.wal.file import FileWal

    wal = FileWal(
        tmp_path / "n.wal",
        settings=FileWalSettings(capacity_bytes=64 * 1024, full_wait_ms=10_000),
    )
    wal.reset()
    try:
        assert _has_room(wal, 60_000)  # empty: any record it takes
        last = None
        while _has_room(wal, 10_000):
            last = wal.append(b"x" * 10_000).result(10)
        assert last is not None and _has_room(wal, 100)
        waiting = threading.Thread(target=lambda: wal.append(b"y" * 30_000).result(10))
        waiting.start()
        deadline = time.monotonic() + 10
        while wal.has_room(100) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the thread waits for room
        assert not wal.has_room(1), "an append waits for room: any other one would queue"
        wal.trim(last)
        waiting.join(10)
        assert not waiting.is_alive() and _has_room(wal, 10_000)
    finally:
        wal.close()


def test_the_room_check_never_waits_for_the_wals_state_lock(tmp_path: Path) -> None:
    """A medium may hold its state lock across its own I/O (a file WAL writing its
    clean-shutdown header, which a frozen device makes endless): `has_room` then answers
    "it would wait" at once instead of blocking the event loop that asked."""
    from s3stream.settings import FileWalSettings
    from s3stream.wal.file import FileWal

    wal = FileWal(tmp_path / "n.wal", settings=FileWalSettings(capacity_bytes=64 * 1024))
    wal.reset()
    try:
        assert _has_room(wal, 100)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with wal._cond:
                held.set()
                release.wait(10)

        t = threading.Thread(target=hold)
        t.start()
        assert held.wait(10)
        started = time.monotonic()
        assert not wal.has_room(100)
        assert time.monotonic() - started < 2  # the holder keeps the lock for 10 s
        release.set()
        t.join(10)
        assert _has_room(wal, 100)
    finally:
        wal.close()


# ---------------------------------------------------------------------------------------------
# Appends made in threads: in submission order per stream, never behind tails


def _slow_reads_client(path: Path, delay_s: float) -> s3stream.StreamClient:
    """A client over `path` whose data object reads each take `delay_s` (a real store behind
    the fault wrapper), so that loading a reopened stream's producers takes a while."""
    from s3stream import SystemClock
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.testing.faults import slow_reads
    from s3stream.wal.memory import MemoryWal

    store = slow_reads(LocalObjectStore(path), delay_s, clock=SystemClock())
    return s3stream.StreamClient(store, MemoryWal(), settings=SMALL)


def test_pipelined_idempotent_appends_land_in_order_through_threads(tmp_path: Path) -> None:
    """The first idempotent append of a reopened stream loads its producers in a thread, and
    the appends made meanwhile follow it there: they must be appended in the order they were
    made, or the producer's sequences arrive out of order (`SequenceError`)."""
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.wal.memory import MemoryWal

    with s3stream.StreamClient(LocalObjectStore(tmp_path), MemoryWal(), settings=SMALL) as first:
        stream = first.create_stream()
        # Other producers: rebuilding the table takes a while (in CPU), as in production.
        others = [
            stream.append_async(RecordBatch(b"x"), producer_id=f"q{k}", sequence=0)
            for k in range(200)
        ]
        for f in others:
            f.result()
        stream.append(RecordBatch(b"0"), producer_id="p", sequence=0)
        sid = stream.stream_id

    async def main() -> None:
        sync = s3stream.StreamClient(LocalObjectStore(tmp_path), MemoryWal(), settings=SMALL)
        async with aio.AsyncStreamClient(sync) as client:
            stream = await client.open_stream(sid)
            assert stream.sync.append_would_wait(idempotent=True)  # producers not loaded
            results = await asyncio.gather(
                *(
                    stream.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k)
                    for k in range(1, 60)
                ),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            assert errors == []
            assert [r.base_offset for r in results if not isinstance(r, BaseException)] == list(
                range(201, 260)
            )
            got = await stream.fetch(201, max_bytes=1 << 20)
            assert [b.payload for b in got.batches] == [b"%d" % k for k in range(1, 60)]

    asyncio.run(main())


def test_idle_tails_do_not_hold_up_an_append_made_in_a_thread(tmp_path: Path) -> None:
    """More idle tails than poll threads: an append that must run in a thread (loading a
    reopened stream's producers) gets a thread of its own at once, not after the tails' polls."""
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.wal.memory import MemoryWal

    with s3stream.StreamClient(LocalObjectStore(tmp_path), MemoryWal(), settings=SMALL) as first:
        stream = first.create_stream()
        stream.append(RecordBatch(b"0"), producer_id="p", sequence=0)
        sid = stream.stream_id
        idle_id = first.create_stream().stream_id

    async def main() -> None:
        sync = s3stream.StreamClient(LocalObjectStore(tmp_path), MemoryWal(), settings=SMALL)
        async with aio.AsyncStreamClient(sync, poll_threads=4) as client:
            stream = await client.open_stream(sid)
            idle = await client.open_stream(idle_id)

            async def tail() -> None:
                async for _ in idle.tail(idle.next_offset, wait_s=2.0):
                    pass

            tails = [asyncio.create_task(tail()) for _ in range(40)]
            await asyncio.sleep(0.2)  # the poll threads are all taken, the queue is long
            t0 = time.monotonic()
            result = await stream.append(RecordBatch(b"1"), producer_id="p", sequence=1)
            took = time.monotonic() - t0
            assert result.base_offset == 1
            assert took < 1.5, f"the append waited {took:.2f} s behind idle tails (2 s polls)"
            for t in tails:
                t.cancel()
            await asyncio.gather(*tails, return_exceptions=True)

    asyncio.run(main())


def test_appends_queued_in_threads_are_dropped_when_the_client_closes(tmp_path: Path) -> None:
    """Appends still queued behind a thread-path append when the handle closes end with
    `StreamClosedError` (nothing written), never left pending."""
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.wal.memory import MemoryWal

    with s3stream.StreamClient(LocalObjectStore(tmp_path), MemoryWal(), settings=SMALL) as first:
        stream = first.create_stream()
        stream.append(RecordBatch(b"0"), producer_id="p", sequence=0)
        sid = stream.stream_id

    async def main() -> None:
        client = aio.AsyncStreamClient(_slow_reads_client(tmp_path, 0.5))
        stream = await client.open_stream(sid)
        appends = [
            asyncio.create_task(stream.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k))
            for k in range(1, 20)
        ]
        await asyncio.sleep(0.1)  # the first loads the producers, the others queue behind
        await client.close()
        results = await asyncio.wait_for(
            asyncio.gather(*appends, return_exceptions=True), timeout=10
        )
        for r in results:
            assert not isinstance(r, BaseException) or isinstance(r, StreamClosedError), r
        # The append in progress at the close ends within its own read's time (0.5 s); on a
        # loaded machine its thread may still be on its way out when close returns.
        deadline = time.monotonic() + 5
        while [t for t in pool_threads() if "-append" in t] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not [t for t in pool_threads() if "-append" in t]

    asyncio.run(main())


def test_an_append_given_up_that_fails_later_reaches_no_exception_handler(
    tmp_path: Path,
) -> None:
    """An append whose await timed out (the caller got `UnavailableError`) and whose WAL
    write fails afterwards: nobody reads that outcome any more, and asyncio reported it to
    the loop's exception handler ("Future exception was never retrieved", with the
    library's internal traceback), once per such append."""
    import contextlib
    import dataclasses
    import gc
    from concurrent.futures import Future

    from s3stream import UnavailableError
    from s3stream.wal.base import WalCapabilities, WalPosition, WriteAheadLog
    from s3stream.wal.memory import MemoryWal

    class FailingLater(WriteAheadLog):
        """Acknowledges nothing: each append fails 0.3 s after it was made."""

        def __init__(self) -> None:
            self._inner = MemoryWal()

        @property
        def capabilities(self) -> WalCapabilities:
            return dataclasses.replace(self._inner.capabilities, acks_on_call=False)

        def recover(self) -> Any:
            return iter(())

        def append(self, data: bytes) -> Future[WalPosition]:
            out: Future[WalPosition] = Future()
            threading.Timer(0.3, lambda: out.set_exception(UnavailableError("disk gone"))).start()
            return out

        def trim(self, position: WalPosition) -> None:
            pass

        def reset(self) -> None:
            pass

        def close(self) -> None:
            pass

        def describe(self) -> str:
            return "failing-later"

    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        sync = s3stream.StreamClient(
            s3stream.objectstore.MemoryObjectStore(), FailingLater(), settings=SMALL
        )
        client = aio.AsyncStreamClient(sync)
        stream = await client.create_stream()
        for _ in range(3):
            with pytest.raises(UnavailableError):
                await stream.append(RecordBatch(b"x"), timeout_s=0.1)
        await asyncio.sleep(0.6)  # the WAL writes fail now
        gc.collect()
        await asyncio.sleep(0)
        with contextlib.suppress(s3stream.S3StreamError):
            await client.close(timeout_s=1)

    asyncio.run(main())
    assert [c.get("message") for c in reported] == []


def test_flush_and_close_keep_their_deadline_behind_stuck_reads(tmp_path: Path) -> None:
    """Reads stuck on a slow store fill the wrapper's call pool; `flush(timeout_s)` and
    `close(timeout_s)` queued behind them, and their deadline started only when a thread
    took them (flush(timeout_s=1) returned after 10.9 s); close then waited for the stuck
    reads to end, whatever its deadline."""
    import contextlib

    with s3stream.open(str(tmp_path), settings=SMALL, wal="memory://") as sync:
        s = sync.create_stream()
        s.append(RecordBatch(b"x" * 100))
        sid = s.stream_id

    async def main() -> tuple[float, float]:
        sync = _slow_reads_client(tmp_path, 2.0)
        client = aio.AsyncStreamClient(sync, threads=2)
        stream = await client.open_stream(sid)
        await stream.append(RecordBatch(b"pending"))
        reads = [asyncio.ensure_future(stream.fetch(0)) for _ in range(6)]
        await asyncio.sleep(0.2)  # the pool's two threads are in a slow GET
        started = time.monotonic()
        await client.flush(timeout_s=1)
        flushed = time.monotonic() - started
        started = time.monotonic()
        with contextlib.suppress(s3stream.S3StreamError):
            await client.close(timeout_s=1)
        closed = time.monotonic() - started
        await asyncio.gather(*reads, return_exceptions=True)
        return flushed, closed

    flushed, closed = asyncio.run(main())
    assert flushed < 1.5 and closed < 2.5, (flushed, closed)


def test_open_flush_and_close_keep_their_deadline_beside_the_loops_busy_executor(
    tmp_path: Path,
) -> None:
    """`aio.open`, `flush` and `close` ran in the loop's default executor, shared with the
    application's own `to_thread` calls: behind them, their deadline started only when a
    thread took them (flush(timeout_s=0.5) took 4.45 s). And a reader's close, queued in a
    call pool whose threads were all busy, failed at its limit, left the reader open, and a
    second close returned at once as if it had closed it."""
    from concurrent.futures import ThreadPoolExecutor

    async def main() -> tuple[float, float, float, bool]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        busy = asyncio.ensure_future(asyncio.to_thread(time.sleep, 3))
        await asyncio.sleep(0.1)  # the executor's one thread sleeps now
        started = time.monotonic()
        client = await aio.open(str(tmp_path), settings=SMALL, wal="memory://")
        opened = time.monotonic() - started
        stream = await client.create_stream()
        await stream.append(RecordBatch(b"x"))
        started = time.monotonic()
        await client.flush(timeout_s=0.5)
        flushed = time.monotonic() - started
        started = time.monotonic()
        await client.close(timeout_s=0.5)
        closed = time.monotonic() - started
        quick = ClientSettings(call_timeout_ms=1000)
        reader = aio.AsyncStreamReader(
            s3stream.open_reader(str(tmp_path), settings=quick), threads=1
        )
        held = asyncio.ensure_future(reader._threads.call(time.sleep, 3))  # its one thread
        await asyncio.sleep(0.1)
        with contextlib.suppress(s3stream.S3StreamError):
            await reader.close()
        try:
            reader.sync.list_streams()
            reader_closed = False
        except s3stream.StreamClosedError:
            reader_closed = True
        await asyncio.gather(busy, held, return_exceptions=True)
        return opened, flushed, closed, reader_closed

    opened, flushed, closed, reader_closed = asyncio.run(main())
    assert opened < 2 and flushed < 1.5 and closed < 1.5, (opened, flushed, closed)
    assert reader_closed


def test_one_streams_conditional_appends_do_not_hold_up_the_others(tmp_path: Path) -> None:
    """Conditional appends of one stream waiting in threads for an offset to settle made
    every append of the client go to threads, one at a time per stream (a flag of the
    client): 300 plain appends to another stream then took 24 s instead of 7, ~100 of them
    refused with `BackpressureError` although nothing was full. A stream's own waits now
    hold up only that stream; waits for room (which all streams share) still hold up all."""
    from concurrent.futures import Future

    async def main() -> None:
        client = await aio.open(str(tmp_path), settings=SMALL)
        try:
            a, b = await client.create_stream(), await client.create_stream()
            threads = client._threads
            # A conditional append of `a` waiting in a thread (a future nobody completes).
            parked: Future[Any] = Future()
            threads.submit_append(a.stream_id, parked.result, room=False)
            assert threads.must_queue(a.stream_id) and not threads.must_queue(b.stream_id)
            results = await asyncio.gather(
                *(b.append(RecordBatch(b"%d" % i), timeout_s=5) for i in range(100))
            )
            assert sorted(r.base_offset for r in results) == list(range(100))
            parked.set_result(None)
            for _ in range(100):
                if not threads.must_queue(a.stream_id):
                    break
                await asyncio.sleep(0.01)
            # Waits for room hold up every stream.
            parked_room: Future[Any] = Future()
            threads.submit_append(a.stream_id, parked_room.result, room=True)
            assert threads.must_queue(b.stream_id)
            parked_room.set_result(None)
        finally:
            await client.close()

    asyncio.run(main())


def test_a_readers_async_tail_follows_the_log_every_poll_s(tmp_path: Path) -> None:
    """`AsyncStreamReader.tail(poll_s=P)` looked at the metadata log every ``tail_poll_ms``
    (a commit showed 0.25 s after it with poll_s=4: 8x the GETs asked for); as the sync
    `StreamReader.tail`, it looks every `poll_s`."""
    with s3stream.open(str(tmp_path), settings=SMALL, wal="memory://") as writer:
        s = writer.create_stream()
        s.append(RecordBatch(b"first"))
        writer.flush()

        async def main() -> float:
            # (A mapping, as `open` takes: open_reader refused it.)
            async with await aio.open_reader(
                str(tmp_path), settings={"tail_poll_ms": 50}
            ) as reader:
                tail = reader.tail(s.stream_id, 0, poll_s=2.0)
                assert (await anext(tail)).payload == b"first"
                following = asyncio.ensure_future(anext(tail))
                await asyncio.sleep(0.3)
                await asyncio.to_thread(s.append, RecordBatch(b"second"))
                await asyncio.to_thread(writer.flush)
                committed = time.monotonic()
                assert (await following).payload == b"second"
                return time.monotonic() - committed

        seen_after = asyncio.run(main())
    # The commit came ~0.3 s into a 2 s poll: seen at the poll's end, not 50 ms later.
    assert 1.0 <= seen_after <= 4.0, seen_after


def test_a_close_whose_await_was_cancelled_still_finishes_before_the_process_exits(
    tmp_path: Path,
) -> None:
    """`asyncio.wait_for(client.close(), 0.05)` timing out, then `asyncio.run` returning and
    the process exiting: the close, moved to a daemon thread of its own, was cut off at exit
    and left the stream open on the node (the next open was a recovery); the interpreter
    waits for it again, as it waited for the loop's executor."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import asyncio, sys
        import s3stream.aio as aio
        from s3stream import RecordBatch

        async def main():
            client = await aio.open(sys.argv[1], node_id="n1")
            stream = await client.create_stream()
            await stream.append(RecordBatch(b"x" * 1000))
            try:
                await asyncio.wait_for(client.close(), 0.001)
            except TimeoutError:
                pass

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    with s3stream.open_reader(str(tmp_path)) as reader:
        (info,) = reader.list_streams()
        assert info.state is StreamState.CLOSED and info.end_offset == 1


def test_a_cancelled_open_that_fails_reaches_no_exception_handler(tmp_path: Path) -> None:
    """An `aio.open` cancelled by its caller, whose open then fails (its node is in use):
    nobody awaits that outcome, and asyncio reported it to the loop's exception handler
    ("Future exception was never retrieved", with the library's internal traceback)."""
    import gc

    root = tmp_path / "s"
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        task = asyncio.create_task(aio.open(root, settings=SMALL))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.0)  # the open fails in its thread meanwhile
        gc.collect()
        await asyncio.sleep(0)

    with s3stream.open(root, settings=SMALL):  # holds the node the cancelled open asks for
        asyncio.run(main())
    assert [c.get("message") for c in reported] == []
