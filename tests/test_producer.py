"""Idempotent producers: (producer_id, sequence) appended at most once, across a crash, a
reopen and a take-over (storage/producers.py, docs/consuming.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import s3stream
from s3stream import (
    ClientSettings,
    InvalidArgumentError,
    ManualClock,
    Record,
    RecordBatch,
    SequenceError,
)

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


def test_racing_retries_of_one_sequence_write_it_once(tmp_path: Path) -> None:
    with s3stream.open(str(tmp_path), settings=SMALL) as client:
        s = client.create_stream()
        results: list[s3stream.AppendResult] = []
        barrier = threading.Barrier(4)

        def send() -> None:
            barrier.wait()
            for k in range(200):
                results.append(s.append(RecordBatch(b"%d" % k), producer_id="p", sequence=k))

        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
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
