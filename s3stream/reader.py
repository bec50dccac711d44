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

import contextlib
import os
import random
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._closeable import Closeable
from ._registry import path_url, split_scheme
from .cache.block_cache import BlockCache
from .clock import Clock, SystemClock
from .errors import (
    InvalidArgumentError,
    StreamClosedError,
    UnavailableError,
)
from .metadata import ExternalMetadataLog, MetadataLogStore, MetadataManager, MetadataState
from .metadata.binding import bind_log
from .metadata.log import MetadataLog
from .metadata.marker import check_not_bound_elsewhere, marker_key
from .metadata.registry import check_metadata_url, open_metadata_log
from .objectstore.base import ObjectStore
from .objectstore.local import LocalObjectStore, check_local_url, is_temp_name
from .objectstore.registry import open_object_store
from .objectstore.stack import store_stack
from .records import Record, batch_records, records_in
from .settings import ClientSettings
from .settings_parse import settings_from_mapping
from .storage.packing import DEFAULT_DATA_PREFIX
from .storage.reader import ObjectDataReader
from .storage.seek import check_timestamp, seek_committed
from .types import FetchedBatch, FetchResult, StreamInfo
from .validation import (
    check_bool,
    check_instance,
    check_int,
    check_offset_in_range,
    check_poll,
    check_read_args,
    check_str_map,
    check_text,
    check_timeout,
)
from .wal.holder import LOCK_SUFFIX

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ObjectSummary",
    "StreamReader",
    "foreign_entries",
    "holds_store",
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

    `metadata` is where the metadata log lives, as for `StreamClient`: None (in the store), a
    URL (``postgresql://...``) or a `MetadataLogStore`; the reader owns and closes it, and
    checks, without writing, that it belongs to this store.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        metadata_prefix: str = "meta",
        settings: ClientSettings | None = None,
        clock: Clock | None = None,
        metadata: str | MetadataLogStore | None = None,
    ) -> None:
        check_instance("store", store, ObjectStore)
        check_text("metadata_prefix", metadata_prefix, allow_empty=False)
        check_instance("settings", settings, ClientSettings, allow_none=True)
        check_instance("clock", clock, Clock, allow_none=True)
        if not isinstance(metadata, MetadataLogStore):
            check_metadata_url(metadata)
        self._settings = settings if settings is not None else ClientSettings()
        self._store = store
        self._clock = clock if clock is not None else SystemClock()
        log = open_metadata_log(
            metadata, store=store, prefix=metadata_prefix, settings=self._settings
        )
        self._meta = MetadataManager(
            log,
            clock=self._clock,
            writer_id="reader",  # never used: a reader commits nothing
        )
        try:
            bind_log(log, store, metadata_prefix, create=False)
            self._meta.load()
            if self._meta.seq == 0 and not isinstance(log, ExternalMetadataLog):
                # An empty log in the store: is the metadata elsewhere (one GET)?
                check_not_bound_elsewhere(store, metadata_prefix)
        except BaseException:
            log.close()
            raise
        self._cache = BlockCache(store, capacity_bytes=self._settings.block_cache_bytes)
        self._objects = ObjectDataReader(self._cache)
        self._closed = False
        #: Tails wait on it between polls of the metadata log; `close` wakes them.
        self._wake = threading.Condition()

    @property
    def settings(self) -> ClientSettings:
        """The settings this reader reads with (caches, `tail_poll_ms`)."""
        return self._settings

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
        wait_s: float | None = None,
    ) -> FetchResult:
        """Committed batches of the stream covering ``[start_offset, end_offset)``, about
        `max_bytes` (at least one batch when any data lies there), as `Stream.fetch`.

        With `wait_s`, when nothing is committed at `start_offset` yet, waits up to `wait_s`
        seconds for a commit, following the metadata log every ``settings.tail_poll_ms``
        (a long poll; empty on timeout or when the reader closes).
        """
        check_int("stream_id", stream_id)
        start, end_arg, max_bytes = check_read_args(start_offset, end_offset, max_bytes)
        wait = check_timeout("wait_s", wait_s)
        self._check_open()
        if not wait:
            return read_committed_range(
                self._meta, self._objects, stream_id, start, end_arg, max_bytes
            )
        return self._read_waiting(
            stream_id, start, end_arg, max_bytes, wait, self._settings.tail_poll_ms / 1000
        )

    def _read_waiting(
        self, stream_id: int, start: int, end: int | None, max_bytes: int, wait: float, poll: float
    ) -> FetchResult:
        """`read`, looking at the log again every `poll` seconds for up to `wait` seconds
        while nothing is committed at `start`."""
        deadline = self._clock.monotonic() + wait
        known = self._meta.state.streams.get(stream_id)
        # Look at the log only once caught up with what it said last time.
        refresh = known is None or start >= known.end_offset
        while True:
            try:
                result = read_committed_range(
                    self._meta, self._objects, stream_id, start, end, max_bytes, refresh=refresh
                )
            except UnavailableError as exc:
                # Closing the reader closes its store under a read: the read failed because
                # the reader closed, which is no outage to retry (and ends a tail cleanly).
                # Damage (`CorruptionError`) is raised as it is, close or not.
                if self._closed:
                    raise StreamClosedError("the reader is closed") from exc
                raise
            if result.batches or (end is not None and start >= end):
                return result
            if not refresh:
                refresh = True  # the snapshot promised data it did not have: look again
                continue
            remaining = deadline - self._clock.monotonic()
            with self._wake:
                if self._closed or remaining <= 0:
                    return result
                self._wake.wait(min(poll, remaining))

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

    def offset_for_timestamp(self, stream_id: int, ts_ms: int) -> int | None:
        """The first committed offset of the stream whose timestamp is >= `ts_ms`
        (milliseconds since the epoch, any i64), or None; as `Stream.offset_for_timestamp`,
        over ``[start_offset, end_offset)`` of the latest metadata. Reads the object indexes
        it needs through the reader's cache, and at most one block (docs/consuming.md)."""
        check_int("stream_id", stream_id)
        ts = check_timestamp("ts_ms", ts_ms)
        self._check_open()
        self._meta.refresh()
        m = self._meta.get_stream(stream_id)
        return seek_committed(self._meta, self._cache, stream_id, m.start_offset, m.end_offset, ts)

    def tail(
        self,
        stream_id: int,
        start_offset: int,
        *,
        max_bytes: int = 1 << 20,
        poll_s: float | None = None,
    ) -> Iterator[FetchedBatch]:
        """Every committed batch of the stream from `start_offset` on, blocking for new ones.

        A batch appears once its upload is committed to the metadata log, which this follows:
        every `poll_s` seconds (default ``settings.tail_poll_ms``) while caught up, it reads
        the log's next entry (a GET, and a HEAD of the last one seen: no LIST). Each batch is
        delivered once, in offset order. Ends cleanly when the reader closes; raises
        `OffsetOutOfRangeError` if a trim passes the position, `StreamNotFoundError` if the
        stream is deleted, and `UnavailableError` if a read of the store fails past its
        retries (``store_timeout_ms``): a tail that should outlive outages catches it and
        starts again from the offset it reached.
        """
        check_int("stream_id", stream_id)
        pos = check_int("start_offset", start_offset)
        check_int("max_bytes", max_bytes, minimum=1)
        poll = (
            self._settings.tail_poll_ms / 1000 if poll_s is None else check_poll("poll_s", poll_s)
        )
        self._check_open()
        return self._tail(stream_id, pos, max_bytes, poll)

    def _tail(
        self, stream_id: int, pos: int, max_bytes: int, poll: float
    ) -> Iterator[FetchedBatch]:
        while True:
            try:
                self._check_open()
                result = self._read_waiting(stream_id, pos, None, max_bytes, poll, poll)
            except StreamClosedError:
                return  # the reader closed
            yield from result.batches
            pos = result.next_offset

    def tail_records(
        self,
        stream_id: int,
        start_offset: int,
        *,
        max_bytes: int = 1 << 20,
        poll_s: float | None = None,
    ) -> Iterator[tuple[int, Record]]:
        """``(offset, record)`` from `start_offset` on, as `tail` delivers committed batches
        (a RAW batch is one record at its base offset, as in `read_records`)."""
        start = check_int("start_offset", start_offset)
        batches = self.tail(stream_id, start, max_bytes=max_bytes, poll_s=poll_s)
        return (record for batch in batches for record in batch_records(batch, start))

    def read_arrow(
        self,
        stream_ids: int | Iterable[int] | None = None,
        start: int | Mapping[int, int] | None = None,
        end: int | Mapping[int, int] | None = None,
        *,
        start_timestamp: int | None = None,
        end_timestamp: int | None = None,
        tags: Mapping[str, str] | None = None,
        include_headers: bool = False,
        topic_tag: str = "topic",
        partition_tag: str = "partition",
        batch_rows: int = 65536,
        max_bytes: int = 1 << 20,
    ) -> pa.RecordBatchReader:
        """Committed records as a `pyarrow.RecordBatchReader`, with the Spark source's columns
        and values: one code path, the Spark source's decoder (`s3stream.arrow`; docs/arrow.md).

        Streams: `stream_ids` (an id or several), else every stream, in both cases only those
        whose tags include all of `tags`; rows come stream by stream, by id, in offset order.
        Offsets: ``[start, end)``, each one offset for every stream or a mapping of stream id
        to offset (a stream it leaves out: from its start offset, to its end), clipped to what
        each stream holds, from `start_offset` to the end committed when this is called: this
        is a scan, so offsets trimmed away or not yet written are no error. A RAW batch is one
        row at its base offset, in the range holding that offset (as `read_records`).

        Time (ms since the epoch): `start_timestamp` moves each stream's start up to its first
        offset whose timestamp is >= it (`offset_for_timestamp`; no rows if none is), and
        `end_timestamp` its end down to the first offset whose timestamp is >= that, as the
        Spark source's ``startingTimestamp`` and ``endingTimestamp``: a range of offsets, not
        a filter on the ``timestamp`` column (timestamps need not grow with offsets).

        `include_headers` adds the ``headers`` column; `topic_tag` and `partition_tag` name the
        tags behind ``topic`` and ``partition`` (Spark's ``topicTag``, ``partitionTag``).
        A record batch holds one stream's rows and closes once it reaches `batch_rows` (an
        appended batch is never split). Objects are read about `max_bytes` at a time, only
        those holding the chosen offsets, as the reader is consumed. Needs pyarrow:
        ``pip install 's3stream[arrow]'`` (else an `ImportError` says so).
        """
        from .arrow import range_slices, record_batch_reader

        for name, ts in (("start_timestamp", start_timestamp), ("end_timestamp", end_timestamp)):
            if ts is not None:
                check_timestamp(name, ts)
        check_str_map("tags", tags, allow_none=True)
        check_bool("include_headers", include_headers)
        check_text("topic_tag", topic_tag)
        check_text("partition_tag", partition_tag)
        check_int("batch_rows", batch_rows, minimum=1)
        check_int("max_bytes", max_bytes, minimum=1)
        slices = range_slices(
            self.snapshot(), stream_ids, start, end,
            start_timestamp=start_timestamp, end_timestamp=end_timestamp,
            seek=self.offset_for_timestamp,
            tags=tags, topic_tag=topic_tag, partition_tag=partition_tag,
            location=self._store.describe(),
        )  # fmt: skip

        def read(stream_id: int, pos: int, stop: int) -> FetchResult:
            # On the snapshot taken above (no refresh per page): the range is fixed at the call.
            self._check_open()
            return read_committed_range(
                self._meta, self._objects, stream_id, pos, stop, max_bytes, refresh=False
            )

        return record_batch_reader(
            slices, read, include_headers=include_headers, batch_rows=batch_rows
        )

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
        with self._wake:
            if self._closed:
                return
            self._closed = True
            self._wake.notify_all()
        # Readahead under way waits on the store: for a store timeout at most, not longer
        # than a call may take.
        self._cache.close(self._settings.call_limit_s())
        self._store.close()
        self._meta.log.close()

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
    check_offset_in_range(stream_id, start, m.start_offset, m.end_offset)
    if start >= stop:
        return FetchResult([], start)
    batches = objects.read_latest(meta, stream_id, start, stop, max_bytes)
    return FetchResult(batches, batches[-1].next_offset if batches else start)


def open_reader(
    url: str | Path,
    *,
    storage_options: Mapping[str, Any] | None = None,
    settings: ClientSettings | Mapping[str, Any] | None = None,
    metadata_prefix: str = "meta",
    clock: Clock | None = None,
    rng: random.Random | None = None,
    metadata: str | MetadataLogStore | None = None,
) -> StreamReader:
    """A `StreamReader` for the store `url` names (a local directory, ``s3://bucket/prefix``,
    any fsspec URL). Needs read access only; a local directory that does not exist is an
    `InvalidArgumentError`, not created. `metadata`: where the metadata log lives, if not in
    the store (``postgresql://...``, as `s3stream.open` takes it). A remote prefix that holds
    no store is an `InvalidArgumentError` too (two HEADs): a prefix has no "missing" of its
    own, so a typo in it would read as an empty store. `settings`: a `ClientSettings`, or a
    mapping of setting names to values (``{"call_timeout_ms": "5s"}``), as `s3stream.open`
    takes them (the environment's ``S3STREAM_*`` are not read here)."""
    if isinstance(settings, Mapping):
        settings = settings_from_mapping(ClientSettings, settings)
    if isinstance(url, Path):
        url = path_url(url)
    if not isinstance(metadata, MetadataLogStore):
        check_metadata_url(metadata)
    clock = clock if clock is not None else SystemClock()
    store = open_reader_store(
        url,
        storage_options=storage_options,
        settings=settings,
        clock=clock,
        rng=rng,
        metadata_prefix=metadata_prefix,
    )
    try:
        if split_scheme(str(url))[0] not in ("file", "memory"):
            _require_held_store(store, str(url), metadata_prefix)
        return StreamReader(
            store,
            metadata_prefix=metadata_prefix,
            settings=settings,
            clock=clock,
            metadata=metadata,
        )
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
    metadata_prefix: str = "meta",
) -> ObjectStore:
    """The object store `open_reader` reads through (retries and timeouts of `settings`),
    without loading the metadata: for a reader of planned objects that builds a
    `StreamReader` on it only when it needs the metadata (a Spark task). The same checks as
    `open_reader` (`metadata_prefix` tells a store directory from somebody else's); the
    caller closes it."""
    if isinstance(url, Path):
        url = path_url(url)
    check_text("url", url, allow_empty=False)
    check_instance("settings", settings, ClientSettings, allow_none=True)
    check_instance("clock", clock, Clock, allow_none=True)
    check_instance("rng", rng, random.Random, allow_none=True)
    check_text("metadata_prefix", metadata_prefix, allow_empty=False)
    _require_existing_directory(url, metadata_prefix=metadata_prefix)
    return store_stack(
        open_object_store(url, storage_options),
        clock=clock if clock is not None else SystemClock(),
        rng=rng if rng is not None else random.Random("s3stream:reader"),
        timeout_s=(settings if settings is not None else ClientSettings()).store_timeout_ms / 1000,
    )


#: The folder of a local store's file WALs (`opening.OBJECT_WAL_DIR`'s local twin).
_WAL_DIR = "wal"
#: A file WAL and its lock file (``x.wal.lock``, and ``x.wal.lock.<pid>.<id>`` while a
#: take-over replaces it: `wal.holder`).
_WAL_FILE_NAME = re.compile(r".+\.wal(" + re.escape(LOCK_SUFFIX) + r"(\.[0-9]+\.[0-9a-f]+)?)?")
#: Top-level names of a local store directory that s3stream writes itself: the metadata log
#: (``meta``), the data objects (``data``, `DEFAULT_DATA_PREFIX`), the WALs (``wal``,
#: `opening.OBJECT_WAL_DIR`, not imported: opening imports this module). ``lost+found`` is
#: there when the store is the root of a file system of its own.
_STORE_NAMES = frozenset({"meta", DEFAULT_DATA_PREFIX, _WAL_DIR, "lost+found"})
#: What desktops leave in any folder they show (Finder, Explorer, a trash): not somebody's
#: files in the sense that matters here.
_DESKTOP_NAMES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini", ".directory"})


def holds_store(store: ObjectStore, metadata_prefix: str = "meta") -> bool:
    """Whether `store` holds an s3stream store: the first entry of its metadata log (every
    writing client's open registers its node there, and entries are never deleted), or the
    marker of a log kept elsewhere (`binding.bind_log` writes it at the first open). Two
    HEADs at most; writes nothing."""
    if MetadataLog(store, metadata_prefix).has_entry(1):
        return True
    return store.head(marker_key(metadata_prefix)) is not None


def foreign_entries(
    root: Path, metadata_prefix: str = "meta", *, wal_file: Path | None = None
) -> list[str]:
    """The names in the existing directory `root` that say it is somebody else's: those that
    are not s3stream's own (`_STORE_NAMES`), when `root` holds no store. Empty for an empty
    directory, a store, and what an interrupted first open leaves (``meta/``, ``wal/``, and
    the file WAL `wal_file` with its lock file if they lie in `root` itself)."""
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        raise InvalidArgumentError(
            f"cannot list the directory {str(root)!r}: {exc.strerror}"
        ) from exc
    meta_top = metadata_prefix.split("/", 1)[0]
    own = _STORE_NAMES | {meta_top}
    wal_name = None
    if wal_file is not None and os.path.realpath(wal_file.parent) == os.path.realpath(root):
        wal_name = wal_file.name
    others = [
        n
        for n in names
        if n not in own
        and n not in _DESKTOP_NAMES
        and not n.startswith(".Trash-")
        and not (wal_name is not None and _is_wal_file_of(n, wal_name))
    ]
    # A folder of ours by name may be the user's ("data" is a common name): before a store
    # exists, s3stream has put nothing in data/ (objects come after the node's registration,
    # the log's first entry), in the metadata folder at most temporary files, and in wal/
    # WAL files and their lock files. A symlinked one is looked into as well: objects would
    # be written into the folder it leads to.
    for top in {DEFAULT_DATA_PREFIX, meta_top}:
        found = _first_file(root / top, is_temp_name)
        if found is not None:
            others.append(found)
    found = _first_file(root / _WAL_DIR, _is_wal_file_name)
    if found is not None:
        others.append(found)
    if not others:
        return []
    with LocalObjectStore(root, fsync=False) as store:  # an existing directory: creates nothing
        return [] if holds_store(store, metadata_prefix) else others


def _first_file(top: Path, ours: Callable[[str], bool]) -> str | None:
    """The path (relative to `top`'s parent) of a file below the directory `top` (or the
    directory a symlink `top` leads to) whose name is not `ours`, or None (also when there is
    no `top`); `top` itself when it is there but no directory (a user's file named ``data``:
    the store took the directory for its own, and its uploads then failed for ever)."""
    try:
        if not top.is_dir():
            return top.name if os.path.lexists(top) else None
    except OSError:  # a name too long to exist (a long metadata prefix), a loop
        return None
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            if not ours(name):
                return os.path.relpath(os.path.join(dirpath, name), top.parent)
    return None


def _is_wal_file_name(name: str) -> bool:
    return _WAL_FILE_NAME.fullmatch(name) is not None


def _is_wal_file_of(name: str, wal_name: str) -> bool:
    """Whether `name` is the file WAL `wal_name` or one of its lock files (`_WAL_FILE_NAME`'s
    suffixes, for a WAL of any name)."""
    return name == wal_name or (
        name.startswith(wal_name + LOCK_SUFFIX)
        and _WAL_FILE_NAME.fullmatch("x.wal" + name[len(wal_name) :]) is not None
    )


def _require_existing_directory(
    url: str,
    *,
    store: bool = False,
    metadata_prefix: str = "meta",
    storage_options: Mapping[str, Any] | None = None,
    settings: ClientSettings | None = None,
) -> None:
    """Refuse a local directory that is missing, or that holds somebody else's files and no
    store (`foreign_entries`): reading it as an empty store would hide the mistake, and a
    tool that writes would add a store beside those files. `store` (a command that needs an
    existing store: the CLI's): refuse any place without one, an empty directory too, and a
    remote prefix or ``memory://`` (`_require_remote_store`, which opens the store with
    `storage_options` and `settings`' timeout)."""
    scheme, rest = split_scheme(url)
    if scheme != "file":
        if store:
            _require_remote_store(url, scheme, storage_options, settings, metadata_prefix)
        return
    check_local_url(url)
    root = Path(rest).expanduser()
    if not root.is_dir():
        # Both say "not a directory holding a store", the rule broken; the first says why.
        if not root.exists():
            raise InvalidArgumentError(
                f"{url!r} does not exist, so it is not a directory holding a store"
            )
        raise InvalidArgumentError(f"{url!r} is a file, not a directory holding a store")
    if store:
        with LocalObjectStore(root, fsync=False) as local:
            if holds_store(local, metadata_prefix):
                return
        _refuse_other_prefix(url, root, metadata_prefix)
        raise InvalidArgumentError(
            f"{url!r} holds no s3stream store (no metadata log under {metadata_prefix}/): "
            "name the directory of an existing store"
        )
    others = foreign_entries(root, metadata_prefix)
    if others:
        _refuse_other_prefix(url, root, metadata_prefix)
        raise InvalidArgumentError(
            f"{url!r} holds no s3stream store but other files ({_some(others)}): name the "
            "directory of a store"
        )


#: Folders of a directory looked into for a store's log under another metadata prefix.
_PREFIX_CANDIDATES = 16


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """Whether `entry` is a directory (a symlink loop or an unreadable entry is not)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _refuse_other_prefix(url: str, root: Path, metadata_prefix: str) -> None:
    """`InvalidArgumentError` naming the prefix if one of the first folders of `root`, which
    holds no store under `metadata_prefix`, holds a metadata log (a store opened with another
    prefix, whose objects would otherwise be called someone else's files). A few HEADs."""
    with contextlib.suppress(OSError), LocalObjectStore(root, fsync=False) as local:
        names = sorted(
            e.name
            for e in os.scandir(root)
            if e.name not in (DEFAULT_DATA_PREFIX, _WAL_DIR, "lost+found") and _is_dir(e)
        )
        for name in names[:_PREFIX_CANDIDATES]:
            try:
                found = name != metadata_prefix and holds_store(local, name)
            except (InvalidArgumentError, OSError):
                continue  # a name no prefix can be (a backslash, not UTF-8), a loop
            if found:
                raise InvalidArgumentError(
                    f"{url!r} holds no s3stream store under the metadata prefix "
                    f"{metadata_prefix!r}, but one under {name!r}: read it with "
                    f"open_reader(..., metadata_prefix={name!r}) or StreamClient(..., "
                    f"metadata_prefix={name!r}), in Spark with metadataPrefix={name} "
                    "(s3stream.open and the CLI know the default prefix, 'meta', only)"
                )


def _require_remote_store(
    url: str,
    scheme: str,
    storage_options: Mapping[str, Any] | None,
    settings: ClientSettings | None,
    metadata_prefix: str,
) -> None:
    """Refuse a remote prefix that holds no store (`holds_store`: two HEADs through the
    retries and timeout of `settings`, writing nothing): a typo in a prefix must not read as
    an empty store, nor have a writing tool create one there. A ``memory://`` store lives
    only as long as the client that made it: a new one never holds a store."""
    if scheme == "memory":
        raise InvalidArgumentError(
            f"{url!r} holds no s3stream store: a memory:// store lives only as long as the "
            "client that made it, so there is none to open here; name a directory or the URL "
            "of a durable store"
        )
    with open_reader_store(
        url, storage_options=storage_options, settings=settings, metadata_prefix=metadata_prefix
    ) as remote:
        _require_held_store(remote, url, metadata_prefix)


def _require_held_store(store: ObjectStore, url: str, metadata_prefix: str) -> None:
    """Refuse a remote `store` (opened from `url`) that holds no s3stream store."""
    if holds_store(store, metadata_prefix):
        return
    raise InvalidArgumentError(
        f"{url!r} holds no s3stream store (no metadata log under {metadata_prefix}/, nor the "
        "marker of a log kept elsewhere): check the bucket and prefix, and name those of an "
        "existing store"
    )


def _some(names: list[str], most: int = 3) -> str:
    """A few of `names` for a message."""
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
