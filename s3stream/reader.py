"""`StreamReader`: read what a store has committed, without ever writing to it.

A `StreamClient` is a node: it registers in the metadata log, opens a WAL and runs an uploader,
so it cannot open a store it may not write (a read-only directory or file system, a bucket with
read-only credentials), and using one to look changes what it looks at. `StreamReader` loads the
metadata log (pointer, checkpoint, later entries: reads only), lists streams and objects, and
reads committed batches and records through a `BlockCache` and the same `ObjectDataReader` a
client uses. It starts no thread and writes nothing, ever; `open_reader` opens one by URL. The
CLI's ``inspect``, ``dump`` and ``verify`` use it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._closeable import Closeable
from ._registry import split_scheme
from .cache.block_cache import BlockCache
from .clock import Clock, SystemClock
from .errors import (
    InvalidArgumentError,
    OffsetOutOfRangeError,
    StreamClosedError,
)
from .metadata import MetadataManager, MetadataState
from .objectstore.base import ObjectStore
from .objectstore.registry import open_object_store
from .objectstore.stack import store_stack
from .records import Record, records_in
from .settings import ClientSettings
from .storage.reader import ObjectDataReader
from .types import FetchResult, StreamInfo
from .validation import check_instance, check_int, check_read_args, check_str_map, check_text

__all__ = [
    "ObjectSummary",
    "StreamReader",
    "open_reader",
    "open_reader_store",
    "read_committed_range",
]


@dataclass(frozen=True, slots=True)
class ObjectSummary:
    """A data object the metadata lists: live, or replaced and awaiting deletion."""

    key: str
    size: int
    kind: str
    node_id: str
    level: int
    #: The streams it holds: (stream_id, start_offset, end_offset).
    ranges: tuple[tuple[int, int, int], ...]
    #: False once compaction or retention replaced it (deleted after the deletion delay).
    live: bool


class StreamReader(Closeable):
    """Read-only view of a store's committed streams (see the module docstring).

    Each call that looks at streams first applies entries committed since the last look, so a
    long-lived reader follows the writers. Thread-safe.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        metadata_prefix: str = "meta",
        settings: ClientSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        check_instance("store", store, ObjectStore)
        check_text("metadata_prefix", metadata_prefix, allow_empty=False)
        check_instance("settings", settings, ClientSettings, allow_none=True)
        check_instance("clock", clock, Clock, allow_none=True)
        self._settings = settings if settings is not None else ClientSettings()
        self._store = store
        self._meta = MetadataManager(
            store,
            clock=clock if clock is not None else SystemClock(),
            writer_id="reader",  # never used: a reader commits nothing
            prefix=metadata_prefix,
        )
        self._meta.load()
        self._cache = BlockCache(store, capacity_bytes=self._settings.block_cache_bytes)
        self._objects = ObjectDataReader(self._cache)
        self._closed = False

    @property
    def metadata(self) -> MetadataManager:
        """The loaded metadata log (read it; a reader never commits)."""
        return self._meta

    @property
    def object_store(self) -> ObjectStore:
        """The store read from."""
        return self._store

    def refresh(self) -> bool:
        """Apply entries committed since the last look; True if there were any."""
        self._check_open()
        return self._meta.refresh()

    def snapshot(self, *, refresh: bool = True) -> MetadataState:
        """The committed metadata as one immutable `MetadataState` (its `seq` names the log
        entry it reflects), after a `refresh` unless `refresh` is False. Planners that make
        several decisions from one view (the Spark source) take it once instead of looking
        at the reader call by call, which could move on between the calls."""
        self._check_open()
        if refresh:
            self._meta.refresh()
        return self._meta.state

    def list_streams(self, tags: Mapping[str, str] | None = None) -> list[StreamInfo]:
        """Streams (not deleted) whose tags include all of `tags`, by id."""
        tags = check_str_map("tags", tags, allow_none=True)
        self.refresh()
        return [m.to_info() for m in self._meta.list_streams(tags or None)]

    def stream_info(self, stream_id: int) -> StreamInfo:
        """Committed metadata of one stream (`StreamNotFoundError` if there is none)."""
        check_int("stream_id", stream_id)
        self.refresh()
        return self._meta.get_stream(stream_id).to_info()

    def read(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int | None = None,
        *,
        max_bytes: int = 1 << 20,
    ) -> FetchResult:
        """Committed batches of the stream covering ``[start_offset, end_offset)``, about
        `max_bytes` (at least one batch when any data lies there), as `Stream.fetch`."""
        check_int("stream_id", stream_id)
        start, end_arg, max_bytes = check_read_args(start_offset, end_offset, max_bytes)
        self._check_open()
        return read_committed_range(self._meta, self._objects, stream_id, start, end_arg, max_bytes)

    def read_records(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int | None = None,
        *,
        max_bytes: int = 1 << 20,
    ) -> Iterator[tuple[int, Record]]:
        """``(offset, record)`` for every committed record in the range, as
        `Stream.read_records` (batches fetched lazily, about `max_bytes` at a time)."""
        first = self.read(stream_id, start_offset, end_offset, max_bytes=max_bytes)
        end = self._meta.get_stream(stream_id).end_offset
        if end_offset is not None:
            end = min(end, end_offset)
        pages = {start_offset: first}

        def fetch(pos: int) -> FetchResult:
            # One refresh per scan (the first page's): the range is fixed at the call.
            page = pages.pop(pos, None)
            if page is not None:
                return page
            return read_committed_range(
                self._meta, self._objects, stream_id, pos, end, max_bytes, refresh=False
            )

        return records_in(fetch, start_offset, end)

    def objects(self) -> list[ObjectSummary]:
        """Every data object the metadata lists, live ones and those awaiting deletion."""
        self.refresh()
        return [
            ObjectSummary(
                key=o.key,
                size=o.size,
                kind=o.kind.value,
                node_id=o.node_id,
                level=o.level,
                ranges=tuple((r.stream_id, r.start_offset, r.end_offset) for r in o.ranges),
                live=o.live,
            )
            for o in sorted(self._meta.state.objects.values(), key=lambda o: o.key)
        ]

    def close(self) -> None:
        """Drop the caches and close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cache.close()
        self._store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosedError("the reader is closed")


def read_committed_range(
    meta: MetadataManager,
    objects: ObjectDataReader,
    stream_id: int,
    start: int,
    end: int | None,
    max_bytes: int,
    *,
    refresh: bool = True,
) -> FetchResult:
    """What a non-owner reads: the committed batches of ``[start, end)`` after a refresh (the
    one implementation behind `StreamReader.read` and `StreamClient.read`). Arguments are
    checked already. `refresh=False` reads on the snapshot already loaded (the later pages of
    one scan)."""
    if refresh:
        meta.refresh()
    m = meta.get_stream(stream_id)
    stop = m.end_offset if end is None else min(end, m.end_offset)
    if not m.start_offset <= start <= m.end_offset:
        raise OffsetOutOfRangeError(
            f"offset {start} is outside [{m.start_offset}, {m.end_offset}] of stream {stream_id}"
        )
    if start >= stop:
        return FetchResult([], start)
    batches = objects.read_latest(meta, stream_id, start, stop, max_bytes)
    return FetchResult(batches, batches[-1].next_offset if batches else start)


def open_reader(
    url: str | Path,
    *,
    storage_options: Mapping[str, Any] | None = None,
    settings: ClientSettings | None = None,
    metadata_prefix: str = "meta",
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> StreamReader:
    """A `StreamReader` for the store `url` names (a local directory, ``s3://bucket/prefix``,
    any fsspec URL). Needs read access only; a local directory that does not exist is an
    `InvalidArgumentError`, not created."""
    clock = clock if clock is not None else SystemClock()
    store = open_reader_store(
        url, storage_options=storage_options, settings=settings, clock=clock, rng=rng
    )
    try:
        return StreamReader(store, metadata_prefix=metadata_prefix, settings=settings, clock=clock)
    except BaseException:
        store.close()
        raise


def open_reader_store(
    url: str | Path,
    *,
    storage_options: Mapping[str, Any] | None = None,
    settings: ClientSettings | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> ObjectStore:
    """The object store `open_reader` reads through (retries and timeouts of `settings`),
    without loading the metadata: for a reader of planned objects that builds a
    `StreamReader` on it only when it needs the metadata (a Spark task). The same checks as
    `open_reader`; the caller closes it."""
    if isinstance(url, Path):
        url = str(url)
    check_text("url", url, allow_empty=False)
    check_instance("settings", settings, ClientSettings, allow_none=True)
    check_instance("clock", clock, Clock, allow_none=True)
    check_instance("rng", rng, random.Random, allow_none=True)
    _require_existing_directory(url)
    return store_stack(
        open_object_store(url, storage_options),
        clock=clock if clock is not None else SystemClock(),
        rng=rng if rng is not None else random.Random("s3stream:reader"),
        timeout_s=(settings if settings is not None else ClientSettings()).store_timeout_ms
        / 1000,
    )


def _require_existing_directory(url: str) -> None:
    scheme, rest = split_scheme(url)
    if scheme == "file" and not Path(rest).expanduser().is_dir():
        raise InvalidArgumentError(f"{url!r} is not a directory holding a store")
