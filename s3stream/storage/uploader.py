"""The uploader: a background thread that turns pending batches into committed objects.

When pending bytes reach the threshold, the interval passes, or on flush/close, it takes every
pending batch, packs objects, PUTs them in parallel (several uploads in flight) and hands them
to the `Committer` strictly in order, retrying failed uploads with backoff. It also repairs a
WAL that failed retryably. It sleeps on the pipeline's condition until woken or the upload
interval is due: an idle client does not wake it.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from .._daemon_pool import DaemonPool
from ..cache.log_cache import LogCache, Taken
from ..clock import Clock
from ..errors import (
    CorruptionError,
    FencedError,
    S3StreamError,
    StreamClosedError,
    UnavailableError,
)
from ..metrics.components import StorageInstruments
from ..objectstore.base import ObjectStore
from ..settings import ClientSettings
from ..throttle import Priority, PriorityRateLimiter
from ..wal.base import WriteAheadLog
from .appender import Appender
from .committer import Committer
from .packing import KeyFactory, PackedObject, pack_groups
from .status import PipelineStatus

__all__ = ["Uploader"]

#: Wake-up of the WAL repair while appends are still completing (they notify, this bounds it).
_REPAIR_WAIT_S = 1.0
#: On a store slower than the writer, an upload is sized to take about this long (`_upload_size`),
#: so that room comes back in steps of about this much time (64 MiB uploads to an 8 MB/s
#: store, two in flight sharing it, held appends up to 16 s).
_BACKLOG_UPLOAD_S = 1.0
#: ... but no smaller than this (PUTs and metadata commits cost per object).
_MIN_BACKLOG_UPLOAD = 1 << 20


@dataclass(slots=True)
class _Upload:
    entries: Taken
    objects: list[PackedObject]
    puts: list[Future[None]] = field(default_factory=list)
    attempts: int = 0
    #: When the upload began (the clock's monotonic seconds).
    started: float = 0.0
    #: Bytes of its objects counted against the pending budget (`LogCache.charge`).
    charged: int = 0


class Uploader:
    """Packs, PUTs and commits pending batches; repairs the WAL (module docstring)."""

    def __init__(
        self,
        *,
        status: PipelineStatus,
        cache: LogCache,
        store: ObjectStore,
        wal: WriteAheadLog,
        appender: Appender,
        committer: Committer,
        settings: ClientSettings,
        clock: Clock,
        keys: KeyFactory,
        limiter: PriorityRateLimiter | None,
        instruments: StorageInstruments,
    ) -> None:
        self._status = status
        self._cache = cache
        self._store = store
        self._wal = wal
        self._appender = appender
        self._committer = committer
        self._settings = settings
        self._clock = clock
        self._keys = keys
        self._limiter = limiter
        self._ins = instruments
        self._log = status.log
        self._last_upload_mono = clock.monotonic()
        #: One upload takes at most this much (objects of bounded size, several in flight):
        #: a backlog drains steadily instead of in ever larger uploads.
        self._max_upload = settings.upload_threshold_bytes
        #: Bytes per second the latest upload got, PUTs started to commit (None: none yet).
        self._upload_rate: float | None = None
        # Daemon threads: a PUT left running at a close with a deadline (a store that
        # stopped answering) must not hold the process's exit for a store try, as a
        # ThreadPoolExecutor's threads, joined at exit, did (6.2 s after close(1) returned).
        self._put_pool = DaemonPool(settings.upload_parallelism, "s3stream-put")
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        """Whether the background thread was started (uploads then happen there)."""
        return self._thread is not None

    def start(self) -> None:
        """Start the background thread."""
        self._thread = threading.Thread(target=self._run, name="s3stream-uploader", daemon=True)
        self._thread.start()

    def join(self, deadline: float | None) -> None:
        """Wait for the thread to end (after `status.stop`), up to `deadline`. Not longer: a
        PUT in flight ends by the store's own deadline and a thread stuck past the call's
        (in a WAL trim on a device that stopped answering) is left behind, harmless, since
        what it has not committed stays in the WAL for the next open."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        if deadline is None:
            thread.join()
            return
        thread.join(max(0.0, deadline - self._clock.monotonic()))
        if thread.is_alive():
            # Not an error: a short deadline (0 s) gives a healthy thread no time to notice.
            self._log.warning(
                "the uploader did not stop by the close deadline; left behind, it stops "
                "before its next PUT or commit (what it holds stays in the WAL)"
            )
            with self._status.cond:
                # Left behind, it must not write for a client whose close has returned: it
                # stops before its next PUT or commit (what it holds stays in the WAL).
                self._status.abandoned = True
                self._status.cond.notify_all()

    def shutdown_puts(self, *, wait: bool) -> None:
        """Stop the PUT pool (after the thread ended, or was left behind): PUTs not started
        are dropped; with `wait`, the ones running are waited for."""
        self._put_pool.shutdown(wait=wait)

    # ------------------------------------------------------------------ the thread

    def _due(self) -> bool:
        """Whether an upload should start now (under `cond`): something is untaken and a
        flush or backpressure asked for it, it reached the threshold, the upload interval
        passed, or the client is stopping."""
        untaken = self._cache.untaken_bytes
        if not untaken:
            return False
        status = self._status
        if status.upload_requested or status.stop or untaken >= self._max_upload:
            return True
        interval = self._settings.upload_interval_ms / 1000
        return interval > 0 and self._clock.monotonic() - self._last_upload_mono >= interval

    def _idle_wait_s(self) -> float | None:
        """How long the idle uploader may sleep: until the upload interval is due (None:
        until woken, as nothing is pending or there is no timer)."""
        interval = self._settings.upload_interval_ms / 1000
        if interval <= 0 or not self._cache.untaken_bytes:
            # Appends that make something pending notify when they cross the threshold; the
            # interval timer starts from the last upload, so re-check within one interval.
            return interval if interval > 0 else None
        return max(0.0, self._last_upload_mono + interval - self._clock.monotonic())

    def _run(self) -> None:
        status = self._status
        try:
            self._run_uploads()
        except BaseException as exc:
            err = (
                exc
                if isinstance(exc, S3StreamError)
                else S3StreamError(f"the uploader thread failed: {exc!r}")
            )
            if err is not exc:
                err.__cause__ = exc
            self._log.exception("the uploader thread died")
            with status.cond:
                status.thread_error = err
                if status.failed is None:
                    status.failed = err
                status.cond.notify_all()

    def _run_uploads(self) -> None:
        """Start bounded uploads while they are due and fewer than `max_inflight` are in
        flight; commit them in order as their PUTs complete. Sleeps on the condition until
        something changes: an append crossing the threshold, a flush, a PUT completing (its
        callback notifies), the interval, close, a WAL failure."""
        status = self._status
        inflight: deque[_Upload] = deque()
        max_inflight = max(1, self._settings.upload_parallelism // 2)
        while True:
            with status.cond:
                while True:
                    if status.abandoned:
                        return
                    stop = status.stop
                    repair = status.wal_error is not None and status.failed is None and not stop
                    start = len(inflight) < max_inflight and self._due()
                    head_done = bool(inflight) and all(f.done() for f in inflight[0].puts)
                    if repair or start or head_done or stop:
                        break
                    status.cond.wait(None if inflight else self._idle_wait_s())
            if repair:
                try:
                    while inflight:
                        self._finish_upload(inflight.popleft())
                    self._repair_wal()
                except S3StreamError:
                    return  # fatal (the client stopped) or stopping
                continue
            if start:
                entries = self._cache.take(self._upload_size())
                if entries:
                    inflight.append(self._start_upload(entries))
                with status.cond:
                    status.upload_woken = False  # the next append over the threshold wakes it
                    if not self._cache.untaken_bytes:
                        status.upload_requested = False  # all asked for is under way
            try:
                # Commit in order what has landed; when stopping, wait for the oldest.
                while inflight and (stop or all(f.done() for f in inflight[0].puts)):
                    self._finish_upload(inflight.popleft())
                    if stop and self._cache.untaken_bytes:
                        break  # start the next upload of what remains
            except S3StreamError:
                # Only raised while stopping: what is not uploaded stays in the WAL.
                return
            if stop and not inflight and not self._cache.untaken_bytes:
                return

    def _upload_size(self) -> int:
        """How much the next upload takes: `upload_threshold_bytes`, or what the store takes
        in about `_BACKLOG_UPLOAD_S` when that is less: at the client's own limit on
        background traffic (``background_bytes_per_s``) always, at the rate the last upload
        got while the backlog holds appends back (half of ``max_pending_bytes`` or more).
        Appends then get room back in small steps at the store's pace instead of waiting for
        a whole large upload; a store that keeps up gets full-size objects."""
        rate = self._upload_rate
        if self._cache.pending_bytes < self._settings.max_pending_bytes // 2:
            rate = None  # a store that keeps up: objects as large as configured
        limit = self._settings.background_bytes_per_s
        if limit and (rate is None or rate > limit):
            rate = float(limit)
        if rate is None:
            return self._max_upload
        return min(self._max_upload, max(_MIN_BACKLOG_UPLOAD, int(rate * _BACKLOG_UPLOAD_S)))

    def _repair_wal(self) -> None:
        """Bring a WAL that failed retryably back into service (uploader thread).

        Every append in flight fails once one has (the WAL's contract), so after they have
        all completed, offsets from each stream's confirm offset on were never acknowledged
        and are handed out again. What was acknowledged is uploaded before `reset` drops it
        from the WAL. Raises only when stopping or when the client failed fatally.
        """
        status = self._status
        attempts = 0
        while not self._appender.rewind_when_quiet(_REPAIR_WAIT_S):
            with status.cond:
                if status.stop or status.failed is not None:
                    raise StreamClosedError("stopping")
        while True:
            self.upload_sync(trim=False)  # the reset below drops it all
            try:
                self._wal.reset()
            except S3StreamError as exc:
                if not exc.retryable:
                    status.fail(exc)
                    raise
                attempts += 1
                self._log.warning("WAL repair attempt %d failed: %s", attempts, exc)
                with status.cond:
                    if status.stop:
                        raise
                    status.cond.wait(_backoff_s(attempts))
                    if status.stop:
                        raise
                continue
            with status.cond:
                self._log.warning("WAL repaired after: %s", status.wal_error)
                status.wal_error = None
                status.cond.notify_all()
            return

    # ------------------------------------------------------------------ one upload

    def _start_upload(self, entries: Taken) -> _Upload:
        self._last_upload_mono = started = self._clock.monotonic()
        self._log.debug("upload start: %d batches", len(entries))
        objects = pack_groups(entries.groups, self._settings, self._keys)
        up = _Upload(entries, objects, started=started)
        # The objects are a copy of the entries until the commit: the pending budget counts it.
        up.charged = sum(len(o.data) for o in up.objects)
        self._cache.charge(up.charged)
        self._submit_puts(up)
        return up

    def _submit_puts(self, up: _Upload) -> None:
        try:
            up.puts = [self._put_pool.submit(self._put, o.key, o.data) for o in up.objects]
        except RuntimeError:
            # The pool was shut down: a close left this thread behind between its look at
            # `abandoned` and here.
            raise _left_behind() from None
        for f in up.puts:
            # The thread sleeps until something changes: a PUT landing is such a change.
            f.add_done_callback(self._put_done)

    def _put_done(self, _: Future[None]) -> None:
        self._status.notify()

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
        status = self._status
        while True:
            try:
                for f in up.puts:
                    f.result()
                if status.abandoned:
                    raise _left_behind()
                self._committer.commit(up.entries, up.objects, up.started, trim)
                self._uncharge(up)
                took = self._clock.monotonic() - up.started
                if took > 0:
                    self._upload_rate = sum(len(o.data) for o in up.objects) / took
                with status.cond:
                    status.upload_error = None
                    status.cond.notify_all()
                return
            except (FencedError, CorruptionError) as exc:
                # The node was taken over, or the metadata log no longer matches what this
                # client applied and uploaded (rolled back, damaged: its entries are never
                # rewritten, so a retry finds the same): no retry can succeed, and no append
                # may be acked. What the WAL holds stays there for a new client.
                self._ins.upload_failures.add()
                status.fail(exc)
                with status.cond:
                    up.attempts += 1
                    status.on_upload_failed(exc)
                self._uncharge(up)
                raise
            except S3StreamError as exc:
                up.attempts += 1
                self._ins.upload_failures.add()
                self._log.warning("upload attempt %d failed: %s", up.attempts, exc)
                with status.cond:
                    status.on_upload_failed(exc)
                    if (
                        status.abandoned
                        or (status.stop and up.attempts >= 3)
                        or (deadline is not None and self._clock.monotonic() >= deadline)
                    ):
                        # Closing, or out of time: the data stays in the WAL for the next
                        # open to recover.
                        self._uncharge(up)
                        raise
                    status.cond.wait(_backoff_s(up.attempts))
                    if status.abandoned:
                        self._uncharge(up)
                        raise _left_behind() from exc
                self._submit_puts(up)

    def _uncharge(self, up: _Upload) -> None:
        """The upload's objects are no longer held for it (committed, or given up)."""
        self._cache.charge(-up.charged)
        up.charged = 0

    def upload_sync(self, deadline: float | None = None, *, trim: bool = True) -> None:
        """Upload everything pending from the calling thread (recovery, WAL repair, and flush
        without a thread); uploads made for a WAL about to be reset trim nothing."""
        while True:
            entries = self._cache.take(self._max_upload)
            if not entries:
                return
            self._finish_upload(self._start_upload(entries), deadline, trim=trim)


def _left_behind() -> UnavailableError:
    """What an upload left behind by its client's close raises instead of going on."""
    return UnavailableError("the client closed: upload not committed (it stays in the WAL)")


def _backoff_s(attempts: int) -> float:
    """Wait before retry `attempts` (woken early by close)."""
    return min(2.0, 0.05 * float(1 << min(attempts, 8)))
