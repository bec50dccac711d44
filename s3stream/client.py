"""StreamClient: wiring of store, metadata, WAL and storage; node identity; lifecycle."""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._bounded import within_deadline
from ._call_deadline import caller_deadline
from ._closeable import Closeable
from ._daemon_pool import DaemonPool
from .cache.block_cache import BlockCache, BlockCacheMetrics
from .clock import Clock, SystemClock
from .compaction import (
    CompactionMetrics,
    CompactionReport,
    Compactor,
    Progress,
    RetentionPolicy,
    WriterOptions,
)
from .errors import (
    FencedError,
    InvalidArgumentError,
    S3StreamError,
    StreamClosedError,
    StreamNotFoundError,
    UnavailableError,
)
from .failover import (
    TakeOverReport,
    call_wal_factory,
    expected_wal_uid,
    has_open_streams,
    take_over_node,
)
from .metadata import (
    CloseStream,
    DeleteStream,
    MetadataLogStore,
    MetadataManager,
    MetadataState,
    Op,
    StreamMeta,
)
from .metadata.binding import bind_log
from .metadata.manager import MAX_CREATES_PER_ENTRY
from .metadata.registry import check_metadata_url, open_metadata_log
from .metrics.components import MetadataInstruments, StorageInstruments, WalInstruments
from .metrics.cost import CostReport, PriceTable
from .metrics.ledger import CostLedger
from .metrics.logs import ContextLogger
from .metrics.observers import DataTotals, observe_client
from .metrics.registry import MetricsRegistry
from .objectstore.base import ObjectStore
from .objectstore.stack import store_stack
from .objectstore.wrappers import MetricsObjectStore, ObjectStoreMetrics
from .reader import read_committed_range
from .settings import ClientSettings
from .storage.committer import fenced_by
from .storage.engine import RecoveryReport, Storage, StorageMetrics
from .storage.packing import KeyFactory, data_prefix_for
from .stream import Stream
from .throttle import PriorityRateLimiter, ThrottleMetrics
from .types import FetchResult, StreamInfo, StreamState
from .validation import (
    check_bool,
    check_callable,
    check_instance,
    check_int,
    check_node_id,
    check_options,
    check_read_args,
    check_str_map,
    check_tags,
    check_text,
    check_timeout,
)
from .wal.base import WriteAheadLog
from .wal.memory import MemoryWal

__all__ = ["MAX_CREATE_BATCH", "ClientMetrics", "StreamClient", "WalFactory"]

log = logging.getLogger(__name__)

#: Builds the client's WAL once the node epoch is known:
#: ``factory(node_id, node_epoch, on_full)``; `on_full` asks for an upload to free WAL space.
WalFactory = Callable[[str, int, Callable[[], None]], WriteAheadLog]

#: Most streams one `StreamClient.create_streams` call creates (it commits one metadata entry
#: per `s3stream.metadata.manager.MAX_CREATES_PER_ENTRY` of them).
MAX_CREATE_BATCH = 100_000


@dataclass(frozen=True, slots=True)
class ClientMetrics:
    """Counters of a client: its storage pipeline, its object-store traffic, the block
    cache (hits, misses, GETs), the compactor and the rate limiter (snapshots); the live
    `registry` of every metric (latencies, the WAL, the metadata log, requests by purpose:
    docs/observability.md), for exporters; and the `cost` of its object storage."""

    storage: StorageMetrics
    object_store: ObjectStoreMetrics
    block_cache: BlockCacheMetrics = field(default_factory=BlockCacheMetrics)
    compaction: CompactionMetrics = field(default_factory=CompactionMetrics)
    throttle: ThrottleMetrics = field(default_factory=ThrottleMetrics)
    registry: MetricsRegistry = field(default_factory=MetricsRegistry)
    ledger: CostLedger | None = None

    def cost(self, window_s: float | None = None) -> CostReport:
        """What the client's object storage costs per month at the current rate, at the
        client's price table (default: S3 Standard, us-east-1).

        Requests: for each purpose and request kind, the rate over the last `window_s`
        seconds (default 3600) on the client's clock, i.e. the requests counted since the
        newest snapshot of the counts at least that old (one is taken at the client's start
        and at each call, so a client younger than the window is measured since its start),
        divided by the seconds since that snapshot, x 2,628,000 seconds per month (730 h)
        x the request's price. Requests are those sent to the store, retries and list pages
        included. Storage: the bytes of the data objects the metadata lists (live and
        awaiting deletion) x the GB-month price (GB = 2**30 bytes).
        """
        if self.ledger is None:
            raise InvalidArgumentError("these metrics have no cost ledger (not a client's)")
        return self.ledger.cost(window_s)


def _check_new_tags(tags: object, name: str = "tags") -> dict[str, str]:
    """Tags of a new stream, as a plain dict of exact str: str to str within the tag limits
    (`check_tags`), and a retention policy in them must parse (else the compactor would meet
    the bad value later, in the background)."""
    checked = check_tags(name, tags)
    try:
        RetentionPolicy.from_tags(checked)
    except InvalidArgumentError as exc:
        if name == "tags":
            raise
        raise InvalidArgumentError(f"{name}: {exc}") from exc
    return checked


def _check_batch_tags(tags: object) -> list[dict[str, str]]:
    """`create_streams`' argument: a sequence (not a str, nor one mapping) of 1 to
    `MAX_CREATE_BATCH` tags of new streams (mappings or None), each checked."""
    if isinstance(tags, str | bytes | bytearray | Mapping) or not isinstance(tags, Sequence):
        raise InvalidArgumentError(
            "tags must be a sequence (e.g. a list) holding each new stream's tags (a mapping "
            f"of str to str, or None), not a {type(tags).__name__}"
        )
    check_int("the number of streams (len(tags))", len(tags), minimum=1, maximum=MAX_CREATE_BATCH)
    # By index, as far as len() says: a sequence whose iteration yields more than its len()
    # cannot make more streams than were checked (nor run forever).
    return [_check_new_tags(tags[i], f"tags[{i}]") for i in range(len(tags))]


def _check_wal_arg(wal: object) -> None:
    """`StreamClient`'s `wal`: a WAL instance or a `WalFactory`."""
    if not isinstance(wal, WriteAheadLog) and not callable(wal):
        raise InvalidArgumentError(
            f"wal must be a WriteAheadLog or a factory (node_id, node_epoch, on_full) -> "
            f"WriteAheadLog, not {type(wal).__name__}"
        )


class StreamClient(Closeable):
    """An embedded stream-storage client over one object store and one WAL.

    Opening a client registers its node id in the metadata log (bumping the node epoch, which
    makes its object keys unique), opens the WAL and recovers whatever a previous run left in
    it, then starts the background uploader. Use `s3stream.open` to build one from URLs.

    `metadata_prefix` names a namespace: its metadata log lives there and its data objects
    under ``{metadata_prefix}/data`` (``data`` for the default ``meta``), so namespaces sharing
    a store never read, overwrite or sweep each other's objects. Each namespace's clients need
    their own WALs (a WAL holds one node's appends of one namespace).

    `metadata` says where the metadata log lives: None (the default) in `store` itself, under
    `metadata_prefix`; a URL (``postgresql://user@host:5432/db``: docs/metadata.md, "The
    PostgreSQL backend") or a `MetadataLogStore` elsewhere, bound to this store at open. The
    client owns a log it was given or opened, and closes it with itself.
    """

    def __init__(
        self,
        store: ObjectStore,
        wal: WriteAheadLog | WalFactory,
        *,
        node_id: str = "local",
        settings: ClientSettings | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        metadata_prefix: str = "meta",
        retry: bool = True,
        metrics_registry: MetricsRegistry | None = None,
        prices: PriceTable | None = None,
        metadata: str | MetadataLogStore | None = None,
    ) -> None:
        # Every argument is checked before the first side effect (registering the node).
        check_instance("store", store, ObjectStore)
        if not isinstance(metadata, MetadataLogStore):
            check_metadata_url(metadata)
        _check_wal_arg(wal)
        self._node_id = check_node_id(node_id)
        check_instance("settings", settings, ClientSettings, allow_none=True)
        check_instance("clock", clock, Clock, allow_none=True)
        check_instance("rng", rng, random.Random, allow_none=True)
        check_text("metadata_prefix", metadata_prefix, allow_empty=False)
        check_bool("retry", retry)
        check_instance("metrics_registry", metrics_registry, MetricsRegistry, allow_none=True)
        check_instance("prices", prices, PriceTable, allow_none=True)
        self._log = ContextLogger(log, self._node_id)
        self._settings = settings if settings is not None else ClientSettings()
        self._clock = clock if clock is not None else SystemClock()
        rng = rng if rng is not None else random.Random(f"s3stream:{node_id}")
        # One stack of wrappers, applied once: a store `s3stream.open` already stacked (to
        # share it with the object WAL) is used as it is.
        if retry:
            self._metrics_store = store_stack(
                store,
                clock=self._clock,
                rng=rng,
                timeout_s=self._settings.store_timeout_ms / 1000,
            )
        else:
            self._metrics_store = (
                store
                if isinstance(store, MetricsObjectStore)
                else MetricsObjectStore(store, clock=self._clock)
            )
        # The registry is the client's: a stack built before the client (by `open`, to share
        # it with an object WAL) records into it from here on.
        self._registry = metrics_registry if metrics_registry is not None else MetricsRegistry()
        self._metrics_store.use_registry(self._registry)
        self._store: ObjectStore = self._metrics_store
        view = self._metrics_store.for_purpose
        self._lock = threading.RLock()
        self._streams: dict[int, Stream] = {}
        self._closed = False
        self._abandoned = False
        #: Calls of `create_streams` (and `create_stream`) committing without the lock: close()
        #: waits for them (on `_creates_done`) before it lists the streams to release.
        self._creating = 0
        self._creates_done = threading.Condition(self._lock)
        #: The `given_up` events of take-overs running (their callers still waiting): close()
        #: sets them, so that none goes on with a closed store and metadata log.
        self._taking_over: set[threading.Event] = set()
        #: Set once close() (or abandon()) has finished; `_close_error` is what it raised.
        self._close_done = threading.Event()
        self._close_error: BaseException | None = None
        meta_log = open_metadata_log(
            metadata, store=view("metadata"), prefix=metadata_prefix, settings=self._settings
        )
        self._meta = MetadataManager(
            meta_log,
            clock=self._clock,
            writer_id=node_id,
            checkpoint_interval=self._settings.metadata_checkpoint_interval,
            commit_attempts=self._settings.metadata_commit_attempts,
            commit_timeout_s=self._settings.metadata_commit_timeout_ms / 1000,
            instruments=MetadataInstruments(self._registry),
        )
        try:
            bind_log(meta_log, view("metadata"), metadata_prefix, create=True)
            self._meta.load()
            open_streams = has_open_streams(self._meta.state, node_id)
            expect_uid = expected_wal_uid(self._meta.state, node_id, open_streams)
            # What the WAL factory would refuse anyway must fail before the registration,
            # which fences a live process of this node.
            check_node = getattr(wal, "check_node", None)
            if callable(check_node):
                check_node(node_id, must_exist=open_streams, expect_uid=expect_uid)
            self._node_epoch = self._meta.register_node(node_id)
        except BaseException:
            if isinstance(wal, WriteAheadLog):
                # The client owns the WAL it was given: a failed open lets go of it (a file
                # WAL's holder lock included), or the next open in this process is refused.
                with contextlib.suppress(Exception):
                    wal.close()
            with contextlib.suppress(Exception):
                meta_log.close()
            raise
        storage_box: list[Storage] = []

        def on_full() -> None:
            if storage_box:
                storage_box[0].request_upload()

        # Every component calls the store through a view of its purpose; what is called on the
        # stack itself while the WAL factory runs, and later, is an object WAL's on this stack.
        self._metrics_store.default_purpose = "wal"
        self._wal = (
            wal
            if isinstance(wal, WriteAheadLog)
            else call_wal_factory(
                wal,
                node_id,
                self._node_epoch,
                on_full,
                must_exist=open_streams,
                expect_uid=expect_uid,
            )
        )
        if getattr(self._wal, "store", None) is not self._metrics_store:
            self._metrics_store.default_purpose = "other"
        observe_commits = getattr(self._wal, "observe_commits", None)
        if callable(observe_commits):
            observe_commits(WalInstruments(self._registry).commit.record)
        #: Opens another node's WAL for `take_over` (None when given a WAL instance).
        # Not an in-memory one: a take-over through it would replay nothing of the other
        # node's WAL and then release its streams.
        self._wal_factory: WalFactory | None = (
            None if isinstance(wal, WriteAheadLog) or isinstance(self._wal, MemoryWal) else wal
        )
        s = self._settings
        # One limiter for all background traffic; one key factory so the uploader's and the
        # compactor's keys never collide.
        self._limiter = PriorityRateLimiter(
            clock=self._clock,
            bytes_per_s=s.background_bytes_per_s,
            requests_per_s=s.background_requests_per_s,
        )
        self._block_cache = BlockCache(
            view("read"), capacity_bytes=s.block_cache_bytes, limiter=self._limiter, node_id=node_id
        )
        keys = KeyFactory(node_id, self._node_epoch, prefix=data_prefix_for(metadata_prefix))
        self._data_prefix = keys.prefix
        self._compactor = Compactor(
            store=view("compaction"),
            meta=self._meta,
            keys=keys,
            cache=self._block_cache,
            settings=s.compaction,
            clock=self._clock,
            node_id=node_id,
            writer=WriterOptions(
                block_target_bytes=s.block_target_bytes,
                compression=s.block_compression,
                zstd_level=s.zstd_level,
            ),
            limiter=self._limiter,
        )
        self._storage = Storage(
            store=view("upload"),
            wal=self._wal,
            meta=self._meta,
            settings=self._settings,
            clock=self._clock,
            keys=keys,
            node_id=node_id,
            block_cache=self._block_cache,
            limiter=self._limiter,
            node_epoch=self._node_epoch,
            instruments=StorageInstruments(self._registry),
        )
        storage_box.append(self._storage)
        self._owner = _ClientStreams(
            meta=self._meta,
            storage=self._storage,
            lock=self._lock,
            streams=self._streams,
            node_id=node_id,
            node_epoch=self._node_epoch,
            check_open=self._check_open,
            clock=self._clock,
            call_limit_s=self._settings.call_limit_s,
        )
        data = DataTotals(self._meta)
        self._ledger = CostLedger(
            self._registry,
            self._clock,
            prices=prices if prices is not None else PriceTable(),
            stored_bytes=data.stored_bytes,
        )
        self._unobserve = observe_client(
            self._registry,
            storage=self._storage,
            block_cache=self._block_cache,
            compactor=self._compactor,
            limiter=self._limiter,
            wal=self._wal,
            meta=self._meta,
            data=data,
            ledger=self._ledger,
        )
        try:
            self.recovery: RecoveryReport = self._storage.recover()
        except BaseException:
            self._storage.abandon()
            self._wal.close()
            self._block_cache.close()
            self._unobserve()
            raise
        if self.recovery.records:
            self._log.info("recovered %s", self.recovery)
        self._storage.start()
        if s.compaction.background:
            self._compactor.start()

    # ------------------------------------------------------------------ properties

    @property
    def node_id(self) -> str:
        """This client's node id."""
        return self._node_id

    @property
    def node_epoch(self) -> int:
        """Epoch of this client's node registration; bumps on every open of the node."""
        return self._node_epoch

    @property
    def settings(self) -> ClientSettings:
        """The settings the client runs with."""
        return self._settings

    @property
    def object_store(self) -> ObjectStore:
        """The object store (wrapped with retries and metrics)."""
        return self._store

    @property
    def wal(self) -> WriteAheadLog:
        """The write-ahead log."""
        return self._wal

    @property
    def metadata(self) -> MetadataManager:
        """The metadata manager (streams and objects)."""
        return self._meta

    @property
    def metrics(self) -> ClientMetrics:
        """A snapshot of the client's counters, its live registry and its cost ledger."""
        return ClientMetrics(
            self._storage.metrics,
            self._metrics_store.metrics,
            self._block_cache.metrics,
            self._compactor.metrics,
            self._limiter.metrics,
            self._registry,
            self._ledger,
        )

    @property
    def logger(self) -> ContextLogger:
        """The client's logger: its records carry ``node_id`` (and ``stream_id``)."""
        return self._log

    @property
    def compactor(self) -> Compactor:
        """The compactor (runs in the background if ``settings.compaction.background``)."""
        return self._compactor

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    # ------------------------------------------------------------------ streams

    def create_stream(self, tags: Mapping[str, str] | None = None) -> Stream:
        """Create a new, empty stream owned by this client.

        `tags` map str to str; ``retention.ms`` / ``retention.bytes`` must be integers.
        Tags are stored in every metadata checkpoint, so they are bounded: at most
        `MAX_TAGS` (1,000) tags, a key at most `MAX_TAG_KEY_BYTES` (1,024) and a value at
        most `MAX_TAG_VALUE_BYTES` (65,536) UTF-8 bytes, and keys and values together at most
        `MAX_TAGS_BYTES` (262,144) UTF-8 bytes (constants of `s3stream.validation`); beyond
        one, `InvalidArgumentError` names the tag or the limit and nothing is created. Keys
        and values are stored as plain str (an instance of a str subclass is copied).
        The stream is created and opened in one metadata entry, and creates of concurrent
        threads fold into one entry (group commit); `create_streams` makes many at once.
        """
        return self._create([_check_new_tags(tags)])[0]

    def create_streams(self, tags: Sequence[Mapping[str, str] | None]) -> list[Stream]:
        """Create ``len(tags)`` new, empty streams owned by this client, one per item of
        `tags` (that stream's tags, or None for none), and return them in that order; their
        ids ascend (consecutive within each entry of 1,024: other writers may take ids between
        entries). ``create_streams([None] * 100)`` makes 100 untagged streams,
        ``create_streams([{"topic": "t", "partition": str(p)} for p in range(64)])`` 64
        partitions.

        One metadata entry per `MAX_CREATES_PER_ENTRY` (1,024) streams: all or none, as one
        `create_stream` is. A batch of several entries that fails part-way deletes the
        streams of the entries already written (best effort) before raising. From 1 to
        `MAX_CREATE_BATCH` (100,000) streams per call; tags as for `create_stream`, limits
        included (per stream). Every item is checked before any stream is created: a bad one
        raises `InvalidArgumentError` naming its index (``tags[3]``) and creates nothing.
        """
        return self._create(_check_batch_tags(tags))

    def _create(self, tags: list[dict[str, str]]) -> list[Stream]:
        """Create and open streams with `tags` (checked), committing without the client's lock
        (so concurrent creates fold into one entry), then attach them under it."""
        with self._lock:
            self._check_open()
            self._creating += 1
        created: list[StreamMeta] = []
        try:
            for i in range(0, len(tags), MAX_CREATES_PER_ENTRY):
                if i and self._closed:
                    raise StreamClosedError("the client was closed while streams were created")
                if self._abandoned:
                    # Like a crash: an abandoned client writes nothing more (no undo either).
                    created = []
                    raise StreamClosedError("the client was abandoned while streams were created")
                chunk = tags[i : i + MAX_CREATES_PER_ENTRY]
                created += self._meta.create_streams(
                    chunk, open_for=self._node_id, wal_uid=self._wal.identity
                )
                # The commit caught up with the log first: a registration of this node
                # before it (a take-over) shows now. Streams created for a fenced session
                # could never be written nor released by it, and would stay open on the
                # node, blocking its next take-over: undone (below), as `open_stream` refuses.
                self._check_session("creates no stream")
        except BaseException:
            if created and not self._abandoned:
                self._undo_creates(created)
            with self._lock:
                self._creating -= 1
                self._creates_done.notify_all()
            raise
        with self._lock:
            self._creating -= 1
            self._creates_done.notify_all()
            if self._owner.closed_how is None:
                # Not listed by close() yet (it waits for this call): attached now, its
                # streams are released by close() as every other one of this client's.
                return [self._attach_created(meta) for meta in created]
        # close() gave up waiting for this call (its deadline passed) and has listed the
        # streams to release without these; or the client was abandoned.
        released = not self._abandoned and self._release_late(created)
        ids = [m.stream_id for m in created]
        raise StreamClosedError(
            f"the client was closed while streams {ids} were created"
            + ("; they were released" if released else f"; they stay open on {self._node_id!r}")
        )

    def _attach_created(self, meta: StreamMeta) -> Stream:
        existing = self._streams.get(meta.stream_id)
        if existing is not None and not existing.closed:
            # Opened by `open_stream` between the commit and now (its id guessed): that
            # handle, of the newer epoch, is the stream's.
            return existing
        now = self._meta.state.streams.get(meta.stream_id)
        if (
            now is None
            or now.state is not StreamState.OPEN
            or now.epoch != meta.epoch
            or now.owner != self._node_id
        ):
            # Opened (and closed, or deleted) by another call between the commit and now: a
            # handle of the create's epoch would take appends that the next upload is fenced
            # from. The stream exists; `open_stream` gives a handle of the current epoch.
            raise FencedError(
                f"stream {meta.stream_id} was opened by another call before its create "
                f"returned (it is now at epoch {now.epoch if now else '-'}, "
                f"{now.state.name.lower() if now else 'deleted'}); open it with open_stream"
            )
        return self._attach(meta)

    def _undo_creates(self, created: list[StreamMeta]) -> None:
        """Delete streams of a batch that failed part-way (one entry), best effort; if that
        fails too they stay this client's (attached: close() releases them)."""

        def build(state: MetadataState) -> list[Op]:
            ops: list[Op] = []
            for m in created:
                s = state.streams.get(m.stream_id)
                # Closed at the create's epoch: released by a take-over of this node, never
                # opened since (an open bumps the epoch), never handed to anyone: undone too.
                if (
                    s is not None
                    and s.state in (StreamState.OPEN, StreamState.CLOSED)
                    and s.epoch == m.epoch
                ):
                    ops.append(DeleteStream(m.stream_id, m.epoch))
            return ops

        try:
            self._meta.commit(build)
        except Exception as exc:
            ids = [m.stream_id for m in created]
            self._log.warning(
                "could not delete streams %s of a create_streams call that failed: %s; they "
                "stay open on this node",
                ids,
                exc,
            )
            with self._lock:
                if self._owner.closed_how is None:
                    for meta in created:
                        # Attached so that close() releases them; one another call opened
                        # meanwhile is that call's (this one is failing anyway).
                        with contextlib.suppress(FencedError):
                            self._attach_created(meta)

    def _release_late(self, created: list[StreamMeta]) -> bool:
        """Close streams created after close() listed this client's (best effort)."""
        with contextlib.suppress(Exception):
            self._release_streams([(m.stream_id, m.epoch) for m in created])
            return True
        return False

    def open_stream(self, stream_id: int, *, force: bool = False) -> Stream:
        """Open an existing stream for appending and reading.

        Bumps the stream's epoch, fencing any other owner. A stream that another node has
        open (it did not close it, nor was it taken over) raises `StreamOwnedError` naming
        that node, since the node may hold acknowledged appends it has not uploaded: take it
        over first (`take_over`), which uploads them, or pass ``force=True``, which discards
        them (logged as a warning; that node's `flush` and `close` then raise `FencedError`).
        Opening a stream this client already has open returns the same handle, unless
        another client has opened (or deleted) the stream since: that handle is fenced, so
        what it acknowledged and did not upload is dropped (`flush` and `close` report it
        with `FencedError`), its appends raise `FencedError`, and the stream is opened
        anew as any other. A client whose node was registered again since (taken over, or
        opened by another process) gets `FencedError`.
        """
        check_int("stream_id", stream_id)
        check_bool("force", force)
        with self._lock:
            self._check_open()
            self._meta.refresh()
            # Taken over (its WAL replayed and uploaded by the taker) or opened again
            # elsewhere: this session may neither open streams nor call what it holds lost
            # (the taker committed it).
            self._check_session("opens no stream")
            existing = self._streams.get(stream_id)
            if existing is not None and not existing.closed:
                now = self._meta.state.streams.get(stream_id)
                # The same epoch, even closed (a take-over of this node closes its streams
                # at their epochs, after uploading what this client acknowledged): not
                # another client's, and nothing of it is to be reported lost here.
                if (
                    now is not None
                    and now.state is not StreamState.DELETED
                    and now.epoch == existing.epoch
                ):
                    return existing
                self._storage.drop_fenced(stream_id, existing.epoch)
                self._streams.pop(stream_id, None)
            meta = self._meta.open_stream(
                stream_id, self._node_id, force=force, wal_uid=self._wal.identity
            )
            if force:
                self._log.for_stream(stream_id).warning(
                    "stream %d opened with force=True: what its previous owner had not "
                    "uploaded is discarded",
                    stream_id,
                )
            return self._attach(meta)

    def _attach(self, meta: StreamMeta) -> Stream:
        w = self._storage.register_writer(meta.stream_id, meta.epoch, meta.end_offset)
        s = Stream(self._owner, self._storage, w, start_offset=meta.start_offset, tags=meta.tags)
        self._streams[meta.stream_id] = s
        return s

    def list_streams(self, tags: Mapping[str, str] | None = None) -> list[StreamInfo]:
        """Streams in the store (not deleted) whose tags include all of `tags`."""
        tags = check_str_map("tags", tags, allow_none=True)
        self._check_open()
        self._meta.refresh()
        return [m.to_info() for m in self._meta.list_streams(tags or None)]

    def stream_info(self, stream_id: int) -> StreamInfo:
        """Committed metadata of one stream (`StreamNotFoundError` if there is none)."""
        check_int("stream_id", stream_id)
        self._check_open()
        self._meta.refresh()
        return self._meta.get_stream(stream_id).to_info()

    def read(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int | None = None,
        *,
        max_bytes: int = 1 << 20,
    ) -> FetchResult:
        """Read committed batches of any stream without opening (fencing) it.

        Sees what is committed to object storage (``stream_info(...).end_offset``), after
        refreshing the metadata; a stream this client has open is read through its handle,
        which also sees what is only in the WAL. For inspection tools and readers that do not
        own the stream.
        """
        check_int("stream_id", stream_id)
        start_offset, end_offset, max_bytes = check_read_args(start_offset, end_offset, max_bytes)
        self._check_open()
        own = self._streams.get(stream_id)
        if own is not None and not own.closed:
            try:
                return own.fetch(start_offset, end_offset, max_bytes=max_bytes)
            except FencedError:
                pass  # another client has it now: read what is committed, as for any other
        started = self._clock.monotonic()
        result = read_committed_range(
            self._meta, self._storage.objects, stream_id, start_offset, end_offset,
            max_bytes,
        )  # fmt: skip
        self._storage.record_object_read(started, result.batches, result.total_bytes)
        return result

    # ------------------------------------------------------------------ lifecycle

    def compact(
        self, progress: Progress | None = None, *, sweep_orphans: bool | None = None
    ) -> CompactionReport:
        """Run one compaction pass now: retention, stream-set and stream object compaction,
        purge of objects past the deletion delay, and (when due, or if `sweep_orphans`) the
        orphan sweep. `progress(done_bytes, total_bytes, phase)` is told as it goes."""
        if progress is not None:
            check_callable("progress", progress)
        if sweep_orphans is not None:
            check_bool("sweep_orphans", sweep_orphans)
        self._check_open()
        return self._compactor.run_once(progress, sweep_orphans=sweep_orphans)

    def take_over(
        self,
        node_id: str,
        *,
        wal: str | WalFactory | None = None,
        storage_options: Mapping[str, Any] | None = None,
        accept_wal_loss: bool = False,
        timeout_s: float | None = None,
    ) -> TakeOverReport:
        """Take over failed node `node_id`: fence it, recover its WAL, upload and commit what
        it had acknowledged, and close its streams so that they can be opened anywhere.

        `wal` says where the node's WAL is: None for the same kind of WAL as this client's
        (an object WAL on the same bucket and prefix, or the node's default file WAL inside a
        local store directory), a URL (``file:///mnt/ebs-of-n1/s3stream.wal``,
        ``s3://bucket/prefix/wal``; `storage_options` as for `s3stream.open`), or a factory
        ``(node_id, node_epoch, on_full) -> WriteAheadLog``. After it returns, the old holder
        of the node can neither acknowledge (object WAL) nor commit anything.

        A WAL of the node that is missing or damaged (docs/file-wal.md, docs/s3-wal.md, "What
        recovery detects") raises `CorruptionError`; ``accept_wal_loss=True`` goes on without
        what is lost, for a `wal` URL (the default WAL goes by the ``accept_wal_loss`` this
        client was opened with).

        Returns or raises within `timeout_s` (default ``settings.call_timeout_ms``): the
        take-over runs in a thread of its own, since a WAL or store directory on a device that
        stops answering holds a write in the kernel for good. At the deadline it raises
        `UnavailableError` and the work left behind stops at its next step (a replay in
        progress goes on while its uploads succeed, and stops at the first failure past the
        deadline; `close` stops it too); run the take-over again: what the first one did is
        kept or fenced by the second.
        """
        check_node_id(node_id)
        check_bool("accept_wal_loss", accept_wal_loss)
        timeout = check_timeout("timeout_s", timeout_s)
        if wal is not None and not isinstance(wal, str) and not callable(wal):
            raise InvalidArgumentError(
                f"wal must be None, a WAL URL or a WAL factory, not {type(wal).__name__}"
            )
        check_options("storage_options", storage_options)
        self._check_open()
        if node_id == self._node_id:
            raise InvalidArgumentError(f"a client cannot take over its own node {node_id!r}")
        factory: WalFactory
        check_wal: Callable[[bool, int | None], None] | None = None
        if isinstance(wal, str):
            from .wal.registry import check_take_over_wal, url_wal_factory

            url = wal

            def check_wal(open_streams: bool, expect_uid: int | None) -> None:
                # A WAL named by URL: a typo must not fence the node nor create a WAL there,
                # nor a WAL that is not the node's (an object WAL's judged by the factory).
                check_take_over_wal(
                    url,
                    node_id,
                    open_streams=open_streams,
                    accept_loss=accept_wal_loss,
                    base=self._settings.file_wal,
                    expect_uid=expect_uid,
                )
                by_url.check_node(node_id, must_exist=open_streams, expect_uid=expect_uid)

            # The WAL settings this client was opened with apply to the node's WAL as well
            # (the URL's query overriding single fields).
            factory = by_url = url_wal_factory(
                wal,
                clock=self._clock,
                file_settings=self._settings.file_wal,
                object_settings=self._settings.object_wal,
                storage_options=storage_options,
                accept_wal_loss=accept_wal_loss,
            )
        elif wal is not None:
            factory = wal
        elif self._wal_factory is not None:
            factory = self._wal_factory
        else:
            raise InvalidArgumentError(
                f"this client cannot open the WAL of node {node_id!r} by itself (it was given a "
                "WAL instance, or its WAL lives in memory): pass wal= (a URL or a factory) to "
                "say where that WAL is"
            )
        limit = self._settings.call_limit_s(timeout)
        deadline = self._clock.monotonic() + limit
        given_up = threading.Event()
        with self._lock:
            # `close` stops a take-over still running (left behind at its deadline, or racing
            # the close) at its next step: it works with this client's store and metadata.
            self._taking_over.add(given_up)
        try:
            return self._take_over_within(node_id, factory, check_wal, given_up, deadline, limit)
        finally:
            with self._lock:
                self._taking_over.discard(given_up)

    def _take_over_within(
        self,
        node_id: str,
        factory: WalFactory,
        check_wal: Callable[[bool, int | None], None] | None,
        given_up: threading.Event,
        deadline: float,
        limit: float,
    ) -> TakeOverReport:
        """`take_over_node` in a thread of its own, until `deadline` (`take_over`)."""
        return within_deadline(
            functools.partial(
                take_over_node,
                node_id,
                wal_factory=factory,
                store=self._metrics_store.for_purpose("upload"),
                meta=self._meta,
                settings=self._settings,
                clock=self._clock,
                block_cache=self._block_cache,
                limiter=self._limiter,
                data_prefix=self._data_prefix,
                check_wal=check_wal,
                given_up=given_up,
                deadline=deadline,
                instruments=self._storage.instruments,
            ),
            clock=self._clock,
            deadline=deadline,
            name=f"s3stream-take-over:{node_id}",
            timeout_error=lambda: UnavailableError(
                f"the take-over of node {node_id!r} did not finish within {limit:g} s: the "
                "device of its WAL or the store is not answering, or a process of that node "
                "that is stopped (SIGSTOP, a debugger) holds its WAL's lock (kill it); what "
                "the take-over started stops at its next step in the background: run it "
                "again later"
            ),
            given_up=given_up,
        )

    def flush(self, timeout_s: float | None = None) -> None:
        """Upload everything acknowledged so far and commit it to the metadata log.

        Waits at most `timeout_s` (default ``settings.call_timeout_ms``); raises
        `UnavailableError` (retryable) if uploads keep failing or the deadline passes, and
        `FencedError` if acknowledged appends were dropped since the last flush because
        another client took their stream over (``open_stream(force=True)``).
        """
        timeout = check_timeout("timeout_s", timeout_s)
        self._check_open()
        self._storage.flush(timeout)

    def close(self, timeout_s: float | None = None) -> None:
        """Graceful shutdown: wait for in-flight appends, upload everything, release this
        client's streams (others may open them without a take-over; also those the metadata
        says this node owns without a handle here, e.g. not reopened after a restart), close
        the WAL.

        Afterwards every stream handle raises `StreamClosedError`, and a new client on the
        same URL sees every acknowledged batch. Returns or raises within `timeout_s`
        (default ``settings.call_timeout_ms``); a WAL whose device stops answering is left
        closing in the background and `UnavailableError` says so (until it has closed, a new
        client of this node on it gets `NodeInUseError`; the next open recovers it). If the
        upload fails, the data stays in the WAL (the next open of this node, or a take-over,
        uploads it), the streams stay owned, and the upload's error is raised; a client that
        ever dropped acknowledged appends raises `FencedError`.
        """
        timeout = check_timeout("timeout_s", timeout_s)
        limit = self._settings.call_limit_s(timeout)
        deadline = self._clock.monotonic() + limit

        def left() -> float:
            return max(0.0, deadline - self._clock.monotonic())

        # Another call may hold the client's lock across store calls (a stream's close
        # uploads and commits under it): wait for it within this call's deadline only.
        if not self._lock.acquire(timeout=limit):
            raise UnavailableError(
                f"close did not start within {limit:g} s: another call of this client (a "
                "stream's close or open) held it all that time; nothing was closed, call "
                "close() again"
            )
        try:
            again = self._closed
            self._closed = True
            for take_over in self._taking_over:
                take_over.set()
            if not again:
                if self._creating:
                    # Creates in flight attach their streams first, so that they are released
                    # with the others (within this call's deadline).
                    self._creates_done.wait_for(lambda: self._creating == 0, left())
                owned = [(sid, s.epoch) for sid, s in self._streams.items() if not s.closed]
                self._owner.close("closed (client closed)")
        finally:
            self._lock.release()
        if again:
            # Closed (or closing) already: report how that ended, not a success it was not.
            if not self._close_done.wait(left()):
                raise UnavailableError("the client is still closing (another close() call)")
            if self._close_error is not None:
                raise self._close_error
            return
        try:
            # Let throttled background work through so that stopping never waits on tokens.
            self._limiter.close()
            # A compaction task in progress stops before its next request; the wait for it
            # takes at most half of what is left of this call's deadline, the flush and
            # release the rest.
            self._compactor.stop(left() / 2)
            try:
                self._storage.close(
                    left(),
                    on_flushed=lambda: self._release_streams(
                        owned, unattached=True, deadline=deadline
                    ),
                )
            finally:
                self._block_cache.close(left())
                if not self._meta.stop_checkpoints(deadline):
                    log.warning(
                        "a metadata checkpoint was still being written at the close deadline; "
                        "left behind (harmless: loading then replays a few more entries)"
                    )
                self._store.close()
                self._meta.log.close()
                self._unobserve()
        except BaseException as exc:
            self._close_error = exc
            raise
        finally:
            self._close_done.set()

    def _check_session(self, refused: str) -> None:
        """`FencedError` (saying the client `refused` what) if the metadata, as last read,
        has this node registered again since this client registered it."""
        ended = self._owner.session_ended(self._meta.state)
        if ended is not None:
            raise FencedError(f"{ended}: this client is fenced and {refused}; open a new one")

    def _release_streams(
        self,
        owned: list[tuple[int, int]],
        *,
        unattached: bool = False,
        deadline: float | None = None,
    ) -> None:
        """Close, in one metadata entry, the streams this client still owns (all uploaded).
        With `unattached`, also the streams the metadata says this node owns that have no
        handle here (opened by this node before a restart, whose recovery uploaded their
        data, or created by a commit that landed after its call gave up): nothing of theirs
        is in this client's WAL, and they would otherwise stay owned until a take-over."""
        handled = {sid for sid, _ in owned}
        if unattached:
            # As the state read last says; no entry at all when there is nothing to release
            # (an entry would queue behind any commit still in flight).
            unattached = any(
                s.state is StreamState.OPEN and s.owner == self._node_id and sid not in handled
                for sid, s in self._meta.state.streams.items()
            )
        if not owned and not unattached:
            return

        def build(state: MetadataState) -> list[CloseStream]:
            ops = state.closes(owned)
            if unattached and state.registered_again(self._node_id, self._node_epoch) is None:
                # Only while this session is the node's current one: a stale session (the
                # node restarted or was taken over meanwhile) must not close the streams
                # the current session owns.
                ops += [
                    CloseStream(sid, s.epoch)
                    for sid, s in state.streams.items()
                    if s.state is StreamState.OPEN
                    and s.owner == self._node_id
                    and sid not in handled
                ]
            return ops

        left = None if deadline is None else max(0.001, deadline - self._clock.monotonic())
        bounded = (
            contextlib.nullcontext() if deadline is None else caller_deadline(self._clock, deadline)
        )
        try:
            # The commit's store calls end by the close's deadline too (this thread leads the
            # group at a close: nothing else commits), not only by store_timeout_ms each.
            with bounded:
                self._meta.commit(build, timeout_s=left)
        except S3StreamError as exc:
            # Everything is uploaded, so nothing is lost; but the streams stay owned, and
            # other nodes must take this node over (cheap: its WAL is empty) or force-open
            # them. A close that left them so must not look like a clean one.
            raise _release_failed([sid for sid, _ in owned], self._node_id, exc) from exc

    def abandon(self) -> None:
        """Stop as a crash would: no upload, the WAL is not closed (for crash tests).

        What was acknowledged stays in the WAL; the next client on the same WAL recovers it.
        The WAL stops as the process's death would stop it (its ``_abandon``, the hook the
        conformance kit's crashes use, where it has one): no clean-shutdown mark, and what the
        kernel would release, such as a file WAL's holder lock, is released.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._abandoned = True
            self._owner.close("closed (client abandoned)")
        try:
            self._storage.abandon()
            crash = getattr(self._wal, "_abandon", None)
            if callable(crash):
                crash()
        finally:
            # What a dead process's connections would do: go away.
            with contextlib.suppress(Exception):
                self._meta.log.close()
            self._unobserve()
            self._close_done.set()

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosedError("the client is closed")

    def __repr__(self) -> str:
        return (
            f"StreamClient(node={self._node_id}#{self._node_epoch}, "
            f"store={self._store.describe()}, wal={self._wal.describe()})"
        )


def _release_failed(stream_ids: list[int], node_id: str, exc: S3StreamError) -> S3StreamError:
    if not exc.retryable:
        return exc
    return UnavailableError(
        f"everything acknowledged is uploaded, but releasing streams {stream_ids} failed "
        f"({exc}): they stay owned by node {node_id!r}; another node can take_over("
        f"{node_id!r}) (nothing is left to replay) or force-open them"
    )


#: How often, at most, an idle tail's empty long polls read the metadata log to learn whether
#: another client took their streams over (one read per client, whatever the tails): an idle
#: writer learns of it from no commit of its own.
_HELD_CHECK_S = 5.0


class _ClientStreams:
    """The client's side of the `StreamOwner` protocol: what its open streams ask of it."""

    def __init__(
        self,
        *,
        meta: MetadataManager,
        storage: Storage,
        lock: threading.RLock,
        streams: dict[int, Stream],
        node_id: str,
        node_epoch: int,
        check_open: Callable[[], None],
        clock: Clock,
        call_limit_s: Callable[[float | None], float],
    ) -> None:
        self.clock = clock
        self._call_limit_s = call_limit_s
        self._meta = meta
        self._storage = storage
        self._lock = lock
        self._streams = streams
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._check_open = check_open
        #: Set (under the client's lock) when the client closes: every handle is closed then.
        self.closed_how: str | None = None
        #: When `taken_from` last asked for a read of the metadata log (on `clock`'s
        #: monotonic time), whether that read is still running, and the thread it runs on.
        self._held_checked = float("-inf")
        self._held_reading = False
        self._held_reader: DaemonPool | None = None
        self._held_lock = threading.Lock()

    def committed_start(self, stream_id: int) -> int:
        """The stream's start offset as this client last read it from the metadata log."""
        meta = self._meta.state.streams.get(stream_id)
        return 0 if meta is None else meta.start_offset

    def closed_reason(self) -> str | None:
        """Why every handle is closed (the client closed or was abandoned), else None."""
        return self.closed_how

    def session_ended(self, state: MetadataState) -> str | None:
        """How `state` says this client's session of its node ended (the node registered
        again since: taken over, or opened by another process), or None while it is on."""
        return state.registered_again(self._node_id, self._node_epoch)

    def close(self, how: str) -> None:
        """Every handle is closed from now on (`closed_how`: why, for their errors)."""
        self.closed_how = how
        with self._held_lock:
            if self._held_reader is not None:
                self._held_reader.shutdown()

    def taken_from(self, stream: Stream) -> str | None:
        """Why the metadata says `stream` is no longer this handle's, or None, as the state
        read last says. At most once per `_HELD_CHECK_S` a read of the log is started on a
        thread of its own, whose answer a later call sees: one read per interval for all the
        client's handles, and never in the caller's thread (a long poll must not wait for a
        slow store, nor a tail's next batch behind it)."""
        now = self.clock.monotonic()
        with self._held_lock:
            due = (
                not self._held_reading
                and self.closed_how is None
                and now >= self._held_checked + _HELD_CHECK_S
            )
            if due:
                self._held_checked = now
                self._held_reading = True
                if self._held_reader is None:
                    self._held_reader = DaemonPool(1, "s3stream-held-check")
                self._held_reader.submit(self._read_for_handles)
        state = self._meta.state
        sid = stream.stream_id
        ended = self.session_ended(state)
        if ended is not None:
            why = f"{ended}: stream {sid} is no longer this client's; open a new one"
        else:
            held = state.streams.get(sid)
            if (
                held is not None
                and held.epoch == stream.epoch
                and held.state is not StreamState.DELETED
            ):
                # Open at this handle's epoch: still its own. Closed at it: by this handle's
                # own release (a take-over closing it is the node's session ending, above),
                # whose `StreamClosedError` the handle raises itself.
                return None
            why = (
                f"stream {sid} is no longer this handle's: {fenced_by(state, sid)} (this "
                f"handle's epoch is {stream.epoch})"
            )
        # The handle is done: appends to it after this error must be refused, not
        # acknowledged and dropped at the next upload. Not under the client's lock, which a
        # slow call may hold (the handle stayed usable then): only while its writer still
        # appends, checked under the append lock, so a release of the handle under way (its
        # writer stopped first) decides it instead. The handle stays listed: its close, and
        # the client's, report the take-over as for any fenced handle.
        if ended is not None:
            # The taker uploaded what it read of this node's WAL: nothing to report dropped
            # here, only appends to stop.
            self._storage.release_writer(sid, FencedError(why), epoch=stream.epoch, live_only=True)
        else:
            self._storage.drop_fenced(sid, stream.epoch, live_only=True)
        return why

    def _read_for_handles(self) -> None:
        try:
            self._meta.refresh()
        except S3StreamError:
            pass  # an outage is no answer; the next interval asks again
        finally:
            with self._held_lock:
                self._held_reading = False

    def trim(self, stream: Stream, new_start: int) -> None:
        """Commit a trim (uploading first what is not committed below `new_start`), the
        upload and the commit within one `call_timeout_ms` together."""
        deadline = self.clock.monotonic() + self._call_limit_s(None)

        def left() -> float:
            return max(0.001, deadline - self.clock.monotonic())

        with caller_deadline(self.clock, deadline):
            if new_start > self._meta.get_stream(stream.stream_id).end_offset:
                # Metadata only trims what is committed: upload the rest first.
                self._storage.flush(left())
            self._meta.trim_stream(stream.stream_id, stream.epoch, new_start, timeout_s=left())

    def release(self, stream: Stream) -> None:
        """Upload what `stream` has pending, stop its appends, release it in the metadata.
        Raises if the release failed (the stream stays owned); calling again retries it.
        `FencedError` when another client has the stream (the handle is done all the same),
        naming what was dropped if that was not reported yet."""
        with self._lock:
            if self.closed_how is not None:
                return
            if self._streams.get(stream.stream_id) is not stream:
                return
            # Upload, stop the writer (an append still completing is then refused, not
            # acknowledged after the close), and upload what was acknowledged in between,
            # which the closed stream would refuse later. Tailers read on until the writer
            # stops. Again after a failed release: the writer is gone, the flushes are cheap.
            # Drop reports (appends of fenced streams) are left to `flush` and `close` of the
            # client, unless this stream turns out fenced itself (then they are all raised
            # here, once): a release that fails afterwards must not have used them up.
            self._storage.flush(report_dropped=False)
            self._storage.release_writer(
                stream.stream_id, StreamClosedError(f"stream {stream.stream_id} is closed")
            )
            self._storage.flush(report_dropped=False)
            try:
                self._meta.close_stream(stream.stream_id, stream.epoch)
            except (FencedError, StreamNotFoundError) as exc:
                # Another client has opened or deleted the stream: nothing of this handle's
                # is left to release, and the handle is done.
                self._streams.pop(stream.stream_id, None)
                self._storage.raise_dropped()
                raise FencedError(
                    f"stream {stream.stream_id} was not released: "
                    f"{fenced_by(self._meta.state, stream.stream_id)} (this handle's epoch "
                    f"is {stream.epoch}; what it had not uploaded, if anything, is reported "
                    "dropped by flush and close)"
                ) from exc
            except S3StreamError as exc:
                # Still listed as this client's: its close() tries the release again.
                raise _release_failed([stream.stream_id], self._node_id, exc) from exc
            self._streams.pop(stream.stream_id, None)
            self._storage.forget_released(stream.stream_id)

    def destroy(self, stream: Stream) -> None:
        """Delete `stream` and its data."""
        with self._lock:
            self._check_open()
            current = self._streams.get(stream.stream_id)
            if current is not None and current is not stream:
                # A handle this client replaced (reopened, or opened anew after a fence):
                # destroying through it would stop the current handle's writer and drop
                # what that one acknowledged.
                raise StreamClosedError(
                    f"stream {stream.stream_id} is open through a newer handle of this client "
                    f"(epoch {current.epoch}, this one's {stream.epoch}): destroy through that one"
                )
            # No upload commits between the discard and the deletion: what the discard
            # took is then exactly what was not committed, if the deletion finds the stream
            # taken.
            with self._storage.commits_held():
                released = self._storage.release_writer(
                    stream.stream_id,
                    StreamClosedError(f"stream {stream.stream_id} was destroyed"),
                    epoch=stream.epoch,
                    discard=True,
                )
                self._streams.pop(stream.stream_id, None)
                try:
                    self._meta.delete_stream(stream.stream_id, stream.epoch)
                except (FencedError, StreamNotFoundError) as exc:
                    # Another client took or deleted the stream first: what this handle had
                    # not uploaded was lost to that owner, not deleted by this call.
                    if released is not None:
                        self._storage.report_fenced(stream.stream_id, released)
                    raise FencedError(
                        f"stream {stream.stream_id} was not destroyed: "
                        f"{fenced_by(self._meta.state, stream.stream_id)} (this handle's "
                        f"epoch is {stream.epoch})"
                    ) from exc
