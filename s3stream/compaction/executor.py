"""Executing a compaction task: read, write, verify, PUT, commit — or abort cleanly.

1. Read every block the task's pieces need, one ranged GET per run of adjacent blocks (at
   most `max_get_bytes`), throttled at `Priority.COMPACTION`; every block's crc32c and
   structure are verified on the way (`decode_block`).
2. Write the outputs with `ObjectWriter`, dropping batches wholly below the stream's start
   offset (as of planning; the start only moves forward, so that keeps enough).
3. Verify each output before it is PUT: its own index, parsed back from its bytes, must show
   exactly the stream ranges its metadata will claim; and every source batch at or above the
   start offset must have gone into an output (the coverage check, done here on the data and
   again by the metadata invariant I10 on the ranges).
4. PUT the outputs, then commit one `CompactObjects`. The commit's build re-checks, on the
   latest metadata, that every replaced object is still live: if another compactor replaced
   one first, the task is aborted and its outputs are deleted (they were never referenced).
   Any other refusal of the commit is a bug in compaction: the outputs are deleted and a
   `CorruptionError` is raised, nothing live is touched.

A crash anywhere leaves either nothing committed (the outputs are orphans for the sweeper) or
the whole task committed (the replaced objects are marked deleted and purged after the
deletion delay).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ..clock import Clock
from ..errors import CorruptionError, InvalidArgumentError, S3StreamError
from ..format.objects import (
    BlockInfo,
    ObjectIndex,
    ObjectWriter,
    coalesce,
    decode_block,
    parse_tail,
)
from ..metadata import (
    CompactObjects,
    MetadataManager,
    MetadataState,
    ObjectKind,
    ObjectMeta,
    StreamRange,
)
from ..objectstore.base import ObjectStore
from ..storage.packing import KIND_STREAM, KIND_STREAM_SET, KeyFactory
from ..throttle import Priority, PriorityRateLimiter
from ..types import FetchedBatch
from .planner import CompactionTask, IndexOf, OutputObject, Piece, keep_from

__all__ = ["CompactionExecutor", "TaskResult", "WriterOptions"]

log = logging.getLogger(__name__)

MiB = 1 << 20
#: Output bytes encoded between two payments to the rate limiter.
_PACE_BYTES = 1 * MiB


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
        max_get_bytes: int = 8 * MiB,
        max_object_bytes: int = 64 * MiB,
    ) -> None:
        if type(max_get_bytes) is not int or max_get_bytes < 1:
            raise InvalidArgumentError(f"max_get_bytes must be an int >= 1, got {max_get_bytes!r}")
        self._store = store
        self._meta = meta
        self._keys = keys
        self._index_of = index_of
        self._clock = clock
        self._node_id = node_id
        self._writer = writer or WriterOptions()
        self._limiter = limiter
        self._max_get = max_get_bytes
        self._max_object = max_object_bytes

    def execute(self, task: CompactionTask, state: MetadataState) -> TaskResult:
        """Run `task`, planned on `state`; see the module docstring for the guarantees."""
        batches, read_bytes, gets = self._read(task)
        outputs = [o for out in task.outputs for o in self._write(task, out, batches, state)]
        self._check_coverage(task, batches, outputs, state)
        keys: list[str] = []
        try:
            for meta, data in outputs:
                # The bytes were paid for while encoding them (see _write).
                self._throttle(0)
                self._store.put(meta.key, data)
                keys.append(meta.key)
        except BaseException:
            self._delete(keys)
            raise
        new_objects = tuple(meta for meta, _ in outputs)
        replaced_keys = tuple(o.key for o in task.replaced)

        def build(latest: MetadataState) -> list[CompactObjects]:
            for key in replaced_keys:
                obj = latest.objects.get(key)
                if obj is None or not obj.live:
                    raise _Aborted(f"object {key} was replaced or purged meanwhile")
            return [CompactObjects(new_objects=new_objects, replaced_keys=replaced_keys)]

        try:
            self._meta.commit(build)
        except _Aborted as exc:
            log.info("compaction task aborted: %s", exc)
            self._delete(keys)
            return TaskResult(task, False, (), read_bytes, 0, gets)
        except InvalidArgumentError as exc:
            # The invariants refused the commit before anything was written.
            self._delete(keys)
            raise CorruptionError(
                f"compaction refused by the metadata invariants (a compaction bug; nothing "
                f"was changed): {exc}"
            ) from exc
        # Any other error leaves the outputs alone: the commit may have landed, and if it
        # did not, they are orphans for the sweeper.
        return TaskResult(
            task, True, new_objects, read_bytes, sum(len(d) for _, d in outputs), gets
        )

    # ------------------------------------------------------------------ read

    def _read(
        self, task: CompactionTask
    ) -> tuple[dict[tuple[str, int], list[FetchedBatch]], int, int]:
        """Decoded batches per (source key, stream id) for every piece of the task."""
        wanted: dict[str, list[Piece]] = {}
        for out in task.outputs:
            for p in out.pieces:
                wanted.setdefault(p.source, []).append(p)
        by_source = {o.key: o for o in task.replaced}
        result: dict[tuple[str, int], list[FetchedBatch]] = {}
        read_bytes = gets = 0
        for key, pieces in wanted.items():
            obj = by_source.get(key)
            if obj is None:
                raise InvalidArgumentError(f"task reads {key!r}, which it does not replace")
            idx = self._index_of(obj)
            blocks: list[BlockInfo] = []
            for p in pieces:
                found = idx.find(p.stream_id, p.start_offset, p.end_offset)
                if (
                    not found
                    or found[0].start_offset > p.start_offset
                    or (found[-1].end_offset < p.end_offset)
                ):
                    raise CorruptionError(
                        f"object {key} does not hold stream {p.stream_id} "
                        f"[{p.start_offset}, {p.end_offset}) as its metadata says",
                        location=key,
                    )
                blocks.extend(found)
            blocks.sort(key=lambda b: b.position)
            for run in self._runs(blocks):
                start, end = run[0].position, run[-1].end_position
                self._throttle(end - start)
                data = self._store.get(key, start, end)
                gets += 1
                read_bytes += len(data)
                if len(data) != end - start:
                    raise CorruptionError(
                        f"corrupt object {key}: ends before byte {end}", location=key
                    )
                view = memoryview(data)
                for b in run:
                    got = decode_block(view[b.position - start : b.end_position - start], b, key)
                    result.setdefault((key, b.stream_id), []).extend(got)
        return result, read_bytes, gets

    def _runs(self, blocks: Sequence[BlockInfo]) -> list[list[BlockInfo]]:
        runs: list[list[BlockInfo]] = []
        for run in coalesce(blocks):
            for b in run:
                if (
                    runs
                    and runs[-1][-1].end_position == b.position
                    and (b.end_position - runs[-1][0].position <= self._max_get)
                ):
                    runs[-1].append(b)
                else:
                    runs.append([b])
        return runs

    def _throttle(self, nbytes: int, requests: int = 1) -> None:
        if self._limiter is not None:
            self._limiter.acquire(nbytes, Priority.COMPACTION, requests)

    # ------------------------------------------------------------------ write + verify

    def _write(
        self,
        task: CompactionTask,
        out: OutputObject,
        batches: dict[tuple[str, int], list[FetchedBatch]],
        state: MetadataState,
    ) -> list[tuple[ObjectMeta, bytes]]:
        """The objects for `out`: one, or for a stream object several of at most
        `max_object_bytes` each (cut between batches)."""
        sources = [o for o in task.replaced if o.key in {p.source for p in out.pieces}]
        limit = self._max_object if out.kind is ObjectKind.STREAM else None
        done: list[tuple[ObjectMeta, bytes]] = []
        w = self._new_writer()
        # Pay for output bytes as they are encoded, not in one lump at the PUT: this spreads
        # the CPU work of a big output evenly over time (appends in the same process share
        # the interpreter with it).
        unpaid = 0
        for p in sorted(out.pieces, key=lambda p: (p.stream_id, p.start_offset)):
            keep = keep_from(state, p.stream_id)
            for b in batches.get((p.source, p.stream_id), ()):
                if b.next_offset <= p.start_offset or b.base_offset >= p.end_offset:
                    continue
                if keep is None or b.next_offset <= keep:
                    continue
                if (
                    limit is not None
                    and not w.is_empty()
                    and w.size_estimate + len(b.payload) > limit
                ):
                    done.append(self._finish(w, sources))
                    w = self._new_writer()
                w.add_fetched(b)
                unpaid += len(b.payload)
                if unpaid >= _PACE_BYTES:
                    self._throttle(unpaid, requests=0)
                    unpaid = 0
        if not w.is_empty():
            done.append(self._finish(w, sources))
        self._throttle(unpaid, requests=0)
        return done

    def _new_writer(self) -> ObjectWriter:
        return ObjectWriter(
            block_target_bytes=self._writer.block_target_bytes,
            compression=self._writer.compression,
            zstd_level=self._writer.zstd_level,
        )

    def _finish(self, w: ObjectWriter, sources: list[ObjectMeta]) -> tuple[ObjectMeta, bytes]:
        ranges = tuple(StreamRange(sid, a, b) for sid, a, b in w.ranges())
        single = len(ranges) == 1
        data = w.finish()
        meta = ObjectMeta(
            key=self._keys.next_key(KIND_STREAM if single else KIND_STREAM_SET),
            kind=ObjectKind.STREAM if single else ObjectKind.STREAM_SET,
            size=len(data),
            ranges=ranges,
            # The age of the data, not of this copy: old data must still age out of
            # stream-set objects into stream objects.
            committed_ms=min(o.committed_ms for o in sources),
            node_id=self._node_id,
            level=max(o.level for o in sources) + 1,
        )
        self._verify_object(meta, data)
        return meta, data

    def _verify_object(self, meta: ObjectMeta, data: bytes) -> None:
        parsed = parse_tail(data, len(data), meta.key)
        if not isinstance(parsed, ObjectIndex):
            raise CorruptionError(f"compaction wrote an unreadable object {meta.key}")
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
        batches: dict[tuple[str, int], list[FetchedBatch]],
        outputs: list[tuple[ObjectMeta, bytes]],
        state: MetadataState,
    ) -> None:
        """Every source batch at or above its stream's start offset was read and lies in an
        output; outputs do not overlap. Raises `CorruptionError` otherwise (a bug)."""
        covered: dict[int, list[tuple[int, int]]] = {}
        for meta, _ in outputs:
            for r in meta.ranges:
                covered.setdefault(r.stream_id, []).append((r.start_offset, r.end_offset))
        for sid, spans in covered.items():
            spans.sort()
            joined: list[tuple[int, int]] = []
            for a, b in spans:
                if joined and a < joined[-1][1]:
                    raise CorruptionError(f"compaction outputs overlap in stream {sid}: {spans}")
                if joined and a == joined[-1][1]:
                    # Outputs cut at the size limit continue each other.
                    joined[-1] = (joined[-1][0], b)
                else:
                    joined.append((a, b))
            covered[sid] = joined
        for obj in task.replaced:
            for rng in obj.ranges:
                keep = keep_from(state, rng.stream_id)
                if keep is None or rng.end_offset <= keep:
                    continue
                live = [
                    b for b in batches.get((obj.key, rng.stream_id), ()) if b.next_offset > keep
                ]
                lo = live[0].base_offset if live else None
                hi = live[-1].next_offset if live else None
                if (
                    lo is None
                    or hi is None
                    or lo > max(keep, rng.start_offset)
                    or hi < rng.end_offset
                    or not any(a <= lo and hi <= b for a, b in covered.get(rng.stream_id, []))
                ):
                    raise CorruptionError(
                        f"compaction would lose live data of stream {rng.stream_id} in "
                        f"{obj.key} [{max(keep, rng.start_offset)}, {rng.end_offset}) "
                        f"(outputs hold {covered.get(rng.stream_id, [])}); nothing was changed",
                        location=obj.key,
                    )

    def _delete(self, keys: list[str]) -> None:
        if not keys:
            return
        try:
            self._store.delete_many(keys)
        except S3StreamError as exc:
            # Harmless: unreferenced objects are orphans the sweeper removes later.
            log.warning("could not delete aborted compaction outputs %s: %s", keys, exc)
