"""Reading data blocks out of objects: the one place their ranged GETs are sent.

Roles:

- `coalesce` — the merge rule: which blocks one ranged GET fetches together (a gap of at most
  `max_gap_bytes` between neighbours, a GET of at most `max_run_bytes`).
- `BlockReader` — a store and a merge rule bound together: `runs` plans the GETs, `fetch`
  sends one and checks that exactly the run's bytes came back, `read` does both and decodes.
  The block cache, the compaction executor and the Spark fetcher each hold one with their own
  limits; they differ in what they do around a GET (rate limits, counters, threads), never in
  how the GET is cut, sent or checked.
- `split_run`, `decode_run` — the stored bytes of each block of a fetched run, and their
  batches (no I/O: the Spark fetcher decodes on another thread than the one that GETs).
- `read_blocks` — fetch and decode blocks in one call (adjacent blocks only, no size cap).

Index and footer reads are not here: `objects.read_index` sends those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import InvalidArgumentError
from ..objectstore.base import ObjectStore
from ..types import FetchedBatch
from ..validation import check_int
from .block import BlockInfo, corrupt, decode_block

__all__ = ["BlockReader", "coalesce", "decode_run", "read_blocks", "split_run"]

#: Told the size of every GET response before it is checked (meters count a short read too).
OnResponse = Callable[[int], None]


def coalesce(
    blocks: Sequence[BlockInfo], max_gap_bytes: int = 0, *, max_run_bytes: int | None = None
) -> list[list[BlockInfo]]:
    """Group consecutive `blocks` into runs that one ranged GET can fetch.

    A block joins the previous run when it starts at most `max_gap_bytes` after the run's end
    (0: only exactly adjacent blocks; the gap's bytes are read and dropped) and the run then
    spans at most `max_run_bytes` (None: no limit). A block larger than that is a run of its
    own: blocks are never split. The given order is kept, so a block before the end of the
    previous one starts a new run; sort by position first to merge all that can be.
    """
    check_int("max_gap_bytes", max_gap_bytes)
    if max_run_bytes is not None:
        check_int("max_run_bytes", max_run_bytes, minimum=1)
    runs: list[list[BlockInfo]] = []
    for b in blocks:
        if runs:
            run = runs[-1]
            gap = b.position - run[-1].end_position
            if 0 <= gap <= max_gap_bytes and (
                max_run_bytes is None or b.end_position - run[0].position <= max_run_bytes
            ):
                run.append(b)
                continue
        runs.append([b])
    return runs


def split_run(run: Sequence[BlockInfo], data: bytes) -> list[memoryview]:
    """The stored bytes of each block of `run`, as views of `data` (the run's GET, as
    `BlockReader.fetch` returned it: from the first block's position)."""
    start = run[0].position
    view = memoryview(data)
    return [view[b.position - start : b.end_position - start] for b in run]


def decode_run(key: str, run: Sequence[BlockInfo], data: bytes) -> list[list[FetchedBatch]]:
    """The batches of each block of `run` of object `key` (checked, see `decode_block`);
    their payloads are views of `data`."""
    return [
        decode_block(stored, b, key) for b, stored in zip(run, split_run(run, data), strict=True)
    ]


class BlockReader:
    """Ranged GETs of data blocks from the objects of one store, merged by one rule.

    Holds nothing but its settings, so one instance serves every thread of its owner.
    """

    __slots__ = ("_max_gap", "_max_run", "_store")

    def __init__(
        self,
        store: ObjectStore,
        *,
        max_gap_bytes: int = 0,
        max_run_bytes: int | None = None,
    ) -> None:
        """Reader of `store` that merges blocks per `coalesce`'s rule with these limits."""
        self._store = store
        self._max_gap = check_int("max_gap_bytes", max_gap_bytes)
        if max_run_bytes is not None:
            check_int("max_run_bytes", max_run_bytes, minimum=1)
        self._max_run = max_run_bytes

    @property
    def store(self) -> ObjectStore:
        """The store blocks are read from."""
        return self._store

    def runs(self, blocks: Sequence[BlockInfo]) -> list[list[BlockInfo]]:
        """`blocks` (in the order given) grouped into runs of one GET each, by this reader's
        limits."""
        return coalesce(blocks, self._max_gap, max_run_bytes=self._max_run)

    def fetch(
        self, key: str, run: Sequence[BlockInfo], *, on_response: OnResponse | None = None
    ) -> bytes:
        """The bytes of object `key` from the first block of `run` to the end of its last: one
        ranged GET. `on_response` is told how many bytes came back before they are checked.

        Raises `CorruptionError` naming `key` and the byte range when the store returns fewer
        bytes (the object ends early) or more than asked; `ObjectNotFoundError` and the
        store's other errors pass through.
        """
        if not run:
            raise InvalidArgumentError("a run needs at least one block")
        start, end = run[0].position, run[-1].end_position
        data = self._store.get(key, start, end)
        if on_response is not None:
            on_response(len(data))
        n = len(data)
        if n < end - start:
            raise corrupt(
                key,
                start + n,
                f"object ends before byte {end} (a GET of bytes [{start}, {end}) returned {n})",
            )
        if n > end - start:
            raise corrupt(
                key, start, f"a GET of bytes [{start}, {end}) returned {n} bytes, more than asked"
            )
        return data

    def read(self, key: str, blocks: Sequence[BlockInfo]) -> list[FetchedBatch]:
        """Fetch and decode `blocks` of object `key`, one GET per run; the batches of all
        blocks, in the order the blocks were given."""
        out: list[FetchedBatch] = []
        for run in self.runs(blocks):
            for batches in decode_run(key, run, self.fetch(key, run)):
                out.extend(batches)
        return out

    def __repr__(self) -> str:
        return (
            f"BlockReader({self._store.describe()}, max_gap_bytes={self._max_gap}, "
            f"max_run_bytes={self._max_run})"
        )


def read_blocks(store: ObjectStore, key: str, blocks: Sequence[BlockInfo]) -> list[FetchedBatch]:
    """Fetch and decode `blocks` of object `key`: one ranged GET per run of adjacent blocks.

    Returns the batches of all blocks, in the order the blocks were given.
    """
    return BlockReader(store).read(key, blocks)
