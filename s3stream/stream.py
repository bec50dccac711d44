"""Stream: one append-only sequence of record batches, owned by one client at a time."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import MappingProxyType
from typing import Protocol

from ._closeable import Closeable
from .clock import Clock
from .errors import (
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    StreamClosedError,
    UnavailableError,
)
from .records import Record, batch_records, decode_columns, records_batch, records_in
from .storage.engine import Storage, WriterState
from .storage.producers import check_unreserved, stamp_batch
from .storage.seek import check_timestamp
from .types import AppendResult, BatchKind, FetchedBatch, FetchResult, RecordBatch
from .validation import (
    check_instance,
    check_int,
    check_offset_in_range,
    check_poll,
    check_read_args,
    check_text,
    check_timeout,
)

__all__ = ["Stream", "StreamOwner"]


class StreamOwner(Protocol):
    """What a `Stream` asks of the client that opened it: the metadata side of its life.

    The stream keeps its append state (`WriterState`) and reads through `Storage`; what needs
    the metadata log or the client's bookkeeping goes through this protocol, so neither side
    reaches into the other's private state.
    """

    @property
    def clock(self) -> Clock:
        """The client's clock (deadlines of waits)."""
        ...

    def committed_start(self, stream_id: int) -> int:
        """The stream's start offset as the owner last read it from the metadata log."""
        ...

    def closed_reason(self) -> str | None:
        """Why every handle of the owner is closed (the owner closed), else None."""
        ...

    def trim(self, stream: Stream, new_start: int) -> None:
        """Commit a trim of `stream` to `new_start` (uploading first what it needs)."""
        ...

    def release(self, stream: Stream) -> None:
        """Upload what `stream` has pending and release it in the metadata; `FencedError`
        once the handle is done all the same (appends dropped, or another owner has it)."""
        ...

    def destroy(self, stream: Stream) -> None:
        """Delete `stream` and all its data; `FencedError` if another owner took it first."""
        ...

    def taken_from(self, stream: Stream) -> str | None:
        """Why the metadata log says `stream` is no longer this handle's (its node registered
        again, or the stream opened, closed or deleted elsewhere), or None. Reads the log at
        most every few seconds per owner; an unreachable store is no answer (None). A handle
        found taken is fenced: later appends to it raise `FencedError`, and what it had
        acknowledged and not uploaded is reported dropped (`flush`, `close`)."""
        ...


class Stream(Closeable):
    """An open stream: append batches, fetch them back by offset, trim the head.

    Obtained from `StreamClient.create_stream` or `StreamClient.open_stream` (which refuses a
    stream another node still has open: `StreamOwnedError`); opening bumps the stream's epoch,
    which fences any previous holder of this handle. Thread-safe.

    Offsets: ``start_offset`` is the first readable offset (moved by `trim`),
    ``confirm_offset`` the end of what is durable (fetches never go past it), ``next_offset``
    where the next append lands (ahead of ``confirm_offset`` while appends are in flight).
    """

    def __init__(
        self,
        owner: StreamOwner,
        storage: Storage,
        writer: WriterState,
        *,
        start_offset: int,
        tags: Mapping[str, str],
    ) -> None:
        self._owner = owner
        self._clock = owner.clock
        self._storage = storage
        self._w = writer
        self._start_offset = start_offset
        self._tags = MappingProxyType(dict(tags))
        self._lock = threading.Lock()
        self._closed: str | None = None

    # ------------------------------------------------------------------ properties

    @property
    def stream_id(self) -> int:
        """The stream's id (unique within its object store)."""
        return self._w.stream_id

    @property
    def epoch(self) -> int:
        """The epoch this handle writes under; a newer epoch elsewhere fences it."""
        return self._w.epoch

    @property
    def tags(self) -> Mapping[str, str]:
        """Tags given at creation (e.g. ``{"topic": "orders", "partition": "0"}``)."""
        return self._tags

    @property
    def start_offset(self) -> int:
        """First readable offset; data below it was trimmed.

        Besides this stream's own `trim`, it follows trims by retention (this client's
        compactor or a standalone one) as soon as this client has read them from the
        metadata log, which it does at its next upload commit at the latest.
        """
        committed = self._owner.committed_start(self.stream_id)
        return self._start_offset if committed <= self._start_offset else committed

    @property
    def confirm_offset(self) -> int:
        """Everything below this offset is durable and readable."""
        return self._w.confirm_offset

    @property
    def next_offset(self) -> int:
        """Offset the next appended batch will start at."""
        return self._w.next_offset

    @property
    def closed(self) -> bool:
        """Whether the handle was closed, the stream destroyed or the client closed."""
        return self._closed is not None or self._owner.closed_reason() is not None

    # ------------------------------------------------------------------ appends

    def append(
        self,
        batch: RecordBatch,
        *,
        timeout_s: float | None = None,
        expected_offset: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> AppendResult:
        """Append a batch and wait until it is durable; returns where it landed.

        With `producer_id` and `sequence` (an idempotent producer, as Kafka's): a batch whose
        (producer, sequence) the stream already took returns the original `AppendResult`
        and writes nothing; sequences of a producer must follow each other (+1), else
        `SequenceError`. This holds across a crash, a reopen and a take-over, within the
        last 5 sequences of a producer, while it is not idle longer than
        ``producer_expiry_ms`` and, after a reopen, while its batches are not trimmed and
        dropped by compaction (docs/consuming.md).

        With `expected_offset`, the batch is appended only if it would land at that offset
        (the stream's `next_offset`); otherwise nothing is written and `OffsetMismatchError`
        says where the next append would land. While an append in flight (not acknowledged
        yet) holds that offset, the call waits for its outcome: acknowledged, then
        `OffsetMismatchError`; failed (its offsets handed out again), then this batch lands
        there; neither by the deadline, then `UnavailableError` with nothing written.
        Retrying an append that timed out with the same `expected_offset` therefore never
        writes it twice, and `OffsetMismatchError` with ``actual > expected_offset`` means
        an append there is durable (docs/consuming.md).

        Waits at most `timeout_s` (default: the client's ``call_timeout_ms``), then raises
        `UnavailableError`; the batch may still become durable after that. Errors: a bad
        batch (`InvalidArgumentError`, larger than the WAL takes) fails this call only; a
        full WAL or upload backlog (`BackpressureError`) and a WAL under repair
        (`UnavailableError`) are retryable; `FencedError`, `CorruptionError` and
        `StreamClosedError` are permanent for this handle.
        """
        if timeout_s is not None:
            check_timeout("timeout_s", timeout_s)
        batch, ident = _checked(batch, expected_offset, producer_id, sequence)
        self._check_open()
        return self._storage.append_and_wait(self._w, batch, timeout_s, expected_offset, ident)

    def append_async(
        self,
        batch: RecordBatch,
        *,
        expected_offset: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> Future[AppendResult]:
        """Append a batch; the future resolves once it is durable. Futures of one stream
        resolve in append order. `expected_offset`, `producer_id` and `sequence`: as for
        `append` (a mismatch or an out-of-order sequence is raised at the call, nothing is
        written; a duplicate of an append still in flight gets that append's future). The
        future cannot be cancelled (``cancel()`` returns False): the batch is in the WAL's
        hands already."""
        batch, ident = _checked(batch, expected_offset, producer_id, sequence)
        self._check_open()
        return self._storage.append(self._w, batch, expected_offset, ident)

    def append_would_wait(
        self,
        *,
        idempotent: bool = False,
        batch: RecordBatch | None = None,
        expected_offset: int | None = None,
    ) -> bool:
        """Whether `append_async` (of `batch`, if given: the WAL's room is checked for its
        size) would wait in the call right now rather than return its future at once: the
        upload backlog or the WAL is full, or the WAL is under repair; with `idempotent`,
        also the first idempotent append of a reopened stream (it reads the stream's newest
        batches); with `expected_offset`, also a conditional append whose offset an append
        in flight holds (it waits for that one to settle). For event loops, which must not
        block (`s3stream.aio` makes such calls in a thread). A hint: the state may change
        just after."""
        if batch is not None:
            check_instance("batch", batch, RecordBatch)
        if expected_offset is not None:
            check_int("expected_offset", expected_offset, minimum=0)
        return self._storage.append_would_wait(
            self._w, idempotent=idempotent, batch=batch, expected_offset=expected_offset
        )

    # ------------------------------------------------------------------ reads

    def fetch(
        self,
        start_offset: int,
        end_offset: int | None = None,
        *,
        max_bytes: int = 1 << 20,
        wait_s: float | None = None,
    ) -> FetchResult:
        """Whole batches covering ``[start_offset, end_offset)``, up to about `max_bytes`.

        The first batch may begin before `start_offset`; at least one batch is returned when
        any data lies in the range (`max_bytes` is a soft limit). `end_offset` defaults to
        `confirm_offset`; fetching at `confirm_offset` returns no batches, or, with `wait_s`,
        waits up to `wait_s` seconds for an append to make data there durable (a long poll:
        empty on timeout; `StreamClosedError` when the stream or client closes meanwhile, at
        once; `FencedError` when, after a wait that found nothing, the metadata shows that
        another client took the stream over: read at most every few seconds per client, see
        `StreamOwner.taken_from`).
        """
        if wait_s is not None:
            wait = check_timeout("wait_s", wait_s)
            # Bad arguments are refused before the wait, not after it; a range that cannot
            # hold data (``end_offset == start_offset``) is not waited on.
            start, end_arg, _ = check_read_args(start_offset, end_offset, max_bytes)
            self._check_open()
            if (
                wait
                and start == self._w.confirm_offset
                and start >= self.start_offset
                and (end_arg is None or end_arg > start)
                and not self._w.wait_for_data(start, wait, self._clock)
                # Nothing came: an idle writer learns from no commit of its own that another
                # client took the stream over, and its long polls (tails) would otherwise
                # wait for ever while the stream grows elsewhere. A close of this handle
                # (its writer stopped before the release is committed) is no take-over.
                and self._w.error is None
                and not self._w.stopped
                and (taken := self._owner.taken_from(self)) is not None
            ):
                # A close of the client meanwhile ends the poll as any close does.
                if self._owner.closed_reason():
                    self._check_open()
                raise FencedError(taken)
        start, end, max_bytes = self._read_range(start_offset, end_offset, max_bytes)
        if start >= end:
            return FetchResult([], start)
        try:
            batches = self._storage.read(self.stream_id, start, end, max_bytes)
        except UnavailableError as exc:
            # Closing the client closes its store under a read: the read failed because the
            # handle closed, which is no outage to retry (and ends a tail cleanly). Damage
            # (`CorruptionError`) is raised as it is, close or not.
            closed = self._closed_error()
            if closed is not None:
                raise closed from exc
            raise
        return FetchResult(batches, batches[-1].next_offset if batches else start)

    # -- records (s3stream.records)

    def append_records(
        self,
        records: Sequence[Record],
        *,
        compression: str = "none",
        timeout_s: float | None = None,
        expected_offset: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> AppendResult:
        """Pack `records` into one RECORDS batch, append it and wait until it is durable.

        The batch holds ``len(records)`` offsets, one per record, in order. `compression`
        ("none" or "zstd") applies to this batch's payload. Records without a timestamp
        take the batch's append time. `expected_offset`, `producer_id` and `sequence`: as
        for `append`.
        """
        batch = records_batch(records, compression=compression)
        return self.append(
            batch,
            timeout_s=timeout_s,
            expected_offset=expected_offset,
            producer_id=producer_id,
            sequence=sequence,
        )

    def append_records_async(
        self,
        records: Sequence[Record],
        *,
        compression: str = "none",
        expected_offset: int | None = None,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> Future[AppendResult]:
        """Like `append_records`, but return a future that resolves once durable."""
        return self.append_async(
            records_batch(records, compression=compression),
            expected_offset=expected_offset,
            producer_id=producer_id,
            sequence=sequence,
        )

    def read_records(
        self, start_offset: int, end_offset: int | None = None, *, max_bytes: int = 1 << 20
    ) -> Iterator[tuple[int, Record]]:
        """``(offset, record)`` for every record in ``[start_offset, end_offset)``, in order.

        `end_offset` defaults to `confirm_offset` at the time of the call; batches are fetched
        lazily, about `max_bytes` at a time. Records without a timestamp of their own report
        their batch's append time. A RAW batch (an opaque payload) yields one
        ``Record(value=payload, timestamp=base_timestamp)`` at its base offset, and only when
        that base offset is in the range: a raw batch belongs to the range holding its first
        offset (as in the Spark source), so adjacent ranges never both return it.
        """
        start, end, max_bytes = self._read_range(start_offset, end_offset, max_bytes)
        return records_in(lambda pos: self.fetch(pos, end, max_bytes=max_bytes), start, end)

    # -- seek by time

    def offset_for_timestamp(self, ts_ms: int) -> int | None:
        """The first offset whose timestamp is >= `ts_ms` (milliseconds since the epoch, any
        i64), among ``[start_offset, confirm_offset)``; None when there is none.

        An offset's timestamp is its record's own, or its batch's base timestamp (records
        without one, and every offset of a raw batch): what `read_records` reports. Timestamps
        need not grow with offsets: the answer is the first offset that qualifies, wherever
        it lies. Searches the LogCache, then committed objects, reading at most one block
        (see docs/consuming.md, "Seek by time").
        """
        ts = check_timestamp("ts_ms", ts_ms)
        self._check_open()
        return self._storage.offset_for_timestamp(
            self.stream_id, self.start_offset, self._w.confirm_offset, ts
        )

    # -- tailing

    def tail(
        self, start_offset: int, *, max_bytes: int = 1 << 20, wait_s: float = 1.0
    ) -> Iterator[FetchedBatch]:
        """Every batch from `start_offset` on, blocking for new ones as they become durable.

        A batch is yielded as soon as its append is acknowledged (this process holds the
        stream). The iterator ends when the stream or its client closes (cleanly, between
        batches), raises `OffsetOutOfRangeError` if a trim passes its position and
        `FencedError` once another client took the stream over (its node taken over, or the
        stream force-opened elsewhere: seen within a few seconds even if this client is
        idle). `wait_s`
        is how long each internal long poll waits (any value works: appends wake it at once).
        """
        pos = check_int("start_offset", start_offset)
        check_int("max_bytes", max_bytes, minimum=1)
        wait = check_poll("wait_s", wait_s)
        return self._tail(pos, max_bytes, wait)

    def _tail(self, pos: int, max_bytes: int, wait: float) -> Iterator[FetchedBatch]:
        while True:
            try:
                result = self.fetch(pos, max_bytes=max_bytes, wait_s=wait)
            except StreamClosedError:
                return
            yield from result.batches
            pos = result.next_offset

    def tail_records(
        self, start_offset: int, *, max_bytes: int = 1 << 20, wait_s: float = 1.0
    ) -> Iterator[tuple[int, Record]]:
        """``(offset, record)`` from `start_offset` on, as `tail` delivers batches (a RAW
        batch counts as one record at its base offset, as in `read_records`)."""
        start = check_int("start_offset", start_offset)
        batches = self.tail(start, max_bytes=max_bytes, wait_s=wait_s)  # checks the rest now
        return (record for batch in batches for record in batch_records(batch, start))

    # ------------------------------------------------------------------ lifecycle

    def trim(self, new_start_offset: int) -> None:
        """Move `start_offset` forward; data below it becomes unreadable and is reclaimed."""
        new_start = check_int("new_start_offset", new_start_offset)
        self._check_open()
        with self._lock:
            if new_start > self._w.confirm_offset:
                raise OffsetOutOfRangeError(
                    f"cannot trim stream {self.stream_id} to {new_start}: "
                    f"confirm offset is {self._w.confirm_offset}"
                )
            if new_start <= self.start_offset:
                return
            self._owner.trim(self, new_start)
            self._start_offset = new_start

    def close(self) -> None:
        """Upload what this stream has pending and release it; other clients may open it.

        If the release fails (the store is unreachable) it raises, the stream stays owned by
        this node, and calling `close` again retries the release. `FencedError` says that
        acknowledged appends were dropped (`StreamClient.flush`) or that another client has
        opened or deleted the stream since this handle was opened; the handle is closed
        then all the same."""
        if not self.closed:
            try:
                self._owner.release(self)
            except FencedError:
                self._closed = "closed"
                raise
            self._closed = "closed"

    def destroy(self) -> None:
        """Delete the stream and all its data. Irreversible. `FencedError` if another
        client opened or deleted the stream first (this handle is closed then, and what it
        had not uploaded is reported dropped)."""
        if self._closed == "destroyed":
            return
        try:
            self._owner.destroy(self)
        except FencedError:
            self._closed = "closed (fenced by another owner)"
            raise
        self._closed = "destroyed"

    def _read_range(
        self, start_offset: object, end_offset: object, max_bytes: object
    ) -> tuple[int, int, int]:
        """A read's arguments checked against this stream: (start, end, max_bytes), with
        `end` capped at `confirm_offset` (and defaulting to it)."""
        start, end_arg, max_bytes = check_read_args(start_offset, end_offset, max_bytes)
        self._check_open()
        confirm = self._w.confirm_offset
        check_offset_in_range(self.stream_id, start, self.start_offset, confirm)
        return start, confirm if end_arg is None else min(end_arg, confirm), max_bytes

    def _closed_error(self) -> StreamClosedError | None:
        """The error of a call on this handle once it or its client closed, else None."""
        how = self._closed or self._owner.closed_reason()
        return None if how is None else StreamClosedError(f"stream {self.stream_id} is {how}")

    def _check_open(self) -> None:
        closed = self._closed_error()
        if closed is not None:
            raise closed
        if self._w.error is not None:
            raise self._w.error

    def __repr__(self) -> str:
        return (
            f"Stream(id={self.stream_id}, epoch={self.epoch}, start={self.start_offset}, "
            f"confirm={self.confirm_offset}, next={self.next_offset})"
        )


def _checked(
    batch: RecordBatch, expected_offset: object, producer_id: object, sequence: object
) -> tuple[RecordBatch, tuple[str, int] | None]:
    """An append's arguments checked: the batch to write (stamped with its producer and
    sequence, if any) and (producer, sequence). The checks cost a call only when they have
    something to say (the hot path)."""
    if not isinstance(batch, RecordBatch):
        check_instance("batch", batch, RecordBatch)
    if batch.kind is BatchKind.RECORDS and not batch.records_verified():
        _check_records_payload(batch)
    if batch.properties:
        check_unreserved(batch.properties)
    if expected_offset is not None:
        check_int("expected_offset", expected_offset)
    if producer_id is None and sequence is None:
        return batch, None
    return _idempotent(batch, producer_id, sequence)


def _check_records_payload(batch: RecordBatch) -> None:
    """Refuse a RECORDS batch made by hand whose payload is not a records payload of `count`
    records (readers would find it corrupt; Arrow and Polars scans would fail on it)."""
    try:
        decode_columns(batch.payload, expected_count=batch.count, location="the appended batch")
    except CorruptionError as exc:
        raise InvalidArgumentError(
            f"a batch of kind RECORDS must hold a records payload (s3stream.records."
            f"records_batch makes one): {exc}"
        ) from None


def _idempotent(
    batch: RecordBatch, producer_id: object, sequence: object
) -> tuple[RecordBatch, tuple[str, int]]:
    """`batch` stamped with its producer and sequence, and the pair; both or neither."""
    if producer_id is None or sequence is None:
        raise InvalidArgumentError("producer_id and sequence go together: give both or neither")
    pid = check_text("producer_id", producer_id, max_bytes=255, allow_empty=False)
    seq = check_int("sequence", sequence)
    return stamp_batch(batch, pid, seq), (pid, seq)
