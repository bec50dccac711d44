"""Executor side, I/O: ranged GETs of the blocks a partition names, a few in flight at once.

The GETs are the shared `BlockReader`'s (adjacent blocks of a slice merged up to
`max_run_bytes`, each response checked for length); this module only schedules them: a few
in flight on a thread pool, decoded in order on the consuming thread.

If a planned object is gone when a task reads it (compaction replaced it and its retention
delay passed), the task asks a `Relocator` for the same offsets from the live objects: the
records did not change, only where they are stored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from .._futures import StopAtOutage
from ..errors import ObjectNotFoundError, OffsetOutOfRangeError
from ..format.block import BlockInfo
from ..format.block_reader import BlockReader, decode_run
from ..objectstore.base import ObjectStore
from ..types import FetchedBatch
from .planning import ReadSlice

__all__ = ["DEFAULT_MAX_RUN_BYTES", "Relocator", "fetch_slices"]

#: Largest ranged GET: adjacent blocks are fetched together up to this many bytes.
DEFAULT_MAX_RUN_BYTES = 8 << 20


#: ``relocate(stream_id, start, end) -> (batches, first)``: the batches holding ``[first, end)``
#: of a stream, read from the objects live now; `first` > `start` when offsets below it are
#: gone (trimmed; `end` when the stream was deleted).
Relocator = Callable[[int, int, int], tuple[list[FetchedBatch], int]]


@dataclass(frozen=True, slots=True)
class _Run:
    """Adjacent blocks of one slice, fetched with one ranged GET."""

    slice_index: int
    key: str
    blocks: tuple[BlockInfo, ...]


def _runs(slices: Sequence[ReadSlice], reader: BlockReader) -> list[_Run]:
    """The GETs of `slices`, in order: each slice's blocks grouped by `reader`'s rule."""
    return [
        _Run(i, s.key, tuple(run)) for i, s in enumerate(slices) for run in reader.runs(s.blocks)
    ]


def _decode(run: _Run, data: bytes) -> list[FetchedBatch]:
    return [b for batches in decode_run(run.key, run.blocks, data) for b in batches]


def fetch_slices(
    store: ObjectStore,
    slices: Sequence[ReadSlice],
    *,
    concurrency: int,
    fail_on_data_loss: bool,
    relocate: Relocator | None = None,
    max_run_bytes: int = DEFAULT_MAX_RUN_BYTES,
) -> Iterator[tuple[ReadSlice, list[FetchedBatch]]]:
    """Fetch and decode the blocks of `slices`, in order, with `concurrency` GETs in flight.

    Yields ``(slice, batches)`` per ranged GET; batches may extend beyond the slice's offsets
    (whole blocks), the caller clips them. When an object no longer exists, `relocate` reads
    the same offsets from the live objects; offsets that are truly gone (trimmed) raise
    `OffsetOutOfRangeError` when `fail_on_data_loss`, else they are skipped.
    """
    reader = BlockReader(store, max_run_bytes=max_run_bytes)
    runs = _runs(slices, reader)
    if not runs:
        return
    pool = ThreadPoolExecutor(max(1, min(concurrency, len(runs))), "s3stream-fetch")
    guard = StopAtOutage()
    try:
        # Threads only GET (the GIL is free while they wait); decoding stays on the consuming
        # thread, since Python work spread over threads costs more in GIL hand-overs.
        pending: deque[tuple[_Run, Future[bytes]]] = deque()
        todo = iter(runs)
        for run in todo:
            pending.append((run, pool.submit(guard.call, reader.fetch, run.key, run.blocks)))
            if len(pending) >= concurrency:
                break
        while pending:
            run, fut = pending.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(guard.call, reader.fetch, nxt.key, nxt.blocks)))
            s = slices[run.slice_index]
            try:
                batches = _decode(run, fut.result())
            except ObjectNotFoundError as exc:
                start = max(s.start_offset, run.blocks[0].start_offset)
                end = min(s.end_offset, run.blocks[-1].end_offset)
                batches, first = relocate(s.stream_id, start, end) if relocate else ([], end)
                if first > start and fail_on_data_loss:
                    raise OffsetOutOfRangeError(
                        f"offsets {start}..{end} of stream {s.stream_id} are gone: object "
                        f"{run.key} was deleted and they were trimmed meanwhile; set "
                        "failOnDataLoss=false to skip lost data"
                    ) from exc
                # The live objects' blocks may reach into other runs' offsets: clip.
                s = replace(s, start_offset=first, end_offset=end)
            yield s, batches
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
