"""Idempotent producers: (producer_id, sequence) appended at most once, across a crash, a
reopen and a take-over (storage/producers.py, docs/consuming.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import s3stream
from s3stream import (
    ClientSettings,
    InvalidArgumentError,
    ManualClock,
    Record,
    RecordBatch,
    S3StreamError,
    SequenceError,
    SystemClock,
    UnavailableError,
)
from s3stream.wal.base import WalCapabilities, WalPosition, WalRecord, WriteAheadLog
from s3stream.wal.memory import MemoryWal

CHILD = Path(__file__).with_name("producer_child.py")
SMALL = ClientSettings(upload_threshold_bytes=4096, upload_interval_ms=0)


def values(stream: s3stream.Stream) -> list[bytes]:
    out: list[bytes] = []
    pos = stream.start_offset
    while pos < stream.confirm_offset:
        res = stream.fetch(pos, max_bytes=1 << 20)
        out += [b.payload for b in res.batches]
        pos = res.next_offset
    return out


def test_a_duplicate_returns_the_original_and_writes_nothing(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()
        first = s.append(RecordBatch(b"a", count=3), producer_id="p", sequence=7)
        s.append(RecordBatch(b"x"))  # a plain append between
        again = s.append(RecordBatch(b"a", count=3), producer_id="p", sequence=7)
        assert again == first
        assert s.next_offset == 4
        r8 = s.append_records([Record(b"r")], producer_id="p", sequence=8)
        assert s.append_async(RecordBatch(b"r"), producer_id="p", sequence=8).result() == r8
        # Another producer has sequences of its own.
        assert s.append(RecordBatch(b"q"), producer_id="q", sequence=0).base_offset == 5
        # The stored batch carries its identity in its properties.
        stored = s.fetch(0).batches[0]
        assert stored.properties["s3stream.producer"] == "p"
        assert stored.properties["s3stream.sequence"] == "7"
        got = values(s)  # the records batch at offset 4 is in the record codec
        assert len(got) == 4 and (got[0], got[1], got[3]) == (b"a", b"x", b"q")


def test_a_new_streams_first_idempotent_append_does_not_wait_for_a_load(
    tmp_path: Path,
) -> None:
    """A stream with nothing committed has no producers to rebuild: its first idempotent
    append counted as one that waits (for a load from the store), which sent the asyncio
    client's appends of the stream through its one-at-a-time lane (200 concurrent appends
    on the S3 WAL: 179 false `BackpressureError`s). A reopened stream still loads them."""
    from s3stream.storage.appender import not_acknowledged

    with s3stream.open(tmp_path / "s") as client:
        stream = client.create_stream()
        assert not stream.append_would_wait(idempotent=True)
        stream.append(RecordBatch(b"x"), producer_id="p", sequence=0)
        assert stream.append(RecordBatch(b"x"), producer_id="p", sequence=0).base_offset == 0
        client.flush()
        sid = stream.stream_id
        stream.close()
        reopened = client.open_stream(sid)
        assert reopened.append_would_wait(idempotent=True)  # committed: its producers load
        assert reopened.append(RecordBatch(b"x"), producer_id="p", sequence=0).base_offset == 0
    # What a retry does is said for the kind of append that timed out.
    advice = [
        str(not_acknowledged(7, "1 s", conditional=c, idempotent=i))
        for c, i in ((False, False), (True, False), (False, True))
    ]
    assert "duplicate it" in advice[0]
    assert "same expected_offset" in advice[1] and "duplicate" not in advice[1]
    assert "same producer_id and sequence" in advice[2] and "duplicate" not in advice[2]


def test_out_of_order_sequences_are_refused(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()
        for k in range(10):
            s.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k)
        with pytest.raises(SequenceError) as gap:
            s.append(RecordBatch(b"x"), producer_id="p", sequence=11)
        assert (gap.value.expected, gap.value.got) == (10, 11)
        assert not gap.value.retryable
        with pytest.raises(SequenceError, match="older than"):
            s.append(RecordBatch(b"x"), producer_id="p", sequence=2)  # outside the window of 5
        assert s.append(RecordBatch(b"5"), producer_id="p", sequence=5).base_offset == 5
        assert s.next_offset == 10
        with pytest.raises(InvalidArgumentError):
            s.append(RecordBatch(b"x"), producer_id="p")
        with pytest.raises(InvalidArgumentError):
            s.append(RecordBatch(b"x"), producer_id="", sequence=1)
        with pytest.raises(InvalidArgumentError):
            s.append(RecordBatch(b"x"), producer_id="p", sequence=-1)
        with pytest.raises(InvalidArgumentError, match="reserved"):
            s.append(
                RecordBatch(b"x", properties={"s3stream.sequence": "1"}),
                producer_id="p",
                sequence=10,
            )


def test_an_idle_producer_expires(tmp_path: Path) -> None:
    clock = ManualClock()
    settings = ClientSettings(upload_interval_ms=0, producer_expiry_ms=60_000)
    with s3stream.open(str(tmp_path), settings=settings, clock=clock) as client:
        s = client.create_stream()
        s.append(RecordBatch(b"a"), producer_id="p", sequence=0)
        clock.advance(61)
        # Forgotten: a new start (a duplicate of 0 would now be appended again).
        assert s.append(RecordBatch(b"b"), producer_id="p", sequence=100).base_offset == 1


def test_one_shot_producers_are_forgotten_once_idle(tmp_path: Path) -> None:
    """Producers that append once and never again were dropped only when they came back,
    so a stream kept every producer id it ever saw (30,000 one-shot producers: ~85 MB). Now
    a growing table sweeps out the idle ones; those still within the expiry stay."""
    clock = ManualClock()
    settings = ClientSettings(upload_interval_ms=0, producer_expiry_ms=60_000)
    with s3stream.open(str(tmp_path), settings=settings, clock=clock) as client:
        s = client.create_stream()
        for i in range(3000):
            s.append(RecordBatch(b"x"), producer_id=f"old-{i}", sequence=0)
        clock.advance(61)
        for i in range(3000):
            s.append(RecordBatch(b"y"), producer_id=f"new-{i}", sequence=0)
        table = client._storage._appender._writers[s.stream_id].producers
        assert table is not None and len(table) <= 3000
        # The recent ones are remembered: a resend is recognised, not written again.
        again = s.append(RecordBatch(b"y"), producer_id="new-2999", sequence=0)
        assert again.base_offset == 5999 and s.confirm_offset == 6000


def test_racing_retries_of_one_sequence_write_it_once(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()
        results: list[s3stream.AppendResult] = []
        unexpected: list[BaseException] = []
        barrier = threading.Barrier(4)

        def send() -> None:
            barrier.wait()
            for k in range(200):
                try:
                    results.append(s.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k))
                except SequenceError as exc:
                    # A thread that fell more than the window behind the others is told it
                    # cannot be judged (docs/consuming.md): right, and nothing is written.
                    if "older than the last" not in str(exc):
                        unexpected.append(exc)
                except BaseException as exc:
                    unexpected.append(exc)

        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not unexpected, unexpected
        # Every thread saw every sequence at one offset; the stream holds each once.
        assert s.next_offset == 200
        assert {r.base_offset for r in results} == set(range(200))
        assert values(s) == [b"%d" % k for k in range(200)]


def test_producer_state_survives_a_reopen(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()
        for k in range(20):
            s.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k)
        sid = s.stream_id
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.open_stream(sid)
        for k in range(15, 20):
            assert s.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k).base_offset == k
        with pytest.raises(SequenceError):
            s.append(RecordBatch(b"x"), producer_id="p", sequence=22)
        s.append(RecordBatch(b"20"), producer_id="p", sequence=20)
        assert values(s) == [b"%d" % k for k in range(21)]


def kill_producer_after_acks(root: Path, node_id: str, acks: int) -> int:
    """Run the producer child until it printed `acks` acknowledgements, SIGKILL it; the last
    sequence it printed."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), node_id], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    last = -1
    deadline = time.monotonic() + 120
    try:
        for line in child.stdout:
            last = int(line.split()[1])
            if last + 1 >= acks or time.monotonic() > deadline:
                break
        child.send_signal(signal.SIGKILL)  # between some ack and its print, likely
        child.wait()
        # What it printed before it died, past the line read (the reader buffers ahead and
        # the child runs on until the signal lands): the real last printed acknowledgement.
        for line in child.stdout:
            last = int(line.split()[1])
    finally:
        child.kill()
        child.wait()
    assert last + 1 >= acks, "the producer child stopped early"
    return last


def resend_and_check(stream: s3stream.Stream, last_printed: int) -> None:
    """Resend as a producer that lost its last replies would: from three before the last
    acknowledgement it printed (so at least three acknowledged appends are sent again,
    wherever the kill fell); every sequence must be in the stream exactly once, in order."""
    for k in range(last_printed - 2, last_printed + 40):
        stream.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k)
    got = [int(v) for v in values(stream)]
    assert got == list(range(len(got))), "a duplicate or a hole"
    assert len(got) == last_printed + 40


def test_a_sigkilled_producer_resends_after_reopen_without_duplicates(tmp_path: Path) -> None:
    for round_ in range(3):
        root = tmp_path / f"r{round_}"
        last = kill_producer_after_acks(root, "w1", 150 + 97 * round_)
        with s3stream.open(str(root), node_id="w1") as client:
            resend_and_check(client.open_stream(0), last)


def test_a_sigkilled_producer_resends_after_take_over_without_duplicates(tmp_path: Path) -> None:
    last = kill_producer_after_acks(tmp_path, "w1", 200)
    with s3stream.open(str(tmp_path), node_id="w2") as client:
        client.take_over("w1")
        resend_and_check(client.open_stream(0), last)


def test_a_resend_after_reopen_is_recognised_whatever_the_batches_timestamps(
    tmp_path: Path,
) -> None:
    """Expiry and the rebuild's horizon go by the library's commit times: a caller's old
    `base_timestamp` (on the producer's batch, or on a later plain batch) changes nothing."""
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()
        sid = s.stream_id
        first = s.append(RecordBatch(b"a", base_timestamp=1000), producer_id="p", sequence=0)
        q0 = s.append(RecordBatch(b"x"), producer_id="q", sequence=0)
        s.append(RecordBatch(b"y", base_timestamp=5))  # a plain batch, stamped long ago
        s.append(RecordBatch(b"z"))
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.open_stream(sid)
        assert (
            s.append(RecordBatch(b"a", base_timestamp=1000), producer_id="p", sequence=0) == first
        )
        assert s.append(RecordBatch(b"x"), producer_id="q", sequence=0) == q0
        assert s.next_offset == 4


def test_plain_appends_may_not_carry_the_reserved_properties(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()
        for key in ("s3stream.producer", "s3stream.sequence"):
            with pytest.raises(InvalidArgumentError, match="reserved"):
                s.append(RecordBatch(b"e", properties={key: "1"}))
            with pytest.raises(InvalidArgumentError, match="reserved"):
                s.append_async(RecordBatch(b"e", properties={key: "1"}))
        assert s.next_offset == 0
        s.append(RecordBatch(b"ok", properties={"s3stream": "fine"}))


def test_a_producer_merged_with_older_data_by_compaction_is_remembered_after_reopen(
    tmp_path: Path,
) -> None:
    """A compacted object is stamped with its oldest source's commit time (the data's age);
    the producers' rebuild must count idle time from the newest source's, else a producer
    whose last batch was merged with older data passes for expired after a reopen and its
    resend is appended twice."""
    clock = ManualClock()
    settings = ClientSettings(
        upload_interval_ms=0, compaction=s3stream.CompactionSettings(stream_set_min_objects=2)
    )
    with s3stream.open(str(tmp_path), settings=settings, clock=clock) as client:
        s = client.create_stream()
        sid = s.stream_id
        s.append(RecordBatch(b"old plain data"), producer_id="q", sequence=0)
        client.flush()  # an object committed now
        clock.advance(20 * 60)  # longer ago than producer_expiry_ms (15 minutes)
        first = s.append(RecordBatch(b"order-17"), producer_id="p", sequence=0)
        client.flush()  # an object committed 20 minutes later
        committed = clock.now_ms()
        assert client.compact().objects_written == 1
    clock.advance(1)
    with s3stream.open(str(tmp_path), settings=settings, clock=clock) as client:
        s = client.open_stream(sid)
        assert s.append(RecordBatch(b"order-17"), producer_id="p", sequence=0) == first
        assert s.next_offset == 2
        assert values(s) == [b"old plain data", b"order-17"]
        (merged,) = client._meta.state.stream_objects(sid)
        # committed_ms keeps its meaning (the data's age, for the planner's aging); the
        # range says when each part was committed.
        assert merged.committed_ms == committed - 20 * 60_000
        assert merged.ranges[0].commits == ((0, committed - 20 * 60_000), (1, committed))
        # Exact per source: a producer whose last batch came from the old object was idle
        # 20 minutes: forgotten (a new start), as it would have been without compaction.
        assert s.append(RecordBatch(b"q"), producer_id="q", sequence=5).base_offset == 2
    # Expiry still counts from the producer's own commit: idle longer, forgotten.
    clock.advance(16 * 60)
    with s3stream.open(str(tmp_path), settings=settings, clock=clock) as client:
        s = client.open_stream(sid)
        assert s.append(RecordBatch(b"new"), producer_id="p", sequence=0).base_offset == 3


def test_a_resend_of_trimmed_sequences_after_reopen_is_recognised(tmp_path: Path) -> None:
    """A queue trims what it consumed: the trimmed batches still tell a reopened stream
    which sequences its producers appended (the rebuild reads below the start offset)."""
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()
        sid = s.stream_id
        acked = [s.append(RecordBatch(b"m%d" % k), producer_id="p", sequence=k) for k in range(3)]
        client.flush()
        s.trim(s.confirm_offset)
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.open_stream(sid)
        assert s.start_offset == 3
        # The last reply was lost: a resend gets the original result, nothing is written.
        assert s.append(RecordBatch(b"m2"), producer_id="p", sequence=2) == acked[2]
        assert s.append(RecordBatch(b"m1"), producer_id="p", sequence=1) == acked[1]
        assert s.next_offset == 3
        assert s.append(RecordBatch(b"m3"), producer_id="p", sequence=3).base_offset == 3


class _HeldWal(WriteAheadLog):
    """A WAL whose appends, while `holding`, stay in flight until `fail_held` fails them all
    (a WAL write that times out): appends in flight that then fail, as many as wanted."""

    def __init__(self, inner: WriteAheadLog) -> None:
        self.inner = inner
        self.holding = False
        self.held: list[Future[WalPosition]] = []

    @property
    def capabilities(self) -> WalCapabilities:
        # Futures resolve later, not in the call.
        return dataclasses.replace(self.inner.capabilities, acks_on_call=False)

    def recover(self) -> Iterator[WalRecord]:
        return self.inner.recover()

    def append(self, data: bytes) -> Future[WalPosition]:
        if not self.holding:
            return self.inner.append(data)
        f: Future[WalPosition] = Future()
        self.held.append(f)
        return f

    def append_parts(self, head: bytes, tail: bytes) -> Future[WalPosition]:
        return self.append(head + tail)

    def fail_held(self) -> None:
        self.holding = False
        for f in self.held:
            f.set_exception(UnavailableError("injected: WAL write timed out"))

    def release_held(self, data: list[bytes]) -> None:
        """Write the held appends (`data`, in order) after all, acknowledging them."""
        self.holding = False
        for f, record in zip(self.held, data, strict=True):
            f.set_result(self.inner.append(record).result())

    def trim(self, position: WalPosition) -> None:
        self.inner.trim(position)

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()

    def describe(self) -> str:
        return f"held({self.inner.describe()})"


def test_more_failed_appends_in_flight_than_the_window_are_all_resent(tmp_path: Path) -> None:
    """Ten idempotent appends in flight fail (more than the 5 whose results are kept): none
    was written, so the producer's resends of all ten, from the first, must be appended in
    order; none may be refused as \"older than the window\" (it was never written)."""
    wal = _HeldWal(MemoryWal())
    with s3stream.open(str(tmp_path), settings=SMALL, wal=wal) as client:
        s = client.create_stream()
        s.append(RecordBatch(b"0"), producer_id="p", sequence=0)
        wal.holding = True
        futs = [
            s.append_async(RecordBatch(b"%d" % k), producer_id="p", sequence=k)
            for k in range(1, 11)
        ]
        wal.fail_held()
        for f in futs:
            with pytest.raises(UnavailableError):
                f.result(30)
        for k in range(1, 11):
            r = s.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k, timeout_s=30)
            assert r.base_offset == k
        # A resend of a sequence now durable is recognised; the next one follows on.
        assert s.append(RecordBatch(b"9"), producer_id="p", sequence=9).base_offset == 9
        assert s.append(RecordBatch(b"11"), producer_id="p", sequence=11).base_offset == 11
        assert values(s) == [b"%d" % k for k in range(12)]


def test_commit_times_of_many_merged_objects_are_bounded_and_never_early(tmp_path: Path) -> None:
    """Compaction merging more objects than a range keeps commit times for joins the closest
    neighbours under the later time: every record counts as committed no earlier than it
    was (its producer is never forgotten early), and the metadata stays small."""
    clock = ManualClock()
    settings = ClientSettings(
        upload_interval_ms=0, compaction=s3stream.CompactionSettings(stream_set_min_objects=2)
    )
    committed: list[int] = []
    with s3stream.open(str(tmp_path), settings=settings, clock=clock) as client:
        s = client.create_stream()
        other = client.create_stream()
        for k in range(40):
            s.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k)
            other.append(RecordBatch(b"o"))
            client.flush()
            committed.append(clock.now_ms())
            clock.advance(1 + k % 7)  # uneven gaps: the closest are joined first
        client.compact()
        objs = client._meta.state.stream_objects(s.stream_id)
        assert all(o.level > 0 for o in objs)
        for obj in objs:
            r = obj.range_of(s.stream_id)
            assert r is not None and r.commits is not None and len(r.commits) <= 32
            for k in range(r.start_offset, r.end_offset):
                assert committed[k] <= r.committed_at(k, obj.committed_ms) <= committed[-1]
        assert values(s) == [b"%d" % k for k in range(40)]


def test_a_producer_with_an_append_in_flight_does_not_expire(tmp_path: Path) -> None:
    """An append still in flight past `producer_expiry_ms` (a stalled WAL, a wall clock that
    stepped forward): its producer is not idle, so a resend of it is the same append, never
    a second copy."""
    clock = s3stream.ManualClock()
    wal = _HeldWal(MemoryWal())
    held: list[bytes] = []
    real_append = wal.append

    def append(data: bytes) -> Future[WalPosition]:
        if wal.holding:
            held.append(data)
        return real_append(data)

    wal.append = append  # type: ignore[method-assign]
    settings = dataclasses.replace(SMALL, producer_expiry_ms=60_000)
    with s3stream.open(str(tmp_path), settings=settings, wal=wal, clock=clock) as client:
        s = client.create_stream()
        wal.holding = True
        first = s.append_async(RecordBatch(b"order-17"), producer_id="p", sequence=0)
        clock.advance(61)  # past the expiry, the append still in flight
        resend = s.append_async(RecordBatch(b"order-17"), producer_id="p", sequence=0)
        wal.release_held(held)
        assert first.result(10).base_offset == resend.result(10).base_offset == 0
        # A retry right after the late acknowledgement is the same append too.
        again = s.append(RecordBatch(b"order-17"), producer_id="p", sequence=0)
        assert again.base_offset == 0
        assert values(s) == [b"order-17"]


def test_a_slow_producer_rebuild_stalls_no_other_append(tmp_path: Path) -> None:
    """The first idempotent append after a reopen rebuilds the stream's producers from the
    store; with the store slow and the stream tailed, plain appends of that stream and of the
    client's other streams are acknowledged meanwhile (the rebuild holds a lock of its own,
    not the stream's tail lock every acknowledgement takes)."""
    from s3stream.objectstore.local import LocalObjectStore

    settings = dataclasses.replace(SMALL, upload_threshold_bytes=4096, upload_interval_ms=0)
    with s3stream.open(str(tmp_path), settings=settings) as client:
        x, y = client.create_stream(), client.create_stream()
        for k in range(5):
            x.append(RecordBatch(b"x" * 100), producer_id="p", sequence=k)
        ids = x.stream_id, y.stream_id

    class SlowData(LocalObjectStore):
        slow = threading.Event()

        def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
            if self.slow.is_set() and key.startswith("data/"):
                time.sleep(3)
            return super().get(key, start, end)

    store = SlowData(tmp_path)
    with s3stream.StreamClient(store, MemoryWal(), node_id="n2", settings=settings) as client:
        x, y = client.open_stream(ids[0]), client.open_stream(ids[1])
        threading.Thread(
            target=lambda: x.fetch(x.confirm_offset, wait_s=10), daemon=True
        ).start()  # a tailer of X
        time.sleep(0.2)
        store.slow.set()

        def idempotent() -> None:
            with contextlib.suppress(S3StreamError):
                x.append(RecordBatch(b"i"), producer_id="p", sequence=5, timeout_s=10)

        rebuild = threading.Thread(target=idempotent, daemon=True)
        rebuild.start()
        time.sleep(0.3)  # the rebuild reads the slow store
        started = time.monotonic()
        x.append(RecordBatch(b"plain"), timeout_s=2)
        for _ in range(3):
            y.append(RecordBatch(b"y"), timeout_s=2)
        assert time.monotonic() - started < 1.5
        rebuild.join(15)
        store.slow.clear()


def test_a_slow_producer_rebuild_keeps_the_calls_deadline(tmp_path: Path) -> None:
    """The first idempotent append after a reopen reads the stream's newest batches from the
    store; with the store slow, the call still raises `UnavailableError` by its deadline
    (sync and async alike), writes nothing, and a retry once the load is done is recognised
    as the duplicate it is."""
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.testing.faults import slow_reads

    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        x = client.create_stream()
        first = [x.append(RecordBatch(b"v%d" % k), producer_id="p", sequence=k) for k in range(5)]
        sid = x.stream_id

    settings = dataclasses.replace(SMALL, call_timeout_ms=400)
    store = slow_reads(LocalObjectStore(tmp_path), 1.5, clock=SystemClock())
    with s3stream.StreamClient(store, MemoryWal(), node_id="n2", settings=settings) as client:
        x = client.open_stream(sid)
        started = time.monotonic()
        with pytest.raises(UnavailableError, match=r"not loaded from the store within 0\.3 s"):
            x.append(RecordBatch(b"v4"), producer_id="p", sequence=4, timeout_s=0.3)
        assert time.monotonic() - started < 1.0
        started = time.monotonic()
        with pytest.raises(UnavailableError, match="call_timeout_ms=400"):
            x.append_async(RecordBatch(b"v4"), producer_id="p", sequence=4)
        assert time.monotonic() - started < 1.0
        assert x.confirm_offset == 5  # nothing written
        deadline = time.monotonic() + 30
        while True:
            try:
                again = x.append(RecordBatch(b"v4"), producer_id="p", sequence=4, timeout_s=5)
                break
            except UnavailableError:
                assert time.monotonic() < deadline
        assert again == first[4]
        assert x.append(RecordBatch(b"v5"), producer_id="p", sequence=5).base_offset == 5
        assert values(x) == [b"v%d" % k for k in range(6)]
