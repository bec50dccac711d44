"""Stream: one append-only sequence of record batches, owned by one client at a time."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import MappingProxyType
from typing import TYPE_CHECKING

from ._closeable import Closeable
from .errors import (
    OffsetOutOfRangeError,
    StreamClosedError,
)
from .records import Record, records_batch, records_in
from .storage.engine import Storage, WriterState
from .types import AppendResult, FetchResult, RecordBatch
from .validation import check_instance, check_int, check_read_args, check_timeout

if TYPE_CHECKING:
    from .client import StreamClient

__all__ = ["Stream"]


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
        client: StreamClient,
        storage: Storage,
        writer: WriterState,
        *,
        start_offset: int,
        tags: Mapping[str, str],
    ) -> None:
        self._client = client
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
        committed = self._client._committed_start(self.stream_id)
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
        """Whether the handle was closed or the stream destroyed."""
        return self._closed is not None

    # ------------------------------------------------------------------ appends

    def append(self, batch: RecordBatch, *, timeout_s: float | None = None) -> AppendResult:
        """Append a batch and wait until it is durable; returns where it landed.

        Waits at most `timeout_s` (default: the client's ``call_timeout_ms``), then raises
        `UnavailableError`; the batch may still become durable after that. Errors: a bad
        batch (`InvalidArgumentError`, larger than the WAL takes) fails this call only; a
        full WAL or upload backlog (`BackpressureError`) and a WAL under repair
        (`UnavailableError`) are retryable; `FencedError`, `CorruptionError` and
        `StreamClosedError` are permanent for this handle.
        """
        # The checks cost a call only when they have something to say (the hot path).
        if not isinstance(batch, RecordBatch):
            check_instance("batch", batch, RecordBatch)
        if timeout_s is not None:
            check_timeout("timeout_s", timeout_s)
        self._check_open()
        return self._storage.append_and_wait(self._w, batch, timeout_s)

    def append_async(self, batch: RecordBatch) -> Future[AppendResult]:
        """Append a batch; the future resolves once it is durable. Futures of one stream
        resolve in append order."""
        check_instance("batch", batch, RecordBatch)
        self._check_open()
        return self._storage.append(self._w, batch)

    # ------------------------------------------------------------------ reads

    def fetch(
        self, start_offset: int, end_offset: int | None = None, *, max_bytes: int = 1 << 20
    ) -> FetchResult:
        """Whole batches covering ``[start_offset, end_offset)``, up to about `max_bytes`.

        The first batch may begin before `start_offset`; at least one batch is returned when
        any data lies in the range (`max_bytes` is a soft limit). `end_offset` defaults to
        `confirm_offset`; fetching at `confirm_offset` returns no batches.
        """
        start, end_arg, max_bytes = check_read_args(start_offset, end_offset, max_bytes)
        self._check_open()
        confirm = self._w.confirm_offset
        end = confirm if end_arg is None else min(end_arg, confirm)
        first = self.start_offset
        if start < first or start > confirm:
            raise OffsetOutOfRangeError(
                f"offset {start} is outside [{first}, {confirm}] of stream {self.stream_id}"
            )
        if start >= end:
            return FetchResult([], start)
        batches = self._storage.read(self.stream_id, start, end, max_bytes)
        return FetchResult(batches, batches[-1].next_offset if batches else start)

    # -- records (s3stream.records)

    def append_records(
        self,
        records: Sequence[Record],
        *,
        compression: str = "none",
        timeout_s: float | None = None,
    ) -> AppendResult:
        """Pack `records` into one RECORDS batch, append it and wait until it is durable.

        The batch holds ``len(records)`` offsets, one per record, in order. `compression`
        ("none" or "zstd") applies to this batch's payload. Records without a timestamp
        take the batch's append time.
        """
        timeout = check_timeout("timeout_s", timeout_s)
        batch = records_batch(records, compression=compression)
        self._check_open()
        return self._storage.append_and_wait(self._w, batch, timeout)

    def append_records_async(
        self, records: Sequence[Record], *, compression: str = "none"
    ) -> Future[AppendResult]:
        """Like `append_records`, but return a future that resolves once durable."""
        return self.append_async(records_batch(records, compression=compression))

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
        start, end_arg, max_bytes = check_read_args(start_offset, end_offset, max_bytes)
        self._check_open()
        confirm = self._w.confirm_offset
        end = confirm if end_arg is None else min(end_arg, confirm)
        first = self.start_offset
        if start < first or start > confirm:
            raise OffsetOutOfRangeError(
                f"offset {start} is outside [{first}, {confirm}] of stream {self.stream_id}"
            )
        return records_in(lambda pos: self.fetch(pos, end, max_bytes=max_bytes), start, end)

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
            self._client._trim_stream(self, new_start)
            self._start_offset = new_start

    def close(self) -> None:
        """Upload what this stream has pending and release it; other clients may open it.

        If the release fails (the store is unreachable) it raises, the stream stays owned by
        this node, and calling `close` again retries the release."""
        if self._closed is None:
            self._client._close_stream(self)
            self._closed = "closed"

    def destroy(self) -> None:
        """Delete the stream and all its data. Irreversible."""
        if self._closed == "destroyed":
            return
        self._client._destroy_stream(self)
        self._closed = "destroyed"

    def _mark_closed(self, how: str) -> None:
        self._closed = how

    def _check_open(self) -> None:
        if self._closed is not None:
            raise StreamClosedError(f"stream {self.stream_id} is {self._closed}")
        if self._w.error is not None:
            raise self._w.error

    def __repr__(self) -> str:
        return (
            f"Stream(id={self.stream_id}, epoch={self.epoch}, start={self.start_offset}, "
            f"confirm={self.confirm_offset}, next={self.next_offset})"
        )
