"""Storage: the append path, the uploader, the read path and WAL recovery, wired together.

Append: a batch gets its offsets and is written to the WAL under one append lock, so WAL order
equals offset order within each stream and completion callbacks run in WAL order. When the WAL
acknowledges it, the batch enters the LogCache (pinned until uploaded) and the stream's
confirm offset advances.

Upload: when pending bytes reach the threshold, the interval passes, or on flush/close, the
uploader takes every pending batch, packs objects, PUTs them in parallel, commits them to the
metadata log strictly in order, unpins them in the LogCache and trims the WAL.

Read: LogCache first; below what it holds, objects found through the metadata and their index.

Errors (docs/architecture.md, "Errors"): a WAL append refused at the call (a caller's mistake,
`WalFullError`) fails that call only. A WAL failure with a retryable error (a full or failing
disk, an unreachable store) fails the appends in flight, and the uploader *repairs* the WAL:
once every in-flight append has completed it rewinds each stream's next offset to its confirm
offset, uploads everything acknowledged, and calls `WriteAheadLog.reset`, after which appends
go on; meanwhile appends wait (up to `backpressure_timeout_ms`) and then fail retryably. Only a
fatal error (fenced, corrupted, a bug in a background thread) stops the client for good.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from .._futures import CompletedFutures
from ..cache.block_cache import BlockCache, Readahead
from ..cache.log_cache import BASE, COUNT, EPOCH, SID, WALPOS, CachedBatch, LogCache
from ..clock import Clock
from ..errors import (
    BackpressureError,
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    S3StreamError,
    StreamClosedError,
    UnavailableError,
    WalFullError,
)
from ..format.batch import WAL_PREFIX, WAL_RECORD_VERSION, decode_wal_record, encode_batch
from ..metadata import (
    CommitObjects,
    MetadataManager,
    MetadataState,
    ObjectKind,
    ObjectMeta,
    StreamRange,
)
from ..metrics.components import StorageInstruments
from ..metrics.logs import ContextLogger
from ..metrics.registry import MetricsRegistry
from ..objectstore.base import ObjectStore
from ..settings import ClientSettings
from ..throttle import Priority, PriorityRateLimiter
from ..types import AppendResult, FetchedBatch, RecordBatch, StreamState
from ..wal.base import WalPosition, WriteAheadLog
from .packing import KeyFactory, PackedObject, pack_objects
from .reader import ObjectDataReader, missing_data

__all__ = ["RecoveryReport", "Storage", "StorageMetrics", "WriterState"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WriterState:
    """Per-stream append state of the owning client."""

    stream_id: int
    epoch: int
    next_offset: int
    confirm_offset: int
    wal_prefix: bytes
    #: Set once the stream can take no more appends (fenced, closed, WAL failure).
    error: S3StreamError | None = None


@dataclass(slots=True)
class RecoveryReport:
    """What `Storage.recover` found in the WAL and did with it."""

    records: int = 0
    bytes: int = 0
    already_committed: int = 0
    fenced: int = 0
    uploaded_batches: int = 0


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


@dataclass(slots=True)
class _Upload:
    entries: list[CachedBatch]
    objects: list[PackedObject]
    puts: list[Future[None]] = field(default_factory=list)
    attempts: int = 0
    #: When the upload began (the clock's monotonic seconds).
    started: float = 0.0


def _stream_epoch_prefix(epoch: int) -> bytes:
    return WAL_PREFIX.pack(WAL_RECORD_VERSION, epoch)


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
        self._store = store
        #: Carried by every commit, so a node taken over by another client commits nothing.
        self._node_epoch = node_epoch
        self._wal = wal
        self._meta = meta
        self._settings = settings
        self._clock = clock
        self._keys = keys
        self._node_id = node_id
        self._log = ContextLogger(log, node_id)
        self._cache = LogCache(settings.log_cache_bytes)
        self._limiter = limiter
        # A block cache made here is ours to close; one passed in belongs to the caller.
        self._owns_block_cache = block_cache is None
        self._block_cache = block_cache or BlockCache(
            store, capacity_bytes=settings.block_cache_bytes, limiter=limiter, node_id=node_id
        )
        self._objects = ObjectDataReader(
            self._block_cache,
            Readahead(
                self._block_cache,
                initial_bytes=settings.readahead_initial_bytes,
                max_bytes=settings.readahead_max_bytes,
            ),
        )
        self._ins = (
            instruments if instruments is not None else StorageInstruments(MetricsRegistry())
        )
        # Bound once: the append path reads the clock twice and records once per append.
        self._mono = clock.monotonic
        self._record_append = self._ins.append.record
        # One lock orders offsets, WAL appends and completion callbacks (see module docstring).
        self._append_lock = threading.RLock()
        self._cond = threading.Condition(threading.Lock())
        self._writers: dict[int, WriterState] = {}
        self._outstanding = 0
        self._closing = False
        #: Fatal: the client takes no more appends (fenced, corrupted, a background bug).
        self._failed: S3StreamError | None = None
        #: Retryable WAL failure under repair by the uploader; appends wait until it clears.
        self._wal_error: S3StreamError | None = None
        #: Set when the WAL refused an append for want of room, until the next upload trims
        #: it: later appends wait for room outside the append lock instead of each waiting
        #: the WAL's full_wait_ms in turn inside it.
        self._wal_full = False
        #: The WAL's record limit (its capabilities do not change), checked per append.
        self._max_record_bytes = wal.capabilities.max_record_bytes
        #: Acknowledged appends dropped because another owner took their stream: reported by
        #: the next `flush` (then cleared) and by `close` (all of them).
        self._dropped: list[str] = []
        self._dropped_unreported: list[str] = []
        #: Set when the uploader thread ended by an unexpected error (a bug): `flush` and
        #: `close` raise it rather than wait for a thread that is gone.
        self._thread_error: S3StreamError | None = None
        self._upload_requested = False
        self._upload_error: S3StreamError | None = None
        #: Failed upload attempts since the client opened (flush counts those during its wait).
        self._upload_failures = 0
        self._last_upload_mono = clock.monotonic()
        self._stop = False
        self._abandoned = False
        self._completed = CompletedFutures()
        self._upload_threshold = settings.upload_threshold_bytes
        self._put_pool = ThreadPoolExecutor(
            max_workers=settings.upload_parallelism, thread_name_prefix="s3stream-put"
        )
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def log_cache(self) -> LogCache:
        """The hot-tail cache."""
        return self._cache

    @property
    def block_cache(self) -> BlockCache:
        """The cache of object blocks behind the LogCache."""
        return self._block_cache

    @property
    def metrics(self) -> StorageMetrics:
        """A snapshot of the counters."""
        return StorageMetrics(**self._ins.snapshot())

    @property
    def instruments(self) -> StorageInstruments:
        """The cells the pipeline records into."""
        return self._ins

    def start(self) -> None:
        """Start the background uploader."""
        self._thread = threading.Thread(target=self._run, name="s3stream-uploader", daemon=True)
        self._thread.start()

    def recover(self) -> RecoveryReport:
        """Replay the WAL: drop what is committed or fenced, upload the rest, reset the WAL.

        Uploads that keep failing past `call_timeout_ms` raise `UnavailableError`; the WAL is
        then left as it was, for the next attempt.
        """
        deadline = self._deadline(None)
        report = RecoveryReport()
        state = self._meta.state
        expected: dict[int, int] = {}
        for pos, data in self._wal.recover():
            report.records += 1
            report.bytes += len(data)
            epoch, batch, _ = decode_wal_record(data, f"{self._wal.describe()}@{pos}")
            sid = batch.stream_id
            try:
                s = state.get_stream(sid)
            except S3StreamError:
                report.fenced += 1
                continue
            if batch.next_offset <= s.end_offset:
                report.already_committed += 1
                continue
            if epoch != s.epoch:
                report.fenced += 1
                continue
            want = expected.get(sid, s.end_offset)
            if batch.base_offset != want:
                raise CorruptionError(
                    f"WAL record at {pos} holds stream {sid} offsets from {batch.base_offset}, "
                    f"expected {want}: acknowledged data is missing",
                    location=self._wal.describe(),
                    position=pos,
                )
            expected[sid] = batch.next_offset
            self._cache.put(
                sid, batch.base_offset, batch.count, batch.base_timestamp, batch.kind,
                batch.properties, batch.payload, data, WAL_PREFIX.size, pos, epoch,
            )  # fmt: skip
            report.uploaded_batches += 1
            if self._cache.pending_bytes >= self._settings.upload_threshold_bytes:
                self._upload_sync(deadline, trim=False)
        # Uploads made while replaying trim nothing (a WAL takes no trim before its recovery
        # ends); the reset drops everything at once.
        self._upload_sync(deadline, trim=False)
        self._wal.reset()
        return report

    def register_writer(self, stream_id: int, epoch: int, end_offset: int) -> WriterState:
        """Make this client the appender of a stream it has just opened."""
        w = WriterState(stream_id, epoch, end_offset, end_offset, _stream_epoch_prefix(epoch))
        with self._append_lock:
            self._writers[stream_id] = w
        return w

    def release_writer(self, stream_id: int, error: S3StreamError) -> None:
        """Stop appends to a stream (closed, destroyed or fenced)."""
        with self._append_lock:
            w = self._writers.pop(stream_id, None)
            if w is not None and w.error is None:
                w.error = error

    def flush(self, timeout_s: float | None = None) -> None:
        """Upload and commit everything acknowledged so far.

        Raises `UnavailableError` (retryable) when uploads keep failing or the deadline
        (`timeout_s`, else `call_timeout_ms`) passes, the client's fatal error if it has one,
        and `FencedError` if acknowledged appends were dropped since the last flush because
        another client took their stream over.
        """
        target = self._cache.last_seq
        deadline = self._deadline(timeout_s)
        if self._thread is None:
            self._upload_sync(deadline)
        with self._cond:
            # Only failures seen during this flush count: an error left from before the store
            # healed must not fail a flush that the next retry will satisfy.
            failures_at_start = self._upload_failures
            self._upload_requested = True
            self._cond.notify_all()
            while not self._flushed(target):
                self._raise_if_broken()
                if self._upload_error is not None and (
                    self._upload_failures - failures_at_start >= 3
                ):
                    raise UnavailableError(
                        f"upload keeps failing: {self._upload_error}"
                    ) from self._upload_error
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    cause = f": {self._upload_error}" if self._upload_error is not None else ""
                    raise UnavailableError(
                        f"flush did not finish within {deadline_text(timeout_s, self._settings)}"
                        f"{cause}"
                    )
                # Woken by every finished upload attempt and by the uploader's death; the
                # timeout only bounds the wait by the deadline.
                self._cond.wait(remaining)
            self._raise_dropped()

    def _deadline(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            timeout_s = self._settings.call_timeout_ms / 1000
        return self._clock.monotonic() + timeout_s

    def _raise_if_broken(self) -> None:
        """Raise the fatal error or the uploader's death, if any (under `_cond`)."""
        if self._failed is not None:
            raise self._failed
        if self._thread_error is not None:
            raise self._thread_error

    def _raise_dropped(self) -> None:
        """Report acknowledged appends dropped since the last report (under `_cond`)."""
        if self._dropped_unreported:
            dropped, self._dropped_unreported = self._dropped_unreported, []
            raise FencedError(_dropped_message(dropped))

    def _flushed(self, target: int) -> bool:
        oldest = self._cache.oldest_unfinished_seq()
        return oldest is None or oldest > target

    def close(
        self, timeout_s: float | None = None, *, on_flushed: Callable[[], None] | None = None
    ) -> None:
        """Refuse new appends, wait for in-flight ones, upload everything, close the WAL.

        `on_flushed` runs once everything acknowledged is committed (the client releases its
        streams then). Returns or raises within the deadline (`timeout_s`, else
        `call_timeout_ms`) plus the time the WAL takes to close; what could not be uploaded
        stays in the WAL for the next open. Raises the flush's error, the uploader's death,
        or `FencedError` if acknowledged appends were ever dropped.
        """
        deadline = self._deadline(timeout_s)
        # An append may hold the lock while the WAL waits for room: close does not queue
        # behind it past its deadline. Without the lock the flag still stops every append
        # that has not yet passed its check; one that has is waited for as outstanding.
        locked = self._append_lock.acquire(
            timeout=max(0.0, deadline - self._clock.monotonic())
        )
        try:
            if self._closing:
                return
            self._closing = True
            self._cond_notify()
        finally:
            if locked:
                self._append_lock.release()
        error: BaseException | None = None
        try:
            with self._cond:
                while self._outstanding > 0:
                    remaining = deadline - self._clock.monotonic()
                    if remaining <= 0:
                        raise UnavailableError(
                            f"{self._outstanding} appends were still waiting for the WAL at "
                            "the close deadline"
                        )
                    self._cond.wait(remaining)
            if self._failed is None:
                self.flush(max(0.0, deadline - self._clock.monotonic()))
                if on_flushed is not None:
                    on_flushed()
        except BaseException as exc:
            error = exc
        finally:
            with self._cond:
                self._stop = True
                # The uploader may be retrying: stopping makes it give up (the data stays in
                # the WAL for the next open).
                self._abandoned = error is not None
                self._cond.notify_all()
            self._join_uploader(deadline)
            self._put_pool.shutdown(wait=False, cancel_futures=True)
            try:
                self._wal.close()
            except BaseException as exc:
                error = error or exc
            if self._owns_block_cache:
                self._block_cache.close()
        if error is not None:
            raise error
        with self._cond:
            # A fatal state means this client stopped short of its work: say so, even though
            # what it acknowledged is safe (in its WAL, or taken over by another client).
            self._raise_if_broken()
            if self._dropped:
                raise FencedError(_dropped_message(self._dropped))

    def _cond_notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _join_uploader(self, deadline: float) -> None:
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        # A PUT in flight is bounded by the store's own deadline, so the uploader stops soon
        # after it; a wait past the deadline would only hide a hang.
        thread.join(max(0.0, deadline - self._clock.monotonic()) + _JOIN_GRACE_S)
        if thread.is_alive():
            self._log.error("the uploader did not stop by the close deadline; leaving it behind")

    def abandon(self) -> None:
        """Stop background work without uploading (tests: simulate a crash in-process)."""
        with self._append_lock:
            self._closing = True
        with self._cond:
            self._stop = True
            self._abandoned = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._put_pool.shutdown(wait=True)
        if self._owns_block_cache:
            self._block_cache.close()

    # ------------------------------------------------------------------ append path

    def append(self, w: WriterState, batch: RecordBatch) -> Future[AppendResult]:
        """Assign offsets, write the WAL record; the future resolves once it is durable."""
        r = self._append(w, batch)
        return r[0] if isinstance(r, tuple) else self._completed.result(r)

    def append_and_wait(
        self, w: WriterState, batch: RecordBatch, timeout_s: float | None = None
    ) -> AppendResult:
        """`append`, then wait for durability (no future at all when the WAL acks at once).

        Without `timeout_s` the wait is bounded by `call_timeout_ms`. On timeout the append
        may still become durable later: `UnavailableError` says so.
        """
        timeout = self._settings.call_timeout_ms / 1000 if timeout_s is None else timeout_s
        r = self._append(w, batch, timeout)
        if not isinstance(r, tuple):
            return r  # durable already (no clock read on this path)
        result, wal_future, call_deadline = r
        if timeout_s is None:
            # The WAL may make the record durable in this thread (`WriteAheadLog.drive`); with
            # a timeout the wait must stay interruptible, so the WAL's own thread does it.
            self._wal.drive(wal_future)
        try:
            # What `_append` spent waiting for room counts (it set the call's deadline then).
            return result.result(
                timeout if call_deadline is None
                else max(0.0, call_deadline - self._clock.monotonic())
            )
        except TimeoutError as exc:
            self._ins.append_failed(exc)
            raise UnavailableError(
                f"append to stream {w.stream_id} was not acknowledged within "
                f"{deadline_text(timeout_s, self._settings)}; it may still become durable "
                "(a retry can then duplicate it)"
            ) from exc

    def _append(
        self, w: WriterState, batch: RecordBatch, call_timeout: float | None = None
    ) -> AppendResult | tuple[Future[AppendResult], Future[WalPosition], float | None]:
        """Append under the lock; the result, or (its future, the WAL's future, the call's
        deadline if a wait made it compute one). `call_timeout`: of a synchronous call. A
        refused append is counted here, for both entry points."""
        try:
            return self._append_counted(w, batch, call_timeout)
        except BaseException as exc:
            self._ins.append_failed(exc)
            raise

    def _append_counted(
        self, w: WriterState, batch: RecordBatch, call_timeout: float | None
    ) -> AppendResult | tuple[Future[AppendResult], Future[WalPosition], float | None]:
        started = self._mono()
        ts = batch.base_timestamp
        if ts is None:
            ts = self._clock.now_ms()
        payload = batch.payload
        # One deadline for everything this call may wait for (a WAL under repair, room in
        # the upload backlog, the append lock), never longer than the call's own: waits
        # never add up. It is computed only once a wait comes: the way through reads no clock.
        deadline: float | None = None
        call_deadline: float | None = None
        while True:
            if not self._append_lock.acquire(blocking=False):
                # Held, maybe by an append the WAL keeps waiting for room (its own
                # full_wait_ms): waiting for the lock counts against the deadline too.
                if deadline is None:
                    call_deadline, deadline = self._wait_deadlines(call_timeout)
                if not self._append_lock.acquire(
                    timeout=max(0.0, deadline - self._clock.monotonic())
                ):
                    raise BackpressureError(
                        "another append holds the way into the WAL (waiting for room in it) "
                        "past this append's deadline; retry later"
                    )
            try:
                if w.error is not None:
                    raise w.error
                if self._closing:
                    raise StreamClosedError("the client is closed")
                if self._failed is not None:
                    raise self._failed
                if self._wal_error is None and not self._no_room():
                    return self._append_locked(w, batch, ts, payload, call_deadline, started)
            finally:
                self._append_lock.release()
            # A WAL under repair or no room: wait outside the lock, side by side with others.
            if deadline is None:
                call_deadline, deadline = self._wait_deadlines(call_timeout)
            if self._wal_error is not None:
                self._wait_for_wal(deadline)
            if self._no_room():
                self._wait_for_room(deadline)

    def _no_room(self) -> bool:
        """Whether an append must wait for an upload first: the WAL refused one for want of
        room, or the upload backlog is at `max_pending_bytes`."""
        return self._wal_full or self._cache.pending_bytes >= self._settings.max_pending_bytes

    def _wait_deadlines(self, call_timeout: float | None) -> tuple[float | None, float]:
        """(the call's deadline, None for an async append; the deadline of its waits: the
        backpressure timeout's, or the call's if sooner), from now."""
        now = self._clock.monotonic()
        waits = now + self._settings.backpressure_timeout_ms / 1000
        if call_timeout is None:
            return None, waits
        return now + call_timeout, min(waits, now + call_timeout)

    def _append_locked(
        self,
        w: WriterState,
        batch: RecordBatch,
        ts: int,
        payload: bytes,
        call_deadline: float | None,
        started: float,
    ) -> AppendResult | tuple[Future[AppendResult], Future[WalPosition], float | None]:
        base = w.next_offset
        record = encode_batch(
            w.stream_id, base, batch.count, batch.kind, ts, batch.properties, payload,
            prefix=w.wal_prefix,
        )  # fmt: skip
        limit = self._max_record_bytes
        if len(record) > limit:
            raise InvalidArgumentError(
                f"a batch of {len(payload)} payload bytes makes a {len(record)}-byte WAL "
                f"record; {self._wal.describe()} takes at most {limit} bytes per record"
            )
        try:
            wal_future = self._wal.append(record)
        except WalFullError:
            # Refused at the call, like the next ones until an upload trims the WAL.
            with self._cond:
                self._wal_full = True
                self._upload_requested = True
                self._cond.notify_all()
            raise
        except (InvalidArgumentError, BackpressureError):
            # Refused at the call: nothing was written, no offset was used (this call only).
            raise
        except S3StreamError as exc:
            self._on_wal_error(exc)
            raise
        w.next_offset = base + batch.count
        if wal_future.done():
            # Every earlier WAL future is done and its callback has run (the WAL completes
            # in order), so completing inline keeps LogCache inserts in WAL order.
            return self._durable(wal_future, w, batch, base, ts, record, started)
        result: Future[AppendResult] = Future()
        with self._cond:
            self._outstanding += 1
        wal_future.add_done_callback(
            lambda f: self._on_durable(f, w, batch, base, ts, record, result, started)
        )
        return result, wal_future, call_deadline

    def _wait_for_wal(self, deadline: float) -> None:
        """Wait (no lock held) until the uploader has repaired the WAL, or raise."""
        with self._cond:
            while self._wal_error is not None:
                self._raise_if_broken()
                if self._closing:
                    raise StreamClosedError("the client is closed")
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    raise UnavailableError(
                        f"the WAL failed and is not repaired yet: {self._wal_error}; "
                        "the client retries by itself, retry the append later"
                    ) from self._wal_error
                self._cond.wait(remaining)

    def _durable(
        self,
        wal_future: Future[WalPosition],
        w: WriterState,
        batch: RecordBatch,
        base: int,
        ts: int,
        record: bytes,
        started: float,
    ) -> AppendResult:
        try:
            pos = wal_future.result()
        except BaseException as exc:
            err = exc if isinstance(exc, S3StreamError) else UnavailableError(f"WAL write: {exc}")
            if err is not exc:
                err.__cause__ = exc
            self._on_wal_error(err)
            raise err from None
        count = batch.count
        pending = self._cache.put(
            w.stream_id, base, count, ts, batch.kind, batch.properties, batch.payload,
            record, WAL_PREFIX.size, pos, w.epoch,
        )  # fmt: skip
        w.confirm_offset = base + count
        self._record_append(self._mono() - started, len(batch.payload), count)
        if pending >= self._upload_threshold and not self._upload_requested:
            self.request_upload()
        return AppendResult(w.stream_id, base, count)

    def _on_durable(
        self,
        wal_future: Future[WalPosition],
        w: WriterState,
        batch: RecordBatch,
        base: int,
        ts: int,
        record: bytes,
        result: Future[AppendResult],
        started: float,
    ) -> None:
        try:
            result.set_result(self._durable(wal_future, w, batch, base, ts, record, started))
        except S3StreamError as exc:
            self._ins.append_failed(exc)
            result.set_exception(exc)
        finally:
            with self._cond:
                self._outstanding -= 1
                if self._outstanding == 0:
                    self._cond.notify_all()

    def _on_wal_error(self, err: S3StreamError) -> None:
        """A WAL append failed: nothing after it may be acknowledged (the WAL fails every
        later append too). Retryable: the uploader repairs the WAL; else the client stops."""
        if not err.retryable or isinstance(err, StreamClosedError):
            self._fail(err)
            return
        with self._cond:
            if self._wal_error is None:
                self._log.warning("WAL failed, repairing it (appends wait): %s", err)
                self._wal_error = err
                self._cond.notify_all()

    def _fail(self, err: S3StreamError) -> None:
        # A failed WAL write leaves a hole in offsets: nothing after it may be acknowledged.
        with self._cond:
            if self._failed is None:
                self._log.error("the client takes no more appends: %s", err)
                self._failed = err
            self._cond.notify_all()

    def _wait_for_room(self, deadline: float) -> None:
        """Wait (no lock held) until the upload backlog is below `max_pending_bytes` and the
        WAL has room again (after an upload trimmed it)."""
        with self._cond:
            self._upload_requested = True
            self._cond.notify_all()
            while self._no_room():
                if self._wal_full and self._cache.pending_bytes == 0:
                    # Nothing left to upload, so no upload will trim the WAL: its fullness is
                    # not ours to wait out. Let the next append ask the WAL itself.
                    self._wal_full = False
                    break
                self._raise_if_broken()
                if self._closing:
                    raise StreamClosedError("the client is closed")
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    cause = f" (last upload error: {self._upload_error})" if (
                        self._upload_error is not None
                    ) else ""
                    if self._wal_full:
                        raise WalFullError(
                            f"{self._wal.describe()} is full and no upload has made room "
                            f"yet{cause}"
                        )
                    raise BackpressureError(
                        f"{self._cache.pending_bytes} bytes wait for upload "
                        f"(max_pending_bytes={self._settings.max_pending_bytes}); "
                        f"the object store is too slow or unreachable{cause}"
                    )
                # Every committed upload notifies.
                self._cond.wait(remaining)

    def request_upload(self) -> None:
        """Ask the uploader to upload now (also the WAL's callback when it is full)."""
        with self._cond:
            self._upload_requested = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ uploader

    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _due(self) -> bool:
        if self._upload_requested:
            return True
        pending = self._cache.pending_bytes
        if pending >= self._settings.upload_threshold_bytes:
            return True
        interval = self._settings.upload_interval_ms / 1000
        return bool(
            pending
            and interval > 0
            and self._clock.monotonic() - self._last_upload_mono >= interval
        )

    def _idle_wait_s(self) -> float | None:
        """How long the idle uploader may sleep: until the upload interval is due (None:
        until woken, as nothing is pending or there is no timer)."""
        interval = self._settings.upload_interval_ms / 1000
        if interval <= 0 or not self._cache.pending_bytes:
            # Appends that make something pending notify when they cross the threshold; the
            # interval timer starts from the last upload, so re-check within one interval.
            return interval if interval > 0 else None
        return max(0.0, self._last_upload_mono + interval - self._clock.monotonic())

    def _run(self) -> None:
        try:
            self._run_uploads()
        except BaseException as exc:
            err = exc if isinstance(exc, S3StreamError) else S3StreamError(
                f"the uploader thread failed: {exc!r}"
            )
            if err is not exc:
                err.__cause__ = exc
            self._log.exception("the uploader thread died")
            with self._cond:
                self._thread_error = err
                if self._failed is None:
                    self._failed = err
                self._cond.notify_all()

    def _run_uploads(self) -> None:
        inflight: deque[_Upload] = deque()
        max_inflight = max(1, self._settings.upload_parallelism // 2)
        while True:
            with self._cond:
                while (
                    not self._stop
                    and not inflight
                    and not self._due()
                    and (self._wal_error is None or self._failed is not None)
                ):
                    self._cond.wait(self._idle_wait_s())
                if self._abandoned:
                    return
                stop = self._stop
                due = self._due() or stop
                self._upload_requested = False
                repair = self._wal_error is not None and self._failed is None and not stop
            if repair:
                try:
                    while inflight:
                        self._finish_upload(inflight.popleft())
                    self._repair_wal()
                except S3StreamError:
                    return  # fatal (the client stopped) or stopping
                continue
            if due:
                entries = self._cache.take_pending()
                if entries:
                    inflight.append(self._start_upload(entries))
            try:
                while inflight and (
                    stop
                    or len(inflight) >= max_inflight
                    or all(f.done() for f in inflight[0].puts)
                    or not self._due()
                ):
                    self._finish_upload(inflight.popleft())
            except S3StreamError:
                # Only raised while stopping: what is not uploaded stays in the WAL.
                return
            if stop and not inflight and self._cache.pending_bytes == 0:
                return

    def _repair_wal(self) -> None:
        """Bring a WAL that failed retryably back into service (uploader thread).

        Every append in flight fails once one has (the WAL's contract), so after they have
        all completed, offsets from each stream's confirm offset on were never acknowledged
        and are handed out again. What was acknowledged is uploaded before `reset` drops it
        from the WAL. Raises only when stopping or when the client failed fatally.
        """
        attempts = 0
        while True:
            with self._append_lock, self._cond:
                if self._outstanding == 0:
                    for w in self._writers.values():
                        w.next_offset = w.confirm_offset
                    break
                self._cond.wait(_REPAIR_WAIT_S)
            with self._cond:
                if self._stop or self._failed is not None:
                    raise StreamClosedError("stopping")
        while True:
            self._upload_sync(trim=False)  # the reset below drops it all
            try:
                self._wal.reset()
            except S3StreamError as exc:
                if not exc.retryable:
                    self._fail(exc)
                    raise
                attempts += 1
                self._log.warning("WAL repair attempt %d failed: %s", attempts, exc)
                with self._cond:
                    if self._stop:
                        raise
                    self._cond.wait(min(2.0, 0.05 * 2**attempts))
                    if self._stop:
                        raise
                continue
            with self._cond:
                self._log.warning("WAL repaired after: %s", self._wal_error)
                self._wal_error = None
                self._cond.notify_all()
            return

    def _start_upload(self, entries: list[CachedBatch]) -> _Upload:
        self._last_upload_mono = started = self._clock.monotonic()
        self._log.debug("upload start: %d batches", len(entries))
        up = _Upload(entries, pack_objects(entries, self._settings, self._keys), started=started)
        self._submit_puts(up)
        return up

    def _submit_puts(self, up: _Upload) -> None:
        up.puts = [self._put_pool.submit(self._put, o.key, o.data) for o in up.objects]

    def _put(self, key: str, data: bytes) -> None:
        if self._limiter is not None:
            self._limiter.acquire(len(data), Priority.UPLOAD)
        self._store.put(key, data)

    def _finish_upload(
        self, up: _Upload, deadline: float | None = None, *, trim: bool = True
    ) -> None:
        """Wait for the PUTs of the oldest upload and commit it (then trim the WAL below it,
        if `trim`); retry until it succeeds (raises only when stopping, when the node was
        fenced, or past `deadline`)."""
        while True:
            try:
                for f in up.puts:
                    f.result()
                self._commit(up, trim)
                with self._cond:
                    self._upload_error = None
                    self._cond.notify_all()
                return
            except FencedError as exc:
                # The node was taken over: no retry can succeed, and no append may be acked.
                self._ins.upload_failures.add()
                self._fail(exc)
                with self._cond:
                    self._upload_error = exc
                    up.attempts += 1
                    self._upload_failures += 1
                    self._cond.notify_all()
                raise
            except S3StreamError as exc:
                up.attempts += 1
                self._ins.upload_failures.add()
                self._log.warning("upload attempt %d failed: %s", up.attempts, exc)
                with self._cond:
                    self._upload_error = exc
                    self._upload_failures += 1
                    self._cond.notify_all()
                    if (
                        self._abandoned
                        or (self._stop and up.attempts >= 3)
                        or (deadline is not None and self._clock.monotonic() >= deadline)
                    ):
                        # Closing, or out of time: the data stays in the WAL for the next
                        # open to recover.
                        raise
                    self._cond.wait(min(2.0, 0.05 * 2**up.attempts))
                self._submit_puts(up)

    def _commit(self, up: _Upload, trim: bool) -> None:
        first: dict[int, CachedBatch] = {}
        for e in up.entries:
            first.setdefault(e[SID], e)
        fenced: set[int] = set()
        now = self._clock.now_ms()

        def build(state: MetadataState) -> Sequence[CommitObjects]:
            fenced.clear()
            for sid, e in first.items():
                s = state.streams.get(sid)
                if s is None or s.state is StreamState.DELETED or s.epoch != e[EPOCH]:
                    fenced.add(sid)
                elif s.end_offset != e[BASE]:
                    raise CorruptionError(
                        f"stream {sid}: upload starts at {e[BASE]} but the "
                        f"committed end is {s.end_offset}"
                    )
            metas = []
            for o in up.objects:
                ranges = tuple(
                    StreamRange(sid, a, b) for sid, a, b in o.ranges if sid not in fenced
                )
                if ranges:
                    metas.append(
                        ObjectMeta(
                            key=o.key,
                            kind=ObjectKind(o.kind),
                            size=len(o.data),
                            ranges=ranges,
                            committed_ms=now,
                            node_id=self._node_id,
                        )
                    )
            if not metas:
                return []
            epochs = {sid: e[EPOCH] for sid, e in first.items() if sid not in fenced}
            return [CommitObjects(objects=tuple(metas), epochs=epochs, node_epoch=self._node_epoch)]

        _, state = self._meta.commit(build)
        live = [e for e in up.entries if e[SID] not in fenced]
        self._cache.mark_uploaded(live)
        for sid in sorted(fenced):
            self._drop_fenced(sid, up.entries, state)
        dead = [o.key for o in up.objects if all(r[0] in fenced for r in o.ranges)]
        if dead:
            self._store.delete_many(dead)
        self._log.debug("upload committed: %d objects", len(up.objects))
        self._ins.upload.record(
            self._clock.monotonic() - up.started,
            sum(len(o.data) for o in up.objects),
            len(up.objects),
        )
        try:
            if trim:
                self._wal.trim(up.entries[-1][WALPOS])
        except S3StreamError as exc:
            # Harmless for correctness: recovery drops what is committed.
            self._log.warning("WAL trim failed: %s", exc)
        if self._wal_full:
            with self._cond:
                self._wal_full = False  # the next append tries the WAL again
                self._cond.notify_all()

    def _drop_fenced(self, sid: int, entries: list[CachedBatch], state: MetadataState) -> None:
        """Another client took stream `sid` over: drop what this client acknowledged of it
        and has not uploaded, stop its appends, and remember the loss for flush/close."""
        mine = [e for e in entries if e[SID] == sid]
        lo = mine[0][BASE]
        w = self._writers.get(sid)
        hi = w.confirm_offset if w is not None else mine[-1][BASE] + mine[-1][COUNT]
        s = state.streams.get(sid)
        by = "it was deleted" if s is None or s.state is StreamState.DELETED else (
            f"node {s.owner!r} opened it at epoch {s.epoch}"
        )
        what = f"stream {sid} offsets [{lo}, {hi}) ({by})"
        self._log.for_stream(sid).error("acknowledged appends dropped: %s", what)
        self._cache.discard_stream(sid)
        self.release_writer(sid, FencedError(f"stream {sid} is owned by a newer epoch: {by}"))
        with self._cond:
            self._dropped.append(what)
            self._dropped_unreported.append(what)
            self._cond.notify_all()

    def _upload_sync(self, deadline: float | None = None, *, trim: bool = True) -> None:
        """Upload everything pending from the calling thread (recovery and WAL repair, which
        reset the WAL afterwards instead of trimming it)."""
        while True:
            entries = self._cache.take_pending()
            if not entries:
                return
            self._finish_upload(self._start_upload(entries), deadline, trim=trim)

    # ------------------------------------------------------------------ read path

    @property
    def objects(self) -> ObjectDataReader:
        """Reads committed batches from objects (shared with read-only readers)."""
        return self._objects

    def read(self, stream_id: int, start: int, end: int, max_bytes: int) -> list[FetchedBatch]:
        """Batches of the stream overlapping ``[start, end)``: at least one, about `max_bytes`."""
        started = self._mono()
        out = self._read(stream_id, start, end, max_bytes)
        self.record_fetch(started, out, sum(map(_SIZE, out)))
        return out

    def record_fetch(self, started: float, batches: Sequence[FetchedBatch], nbytes: int) -> None:
        """Count a fetch that began at `started` (the clock's monotonic seconds) and returned
        `batches` of `nbytes` bytes; also for the client's reads of streams it does not own."""
        # A stream's batches are contiguous in offsets: the records are the span.
        records = batches[-1].next_offset - batches[0].base_offset if batches else 0
        self._ins.fetch.record(self._mono() - started, nbytes, records)

    def _read(self, stream_id: int, start: int, end: int, max_bytes: int) -> list[FetchedBatch]:
        out: list[FetchedBatch] = []
        pos = start
        remaining = max_bytes
        ins = self._ins
        while pos < end:
            got, complete = self._cache.read(stream_id, pos, end, max(remaining, 1))
            if complete:
                if got:
                    ins.log_hit.add()
                out.extend(got)
                break
            first_cached = self._cache.first_offset(stream_id)
            obj_end = end if first_cached is None else min(end, max(first_cached, pos + 1))
            state = self._meta.state
            got = self._objects.read_latest(
                self._meta, stream_id, pos, obj_end, max(remaining, 1), state
            )
            if not got:
                if first_cached is not None and first_cached > pos:
                    raise missing_data(self._meta.state, stream_id, pos, first_cached, "")
                break
            ins.log_miss.add()
            out.extend(got)
            pos = got[-1].next_offset
            remaining -= sum(b.size for b in got)
            if remaining <= 0:
                break
        return out


_SIZE = operator.attrgetter("size")

#: How long `close` waits for the uploader past its deadline (a PUT ending, a last commit).
_JOIN_GRACE_S = 2.0
#: Wake-up of the WAL repair while appends are still completing (they notify, this bounds it).
_REPAIR_WAIT_S = 1.0


def deadline_text(timeout_s: float | None, settings: ClientSettings) -> str:
    """How a deadline was set, for error messages."""
    if timeout_s is None:
        return f"call_timeout_ms={settings.call_timeout_ms}"
    return f"{timeout_s} s"


def _dropped_message(dropped: list[str]) -> str:
    shown = "; ".join(dropped[:5]) + (f"; and {len(dropped) - 5} more" if len(dropped) > 5 else "")
    return (
        "acknowledged appends were dropped because another client took their streams over "
        "(open_stream(force=True), the stream's deletion, or another process opening the "
        f"store with this client's node_id): {shown}"
    )
