"""The read path of the owning client: the LogCache first, then committed objects.

The hot tail (acknowledged, maybe not uploaded yet) is served from the LogCache; below what
it holds, `ObjectDataReader` reads objects found through the metadata. A hole between the
two (objects end before the cache begins) is reported as missing data, never skipped.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from ..cache.log_cache import LogCache
from ..clock import Clock
from ..metadata import MetadataManager
from ..metrics.components import StorageInstruments
from ..types import FetchedBatch
from .reader import ObjectDataReader, missing_data

__all__ = ["ReadPath"]

_SIZE = operator.attrgetter("size")


class ReadPath:
    """Reads a stream's batches for the client that owns the pipeline."""

    def __init__(
        self,
        *,
        cache: LogCache,
        meta: MetadataManager,
        objects: ObjectDataReader,
        clock: Clock,
        instruments: StorageInstruments,
    ) -> None:
        self._cache = cache
        self._meta = meta
        self._objects = objects
        self._mono = clock.monotonic
        self._ins = instruments

    @property
    def objects(self) -> ObjectDataReader:
        """Reads committed batches from objects (shared with read-only readers)."""
        return self._objects

    def read(self, stream_id: int, start: int, end: int, max_bytes: int) -> list[FetchedBatch]:
        """Batches of the stream overlapping ``[start, end)``: at least one, about `max_bytes`."""
        started = self._mono()
        out, nbytes = self._read(stream_id, start, end, max_bytes)
        self.record_fetch(started, out, nbytes)
        return out

    def record_fetch(
        self,
        started: float,
        batches: Sequence[FetchedBatch],
        nbytes: int,
        *,
        from_objects: bool = False,
    ) -> None:
        """Count a fetch that began at `started` (the clock's monotonic seconds) and returned
        `batches` of `nbytes` bytes; also for the client's reads of streams it does not own
        (`from_objects`: read past the LogCache, which holds only this client's streams, so
        a miss of it when it returned batches, as the read path counts its own)."""
        if from_objects and batches:
            self._ins.log_miss.add()
        # A stream's batches are contiguous in offsets: the records are the span.
        records = batches[-1].next_offset - batches[0].base_offset if batches else 0
        self._ins.fetch.record(self._mono() - started, nbytes, records)

    def _read(
        self, stream_id: int, start: int, end: int, max_bytes: int
    ) -> tuple[list[FetchedBatch], int]:
        """The batches and their total size (each batch's size added once)."""
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
                remaining -= sum(map(_SIZE, got))
                break
            first_cached = self._cache.first_offset(stream_id)
            obj_end = end if first_cached is None else min(end, max(first_cached, pos + 1))
            got = self._objects.read_latest(self._meta, stream_id, pos, obj_end, max(remaining, 1))
            if not got:
                if first_cached is not None and first_cached > pos:
                    raise missing_data(self._meta.state, stream_id, pos, first_cached, "")
                break
            ins.log_miss.add()
            out.extend(got)
            pos = got[-1].next_offset
            remaining -= sum(map(_SIZE, got))
            if remaining <= 0:
                break
        return out, max_bytes - remaining
