"""A conditional append (`expected_offset`) retried after a timeout never loses the batch.

`OffsetMismatchError` tells the caller its batch is already at `expected_offset` ("do not
append again"), so it may be raised only once an append there is acknowledged: an append
still in flight at that offset may yet fail, and a WAL repair then hands its offsets out
again. The WAL here is a real memory WAL behind a gate that holds writes in flight (as a WAL
PUT or a disk write that hangs) and then lets them through or fails them, in WAL order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import s3stream
import s3stream.aio as aio
from s3stream import OffsetMismatchError, RecordBatch, UnavailableError
from s3stream.wal.base import WalCapabilities, WalPosition, WalRecord, WriteAheadLog
from s3stream.wal.memory import MemoryWal


class GatedWal(WriteAheadLog):
    """A memory WAL whose writes, while `held`, stay in flight until `release` writes them
    or `fail` fails them (all of them, in order: a WAL completes in order)."""

    def __init__(self) -> None:
        self._inner = MemoryWal()
        self._lock = threading.Lock()
        self.held = False
        self._pending: list[tuple[bytes, Future[WalPosition]]] = []

    @property
    def capabilities(self) -> WalCapabilities:
        # Acknowledged by a future, not on the call: an append can be in flight.
        return dataclasses.replace(self._inner.capabilities, acks_on_call=False)

    def recover(self) -> Iterator[WalRecord]:
        return self._inner.recover()

    def append(self, data: bytes) -> Future[WalPosition]:
        with self._lock:
            if not self.held:
                return self._inner.append(data)
            future: Future[WalPosition] = Future()
            self._pending.append((data, future))
            return future

    def append_parts(self, head: bytes, tail: bytes) -> Future[WalPosition]:
        return self.append(head + tail)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def release(self) -> None:
        """Write what is held, in order, and stop holding."""
        with self._lock:
            pending, self._pending, self.held = self._pending, [], False
            done = [(self._inner.append(data), future) for data, future in pending]
        for written, future in done:
            future.set_result(written.result())

    def fail(self) -> None:
        """Fail what is held (a write that timed out), and stop holding."""
        with self._lock:
            pending, self._pending, self.held = self._pending, [], False
        for _, future in pending:
            future.set_exception(UnavailableError("injected: the WAL write timed out"))

    def trim(self, position: WalPosition) -> None:
        self._inner.trim(position)

    def reset(self) -> None:
        self._inner.reset()

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[s3stream.StreamClient, GatedWal]]:
    wal = GatedWal()
    client = s3stream.open(str(tmp_path), wal=wal)
    try:
        yield client, wal
    finally:
        wal.release()  # a test that failed early leaves a write held: close would wait for it
        client.close()


def payloads(stream: s3stream.Stream) -> list[bytes]:
    return [b.payload for b in stream.fetch(0).batches]


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run `fn` in a thread; its outcome (result or exception) lands in the list."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def timed_out_first_attempt(stream: s3stream.Stream, wal: GatedWal, batch: RecordBatch) -> int:
    """An append at `expected` whose WAL write is still in flight when the call times out."""
    stream.append(RecordBatch(b"order-16"))
    wal.held = True
    expected = stream.next_offset
    with pytest.raises(UnavailableError):
        stream.append(batch, expected_offset=expected, timeout_s=0.1)
    assert wal.in_flight() == 1
    return expected


def test_a_retry_after_the_first_attempt_failed_appends_the_batch(
    gated: tuple[s3stream.StreamClient, GatedWal],
) -> None:
    """The documented recipe: the first attempt times out and then fails in the WAL. The
    retry must not report it as landed (the batch would be lost): it waits for the outcome
    and, the offset being handed out again, appends the batch there."""
    client, wal = gated
    stream = client.create_stream()
    batch = RecordBatch(b"order-17")
    expected = timed_out_first_attempt(stream, wal, batch)

    thread, outcome = in_thread(
        lambda: stream.append(batch, expected_offset=expected, timeout_s=10)
    )
    time.sleep(0.3)
    assert outcome == [], f"the retry answered before the first attempt settled: {outcome}"
    wal.fail()
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], s3stream.AppendResult), outcome
    assert outcome[0].base_offset == expected
    client.flush()
    assert payloads(stream) == [b"order-16", b"order-17"]
    assert stream.next_offset == expected + 1


def test_a_retry_after_the_first_attempt_landed_raises_offset_mismatch(
    gated: tuple[s3stream.StreamClient, GatedWal],
) -> None:
    """The first attempt becomes durable while the retry waits: `OffsetMismatchError` with
    `actual > expected`, and the batch is in the stream once."""
    client, wal = gated
    stream = client.create_stream()
    batch = RecordBatch(b"order-17")
    expected = timed_out_first_attempt(stream, wal, batch)

    thread, outcome = in_thread(
        lambda: stream.append(batch, expected_offset=expected, timeout_s=10)
    )
    time.sleep(0.2)
    assert outcome == []
    wal.release()
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], OffsetMismatchError), outcome
    assert outcome[0].expected == expected and outcome[0].actual == expected + 1
    client.flush()
    assert payloads(stream) == [b"order-16", b"order-17"]


def test_a_retry_waits_no_longer_than_its_deadline(
    gated: tuple[s3stream.StreamClient, GatedWal],
) -> None:
    """While the first attempt stays in flight the retry cannot know: past its deadline it
    raises a retryable `UnavailableError` and writes nothing; the next retry decides."""
    client, wal = gated
    stream = client.create_stream()
    batch = RecordBatch(b"order-17")
    expected = timed_out_first_attempt(stream, wal, batch)

    t0 = time.monotonic()
    with pytest.raises(UnavailableError, match="retry with the same expected_offset") as info:
        stream.append(batch, expected_offset=expected, timeout_s=0.3)
    assert info.value.retryable
    assert 0.25 <= time.monotonic() - t0 < 2
    assert wal.in_flight() == 1  # the retry wrote nothing
    wal.release()
    with pytest.raises(OffsetMismatchError):
        stream.append(batch, expected_offset=expected)
    client.flush()
    assert payloads(stream) == [b"order-16", b"order-17"]


def test_settled_offsets_are_refused_at_once(
    gated: tuple[s3stream.StreamClient, GatedWal],
) -> None:
    """Nothing in flight at `expected`: the check stays immediate (acknowledged offsets,
    and offsets past the next one, even while later appends are in flight)."""
    client, wal = gated
    stream = client.create_stream()
    stream.append(RecordBatch(b"a"))
    wal.held = True
    pending = stream.append_async(RecordBatch(b"b"))  # offset 1, in flight
    for expected, actual in ((0, 2), (3, 2)):
        t0 = time.monotonic()
        with pytest.raises(OffsetMismatchError) as info:
            stream.append(RecordBatch(b"x"), expected_offset=expected, timeout_s=5)
        assert time.monotonic() - t0 < 0.5
        assert info.value.actual == actual
    wal.release()
    assert pending.result(5).base_offset == 1
    assert stream.append(RecordBatch(b"c"), expected_offset=2).base_offset == 2


def test_an_async_retry_waits_in_a_thread_and_appends_after_the_failure(
    gated: tuple[s3stream.StreamClient, GatedWal],
) -> None:
    """aio: the retry's wait for the first attempt runs in a thread, never on the loop."""
    client, wal = gated

    async def main() -> None:
        wrapper = aio.AsyncStreamClient(client)
        stream = await wrapper.create_stream()
        batch = RecordBatch(b"order-17")
        expected = await asyncio.to_thread(timed_out_first_attempt, stream.sync, wal, batch)
        asyncio.get_running_loop().call_later(0.3, wal.fail)
        gaps: list[float] = []

        async def tick() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        result = await stream.append(batch, expected_offset=expected, timeout_s=10)
        ticker.cancel()
        assert result.base_offset == expected
        assert gaps and max(gaps) < 0.2, "the loop was blocked while the retry waited"
        await wrapper.flush()
        assert payloads(stream.sync) == [b"order-16", b"order-17"]
        await wrapper.close()

    asyncio.run(main())


def test_an_append_in_flight_cannot_be_cancelled_so_a_resend_is_not_appended_twice(
    gated: tuple[s3stream.StreamClient, GatedWal],
) -> None:
    """The future of `append_async` is running from the start: the batch is in the WAL's
    hands. A cancel that succeeded made the idempotent producer table count the append as
    failed while the WAL wrote it, and the resend of its sequence landed a second time."""
    client, wal = gated
    stream = client.create_stream()
    stream.append(RecordBatch(b"p0"), producer_id="P", sequence=0)
    wal.held = True
    future = stream.append_async(RecordBatch(b"p1"), producer_id="P", sequence=1)
    assert not future.cancel()
    wal.release()
    assert future.result(10).base_offset == 1
    again = stream.append(RecordBatch(b"p1"), producer_id="P", sequence=1, timeout_s=5)
    assert again.base_offset == 1
    client.flush()
    assert payloads(stream) == [b"p0", b"p1"]
