"""Stream habits in the owning process: long-poll fetch, tailing, conditional appends."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import (
    ClientSettings,
    FencedError,
    InvalidArgumentError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    Record,
    RecordBatch,
    S3StreamError,
    StreamClosedError,
)

WRITER = Path(__file__).with_name("tail_writer_child.py")
SMALL = ClientSettings(upload_threshold_bytes=16 * 1024, upload_interval_ms=0)


def open_dir(path: Path) -> s3stream.StreamClient:
    # The default file WAL: appends are durable on disk when acknowledged.
    return s3stream.open(str(path), settings=SMALL)


def test_fetch_long_poll_waits_for_an_append_and_times_out_empty(tmp_path: Path) -> None:
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        t0 = time.monotonic()
        assert s.fetch(0, wait_s=0.3).batches == []
        assert time.monotonic() - t0 >= 0.25
        timer = threading.Timer(0.2, lambda: s.append(RecordBatch(b"late")))
        timer.start()
        t0 = time.monotonic()
        got = s.fetch(0, wait_s=30)
        waited = time.monotonic() - t0
        timer.join()
        assert [b.payload for b in got.batches] == [b"late"]
        assert waited < 10, "the append should wake the poll at once"
        with pytest.raises(InvalidArgumentError):
            s.fetch(0, wait_s=-1)


def test_a_long_poll_refuses_bad_arguments_before_waiting(tmp_path: Path) -> None:
    """Arguments are checked before the wait, not after it; a range that cannot hold data
    (``end_offset == start_offset``) is answered at once."""
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        s.append(RecordBatch(b"a"))
        t0 = time.monotonic()
        for bad in ({"end_offset": 0}, {"max_bytes": 0}, {"max_bytes": "x"}):
            with pytest.raises(InvalidArgumentError):
                s.fetch(1, wait_s=3, **bad)  # type: ignore[arg-type]
        assert s.fetch(1, 1, wait_s=3).batches == []
        assert time.monotonic() - t0 < 2.5  # one wait would be 3 s


def test_tail_delivers_every_batch_once_in_order_while_a_writer_appends(tmp_path: Path) -> None:
    n = 2_000
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        s.append(RecordBatch(b"before"))
        seen: list[bytes] = []

        def consume() -> None:
            for b in s.tail(0, max_bytes=4096):
                seen.append(b.payload)
                if len(seen) == n + 1:
                    return

        reader = threading.Thread(target=consume)
        reader.start()
        for i in range(n):
            s.append(RecordBatch(b"%d" % i))  # uploads run meanwhile (small threshold)
        reader.join(60)
        assert not reader.is_alive()
        assert seen == [b"before"] + [b"%d" % i for i in range(n)]


def test_tail_ends_cleanly_on_close_and_raises_on_trim(tmp_path: Path) -> None:
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        s.append(RecordBatch(b"a"))
        got: list[bytes] = []
        done = threading.Event()

        def consume() -> None:
            for b in s.tail(0, wait_s=60):
                got.append(b.payload)
            done.set()

        t = threading.Thread(target=consume)
        t.start()
        time.sleep(0.3)
        s.close()  # wakes the 60 s poll: the iterator ends
        assert done.wait(10)
        assert got == [b"a"]

        s2 = client.create_stream()
        for i in range(5):
            s2.append(RecordBatch(b"%d" % i))
        it = s2.tail(1, max_bytes=1, wait_s=0.2)  # one batch per fetch
        assert next(it).base_offset == 1
        s2.trim(4)
        with pytest.raises(OffsetOutOfRangeError):
            next(it)
        with pytest.raises(InvalidArgumentError):
            s2.tail(0, wait_s=0)

    # The client closing ends a tail that is waiting.
    with open_dir(tmp_path / "b") as client:
        s3 = client.create_stream()
        ended = threading.Event()

        def drain() -> None:
            list(s3.tail(0, wait_s=60))
            ended.set()

        t = threading.Thread(target=drain)
        t.start()
        time.sleep(0.3)
    assert ended.wait(10)


def test_a_tail_of_a_handle_whose_node_was_taken_over_raises(tmp_path: Path) -> None:
    """Another node took this one over and appended to its stream: this client's append
    raised `FencedError` (it knows), but its tail waited for ever and `fetch(wait_s=...)`
    returned nothing while the stream grew under the new owner. Both raise now."""
    url = str(tmp_path / "s")
    a = s3stream.open(url, node_id="a")
    stream = a.create_stream()
    stream.append(RecordBatch(b"a0"))
    a.flush()
    seen: list[bytes] = []
    ended: list[BaseException] = []

    def tail() -> None:
        try:
            for b in stream.tail(0, wait_s=0.2):
                seen.append(bytes(b.payload))
        except BaseException as exc:
            ended.append(exc)

    thread = threading.Thread(target=tail, daemon=True)
    thread.start()
    with s3stream.open(url, node_id="b") as b:
        b.take_over("a")
        taken = b.open_stream(stream.stream_id)
        taken.append(RecordBatch(b"b0"))
        with pytest.raises(FencedError):
            stream.append(RecordBatch(b"late"), timeout_s=5)
        thread.join(10)
        assert not thread.is_alive(), "the tail still waits"
        assert seen == [b"a0"] and isinstance(ended[0], FencedError), (seen, ended)
        with pytest.raises(FencedError):
            stream.fetch(1, wait_s=0.5)
    with contextlib.suppress(S3StreamError):
        a.close(timeout_s=5)


def test_an_idle_writers_tail_learns_its_stream_was_taken(tmp_path: Path) -> None:
    """A writer that appends nothing learns of a take-over from no commit of its own: its
    tails waited for ever while the stream grew under the new owner. An empty long poll now
    reads the metadata (at most every few seconds per client): a stream force-opened
    elsewhere fails its tail with `FencedError`, the client's other tails go on, and once the
    node is taken over those fail too. A close of the client's own still ends its tail
    cleanly."""
    url = str(tmp_path / "s")
    a = s3stream.open(url, node_id="a")
    forced, kept, closed = a.create_streams([None, None, None])
    for s in (forced, kept, closed):
        s.append(RecordBatch(b"a0"))
    a.flush()
    ended: dict[int, list[object]] = {s.stream_id: [] for s in (forced, kept, closed)}

    def tail(stream: s3stream.Stream) -> None:
        try:
            for b in stream.tail(0, wait_s=0.2):
                ended[stream.stream_id].append(bytes(b.payload))
            ended[stream.stream_id].append("ended")
        except BaseException as exc:
            ended[stream.stream_id].append(exc)

    threads = {s.stream_id: threading.Thread(target=tail, args=(s,)) for s in (forced, kept)}
    threads[closed.stream_id] = threading.Thread(target=tail, args=(closed,))
    for t in threads.values():
        t.start()
    with s3stream.open(url, node_id="b") as b:
        mine = b.open_stream(forced.stream_id, force=True)
        mine.append(RecordBatch(b"b0"))
        threads[forced.stream_id].join(15)
        assert not threads[forced.stream_id].is_alive(), "the tail still waits"
        got = ended[forced.stream_id]
        assert got[:-1] == [b"a0"] and isinstance(got[-1], FencedError), got
        assert "no longer this handle's" in str(got[-1])
        # The handle is done: an append to it is refused, not acknowledged at offset 1 (which
        # holds b"b0" now) and dropped at the next upload.
        with pytest.raises(FencedError):
            forced.append(RecordBatch(b"late"), expected_offset=1)
        closed.close()
        threads[closed.stream_id].join(5)
        assert ended[closed.stream_id] == [b"a0", "ended"]
        assert threads[kept.stream_id].is_alive() and ended[kept.stream_id] == [b"a0"]
        b.take_over("a")
        threads[kept.stream_id].join(15)
        assert not threads[kept.stream_id].is_alive(), "the tail still waits"
        got = ended[kept.stream_id]
        assert got[:-1] == [b"a0"] and isinstance(got[-1], FencedError), got
        assert "registered again" in str(got[-1])
        with pytest.raises(FencedError):
            kept.append(RecordBatch(b"late"))
        assert [bytes(x.payload) for x in b.open_stream(forced.stream_id).fetch(0).batches] == [
            b"a0",
            b"b0",
        ]
    with contextlib.suppress(S3StreamError):
        a.close(timeout_s=5)


@contextlib.contextmanager
def _taken_from_a(tmp_path: Path) -> Iterator[tuple[s3stream.StreamClient, s3stream.Stream]]:
    """Client "a" with a handle of a stream holding b"a0", which client "b" then
    force-opened and appended b"b0" to (both committed)."""
    url = str(tmp_path / "s")
    a = s3stream.open(url, node_id="a")
    b = s3stream.open(url, node_id="b")
    try:
        stream = a.create_stream()
        stream.append(RecordBatch(b"a0"))
        a.flush()
        b.open_stream(stream.stream_id, force=True).append(RecordBatch(b"b0"))
        b.flush()
        yield a, stream
    finally:
        with contextlib.suppress(S3StreamError):
            a.close(timeout_s=5)
        b.close()


def test_a_long_poll_fences_its_handle_while_another_call_holds_the_client(
    tmp_path: Path,
) -> None:
    """The long poll that finds its stream taken fences the handle even while another call
    of the client (here a thread standing in for a slow one) holds the client's lock: it
    raised `FencedError` and left the handle appending, and the next append was acknowledged
    and then reported dropped."""
    with _taken_from_a(tmp_path) as (a, stream):
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with a._lock:
                holding.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        holding.wait(5)
        try:
            with pytest.raises(FencedError, match="no longer this handle's"):
                for _ in range(200):  # the metadata is read every few seconds per client
                    stream.fetch(stream.confirm_offset, wait_s=0.1)
            with pytest.raises(FencedError):
                stream.append(RecordBatch(b"late"))
        finally:
            release.set()
            holder.join(5)
        a.flush()  # nothing acknowledged was dropped: "late" was refused


def test_a_long_poll_racing_its_own_close_ends_closed_not_fenced(tmp_path: Path) -> None:
    """A handle closed by its own client between the long poll's empty wait and its
    ownership check read as taken ("closed since") and raised `FencedError`; it is the
    handle's own close: `StreamClosedError`."""
    with s3stream.open(tmp_path / "s") as client:
        stream = client.create_stream()
        stream.append(RecordBatch(b"a0"))
        owner = stream._owner
        checked = owner.taken_from

        def closing_first(handle: s3stream.Stream) -> str | None:
            handle.close()  # the close lands between the wait and the check
            return checked(handle)

        owner.taken_from = closing_first  # type: ignore[method-assign]
        with pytest.raises(StreamClosedError):
            stream.fetch(stream.confirm_offset, wait_s=0.05)


def test_a_long_poll_racing_a_close_after_a_take_over_still_says_fenced(
    tmp_path: Path,
) -> None:
    """Another client took the stream, then this handle's close landed between the poll's
    empty wait and its ownership check: the poll reported a clean close (a tail would end
    quietly while the other client writes the stream). It is a take-over: `FencedError`."""
    with _taken_from_a(tmp_path) as (_, stream):
        owner = stream._owner
        checked = owner.taken_from

        def closing_first(handle: s3stream.Stream) -> str | None:
            with contextlib.suppress(FencedError):  # the close learns of the take-over
                handle.close()
            return checked(handle)

        owner.taken_from = closing_first  # type: ignore[method-assign]
        with pytest.raises(FencedError):
            stream.fetch(stream.confirm_offset, wait_s=0.05)


def test_a_fenced_handle_leaves_the_clients_read_to_committed_data(tmp_path: Path) -> None:
    """After a long poll fenced the handle (it stays listed, for its close to report the
    take-over), `StreamClient.read`, which reads without opening, read through it and raised
    its `FencedError`; it serves what is committed."""
    with _taken_from_a(tmp_path) as (a, stream):
        with pytest.raises(FencedError):
            for _ in range(200):
                stream.fetch(stream.confirm_offset, wait_s=0.1)
        got = a.read(stream.stream_id, 0)
        assert [bytes(x.payload) for x in got.batches] == [b"a0", b"b0"]


def test_tail_records_yields_offsets_and_records(tmp_path: Path) -> None:
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        s.append_records([Record(b"v0", b"k0"), Record(b"v1", b"k1")])
        s.append(RecordBatch(b"raw"))
        it = s.tail_records(1, wait_s=0.1)
        first = next(it)
        assert first[0] == 1 and first[1].value == b"v1"
        second = next(it)
        assert second[0] == 2 and second[1].value == b"raw"


def test_conditional_append_refuses_a_stale_offset_and_never_duplicates(tmp_path: Path) -> None:
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        assert s.append(RecordBatch(b"a", count=2), expected_offset=0).base_offset == 0
        # The same append retried (its first outcome unknown to the caller): refused.
        with pytest.raises(OffsetMismatchError) as e:
            s.append(RecordBatch(b"a", count=2), expected_offset=0)
        assert (e.value.expected, e.value.actual) == (0, 2)
        assert not e.value.retryable
        with pytest.raises(OffsetMismatchError):
            s.append_async(RecordBatch(b"x"), expected_offset=5)
        assert s.append_async(RecordBatch(b"b"), expected_offset=2).result().base_offset == 2
        assert s.next_offset == 3
        with pytest.raises(InvalidArgumentError):
            s.append(RecordBatch(b"x"), expected_offset=-1)


def test_conditional_appends_racing_from_two_threads_each_offset_wins_once(
    tmp_path: Path,
) -> None:
    rounds = 300
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        wins: dict[str, int] = {"a": 0, "b": 0}
        barrier = threading.Barrier(2)

        def writer(name: str) -> None:
            barrier.wait()
            while True:
                offset = s.next_offset
                if offset >= rounds:
                    return
                try:
                    s.append(RecordBatch(f"{name}{offset}".encode()), expected_offset=offset)
                    wins[name] += 1
                except OffsetMismatchError as exc:
                    assert exc.actual > offset

        threads = [threading.Thread(target=writer, args=(n,)) for n in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert wins["a"] + wins["b"] == s.confirm_offset == rounds
        batches = s.fetch(0, max_bytes=1 << 30).batches
        while batches[-1].next_offset < rounds:
            batches += s.fetch(batches[-1].next_offset, max_bytes=1 << 30).batches
        # Each offset holds exactly the batch that was appended expecting it.
        assert [int(b.payload[1:]) for b in batches] == list(range(rounds))


# ---------------------------------------------------------------- a reader in another process


def tail_from_another_process(
    url: str, options: dict[str, Any], count: int, wal: str | None = None
) -> list[int]:
    """Run a writer process on `url`; tail its stream from this process with a reader."""
    child = subprocess.Popen(
        [sys.executable, str(WRITER), url, str(count), json.dumps(options)]
        + ([wal] if wal else []),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        stream_id = int(child.stdout.readline())
        seen: list[int] = []
        with s3stream.open_reader(url, storage_options=options or None) as reader:
            # The reader closing ends the tail: a watchdog bounds the test.
            watchdog = threading.Timer(120, reader.close)
            watchdog.start()
            try:
                for offset, record in reader.tail_records(stream_id, 0, poll_s=0.05):
                    assert record.value is not None
                    assert offset == len(seen)
                    seen.append(int(record.value))
                    if len(seen) == count:
                        break
            finally:
                watchdog.cancel()
        assert child.wait(60) == 0
        return seen
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_reader_process_tails_a_writer_process_on_a_local_directory(tmp_path: Path) -> None:
    assert tail_from_another_process(str(tmp_path / "store"), {}, 300) == list(range(300))


@pytest.mark.s3
def test_a_reader_process_tails_a_writer_process_on_s3(seaweedfs: Any, tmp_path: Path) -> None:
    url = f"s3://{seaweedfs.bucket}/tail-{uuid.uuid4().hex}"
    options = seaweedfs.storage_options()
    wal = str(tmp_path / "writer.wal")  # a file WAL: appends at disk speed, uploads to S3
    assert tail_from_another_process(url, options, 200, wal) == list(range(200))


def test_a_reader_tail_ends_on_close_and_checks_its_arguments(tmp_path: Path) -> None:
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        s.append(RecordBatch(b"a"))
        client.flush()
        reader = s3stream.open_reader(str(tmp_path))
        got: list[bytes] = []
        ended = threading.Event()

        def consume() -> None:
            for b in reader.tail(s.stream_id, 0, poll_s=30):
                got.append(b.payload)
            ended.set()

        t = threading.Thread(target=consume)
        t.start()
        time.sleep(0.5)
        reader.close()  # wakes the 30 s wait
        assert ended.wait(10)
        assert got == [b"a"]
        with s3stream.open_reader(str(tmp_path)) as r2, pytest.raises(InvalidArgumentError):
            r2.tail(s.stream_id, 0, poll_s=0)


def test_tail_records_checks_its_arguments_at_the_call(tmp_path: Path) -> None:
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        client.flush()
        with pytest.raises(InvalidArgumentError):
            s.tail_records(-1)
        with pytest.raises(InvalidArgumentError):
            s.tail_records(0, wait_s=0)
        with s3stream.open_reader(str(tmp_path)) as reader, pytest.raises(InvalidArgumentError):
            reader.tail_records(s.stream_id, -1)
        # The record codec's bound holds at append time: every batch reads back as records.
        with pytest.raises(InvalidArgumentError):
            RecordBatch(b"d", base_timestamp=-(2**63))


@pytest.mark.parametrize("wait", [1e-300, 1e-9, 0.0009, None])
def test_a_wait_that_would_spin_is_refused_like_none(tmp_path: Path, wait: float | None) -> None:
    """`wait_s` / `poll_s` of 0 were refused (the loop would spin), yet 1e-9 passed and spun:
    about 720,000 fetches (or 83,000 metadata-log reads, each a GET on a store) in 2 s on an
    idle stream. A wait under a millisecond is refused as 0 is; 1 ms is taken."""
    with open_dir(tmp_path) as client:
        s = client.create_stream()
        client.flush()
        with pytest.raises(InvalidArgumentError, match="wait_s"):
            s.tail(0, wait_s=wait)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="wait_s"):
            s.tail_records(0, wait_s=wait)  # type: ignore[arg-type]
        s.tail(0, wait_s=0.001)
        with s3stream.open_reader(str(tmp_path)) as reader:
            if wait is not None:  # None is the reader's default poll
                with pytest.raises(InvalidArgumentError, match="poll_s"):
                    reader.tail(s.stream_id, 0, poll_s=wait)
            reader.tail(s.stream_id, 0, poll_s=0.001)
