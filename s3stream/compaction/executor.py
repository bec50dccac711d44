"""Executing a compaction task: read, copy blocks, verify, PUT, commit — or abort cleanly.

1. Read the blocks the task's pieces need (none wholly below a stream's start offset), one
   ranged GET of at most `max_get_bytes` per run of adjacent blocks (the shared `BlockReader`
   cuts, sends and checks them), each GET paid to the rate limiter at `Priority.COMPACTION`
   just before it is sent.
2. Write the outputs with `ObjectWriter.add_block`: blocks are copied without decoding their
   batches (small adjacent ones of a stream are merged into one), after their crc32c is
   checked. Only a block straddling a stream's start offset (as of planning; the start only
   moves forward, so that keeps enough) is decoded, to drop the batches wholly below it.
   Each block's time range (seek by time) travels with it; a block from an object written
   before time ranges existed is decoded once to compute it, so its copy has one.
3. Verify each output before it is PUT — its own index, parsed back from its bytes, must show
   exactly the stream ranges its metadata will claim — and PUT it; one output is held at a
   time. Output bytes are paid to the limiter 1 MiB at a time as they are copied.
4. Before the commit, the coverage check: for every live range of every replaced object, the
   offsets actually copied from it must join up to cover the range and lie in the outputs,
   and the outputs must not overlap (index level; invariant I10 of the metadata checks the
   ranges once more). A failure is a bug: the outputs are deleted, `CorruptionError` raised.
5. Commit one `CompactObjects`. The commit's build re-checks, on the latest metadata, that
   every replaced object is still live: if another compactor replaced one first, the task is
   aborted and its outputs are deleted (they were never referenced). Any other refusal of the
   commit is a bug in compaction: the outputs are deleted and a `CorruptionError` is raised,
   nothing live is touched.

A crash anywhere leaves either nothing committed (the outputs are orphans for the sweeper) or
the whole task committed (the replaced objects are marked deleted and purged after the
deletion delay).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .._call_deadline import caller_deadline
from ..clock import Clock
from ..errors import (
    CorruptionError,
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    UnavailableError,
)
from ..format.block import BlockInfo, decode_block
from ..format.block_reader import BlockReader, split_run
from ..format.objects import ObjectIndex, ObjectWriter, parse_tail
from ..metadata import (
    CompactObjects,
    MetadataManager,
    MetadataState,
    ObjectKind,
    ObjectMeta,
    StreamRange,
)
from ..metrics.logs import ContextLogger
from ..objectstore.base import ObjectStore
from ..storage.packing import KeyFactory
from ..throttle import Priority, PriorityRateLimiter
from ..units import MiB
from ..validation import check_int
from .planner import CompactionTask, IndexOf, OutputObject, keep_from

__all__ = ["CompactionExecutor", "Moved", "TaskResult", "WriterOptions"]

log = logging.getLogger(__name__)

#: Output bytes copied between two payments to the rate limiter.
_PACE_BYTES = 1 * MiB

#: Blocks read for one (source key, stream id): index entries with their stored bytes.
_SourceBlocks = dict[tuple[str, int], list[tuple[BlockInfo, bytes]]]
#: Offset spans actually copied, per (source key, stream id).
_Copied = dict[tuple[str, int], list[tuple[int, int]]]
#: Told the bytes a task has just read (a GET) or copied into its outputs (each MiB or so).
Moved = Callable[[int], None]
#: (offset, committed_ms) pairs of the records copied into one output, per stream id, by
#: ascending offset (`StreamRange.commits` before joining).
_Commits = dict[int, list[tuple[int, int]]]
#: Most commit times kept per range: merging many objects must not grow the metadata without
#: bound; beyond it, neighbours with the closest times are joined (`_capped_commits`).
_MAX_COMMITS = 32
#: How long a failed task may spend deleting its outputs after an outage (then they are left
#: to the next pass, or to the sweep of this session's keys once it has ended).
_CLEANUP_AFTER_OUTAGE_S = 1.0


@dataclass(frozen=True, slots=True)
class WriterOptions:
    """How output objects are written (as the uploader writes them)."""

    block_target_bytes: int = 1 * MiB
    compression: str = "none"
    zstd_level: int = 3


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What executing one task did."""

    task: CompactionTask
    #: True if the task was committed; False if it was aborted (outputs deleted).
    committed: bool
    new_objects: tuple[ObjectMeta, ...] = ()
    bytes_read: int = 0
    bytes_written: int = 0
    gets: int = 0


class _Aborted(Exception):
    """A replaced object is no longer live: another compactor got there first."""


class _Halted(Exception):
    """`CompactionExecutor.halt` was called: the task stops before its next request."""


#: Failed tasks whose outputs `CompactionExecutor.settle` keeps track of, the latest: older
#: ones are left to the orphan sweep (which deletes them once this session has ended).
_MAX_UNRESOLVED = 256


class CompactionExecutor:
    """Runs `CompactionTask`s against one store and metadata log (see module docstring)."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        meta: MetadataManager,
        keys: KeyFactory,
        index_of: IndexOf,
        clock: Clock,
        node_id: str,
        writer: WriterOptions | None = None,
        limiter: PriorityRateLimiter | None = None,
        bytes_per_s: float = 0,
        max_get_bytes: int = 4 * MiB,
        max_object_bytes: int = 64 * MiB,
    ) -> None:
        """`limiter` is the client's shared one (traffic waits there at `Priority.COMPACTION`);
        `bytes_per_s` > 0 adds a limit of the executor's own on the bytes it reads and writes.
        """
        check_int("max_get_bytes", max_get_bytes, minimum=1)
        # Validated by the limiter itself.
        self._own_rate = bytes_per_s
        self._own = self._new_own_limiter(clock)
        self._store = store
        self._reader = BlockReader(store, max_run_bytes=max_get_bytes)
        self._meta = meta
        self._keys = keys
        self._index_of = index_of
        self._clock = clock
        self._node_id = node_id
        self._log = ContextLogger(log, node_id)
        self._writer = writer or WriterOptions()
        self._limiter = limiter
        self._max_object = max_object_bytes
        #: Set by `halt`: the task in progress ends before its next GET, PUT or commit.
        self._halted = threading.Event()
        #: Outputs of tasks that failed with their fate unknown, for `settle`: (the log's
        #: seq when the commit failed, or None if none was made; their keys).
        self._unresolved: list[tuple[int | None, tuple[str, ...]]] = []

    def _new_own_limiter(self, clock: Clock) -> PriorityRateLimiter | None:
        if not self._own_rate:
            return None
        # A short burst (a quarter second of the rate, paid in slices of a quarter of that):
        # the work is spread evenly instead of running a second's worth at full speed.
        return PriorityRateLimiter(clock=clock, bytes_per_s=self._own_rate, burst_s=0.25)

    def halt(self) -> None:
        """Stop the task in progress before its next GET, PUT or commit (it deletes what it
        wrote and commits nothing), and refuse tasks until `resume`; a wait for the
        executor's own limit ends at once. For a client that is closing: its deadline must
        not wait for a task's remaining requests."""
        self._halted.set()
        own = self._own
        if own is not None:
            own.close()

    def resume(self) -> None:
        """Run tasks again after `halt`."""
        self._halted.clear()

    def execute(
        self, task: CompactionTask, state: MetadataState, moved: Moved | None = None
    ) -> TaskResult:
        """Run `task`, planned on `state`; see the module docstring for the guarantees.
        `moved` is told the bytes read and copied as the task goes."""
        if self._halted.is_set():
            return TaskResult(task, False)
        if self._own is not None and self._own.closed:
            self._own = self._new_own_limiter(self._clock)
        try:
            blocks, read_bytes, gets = self._read(task, state, moved)
        except _Halted:
            return TaskResult(task, False)
        except ObjectNotFoundError:
            # Purged under us (another compactor replaced it, and the deletion delay ran out
            # while this task read): the task is moot, as if its commit had been refused.
            # A source still live and missing is another matter: that error stands.
            self._meta.refresh()
            latest = self._meta.state
            if all((o := latest.objects.get(r.key)) is not None and o.live for r in task.replaced):
                raise
            self._log.info("compaction task aborted: a source object was purged meanwhile")
            return TaskResult(task, False)
        copied: _Copied = {}
        keys: list[str] = []
        metas: list[ObjectMeta] = []
        written = 0
        try:
            for out in task.outputs:
                for meta, data in self._write(task, out, blocks, state, copied, moved):
                    # The bytes were paid for while copying them (see _write).
                    self._throttle(0)
                    # Listed first: a PUT that failed may have landed, or land later.
                    keys.append(meta.key)
                    self._store.put(meta.key, data)
                    metas.append(meta)
                    written += len(data)
            del blocks  # the read buffers: the outputs are in the store now
            self._check_coverage(task, copied, metas, state)
            self._check_not_halted()
        except _Halted:
            self._delete(keys)
            return TaskResult(task, False, (), read_bytes, 0, gets)
        except BaseException as exc:
            # A PUT that timed out against a store that stopped answering may land after
            # this delete: deleted again on a later pass. After an outage the delete gets a
            # short deadline of its own: against the store that just failed it took another
            # store timeout before the error reached the caller; on a full disk it frees the
            # room at once.
            bound = (
                caller_deadline(self._clock, self._clock.monotonic() + _CLEANUP_AFTER_OUTAGE_S)
                if isinstance(exc, UnavailableError)
                else contextlib.nullcontext()
            )
            with bound:
                deleted = self._delete(keys)
            if not deleted:
                self._unresolved.append((None, tuple(keys)))
            raise
        new_objects = tuple(metas)
        replaced_keys = tuple(o.key for o in task.replaced)

        keys_made = self._keys

        def build(latest: MetadataState) -> list[CompactObjects]:
            if keys_made.session_ended(latest):
                # Its node was taken over or registered again (another job with this node
                # id): the orphan sweep of the new session may have deleted these outputs
                # already, as objects of an ended session nobody references.
                raise _Aborted(f"the session of node {self._node_id!r} ended meanwhile")
            for key in replaced_keys:
                obj = latest.objects.get(key)
                if obj is None or not obj.live:
                    raise _Aborted(f"object {key} was replaced or purged meanwhile")
            return [CompactObjects(new_objects=new_objects, replaced_keys=replaced_keys)]

        try:
            self._meta.commit(build)
        except _Aborted as exc:
            self._log.info("compaction task aborted: %s", exc)
            self._delete(keys)
            return TaskResult(task, False, (), read_bytes, 0, gets)
        except InvalidArgumentError as exc:
            # The invariants refused the commit before anything was written.
            self._delete(keys)
            raise CorruptionError(
                f"compaction refused by the metadata invariants (a compaction bug; nothing "
                f"was changed): {exc}"
            ) from exc
        except BaseException:
            # The commit may have landed: the outputs stay until `settle` can tell (left to
            # the orphan sweep, they stayed for the session's life: on a full disk, the
            # space a later upload needed).
            self._unresolved.append((self._meta.state.seq, tuple(keys)))
            raise
        return TaskResult(task, True, new_objects, read_bytes, written, gets)

    def settle(self, state: MetadataState) -> int:
        """Delete the outputs of failed tasks that `state` (fresh) shows were never
        committed; returns how many were deleted. A failed commit was attempted at most at
        the seq after the one its manager knew when it failed: once the log is past that
        seq, outputs it does not reference can never be. Outputs of a task that failed
        before its commit are deleted again in any case (a PUT may land after the task's
        own delete)."""
        if not self._unresolved:
            return 0
        deleted = 0
        left: list[tuple[int | None, tuple[str, ...]]] = []
        for seq, keys in self._unresolved:
            if seq is not None:
                if state.seq <= seq:
                    left.append((seq, keys))  # the commit may still land
                    continue
                if any(k in state.objects for k in keys):
                    continue  # it landed: the objects are the log's now
            if self._delete(list(keys)):
                deleted += len(keys)
            else:
                left.append((seq, keys))
        self._unresolved = left[-_MAX_UNRESOLVED:]
        return deleted

    # ------------------------------------------------------------------ read

    def _read(
        self, task: CompactionTask, state: MetadataState, moved: Moved | None
    ) -> tuple[_SourceBlocks, int, int]:
        """The blocks (with their stored bytes) every piece of the task needs, in offset
        order per (source key, stream id); blocks wholly below the start offset are skipped."""
        wanted: dict[str, list[BlockInfo]] = {}
        by_source = {o.key: o for o in task.replaced}
        for out in task.outputs:
            for p in out.pieces:
                obj = by_source.get(p.source)
                if obj is None:
                    raise InvalidArgumentError(
                        f"task reads {p.source!r}, which it does not replace"
                    )
                keep = keep_from(state, p.stream_id)
                if keep is None:
                    continue  # a deleted stream: nothing to copy
                lo = max(p.start_offset, keep)
                if lo >= p.end_offset:
                    continue
                found = self._index_of(obj).find(p.stream_id, lo, p.end_offset)
                if not found or found[0].start_offset > lo or found[-1].end_offset < p.end_offset:
                    raise CorruptionError(
                        f"object {p.source} does not hold stream {p.stream_id} "
                        f"[{lo}, {p.end_offset}) as its metadata says",
                        location=p.source,
                    )
                wanted.setdefault(p.source, []).extend(found)
        result: _SourceBlocks = {}
        read_bytes = gets = 0
        for key, found in wanted.items():
            # Unique by position: two pieces of one stream may share a block.
            blocks = sorted({b.position: b for b in found}.values(), key=lambda b: b.position)
            for run in self._reader.runs(blocks):
                self._throttle(run[-1].end_position - run[0].position)
                data = self._reader.fetch(key, run, on_response=moved)
                gets += 1
                read_bytes += len(data)
                for b, stored in zip(run, split_run(run, data), strict=True):
                    # A bytes copy of one block rather than a memoryview: joining the output
                    # releases the GIL only over exact bytes, and an object's worth of
                    # copying must not stall the threads appending meanwhile.
                    result.setdefault((key, b.stream_id), []).append((b, bytes(stored)))
        for got in result.values():
            got.sort(key=lambda item: item[0].start_offset)
        return result, read_bytes, gets

    def _check_not_halted(self) -> None:
        if self._halted.is_set():
            raise _Halted

    def _throttle(self, nbytes: int, requests: int = 1) -> None:
        """Wait for the limits before a request (every GET and PUT comes here first)."""
        self._check_not_halted()
        own = self._own
        if own is not None:
            own.acquire(nbytes, Priority.COMPACTION, requests)
        if self._limiter is not None:
            self._limiter.acquire(nbytes, Priority.COMPACTION, requests)
        self._check_not_halted()

    # ------------------------------------------------------------------ write + verify

    def _write(
        self,
        task: CompactionTask,
        out: OutputObject,
        blocks: _SourceBlocks,
        state: MetadataState,
        copied: _Copied,
        moved: Moved | None,
    ) -> Iterator[tuple[ObjectMeta, bytes]]:
        """The objects for `out`, one at a time: one, or for a stream object several of at
        most `max_object_bytes` each (cut between blocks). Records what it copied."""
        sources = [o for o in task.replaced if o.key in {p.source for p in out.pieces}]
        by_key = {o.key: o for o in sources}
        limit = self._max_object if out.kind is ObjectKind.STREAM else None
        w = self._new_writer()
        # When what goes into `w` was first committed: the producers' rebuild needs it
        # (StreamRange.commits), and the object's own committed_ms is the oldest source's.
        commits: _Commits = {}
        # Pay for output bytes as they are copied, not in one lump at the PUT, so that the
        # work spreads evenly over time when throttled.
        unpaid = 0
        for p in sorted(out.pieces, key=lambda p: (p.stream_id, p.start_offset)):
            keep = keep_from(state, p.stream_id)
            if keep is None:
                continue
            lo, hi = max(p.start_offset, keep), p.end_offset
            spans = copied.setdefault((p.source, p.stream_id), [])
            src = by_key[p.source]
            src_range = src.range_of(p.stream_id)
            src_times = (
                src_range.commit_times(src.committed_ms)
                if src_range is not None
                else ((p.start_offset, src.committed_ms),)
            )
            for b, data in blocks.get((p.source, p.stream_id), ()):
                if b.end_offset <= lo or b.start_offset >= hi:
                    continue
                if (
                    limit is not None
                    and not w.is_empty()
                    and w.size_estimate + b.stored_size > limit
                ):
                    yield self._finish(w, sources, commits)
                    w = self._new_writer()
                    commits = {}
                if lo <= b.start_offset and b.end_offset <= hi:
                    w.add_block(b, data, location=p.source)
                    spans.append((b.start_offset, b.end_offset))
                    _add_commits(commits, p.stream_id, src_times, b.start_offset, b.end_offset)
                else:
                    # Straddles the start offset (or the piece's end): the only blocks decoded.
                    kept = [
                        x
                        for x in decode_block(data, b, p.source)
                        if x.next_offset > lo and x.base_offset < hi
                    ]
                    for x in kept:
                        w.add_fetched(x)
                    if kept:
                        spans.append((kept[0].base_offset, kept[-1].next_offset))
                        _add_commits(
                            commits,
                            p.stream_id,
                            src_times,
                            kept[0].base_offset,
                            kept[-1].next_offset,
                        )
                unpaid += b.stored_size
                if unpaid >= _PACE_BYTES:
                    self._throttle(unpaid, requests=0)
                    if moved is not None:
                        moved(unpaid)
                    unpaid = 0
        self._throttle(unpaid, requests=0)
        if moved is not None and unpaid:
            moved(unpaid)
        if not w.is_empty():
            yield self._finish(w, sources, commits)

    def _new_writer(self) -> ObjectWriter:
        return ObjectWriter(
            block_target_bytes=self._writer.block_target_bytes,
            compression=self._writer.compression,
            zstd_level=self._writer.zstd_level,
        )

    def _finish(
        self, w: ObjectWriter, sources: list[ObjectMeta], commits: _Commits
    ) -> tuple[ObjectMeta, bytes]:
        offsets = w.ranges()
        data = w.finish()
        times = w.time_ranges()
        # Never earlier than any source's data, should a range's times be missing (a bug):
        # a later time only makes producers remembered longer, an earlier one forgets them.
        newest = max(t for o in sources for _, t in _times_of(o))
        ranges = tuple(
            StreamRange(
                sid, a, b, *times[sid], commits=_range_commits(commits.get(sid, []), a, b, newest)
            )
            for sid, a, b in offsets
        )
        single = len(ranges) == 1
        meta = ObjectMeta(
            key=self._keys.next_key(ObjectKind.STREAM if single else ObjectKind.STREAM_SET),
            kind=ObjectKind.STREAM if single else ObjectKind.STREAM_SET,
            size=len(data),
            ranges=ranges,
            # The age of the data, not of this copy: old data must still age out of
            # stream-set objects into stream objects.
            committed_ms=min(o.committed_ms for o in sources),
            node_id=self._node_id,
            level=max(o.level for o in sources) + 1,
            # How new each part of it is goes in its ranges' `commits` (above): the
            # producers' rebuild at a reopen counts idle time from those, since with this
            # time a producer whose last batch was merged with older data would pass for
            # expired, and its resend be appended twice.
        )
        self._verify_object(meta, data)
        return meta, data

    def _verify_object(self, meta: ObjectMeta, data: bytes) -> None:
        parsed = parse_tail(data, len(data), meta.key)
        if not isinstance(parsed, ObjectIndex):
            raise CorruptionError(f"compaction wrote an unreadable object {meta.key}")
        if not parsed.has_time_ranges:
            raise CorruptionError(f"compaction wrote {meta.key} without time ranges")
        got = [(sid, a, b) for sid, a, b in parsed.stream_ranges()]
        claimed = [(r.stream_id, r.start_offset, r.end_offset) for r in meta.ranges]
        if got != claimed:
            raise CorruptionError(
                f"compaction output {meta.key} holds {got} but would be committed as {claimed}",
                location=meta.key,
            )

    def _check_coverage(
        self,
        task: CompactionTask,
        copied: _Copied,
        outputs: Sequence[ObjectMeta],
        state: MetadataState,
    ) -> None:
        """Every live range of every replaced object was copied — the spans copied from it
        join up and cover it — into the outputs, which do not overlap. Works on offsets only
        (every copied block's crc32c was checked as it was copied). Raises `CorruptionError`
        otherwise (a bug)."""
        covered: dict[int, list[tuple[int, int]]] = {}
        for meta in outputs:
            for r in meta.ranges:
                covered.setdefault(r.stream_id, []).append((r.start_offset, r.end_offset))
        for sid, spans in covered.items():
            covered[sid] = _join(spans, f"compaction outputs overlap in stream {sid}: {spans}")
        for obj in task.replaced:
            for rng in obj.ranges:
                keep = keep_from(state, rng.stream_id)
                if keep is None or rng.end_offset <= keep:
                    continue
                got = _join(
                    copied.get((obj.key, rng.stream_id), []),
                    f"compaction copied overlapping data of stream {rng.stream_id} from {obj.key}",
                )
                want = (max(keep, rng.start_offset), rng.end_offset)
                if (
                    len(got) != 1
                    or got[0][0] > want[0]
                    or got[0][1] < want[1]
                    or not any(
                        a <= got[0][0] and got[0][1] <= b for a, b in covered.get(rng.stream_id, [])
                    )
                ):
                    raise CorruptionError(
                        f"compaction would lose live data of stream {rng.stream_id} in "
                        f"{obj.key} [{want[0]}, {want[1]}) (copied {got}, outputs hold "
                        f"{covered.get(rng.stream_id, [])}); nothing was changed",
                        location=obj.key,
                    )

    def _delete(self, keys: list[str]) -> bool:
        """Delete outputs of this executor's (never committed); False if that failed."""
        if not keys:
            return True
        try:
            self._store.delete_many(keys)
        except S3StreamError as exc:
            # Harmless: unreferenced objects are orphans the sweeper removes later.
            self._log.warning("could not delete aborted compaction outputs %s: %s", keys, exc)
            return False
        return True


def _join(spans: list[tuple[int, int]], overlap_message: str) -> list[tuple[int, int]]:
    """Sorted `spans` with touching ones joined; `CorruptionError` if any overlap."""
    joined: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if joined and a < joined[-1][1]:
            raise CorruptionError(overlap_message)
        if joined and a == joined[-1][1]:
            joined[-1] = (joined[-1][0], b)
        else:
            joined.append((a, b))
    return joined


def _times_of(obj: ObjectMeta) -> list[tuple[int, int]]:
    """Every (offset, committed_ms) pair of `obj`'s ranges."""
    return [t for r in obj.ranges for t in r.commit_times(obj.committed_ms)] or [
        (0, obj.committed_ms)
    ]


def _add_commits(
    commits: _Commits,
    stream_id: int,
    src_times: tuple[tuple[int, int], ...],
    start: int,
    end: int,
) -> None:
    """Note that records ``[start, end)`` of `stream_id` were copied from a source range whose
    commit times are `src_times`: each part keeps the time its source gives it."""
    out = commits.setdefault(stream_id, [])
    for i, (offset, ms) in enumerate(src_times):
        seg_end = src_times[i + 1][0] if i + 1 < len(src_times) else end
        lo, hi = max(offset, start), min(seg_end, end)
        if lo < hi:
            out.append((lo, ms))


def _range_commits(
    got: list[tuple[int, int]], start: int, end: int, newest: int
) -> tuple[tuple[int, int], ...]:
    """`StreamRange.commits` of an output range ``[start, end)`` from the pairs noted while
    copying (ascending offsets): equal neighbours joined, at most `_MAX_COMMITS`."""
    pairs = [(o, t) for o, t in got if start <= o < end]
    if not pairs or pairs[0][0] != start:
        # Not expected (every copied span is noted): the newest time covers it safely.
        pairs.insert(0, (start, newest))
    joined: list[tuple[int, int]] = []
    for o, t in pairs:
        if joined and joined[-1][0] == o:
            # Two notes at one offset (not expected): keep the later time, never forget early.
            joined[-1] = (o, max(joined[-1][1], t))
        elif joined and joined[-1][1] == t:
            continue  # the same time goes on
        else:
            joined.append((o, t))
    return _capped_commits(joined)


def _capped_commits(pairs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """At most `_MAX_COMMITS` pairs: the neighbours whose times are closest are joined, under
    the later time (records then count as committed a little later than they were: their
    producers are remembered a little longer, never forgotten early)."""
    while len(pairs) > _MAX_COMMITS:
        i = min(range(len(pairs) - 1), key=lambda j: abs(pairs[j + 1][1] - pairs[j][1]))
        pairs[i : i + 2] = [(pairs[i][0], max(pairs[i][1], pairs[i + 1][1]))]
    return tuple(pairs)
