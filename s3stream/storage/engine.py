"""Storage: the parts of a client's storage pipeline, wired together, and its lifecycle.

Each step has one owner (docs/architecture.md draws them):

- `appender.Appender`: offsets, the WAL write, acknowledgement into the LogCache;
  backpressure while the WAL is under repair or the upload backlog is full.
- `uploader.Uploader`: the background thread that packs pending batches into objects, PUTs
  them, retries, and repairs a WAL that failed retryably.
- `committer.Committer`: commits an upload to the metadata log in order, unpins it, drops
  what streams taken over elsewhere had acknowledged, trims the WAL.
- `read_path.ReadPath`: the LogCache, then objects (`reader.ObjectDataReader`).
- `recovery.recover_wal`: replays the WAL at open.
- `status.PipelineStatus`: the one condition and the flags the parts signal each other by.

`Storage` owns flush and close (they need every part) and hands the rest to its parts.

Errors (docs/architecture.md, "Errors"): a WAL append refused at the call (a caller's mistake,
`WalFullError`) fails that call only. A WAL failure with a retryable error (a full or failing
disk, an unreachable store) fails the appends in flight, and the uploader *repairs* the WAL:
once every in-flight append has completed it rewinds each stream's next offset to its confirm
offset, uploads everything acknowledged, and calls `WriteAheadLog.reset`, after which appends
go on; meanwhile appends wait (up to `backpressure_timeout_ms`) and then fail retryably. Only a
fatal error (fenced, corrupted, a bug in a background thread) stops the client for good.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from .._bounded import within_deadline
from ..cache.block_cache import BlockCache, Readahead
from ..cache.log_cache import LogCache
from ..clock import Clock
from ..errors import FencedError, ObjectNotFoundError, S3StreamError, UnavailableError
from ..metadata import MetadataManager
from ..metrics.components import StorageInstruments
from ..metrics.logs import ContextLogger
from ..metrics.registry import MetricsRegistry
from ..objectstore.base import ObjectStore
from ..settings import ClientSettings
from ..throttle import PriorityRateLimiter
from ..types import AppendResult, FetchedBatch, RecordBatch
from ..wal.base import WriteAheadLog
from .appender import Appender, Ident, Released, WriterState, deadline_text
from .committer import Committer, fenced_by
from .packing import KeyFactory
from .producers import ProducerTable
from .read_path import ReadPath
from .reader import ObjectDataReader
from .recovery import RecoveryReport, recover_wal
from .seek import seek_with_log_cache
from .status import PipelineStatus, dropped_message
from .uploader import Uploader

__all__ = ["RecoveryReport", "Storage", "StorageMetrics", "WriterState", "deadline_text"]

log = logging.getLogger(__name__)


#: The end of a close's deadline kept for closing the WAL (a header write and a sync), at most
#: this much and at most a quarter of the deadline (`Storage.close`).
WAL_CLOSE_RESERVE_S = 1.0


@dataclass(slots=True)
class StorageMetrics:
    """Counters of the storage pipeline (a snapshot, read from the client's registry:
    ``s3stream.append.*``, ``s3stream.upload.*``, ``s3stream.cache.requests{tier="log"}``)."""

    appends: int = 0
    append_bytes: int = 0
    uploads: int = 0
    objects_uploaded: int = 0
    uploaded_bytes: int = 0
    fetches_from_cache: int = 0
    fetches_from_objects: int = 0


class Storage:
    """The storage pipeline of one client (see the module docstring)."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        wal: WriteAheadLog,
        meta: MetadataManager,
        settings: ClientSettings,
        clock: Clock,
        keys: KeyFactory,
        node_id: str,
        block_cache: BlockCache | None = None,
        limiter: PriorityRateLimiter | None = None,
        node_epoch: int | None = None,
        instruments: StorageInstruments | None = None,
    ) -> None:
        self._wal = wal
        self._meta = meta
        self._keys = keys
        self._settings = settings
        # One producer-table rebuild per stream at a time, under a lock of its own: the
        # stream's tail lock would stall every append's acknowledgement meanwhile (wake_tailers
        # takes it), and with them the client's other streams.
        self._rebuild_guard = threading.Lock()
        self._rebuilding: dict[int, threading.Lock] = {}
        self._clock = clock
        self._cache = LogCache(settings.log_cache_bytes)
        # A block cache made here is ours to close; one passed in belongs to the caller.
        self._owns_block_cache = block_cache is None
        self._block_cache = block_cache or BlockCache(
            store, capacity_bytes=settings.block_cache_bytes, limiter=limiter, node_id=node_id
        )
        ins = instruments if instruments is not None else StorageInstruments(MetricsRegistry())
        self._ins = ins
        self._status = status = PipelineStatus(ContextLogger(log, node_id))
        self._appender = appender = Appender(
            status=status, wal=wal, cache=self._cache, settings=settings, clock=clock,
            instruments=ins,
        )  # fmt: skip
        self._committer = committer = Committer(
            status=status, meta=meta, store=store, wal=wal, cache=self._cache,
            appender=appender, clock=clock, node_id=node_id, node_epoch=node_epoch,
            instruments=ins,
        )  # fmt: skip
        self._uploader = Uploader(
            status=status, cache=self._cache, store=store, wal=wal, appender=appender,
            committer=committer, settings=settings, clock=clock, keys=keys, limiter=limiter,
            instruments=ins,
        )  # fmt: skip
        objects = ObjectDataReader(
            self._block_cache,
            Readahead(
                self._block_cache,
                initial_bytes=settings.readahead_initial_bytes,
                max_bytes=settings.readahead_max_bytes,
            ),
        )
        self._read_path = ReadPath(
            cache=self._cache, meta=meta, objects=objects, clock=clock, instruments=ins
        )

    # ------------------------------------------------------------------ parts

    @property
    def log_cache(self) -> LogCache:
        """The hot-tail cache."""
        return self._cache

    @property
    def block_cache(self) -> BlockCache:
        """The cache of object blocks behind the LogCache."""
        return self._block_cache

    @property
    def objects(self) -> ObjectDataReader:
        """Reads committed batches from objects (shared with read-only readers)."""
        return self._read_path.objects

    @property
    def keys(self) -> KeyFactory:
        """Makes the keys of the objects this pipeline uploads (unique to this session)."""
        return self._keys

    @property
    def metrics(self) -> StorageMetrics:
        """A snapshot of the counters."""
        return StorageMetrics(**self._ins.snapshot())

    @property
    def instruments(self) -> StorageInstruments:
        """The cells the pipeline records into."""
        return self._ins

    # ------------------------------------------------------------------ delegated

    def register_writer(self, stream_id: int, epoch: int, end_offset: int) -> WriterState:
        """Make this client the appender of a stream it has just opened."""
        return self._appender.register_writer(stream_id, epoch, end_offset)

    def release_writer(
        self,
        stream_id: int,
        error: S3StreamError,
        *,
        epoch: int | None = None,
        discard: bool = False,
        live_only: bool = False,
    ) -> Released | None:
        """Stop appends to a stream (closed or destroyed); with `discard`, also drop what
        the LogCache holds of it; with `epoch`, only this client's writer at that epoch;
        with `live_only`, only if it was not stopped already. What was stopped (see
        `Appender.release_writer`)."""
        return self._appender.release_writer(
            stream_id, error, epoch=epoch, discard=discard, live_only=live_only
        )

    def forget_released(self, stream_id: int) -> None:
        """The stream was released here (closed in the metadata): its cached batches, all
        uploaded, go now (reads go to objects; another node may write it next)."""
        self._cache.forget_uploaded(stream_id)

    def report_fenced(self, stream_id: int, released: Released) -> None:
        """What `released` (of a destroy) had not uploaded went to another owner, who took
        the stream before the deletion: report it as dropped (`flush`, `close`)."""
        self._committer.report_dropped(stream_id, released, fenced_by(self._meta.state, stream_id))

    def drop_fenced(self, stream_id: int, epoch: int, *, live_only: bool = False) -> None:
        """This client's writer of `stream_id` at `epoch` is fenced (another client opened
        the stream since, or deleted it; the metadata was just refreshed): stop it and drop
        what it acknowledged and did not upload, which `flush` and `close` then report with
        `FencedError`, as when an upload finds the stream taken. `live_only`: only if that
        writer was not stopped already (a release under way decides it)."""
        self._committer.drop_fenced(
            stream_id, epoch, fenced_by(self._meta.state, stream_id), live_only=live_only
        )

    def append(
        self,
        w: WriterState,
        batch: RecordBatch,
        expected: int | None = None,
        ident: Ident | None = None,
    ) -> Future[AppendResult]:
        """Assign offsets, write the WAL record; the future resolves once it is durable.
        With `expected`: only at that next offset (`OffsetMismatchError`). With `ident`
        (producer id, sequence; `batch` stamped with them): at most once."""
        if ident is not None:
            self.load_producers(w, None)
        return self._appender.append(w, batch, expected, ident)

    def append_and_wait(
        self,
        w: WriterState,
        batch: RecordBatch,
        timeout_s: float | None = None,
        expected: int | None = None,
        ident: Ident | None = None,
    ) -> AppendResult:
        """`append`, then wait for durability (bounded by `timeout_s` or `call_timeout_ms`)."""
        if ident is not None and w.producers is None:
            started = self._clock.monotonic()
            self.load_producers(w, timeout_s)
            # The load took part of the call's time (its own or call_timeout_ms): the append
            # gets the rest.
            limit = self._settings.call_limit_s(timeout_s)
            timeout_s = max(0.0, limit - (self._clock.monotonic() - started))
        return self._appender.append_and_wait(w, batch, timeout_s, expected, ident)

    def append_would_wait(
        self,
        w: WriterState,
        *,
        idempotent: bool = False,
        batch: RecordBatch | None = None,
        expected_offset: int | None = None,
    ) -> bool:
        """Whether `append` (of `batch`, if given) would wait in the call now (for room in the
        upload backlog or the WAL, a WAL under repair, for an idempotent append loading the
        stream's producers, for a conditional one an append in flight holding its offset):
        `Appender.would_wait`."""
        return (
            (idempotent and w.producers is None and self._has_committed(w))
            or (expected_offset is not None and w.unsettled(expected_offset))
            or self._appender.would_wait(batch, stamped=idempotent)
        )

    def load_producers(self, w: WriterState, timeout_s: float | None) -> ProducerTable:
        """The stream's idempotent producers, rebuilt from its newest committed batches on
        first use (storage/producers.py): recovery and take-over commit everything a WAL
        acknowledged before a stream can be opened, so every acknowledged append is seen.

        The rebuild reads the store, which may be slow: it runs in a thread of its own and
        the caller waits for it at most `timeout_s` (None: ``call_timeout_ms``), then gets
        `UnavailableError` with nothing written. The rebuild goes on and keeps its table,
        so a retry finds it built (or waits for the same rebuild)."""
        if w.producers is not None:
            return w.producers
        if not self._has_committed(w):
            # Nothing to read: made here, at once. A new stream's first idempotent append
            # counted as one that waits, and sent the asyncio client's appends of the stream
            # through its one-at-a-time lane (false BackpressureError at their deadlines).
            return self._rebuild_producers(w)
        timeout = self._settings.call_limit_s(timeout_s)
        return within_deadline(
            lambda: self._rebuild_producers(w),
            clock=self._clock,
            deadline=self._clock.monotonic() + timeout,
            name=f"s3stream-producers-{w.stream_id}",
            timeout_error=lambda: UnavailableError(
                f"the idempotent producers of stream {w.stream_id} were not loaded from the "
                f"store within {deadline_text(timeout_s, self._settings)}; nothing was "
                "written: retry (the load goes on meanwhile)"
            ),
        )

    def _has_committed(self, w: WriterState) -> bool:
        """Whether the stream has committed batches (its producers are rebuilt from them;
        recovery and take-over commit every acknowledged append before a stream opens)."""
        meta = self._meta.state.streams.get(w.stream_id)
        return meta is None or meta.end_offset > 0

    def _rebuild_producers(self, w: WriterState) -> ProducerTable:
        """`load_producers`' work: one rebuild per stream at a time (a caller that comes
        while one runs waits for it); appends of other streams go on."""
        with self._rebuild_guard:
            lock = self._rebuilding.setdefault(w.stream_id, threading.Lock())
        with lock:
            if w.producers is None:
                table = ProducerTable(self._settings.producer_expiry_ms, self._clock)
                now = self._clock.now_ms()
                try:
                    table.rebuild(self._newest_first(w.stream_id, now), now)
                except ObjectNotFoundError:
                    # Compaction replaced an object meanwhile: once more on a fresh view.
                    self._meta.refresh()
                    table = ProducerTable(self._settings.producer_expiry_ms, self._clock)
                    table.rebuild(self._newest_first(w.stream_id, now), now)
                w.producers = table
        with self._rebuild_guard:
            # Built: later callers take the table without the lock (no lock per stream kept).
            if self._rebuilding.get(w.stream_id) is lock:
                del self._rebuilding[w.stream_id]
        return w.producers

    def _newest_first(self, stream_id: int, now_ms: int) -> Iterator[tuple[FetchedBatch, int]]:
        """The stream's stored batches, newest first, each with the time it was committed,
        back to the producer expiry horizon (an object whose records of the stream were all
        committed before it holds no producer still remembered, and neither does any object
        of lower offsets: a stream's records are committed in offset order) or
        `producer_scan_bytes`, whichever comes first. Commit times are the library's clock.
        In an object written by compaction they come from its range's `commits`, not from
        its `committed_ms`: that is the oldest source's, and would make a producer whose
        last batch was merged with older data pass for expired (then a resend is appended
        twice).

        Batches below the stream's start offset are read too while their objects are still
        listed: a trim does not make a producer's appends unappended, and a resend of them
        must still be recognised (docs/records.md says when compaction has dropped them)."""
        state = self._meta.state
        stream = state.streams.get(stream_id)
        if stream is None:
            return
        horizon = now_ms - self._settings.producer_expiry_ms
        budget = self._settings.producer_scan_bytes
        for obj in reversed(state.stream_objects(stream_id)):
            r = obj.range_of(stream_id)
            if r is None:
                continue
            if r.newest_commit(obj.committed_ms) < horizon:
                return
            lo, hi = r.start_offset, r.end_offset
            if lo >= hi:
                continue
            # Block by block from the newest: a large (compacted) object is read only
            # as far back as needed.
            index = self._block_cache.index(obj.key, obj.size)
            for block in reversed(index.find(stream_id, lo, hi)):
                for batches in self._block_cache.get_blocks(obj.key, [block]):
                    for b in reversed(batches):
                        if b.base_offset >= hi or b.next_offset <= lo:
                            continue
                        yield b, r.committed_at(b.base_offset, obj.committed_ms)
                        budget -= b.size
                        if budget <= 0:
                            return

    def request_upload(self) -> None:
        """Ask the uploader to upload now."""
        self._status.request_upload()

    def read(self, stream_id: int, start: int, end: int, max_bytes: int) -> list[FetchedBatch]:
        """Batches of the stream overlapping ``[start, end)``: at least one, about `max_bytes`."""
        return self._read_path.read(stream_id, start, end, max_bytes)

    def offset_for_timestamp(self, stream_id: int, start: int, end: int, ts: int) -> int | None:
        """The first offset in ``[start, end)`` whose timestamp is >= `ts`: the LogCache,
        then committed objects, as reads go (storage/seek.py)."""
        return seek_with_log_cache(
            self._cache, self._meta, self._block_cache, stream_id, start, end, ts
        )

    def record_object_read(
        self, started: float, batches: Sequence[FetchedBatch], nbytes: int
    ) -> None:
        """Count a read of a stream the client does not own (from objects) as a fetch."""
        self._read_path.record_fetch(started, batches, nbytes, from_objects=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the background uploader."""
        self._uploader.start()

    def recover(self, timeout_s: float | None = None) -> RecoveryReport:
        """Replay the WAL: drop what is committed or fenced, upload the rest, reset the WAL.

        Uploads that keep failing past `timeout_s` (default `call_timeout_ms`) raise
        `UnavailableError`; the WAL is then left as it was, for the next attempt.
        """
        deadline = self._deadline(timeout_s)
        return recover_wal(
            self._wal,
            self._meta.state,
            self._cache,
            self._settings.upload_threshold_bytes,
            lambda: self._uploader.upload_sync(deadline, trim=False),
        )

    def flush(self, timeout_s: float | None = None, *, report_dropped: bool = True) -> None:
        """Upload and commit everything acknowledged so far.

        Raises `UnavailableError` (retryable) when uploads keep failing or the deadline
        (`timeout_s`, else `call_timeout_ms`) passes, the client's fatal error if it has one,
        and `FencedError` if acknowledged appends were dropped since the last flush because
        another client took their stream over (unless not `report_dropped`: the report is
        then left for the next flush).
        """
        target = self._cache.last_seq
        deadline = self._deadline(timeout_s)
        if not self._uploader.running:
            self._uploader.upload_sync(deadline)
        status = self._status
        with status.cond:
            # Only failures seen during this flush count: an error left from before the store
            # healed must not fail a flush that the next retry will satisfy.
            failures_at_start = status.upload_failures
            status.upload_requested = True
            status.cond.notify_all()
            while not self._flushed(target):
                # A failed WAL stops appends, not uploads: what it acknowledged is uploaded.
                status.raise_if_broken(but_wal=True)
                if status.upload_error is not None and (
                    status.upload_failures - failures_at_start >= 3
                ):
                    raise UnavailableError(
                        f"upload keeps failing: {status.upload_error}"
                    ) from status.upload_error
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    cause = f": {status.upload_error}" if status.upload_error is not None else ""
                    raise UnavailableError(
                        f"flush did not finish within {deadline_text(timeout_s, self._settings)}"
                        f"{cause}"
                    )
                # Woken by every finished upload attempt and by the uploader's death; the
                # timeout only bounds the wait by the deadline.
                status.cond.wait(remaining)
            if report_dropped:
                status.raise_dropped()

    def raise_dropped(self) -> None:
        """`FencedError` if acknowledged appends were dropped since the last report (which
        this makes)."""
        with self._status.cond:
            self._status.raise_dropped()

    def commits_held(self) -> contextlib.AbstractContextManager[object]:
        """While inside, no upload commits (nor drops what another owner fenced): what the
        LogCache holds of a stream is then exactly what is not committed of it."""
        return self._committer.lock

    def _deadline(self, timeout_s: float | None) -> float:
        return self._clock.monotonic() + self._settings.call_limit_s(timeout_s)

    def _flushed(self, target: int) -> bool:
        oldest = self._cache.oldest_unfinished_seq()
        return oldest is None or oldest > target

    def close(
        self, timeout_s: float | None = None, *, on_flushed: Callable[[], None] | None = None
    ) -> None:
        """Refuse new appends, wait for in-flight ones, upload everything, close the WAL.

        `on_flushed` runs once everything acknowledged is committed (the client releases its
        streams then). Returns or raises within the deadline (`timeout_s`, else
        `call_timeout_ms`); what could not be uploaded stays in the WAL for the next open. A
        WAL that cannot close by then (its device stopped answering) is left closing in the
        background and `UnavailableError` says so (the end of the deadline,
        `WAL_CLOSE_RESERVE_S` at most, is kept for the WAL's close).
        Raises the flush's error, the uploader's death,
        or `FencedError` if acknowledged appends were ever dropped.
        """
        deadline = self._deadline(timeout_s)
        # The WAL closes last: the rest of the work ends early enough to leave it some time.
        work_deadline = deadline - min(
            WAL_CLOSE_RESERVE_S, (deadline - self._clock.monotonic()) / 4
        )
        if not self._appender.refuse_appends(work_deadline):
            return
        status = self._status
        error: BaseException | None = None
        try:
            self._appender.wait_quiet(work_deadline)
            if status.failed is None or status.failed_in_wal:
                # With a failed WAL too: once everything it acknowledged is committed, the
                # streams are released and the next open needs nothing from that WAL.
                self.flush(max(0.0, work_deadline - self._clock.monotonic()))
                if on_flushed is not None:
                    on_flushed()
        except BaseException as exc:
            error = exc
        finally:
            with status.cond:
                status.stop = True
                # The uploader may be retrying: stopping makes it give up (the data stays in
                # the WAL for the next open).
                status.abandoned = error is not None
                status.cond.notify_all()
            self._uploader.join(work_deadline)
            self._uploader.shutdown_puts(wait=False)
            try:
                self._close_wal(deadline)
            except BaseException as exc:
                error = error or exc
            if self._owns_block_cache:
                self._block_cache.close(max(0.0, deadline - self._clock.monotonic()))
        if error is not None:
            raise error
        with status.cond:
            # A fatal state means this client stopped short of its work: say so, even though
            # what it acknowledged is safe (in its WAL, or taken over by another client).
            status.raise_if_broken()
            if status.dropped:
                raise FencedError(dropped_message(status.dropped))

    def _close_wal(self, deadline: float) -> None:
        """Close the WAL, waiting for it until `deadline` at most. Its close writes and syncs
        (pending records, a clean-shutdown mark) and a device that stops answering holds a
        sync in the kernel uninterruptibly, so the close runs in a thread of its own and is
        left to finish there: a WAL not closed cleanly is what a crash leaves, which the next
        open recovers from (everything acknowledged is in it or uploaded)."""
        wal = self._wal
        if wal.in_completion():
            # Called from an append's callback: the close only marks the WAL closing (this
            # thread finishes it once the callback returns), and a thread of its own would
            # wait for this one.
            wal.close()
            return
        within_deadline(
            wal.close,
            clock=self._clock,
            deadline=deadline,
            name="s3stream-wal-close",
            timeout_error=lambda: UnavailableError(
                f"{wal.describe()} did not close by the deadline (its device is not "
                "answering); it finishes closing in the background when the device answers, "
                "and what it holds is recovered by the next open"
            ),
        )

    def abandon(self) -> None:
        """Stop background work without uploading (tests: simulate a crash in-process)."""
        self._appender.refuse_appends(None)
        status = self._status
        with status.cond:
            status.closing = True
            status.stop = True
            status.abandoned = True
            status.cond.notify_all()
        self._uploader.join(None)
        self._uploader.shutdown_puts(wait=True)
        if self._owns_block_cache:
            self._block_cache.close()
