"""`Compactor`: one pass of retention, both compactions, purge and orphan sweep; in the
background of a client or as a standalone job.

A pass, on the latest metadata:

1. **room**: the outputs of failed tasks known never to be committed, and the **purge** of
   objects marked deleted longer than `deletion_delay_ms` ago (first: it needs no write);
2. **retention** — trim streams whose policy (`retention.ms` / `retention.bytes` tags, or the
   settings' defaults) asks for a higher start offset (`TrimStream` at the stream's current
   epoch: it does not fence the owner);
3. the **drops** (tasks that write no object), then **stream-set compaction**, then **stream
   object compaction** (planned again after the first, whose split-out stream objects it
   merges);
4. **purge** again (what this pass replaced, with a deletion delay of 0);
5. **orphan sweep**, when `orphan_sweep_interval_ms` has passed since the last one.

All object-store traffic of a pass goes through the rate limiter at `Priority.COMPACTION`.
Several compactors (in several clients, plus a standalone job) may run at once: a task that
loses the race for an object is aborted cleanly (see `executor`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..cache.block_cache import BlockCache
from ..clock import Clock
from ..errors import (
    CorruptionError,
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    UnavailableError,
)
from ..format.objects import ObjectIndex
from ..metadata import MetadataManager, MetadataState, ObjectMeta, StreamState, TrimStream
from ..metrics.logs import ContextLogger
from ..objectstore.base import ObjectStore
from ..settings import CompactionSettings
from ..storage.packing import KeyFactory
from ..throttle import PriorityRateLimiter
from .executor import CompactionExecutor, Moved, TaskResult, WriterOptions
from .planner import (
    CompactionTask,
    IndexOf,
    UnreadableIndex,
    guard_index,
    plan_stream_object_compaction,
    plan_stream_object_drops,
    plan_stream_set_compaction,
)
from .retention import RetentionPolicy, retention_start
from .sweeper import OrphanSweeper, purge_deleted

__all__ = ["CompactionMetrics", "CompactionReport", "Compactor", "Progress"]

log = logging.getLogger(__name__)

#: Told ``(done_bytes, total_bytes, what)`` as a pass goes (e.g. to drive a progress bar):
#: the bytes the phase `what` has read plus those it has copied into new objects, out of
#: twice what its tasks read (each byte read is about one written). Called after every GET
#: and about every MiB copied, so it moves within a task, and once more as each task ends.
Progress = Callable[[int, int, str], None]


@dataclass(slots=True)
class CompactionReport:
    """What one pass did."""

    #: Live objects (and their bytes) before and after the pass.
    objects_before: int = 0
    objects_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    #: Streams whose start offset retention moved.
    streams_trimmed: int = 0
    #: Tasks committed and aborted (lost a race to another compactor), by kind.
    tasks: dict[str, int] = field(default_factory=dict)
    aborted: int = 0
    #: Tasks stopped because an object they read is damaged (`CorruptionError`, logged with
    #: the object's key): nothing of theirs was committed, the rest of the pass went on.
    damaged: int = 0
    objects_replaced: int = 0
    objects_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    #: Objects deleted from the store after the deletion delay, and orphans deleted.
    objects_purged: int = 0
    orphans_deleted: int = 0
    #: Seconds the pass took (on the injected clock).
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CompactionMetrics:
    """Totals over every pass of a compactor (a snapshot)."""

    passes: int = 0
    failed_passes: int = 0
    tasks: int = 0
    aborted: int = 0
    damaged: int = 0
    objects_replaced: int = 0
    objects_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    streams_trimmed: int = 0
    objects_purged: int = 0
    orphans_deleted: int = 0


class Compactor:
    """Compacts the objects of one store (see the module docstring). Thread-safe: passes are
    serialized; `start` runs them in a background thread every `settings.interval_ms`."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        meta: MetadataManager,
        keys: KeyFactory,
        cache: BlockCache,
        settings: CompactionSettings,
        clock: Clock,
        node_id: str,
        writer: WriterOptions | None = None,
        limiter: PriorityRateLimiter | None = None,
    ) -> None:
        self._store = store
        self._meta = meta
        self._cache = cache
        self._log = ContextLogger(log, node_id)
        self._settings = settings
        self._clock = clock
        self._limiter = limiter
        self._executor = CompactionExecutor(
            store=store,
            meta=meta,
            keys=keys,
            index_of=self._index_of,
            clock=clock,
            node_id=node_id,
            writer=writer,
            limiter=limiter,
            bytes_per_s=settings.bytes_per_s,
            max_object_bytes=settings.stream_object_target_bytes,
        )
        self._sweeper = OrphanSweeper(
            store=store,
            meta=meta,
            clock=clock,
            grace_ms=settings.orphan_grace_ms,
            max_keys=settings.orphan_sweep_max_keys,
            data_prefix=keys.prefix,
            limiter=limiter,
        )
        self._default_policy = RetentionPolicy(
            retention_ms=settings.retention_ms or None,
            retention_bytes=settings.retention_bytes or None,
        )
        self._pass_lock = threading.Lock()
        # Separate from the pass lock: reading metrics must not wait for a pass.
        self._totals_lock = threading.Lock()
        self._last_sweep: float | None = None
        self._totals = dict.fromkeys(CompactionMetrics.__slots__, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def settings(self) -> CompactionSettings:
        """The settings the compactor runs with."""
        return self._settings

    @property
    def sweeper(self) -> OrphanSweeper:
        """The orphan sweeper."""
        return self._sweeper

    @property
    def metrics(self) -> CompactionMetrics:
        """Totals over every pass so far."""
        with self._totals_lock:
            return CompactionMetrics(**self._totals)

    # ------------------------------------------------------------------ one pass

    def run_once(
        self, progress: Progress | None = None, *, sweep_orphans: bool | None = None
    ) -> CompactionReport:
        """One full pass. `sweep_orphans` None sweeps when the interval has passed."""
        self._revive()
        with self._pass_lock:
            try:
                report = self._pass(progress, sweep_orphans)
            except BaseException:
                with self._totals_lock:
                    self._totals["failed_passes"] += 1
                raise
            self._add_totals(report)
            return report

    def _free_room(self, report: CompactionReport) -> None:
        """Before the tasks, whose outputs need room: delete the outputs of earlier tasks
        now known never to be committed, and purge (on a full disk each pass failed at its
        first PUT, and what would have freed room never ran)."""
        if self._stop.is_set():
            raise _Stopped
        report.orphans_deleted += self._executor.settle(self._meta.state)
        try:
            self._purge(report)
        except UnavailableError as exc:
            # Deletes failing (an outage, a policy denying them) must not stop retention and
            # the tasks: the purge at the end of the pass tries again and reports it.
            self._log.warning("purge before the tasks failed: %s", exc)

    def _purge(self, report: CompactionReport) -> None:
        """Delete the objects marked deleted longer ago than the deletion delay."""
        purged = purge_deleted(
            self._meta,
            self._store,
            now_ms=self._clock.now_ms(),
            delay_ms=self._settings.deletion_delay_ms,
            limiter=self._limiter,
        )
        for key in purged:
            self._cache.forget(key)
        report.objects_purged += len(purged)

    def _add_totals(self, report: CompactionReport) -> None:
        with self._totals_lock:
            t = self._totals
            t["passes"] += 1
            t["tasks"] += sum(report.tasks.values())
            for name in (
                "aborted",
                "damaged",
                "objects_replaced",
                "objects_written",
                "bytes_read",
                "bytes_written",
                "streams_trimmed",
                "objects_purged",
                "orphans_deleted",
            ):
                t[name] += getattr(report, name)

    def _pass(self, progress: Progress | None, sweep_orphans: bool | None) -> CompactionReport:
        started = self._clock.monotonic()
        self._meta.refresh()
        report = CompactionReport()
        live = _live(self._meta.state)
        report.objects_before, report.bytes_before = len(live), sum(o.size for o in live)
        unreadable: dict[str, S3StreamError] = {}
        # An index that cannot be read leaves its object out (retention, planning), to be
        # reported once below, instead of ending the pass.
        index_of = guard_index(self._index_of, unreadable)
        try:
            # Room first: on a full disk every write fails (retention's commit, each task's
            # first PUT) and ends the pass, so what frees room without writing comes before
            # them: the purge, then the tasks that only drop objects nothing needs any more.
            self._free_room(report)
            report.streams_trimmed = self._apply_retention(index_of)
            state = self._meta.state
            tasks = plan_stream_set_compaction(
                state, self._settings, index_of, self._clock.now_ms()
            )
            drops = plan_stream_object_drops(state) + [t for t in tasks if not t.outputs]
            if drops:
                self._run_tasks(drops, state, report, progress, "dropping unneeded objects")
            tasks = [t for t in tasks if t.outputs]
            self._run_tasks(tasks, state, report, progress, "stream-set compaction")
            state = self._meta.state
            tasks = plan_stream_object_compaction(state, self._settings, index_of)
            self._run_tasks(tasks, state, report, progress, "stream object compaction")
        except _Stopped:
            pass
        if self._stop.is_set():
            # Stopping (the client is closing): the rest of the pass, purge and sweep
            # included, waits for the next one.
            report.duration_s = self._clock.monotonic() - started
            return report
        self._report_unreadable(unreadable, report)

        self._purge(report)  # what this pass replaced, if the deletion delay is 0

        if self._sweep_due(sweep_orphans):
            self._last_sweep = self._clock.monotonic()
            report.orphans_deleted += len(self._sweeper.sweep())

        live = _live(self._meta.state)
        report.objects_after, report.bytes_after = len(live), sum(o.size for o in live)
        report.duration_s = self._clock.monotonic() - started
        return report

    def _run_tasks(
        self,
        tasks: list[CompactionTask],
        state: MetadataState,
        report: CompactionReport,
        progress: Progress | None,
        what: str,
    ) -> None:
        """Run the tasks of one phase, planned on `state`, telling `progress` (see `Progress`)."""
        total, done = sum(2 * t.read_bytes for t in tasks), 0
        if progress is not None:
            progress(0, total, what)
        for task in tasks:
            if self._stop.is_set():
                break  # stopping: the rest waits for the next pass
            share = 2 * task.read_bytes
            moved = None if progress is None else _within(progress, done, share, total, what)
            self._run_task(task, state, report, moved)
            done += share
            if progress is not None:
                progress(done, total, what)

    def _report_unreadable(
        self, unreadable: dict[str, S3StreamError], report: CompactionReport
    ) -> None:
        """Count and log the objects planning left out because their index could not be read:
        damaged, or missing while still live (one purged since the plan's snapshot is not)."""
        if not unreadable:
            return
        self._meta.refresh()
        objects = self._meta.state.objects
        for key, exc in unreadable.items():
            obj = objects.get(key)
            if isinstance(exc, ObjectNotFoundError) and (obj is None or not obj.live):
                continue
            report.damaged += 1
            self._log.error(
                "object %s left out of compaction, its index unreadable: %s; run "
                "`s3stream verify` on the store",
                key,
                exc,
            )

    def _index_of(self, obj: ObjectMeta) -> ObjectIndex:
        if self._stop.is_set():
            raise _Stopped  # an index read may be a GET: stopping must not wait for more
        return self._cache.index(obj.key, obj.size)

    def _sweep_due(self, forced: bool | None) -> bool:
        if forced is not None:
            return forced
        interval = self._settings.orphan_sweep_interval_ms
        if not interval:
            return False
        if self._last_sweep is None:
            return True
        return (self._clock.monotonic() - self._last_sweep) * 1000 >= interval

    def _run_task(
        self,
        task: CompactionTask,
        state: MetadataState,
        report: CompactionReport,
        moved: Moved | None = None,
    ) -> None:
        # A task planned on `state` may have lost its objects to an earlier task of this
        # pass or to another compactor: skip it (the executor would abort it anyway).
        latest = self._meta.state
        if any((o := latest.objects.get(r.key)) is None or not o.live for r in task.replaced):
            report.aborted += 1
            return
        try:
            result: TaskResult = self._executor.execute(task, state, moved)
        except (CorruptionError, ObjectNotFoundError) as exc:
            # One damaged object stops its task only: the other tasks, the purge of
            # replaced objects and the orphan sweep go on (they stalled store-wide before).
            # (The executor raises ObjectNotFoundError only for a source still live: one
            # missing from the store is damage too.)
            report.damaged += 1
            self._log.error(
                "compaction task (%s) stopped, nothing of it committed: %s; run "
                "`s3stream verify` on the store",
                task.what,
                exc,
            )
            return
        if not result.committed:
            report.aborted += 1
            return
        report.tasks[task.what] = report.tasks.get(task.what, 0) + 1
        report.objects_replaced += len(task.replaced)
        report.objects_written += len(result.new_objects)
        report.bytes_read += result.bytes_read
        report.bytes_written += result.bytes_written

    def _apply_retention(self, index_of: IndexOf) -> int:
        state = self._meta.state
        now = self._clock.now_ms()
        targets: dict[int, int] = {}
        for stream in state.streams.values():
            if stream.state is StreamState.DELETED:
                continue
            try:
                policy = RetentionPolicy.from_tags(stream.tags, self._default_policy)
                if policy.unlimited:
                    continue
                new_start = retention_start(state, stream, policy, index_of, now)
            except (InvalidArgumentError, UnreadableIndex) as exc:
                # A bad tag or an unreadable index (reported as damage) must not stop
                # compaction of the rest; an outage (UnavailableError) ends the pass: going
                # on stream by stream took a store timeout per stream with a retention policy.
                self._log.for_stream(stream.stream_id).warning(
                    "retention of stream %d: %s", stream.stream_id, exc
                )
                continue
            if new_start > stream.start_offset:
                targets[stream.stream_id] = new_start
        if not targets:
            return 0
        trimmed: list[int] = []

        def build(latest: MetadataState) -> list[TrimStream]:
            trimmed.clear()
            ops = []
            for sid, new_start in sorted(targets.items()):
                s = latest.streams.get(sid)
                if s is None or s.state is StreamState.DELETED:
                    continue
                new_start = min(new_start, s.end_offset)
                if new_start > s.start_offset:
                    ops.append(TrimStream(sid, s.epoch, new_start))
                    trimmed.append(sid)
            return ops

        self._meta.commit(build)
        return len(trimmed)

    # ------------------------------------------------------------------ background

    def start(self) -> None:
        """Run passes in a background thread every `interval_ms` until `stop`."""
        self._revive()
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="s3stream-compactor", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the background thread and any pass in progress: the current task ends before
        its next request (deleting what it wrote, committing nothing), the rest of the pass
        is skipped. Waits up to `timeout_s` (None: as long as it takes) for the pass to end;
        False if it did not (its thread then ends on its own once its request in flight
        returns, which closing the store hastens)."""
        self._stop.set()
        self._executor.halt()
        deadline = None if timeout_s is None else self._clock.monotonic() + timeout_s

        def left() -> float:
            return -1 if deadline is None else max(0.0, deadline - self._clock.monotonic())

        thread = self._thread
        if thread is not None:
            thread.join(None if deadline is None else left())
            if not thread.is_alive():
                self._thread = None
        # Then let a foreground pass cut short by stopping finish too.
        if self._thread is not None or not self._pass_lock.acquire(timeout=left()):
            self._log.warning("compaction did not stop within %.3g s", timeout_s)
            return False
        try:
            self._stop.clear()
            self._executor.resume()
        finally:
            self._pass_lock.release()
        return True

    def _revive(self) -> None:
        """After a `stop` that timed out, once its thread has ended: run again (passes, and
        `start`), as after a stop that returned True."""
        thread = self._thread
        if thread is not None and not thread.is_alive():
            self._thread = None
        if self._stop.is_set() and self._thread is None:
            self._stop.clear()
            self._executor.resume()

    def _run(self) -> None:
        interval_s = self._settings.interval_ms / 1000
        while not self._stop.is_set():
            try:
                report = self.run_once()
                if report.tasks or report.objects_purged or report.streams_trimmed:
                    self._log.info("compaction pass: %s", report)
            except CorruptionError as exc:
                self._log.error("compaction pass stopped, nothing live was changed: %s", exc)
            except S3StreamError as exc:
                self._log.warning("compaction pass failed (retried next interval): %s", exc)
            deadline = self._clock.monotonic() + interval_s
            while not self._stop.is_set():
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    break
                self._stop.wait(min(remaining, 0.25))


class _Stopped(Exception):
    """`Compactor.stop` was called: the pass ends before its next request."""


def _within(progress: Progress, before: int, share: int, total: int, what: str) -> Moved:
    """`Moved` of one task whose `share` of the phase's `total` starts at `before`."""
    within = 0

    def moved(nbytes: int) -> None:
        nonlocal within
        # The plan's figure is an estimate (blocks below a start offset are skipped, a
        # straddling block is re-encoded): capped, the count never passes the next task's
        # start, and the task's end settles it.
        within = min(share, within + nbytes)
        progress(before + within, total, what)

    return moved


def _live(state: MetadataState) -> list[ObjectMeta]:
    return [o for o in state.objects.values() if o.live]
