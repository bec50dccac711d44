"""The object-store WAL ("S3 WAL"): records PUT in batches as WAL objects.

Layout, fencing and the recovery argument are in ``docs/s3-wal.md``. In short, under
``{prefix}/{node_id}/`` of any `ObjectStore`:

- ``{first:020d}`` — a *chain object* claiming positions from `first` on, created with
  `put_if_absent`: a DATA object holds the record frames of positions ``[first, next)``
  (framed and checksummed exactly as in the file WAL, `s3stream.wal.framing`), so ``next =
  first + size - 40`` follows from the size a LIST reports; a SEAL object (40 bytes, header
  only) is written by a new owner at the end of the chain and makes the chain jump to
  ``first + SESSION_GAP``, where that owner's objects start. The header (version 2) of each
  carries `acked_through`: every position of its writer's chain below it was on an object
  that had landed when the object was cut.
- ``trim/{trim:020d}.{anchor:020d}.{epoch:012d}`` — a *trim marker*: records at positions
  <= `trim` are gone and the live chain starts at `anchor`.
- ``identity`` — the WAL's identity (`ObjectWal.identity`), written by its first open, which
  the store records for the node; an open expecting another (`expect_uid`) refuses the WAL
  if it holds records (another store's or node's), else takes it with a new identity.

Recovery is a LIST: the newest marker gives the anchor, the chain is followed from there by
key and size (``next`` of each object is the key of the following one), data objects are
read, and a SEAL is created where the chain ends; a second LIST checks that no trim marker
moved the chain's start past the seal meanwhile (else the walk goes on and seals again).
Objects listed past the chain end are a crash's torn tail (never acknowledged) unless one of
them proves the missing object had landed (a SEAL, or an `acked_through` past it): that is
damage, `CorruptionError`. Because every WAL position can be claimed by one object only, the
seal makes an older writer's next PUT fail (`FencedError`), and whatever it manages to write
after the seal lies off the chain, where nobody ever reads it. Trims delete whole data objects
below the anchor; seals are kept, so their positions stay claimed.

A WAL object PUT that is slow gets *hedged*: an identical PUT of the same key, sent from a
pool of its own; the first attempt that lands acknowledges the batch, and an attempt told
"exists" reads the object back (equal bytes: a sibling attempt made it; different: fenced).

Appends, room, in-order acknowledgement and the lifecycle are the WAL core's
(`s3stream.wal.pipeline`); this module is the medium: the chain, its batches and their PUTs,
trim markers, seals and recovery.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import random
import re
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import crc32c

from .._registry import split_scheme
from ..clock import Clock, SystemClock
from ..errors import (
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    UnavailableError,
)
from ..metrics.logs import ContextLogger
from ..objectstore.base import MAX_KEY_BYTES, ObjectStore, check_key
from ..objectstore.wrappers import RetryingObjectStore
from ..settings import MAX_OBJECT_WAL_UNFLUSHED_BYTES, ObjectWalSettings
from ..validation import check_bool, check_int, check_node_id
from .base import WalCapabilities, WalRecord, WriteAheadLog
from .checks import closed_error
from .framing import FRAME_HEADER, FrameScanner, frame_size
from .loss import check_open_node_wal, check_wal_loss
from .pipeline import Group, PipelinedWal

__all__ = [
    "HEADER",
    "KIND_DATA",
    "KIND_SEAL",
    "OBJECT_WAL_PREFIX",
    "SESSION_GAP",
    "ObjectWal",
    "ObjectWalCheck",
    "WalObjectHeader",
    "check_object_wal",
    "decode_object_header",
    "open_object_wal",
]

_log = logging.getLogger(__name__)
#: The epoch `check_object_wal` reads with: above any writer's, so nothing reads as fenced.
_CHECKER_EPOCH = (1 << 63) - 1

#: Object header: magic, version, kind, node epoch, first position, then in version 1 the next
#: position, in version 2 `acked_through`; record count, crc32c (seeded per node) of the 36
#: bytes before it. Version 2 keeps the size, so the chain still follows from key and size.
HEADER = struct.Struct("<4sHHQQQII")
_MAGIC = b"S3WO"
_VERSION = 2
#: Headers of version 1 hold `next` (redundant with key and size) instead of `acked_through`.
_VERSION_NEXT = 1
KIND_DATA = 1
KIND_SEAL = 2
#: Positions a new owner skips past the end of the chain. An older writer can only ever have
#: written below ``its trim point + max_unflushed_bytes`` (positions are contiguous in a
#: session and its trim never passes what it had acknowledged, which ends at the seal), so
#: with ``max_unflushed_bytes <= SESSION_GAP / 2`` (what `ObjectWalSettings` allows) the new
#: owner's positions never meet its.
SESSION_GAP = 2 * MAX_OBJECT_WAL_UNFLUSHED_BYTES
_MAX_POSITION = (1 << 64) - 1
#: URL scheme prefix that opens an object WAL on any object-store URL (``object+file://``).
OBJECT_WAL_PREFIX = "object+"
_MAX_RECORD_BYTES = 64 << 20
_OBJECT_NAME = re.compile(r"^\d{20}$")
# Epochs are written with at least 12 digits (any int64 one fits in 19).
_MARKER_NAME = re.compile(r"^trim/(\d{20})\.(\d{20})\.(\d{12,19})$")
_SEAL_ATTEMPTS = 64
#: The identity object: magic, version, the identity, the epoch of the node that wrote it,
#: crc32c of the 24 bytes before it.
_IDENTITY = struct.Struct("<4sHxxQQI")
_IDENTITY_MAGIC = b"S3WI"
_IDENTITY_NAME = "identity"
_RECOVERY_READ_AHEAD = 8
#: Walks of `ObjectWal.check` at most, when a writer at work trims objects it was reading.
_CHECK_PASSES = 5
#: Adaptive hedging: the delay is `_HEDGE_FACTOR` times the p90 of the last `_HEDGE_WINDOW`
#: PUT latencies of objects of the same size class, and `_HEDGE_INITIAL_S` until
#: `_HEDGE_MIN_SAMPLES` were measured. Classes split at `_HEDGE_CLASS_BYTES`: latency grows
#: with size, so one window for all would hedge every large object when a burst follows a
#: trickle of small ones.
_HEDGE_CLASS_BYTES = (256 << 10, 2 << 20)
_HEDGE_WINDOW = 64
_HEDGE_MIN_SAMPLES = 8
_HEDGE_FACTOR = 2.0
_HEDGE_INITIAL_S = 1.0

assert HEADER.size == 40


class WalObjectHeader(NamedTuple):
    """The decoded header of a WAL object."""

    kind: int
    epoch: int
    first: int
    #: Where the object's positions end (a SEAL's: where its owner's start). Version 2
    #: derives it from the object's size.
    next: int
    records: int
    #: Version 2: the end of the writer's unbroken run of landed objects when this one was cut
    #: (a SEAL's: its own position, as its owner walked the chain up to it); every chain
    #: object below it had landed. None in version 1, which does not say.
    acked_through: int | None = None


def _node_seed(node_id: str) -> int:
    # Frames of one node never validate in another node's WAL.
    return int(crc32c.crc32c(b"s3stream-object-wal:" + node_id.encode()))


def _encode_header(h: WalObjectHeader, seed: int) -> bytes:
    assert h.acked_through is not None
    head = HEADER.pack(_MAGIC, _VERSION, h.kind, h.epoch, h.first, h.acked_through, h.records, 0)
    return head[:36] + struct.pack("<I", crc32c.crc32c(head[:36], seed))


def decode_object_header(
    data: bytes, *, node_id: str, key: str, size: int | None = None
) -> WalObjectHeader:
    """The validated header of WAL object `key` of `node_id`; `CorruptionError` if invalid.

    `data` is the object, or its first `HEADER.size` bytes with `size` the object's size
    (from which a version 2 header's `next` follows)."""
    if len(data) < HEADER.size:
        raise CorruptionError(f"WAL object {key!r} is shorter than its header", location=key)
    magic, version, kind, epoch, first, field5, records, crc = HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise CorruptionError(f"WAL object {key!r} has no WAL object magic", location=key)
    if version > _VERSION:
        raise CorruptionError(f"WAL object {key!r} has unsupported version {version}", location=key)
    if crc32c.crc32c(data[:36], _node_seed(node_id)) != crc:
        raise CorruptionError(f"WAL object {key!r}: header checksum mismatch", location=key)
    if kind not in (KIND_DATA, KIND_SEAL):
        raise CorruptionError(f"WAL object {key!r} has unknown kind {kind}", location=key)
    if version <= _VERSION_NEXT:
        return WalObjectHeader(kind, epoch, first, field5, records)
    if field5 > first:
        # An object cannot have landed before it was cut: a writer never claims its own.
        raise CorruptionError(
            f"WAL object {key!r}: acked_through {field5} is past its first position {first}",
            location=key,
        )
    size = len(data) if size is None else size
    nxt = first + SESSION_GAP if kind == KIND_SEAL else first + size - HEADER.size
    return WalObjectHeader(kind, epoch, first, nxt, records, field5)


@dataclass(slots=True)
class _Obj:
    """A chain object this WAL knows of (its own, or found by recovery)."""

    first: int
    next: int
    key: str
    #: Position of its last record (an upper bound for unread ones); -1 for a seal.
    last: int
    landed: bool


@dataclass(slots=True, eq=False, kw_only=True)
class _Batch(Group):
    """A WAL object being PUT: its records (a `Group`, resolved by the first attempt that
    settles it; later attempts change nothing) and its attempts."""

    obj: _Obj
    #: The writer's `_durable` when the batch was cut: its header's `acked_through`, fixed
    #: here so that every attempt builds the same bytes.
    acked_through: int = 0
    #: The object's bytes, built by the first attempt that runs; every attempt sends these.
    blob: bytes | None = None
    #: PUT attempts started (the first one plus hedges) and those not yet returned.
    attempts: int = 0
    running: int = 0
    #: When the next hedge is due (`Clock.monotonic`); inf when none may follow.
    hedge_due: float = math.inf
    #: Size class of the object, for the adaptive hedge delay.
    size_class: int = 0


@dataclass(slots=True)
class _Listing:
    """One LIST of the node's prefix, parsed."""

    #: first position -> (key, size)
    objects: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: (trim, anchor, epoch, key)
    markers: list[tuple[int, int, int, str]] = field(default_factory=list)

    @property
    def trim(self) -> int:
        return max((m[0] for m in self.markers), default=-1)

    @property
    def anchor(self) -> int:
        return max((m[1] for m in self.markers), default=0)


def _onto_anchor(listing: _Listing, pos: int, chain: list[_Obj]) -> tuple[int, list[_Obj]]:
    """Where a recovery at `pos` with `chain` walked goes on after `listing`: from its anchor
    if a trim moved it past `pos` (what lies below is gone, records included), else as it
    was."""
    if listing.anchor <= pos:
        return pos, chain
    return listing.anchor, [o for o in chain if o.first >= listing.anchor]


class _Identity(NamedTuple):
    """A WAL prefix's identity object, decoded."""

    uid: int
    #: The epoch of the opener that wrote it (of its store's node).
    epoch: int


class _PlanStep(NamedTuple):
    first: int
    key: str
    size: int
    next: int
    seal: bool


class _PastEnd(NamedTuple):
    """An object listed past the end of the chain."""

    first: int
    key: str
    #: Why it proves that the missing object at the chain end had landed; "" if it does not.
    proof: str

    @property
    def proves(self) -> bool:
        return bool(self.proof)


@dataclass(frozen=True, slots=True)
class ObjectWalCheck:
    """What `ObjectWal.check` found in one node's WAL prefix."""

    prefix: str
    node_id: str
    #: WAL objects listed (data and seals), live records above the trim point and their bytes.
    objects: int
    records: int
    record_bytes: int
    #: Objects past the chain end that are a crash's torn tail (never acknowledged).
    torn_tail: int
    #: Why recovery would refuse this WAL with `CorruptionError`; None if healthy.
    damage: str | None
    #: The prefix's identity (`ObjectWal.identity`); None if it has none, or it is damaged.
    identity: int | None = None
    #: The damage is an object that was listed and then gone when read (a writer at work
    #: trims, which `check` tells apart by the trim marker moving).
    vanished: bool = False

    @property
    def ok(self) -> bool:
        """No damage: recovery would return every acknowledged record."""
        return self.damage is None


class ObjectWal(PipelinedWal):
    """A write-ahead log kept as objects in an object store (see the module docstring).

    The medium of a `PipelinedWal` (appends, backpressure, in-order acknowledgement and the
    lifecycle are the core's, `s3stream.wal.pipeline`): the chain of WAL objects, batches cut
    by a flusher thread and PUT (and hedged) from a pool, trim markers, seals, recovery.

    `store` is the object store; WAL objects go under ``{prefix}/{node_id}/`` (`prefix` may be
    empty). Unless `retry` is false the store is wrapped in a `RetryingObjectStore` (backoff on
    `UnavailableError`, ambiguous conditional creates resolved by reading back), drawing
    jitter from `rng` (seeded from the node id by default). `on_full` is called (without
    locks held) when an append starts waiting because `max_unflushed_bytes` are untrimmed.
    With `close_store`, `close()` also closes the store. PUTs slower than the hedge delay
    (`ObjectWalSettings.hedge_after_ms`, adaptive by default) are hedged; `hedged_puts` and
    `hedges_won` count that.

    `recover()` tells a crash's torn tail from damage (see ``docs/s3-wal.md``, "What recovery
    detects"): a missing chain object followed by one proving it had landed raises
    `CorruptionError` naming both; with `must_exist` (the node still has streams open), so
    does a prefix holding no object at all. `accept_loss` logs a warning instead and goes on
    without what is lost.

    `expect_uid`: the identity (`identity`, the prefix's ``identity`` object) the store
    recorded for this node's WAL, or -1 when no WAL's records can be of use to the node (none
    recorded, no stream open); None: no check. A prefix of another identity (or of none) is
    another store's or node's: refused by recovery (`InvalidArgumentError`, before anything is
    written) if its chain holds records, else taken with an identity of its own; unless
    `must_exist` (the node's own WAL, elsewhere, may hold acknowledged appends): then the
    loss is `CorruptionError` unless `accept_loss`. As `FileWal`'s (docs/s3-wal.md, "One
    WAL, one store").
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        node_id: str,
        node_epoch: int = 0,
        prefix: str = "",
        settings: ObjectWalSettings | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        on_full: Callable[[], None] | None = None,
        retry: bool = True,
        close_store: bool = False,
        must_exist: bool = False,
        accept_loss: bool = False,
        expect_uid: int | None = None,
    ) -> None:
        if not isinstance(store, ObjectStore):
            raise InvalidArgumentError(f"store must be an ObjectStore, got {store!r}")
        check_node_id(node_id)
        check_int("node_epoch", node_epoch)
        if not isinstance(prefix, str):
            raise InvalidArgumentError(f"prefix must be a str, got {prefix!r}")
        settings = settings if settings is not None else ObjectWalSettings()
        if not isinstance(settings, ObjectWalSettings):
            raise InvalidArgumentError(f"settings must be ObjectWalSettings, got {settings!r}")
        self._must_exist = check_bool("must_exist", must_exist)
        self._accept_loss = check_bool("accept_loss", accept_loss)
        if expect_uid is not None:
            check_int("expect_uid", expect_uid, minimum=-1)
        self._expect_uid = expect_uid
        #: This WAL's identity, known once recovery has sealed the chain.
        self._ident: _Identity | None = None
        super().__init__(
            clock=clock if clock is not None else SystemClock(),
            on_full=on_full,
            full_wait_ms=settings.full_wait_ms,
            log=ContextLogger(_log, node_id),
        )
        self._rng = rng if rng is not None else random.Random(f"s3stream-object-wal:{node_id}")
        self._raw_store = store
        self._store: ObjectStore = (
            RetryingObjectStore(store, clock=self._clock, rng=self._rng) if retry else store
        )
        self._close_store = close_store
        self._node_id = node_id
        self._epoch = node_epoch
        self._session = node_epoch & 0xFFFFFFFF
        self._dir = f"{prefix.strip('/')}/{node_id}" if prefix.strip("/") else node_id
        try:
            check_key(self.object_key(0))
            if len(self.object_key(0).encode()) > MAX_KEY_BYTES:
                raise InvalidArgumentError(
                    f"its keys pass the {MAX_KEY_BYTES} bytes S3, GCS and Azure take"
                )
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"WAL prefix {prefix!r} makes invalid object keys: {exc}"
            ) from None
        self._seed = _node_seed(node_id)
        self._settings = settings
        self._interval_s = settings.wal_batch_interval_ms / 1000
        self._max_batch = settings.wal_batch_max_bytes
        self._capacity = settings.max_unflushed_bytes
        self._max_record = max(1, min(_MAX_RECORD_BYTES, self._capacity - 2 * FRAME_HEADER.size))
        self._capabilities = WalCapabilities(
            persistent=True,
            durable_on_ack=True,
            torn_writes=False,
            bounded_capacity=True,
            fencing=True,
            max_record_bytes=self._max_record,
        )
        # The flusher waits for the batch interval: wake it early once a batch is full.
        self._wake_bytes = self._max_batch
        #: Serializes trims and resets (their I/O runs without `_lock`).
        self._trim_lock = threading.Lock()

        #: The position the next record gets.
        self._next = 0
        #: Where this writer's latest seal is (its open's, or a resume's).
        self._sealed_at = -1
        #: Where the unbroken run of this writer's chain objects known to have landed ends
        #: (exclusive): what the next object cut records as `acked_through`.
        self._durable = 0
        self._trim = -1
        self._anchor = 0
        self._last_cut = float("-inf")
        #: Batches cut and not yet resolved.
        self._inflight = 0
        #: Chain objects not yet deleted, in position order (recovered ones first).
        self._objects: deque[_Obj] = deque()
        #: Data objects found by recovery off the chain or below the anchor: (first, key).
        self._stale: list[tuple[int, str]] = []
        self._marker_keys: list[str] = []
        #: Untrimmed records: (position, frame size), in order.
        self._live: deque[tuple[int, int]] = deque()
        self._live_bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        #: Runs hedges only, so a hedge never queues behind the slow PUTs it works around.
        self._hedge_pool: ThreadPoolExecutor | None = None
        self._flusher: threading.Thread | None = None
        #: Per size class: latencies of recent PUT attempts (seconds) and the hedge delay.
        self._put_latencies = [
            deque[float](maxlen=_HEDGE_WINDOW) for _ in range(len(_HEDGE_CLASS_BYTES) + 1)
        ]
        self._hedge_delays_s = [
            settings.hedge_after_ms / 1000 if settings.hedge_after_ms else _HEDGE_INITIAL_S
        ] * (len(_HEDGE_CLASS_BYTES) + 1)
        self._hedges_sent = 0
        self._hedges_won = 0

    # ------------------------------------------------------------------ introspection

    @property
    def node_id(self) -> str:
        """The node whose WAL this is."""
        return self._node_id

    @property
    def node_epoch(self) -> int:
        """The epoch this writer holds."""
        return self._epoch

    @property
    def key_prefix(self) -> str:
        """Where this node's WAL objects live in the store (without the trailing ``/``)."""
        return self._dir

    @property
    def store(self) -> ObjectStore:
        """The object store (as given, without the retry wrapper)."""
        return self._raw_store

    @property
    def identity(self) -> int | None:
        """The prefix's identity (its ``identity`` object), once recovery has run; None
        before."""
        with self._cond:
            return None if self._ident is None else self._ident.uid

    @property
    def hedged_puts(self) -> int:
        """Hedges sent so far: second PUTs of a WAL object whose first PUT was slow."""
        with self._lock:
            return self._hedges_sent

    @property
    def hedges_won(self) -> int:
        """Hedges that resolved their WAL object's PUT before every other attempt did."""
        with self._lock:
            return self._hedges_won

    def hedge_delay_ms(self, object_bytes: int = 0) -> float:
        """How long the PUT of a WAL object of `object_bytes` may run before it is hedged,
        as of now."""
        with self._lock:
            return 1000 * self._hedge_delays_s[bisect.bisect(_HEDGE_CLASS_BYTES, object_bytes)]

    def describe(self) -> str:
        return f"ObjectWal({self._raw_store.describe()} {self._dir}/ epoch {self._epoch})"

    def object_key(self, first: int) -> str:
        """The key of the chain object starting at position `first`."""
        return f"{self._dir}/{first:020d}"

    # ------------------------------------------------------------------ recovery

    def recover(self) -> Iterator[WalRecord]:
        self._check_open()
        if self._ready:
            raise S3StreamError("WAL: recover() runs once, before the first append")
        return self._recover(read_records=True)

    def _recover(self, *, read_records: bool) -> Iterator[WalRecord]:
        found = self._read_identity()
        found_uid = None if found is None else found.uid
        foreign = self._expect_uid is not None and found_uid != self._expect_uid
        # Another store's WAL: its epochs are that store's, and fence nobody of this one.
        fence = not foreign or found_uid is None
        listing = self._list(fence=fence)
        self._check_not_wiped(listing)
        trim, start = listing.trim, listing.anchor
        chain: list[_Obj] = []
        live: list[tuple[int, int]] = []
        last_record = -1
        pos = start
        loss_checked = False
        for _ in range(_SEAL_ATTEMPTS):
            plan, end = self._plan(listing, pos)
            if foreign and any(not step.seal and step.next - 1 > trim for step in plan):
                # Before a record is read or anything written: not this store's to replay.
                raise self._foreign_error(found_uid)
            with ThreadPoolExecutor(_RECOVERY_READ_AHEAD, "s3stream-wal-recover") as pool:
                reads: dict[int, Future[bytes]] = {}
                vanished = False
                for i, step in enumerate(plan):
                    for ahead in plan[i : i + _RECOVERY_READ_AHEAD]:
                        if ahead.first not in reads and self._must_read(ahead, trim, read_records):
                            reads[ahead.first] = pool.submit(self._store.get, ahead.key)
                    if not self._must_read(step, trim, read_records):
                        chain.append(_Obj(step.first, step.next, step.key, step.next - 1, True))
                        pos = step.next
                        continue
                    try:
                        data = reads.pop(step.first).result()
                    except ObjectNotFoundError:
                        vanished = True
                        break
                    header = self._check_object(step, data, fence=fence)
                    if step.seal:
                        chain.append(_Obj(step.first, step.next, step.key, -1, True))
                    else:
                        records = self._records(step, header, data)
                        for p, rec in records:
                            if p > trim:
                                live.append((p, frame_size(len(rec))))
                                last_record = p
                                yield WalRecord(p, rec)
                        last = records[-1][0] if records else step.next - 1
                        chain.append(_Obj(step.first, step.next, step.key, last, True))
                    pos = step.next
                for f in reads.values():
                    f.cancel()
                past = [] if vanished else self._past_end(listing, end, pool)
            if vanished:
                # A WAL object disappears only when a trim covers it: the marker says so.
                listing = self._list(fence=fence)
                if listing.anchor <= pos:
                    key = self.object_key(pos)
                    raise CorruptionError(
                        f"WAL object {key!r} vanished during recovery and no trim covers it",
                        location=key,
                    )
                trim = max(trim, listing.trim)
                pos, chain = _onto_anchor(listing, pos, chain)
                continue
            proof = next((p for p in past if p.proves), None)
            if foreign and proof is not None:
                raise self._foreign_error(found_uid)  # it held records, lost or not
            if proof is not None:
                # Confirmed on a new LIST first: a paginated LIST can miss an object that landed
                # while it ran and still show a later one.
                listing = self._list(fence=fence)
                trim = max(trim, listing.trim)
                if listing.anchor > end:  # trimmed meanwhile: read on from the new anchor
                    pos, chain = _onto_anchor(listing, pos, chain)
                    continue
                if end in listing.objects:  # the chain grew meanwhile: read on
                    continue
                resume = self._lost(end, proof, listing)
                if resume is not None:
                    pos = resume
                    continue
            elif past:
                self._log.info(
                    "%s: the chain ends at position %d; %d WAL object(s) past it are a "
                    "crash's torn tail (never acknowledged), skipped: %s",
                    self.describe(),
                    end,
                    len(past),
                    ", ".join(p.key for p in past),
                )
            self._check_not_closing()
            if foreign and self._read_identity() != found:
                # Another opener wrote an identity since this open read it (a newer opener
                # of this node, perhaps): judged on the old one, this open would take the WAL
                # from it.
                raise UnavailableError(
                    f"{self.describe()}: another opener gave this WAL an identity while this "
                    "open read it; open it again"
                )
            if foreign and found is not None and found.epoch > self._epoch:
                # Perhaps this store's own node, opened meanwhile by a newer opener (whose
                # identity this stale open, expecting none, cannot tell from another store's):
                # taking the WAL would fence it, and the appends it acknowledges would be
                # recorded under an identity that is no longer the WAL's.
                raise FencedError(
                    f"{self.describe()}: its identity was written by an opener at epoch "
                    f"{found.epoch}, newer than this writer's {self._epoch}: a newer opener of "
                    "this node holds it (or, if it is another store's WAL, that store's)"
                )
            if foreign and not loss_checked:
                loss_checked = True
                self._check_own_elsewhere(found_uid)
            # Taking another store's WAL, this open's seal and trim marker carry epoch 0: a
            # crash before the identity is ours leaves the WAL the other store's, which this
            # store's epochs must not fence (its live writer is fenced by the position).
            if self._claim(end, KIND_SEAL, epoch=self._epoch if fence else 0):
                after = self._list(fence=fence)
                if after.anchor <= end:
                    trim = max(trim, after.trim)
                    live = [(p, size) for p, size in live if p > trim]
                    self._become_ready(after, chain, end, trim, live, last_record)
                    if not fence:
                        self._forget_other_store(end)
                    ident = self._settle_identity(found, foreign, end)
                    with self._cond:
                        self._ident = ident
                    return
                # The position was free because an older writer still at work had written it
                # and then trimmed past it (its marker, written before the delete, shows it):
                # this seal lies off the chain and fences nobody. Walk on from the new anchor
                # and seal the chain's end there.
                self._log.info(
                    "%s: the chain moved past position %d while it was sealed (anchor now %d); "
                    "sealing again further on",
                    self.describe(),
                    end,
                    after.anchor,
                )
                listing = after
            else:
                # Someone extended the chain (an older writer still at work): read on.
                listing = self._list(fence=fence)
            trim = max(trim, listing.trim)
            pos, chain = _onto_anchor(listing, pos, chain)
        raise UnavailableError(
            f"{self.describe()}: could not seal the WAL: another writer kept extending it"
        )

    def check(self) -> ObjectWalCheck:
        """Walk the chain as recovery reads it, without writing anything (no seal, no trim):
        for ``s3stream verify``. Damage is reported in the result, not raised; an epoch check
        is not made (a checker is no writer). One pass: a writer at work may extend the chain
        meanwhile, which then shows as a torn tail; an object it trims away while it is read
        makes the walk start again (up to `_CHECK_PASSES` times), not damage."""
        self._check_open()
        for _ in range(_CHECK_PASSES - 1):
            listing = self._list()
            result = self._check_pass(listing)
            if not result.vanished or self._list().trim <= listing.trim:
                return result
            # The writer trimmed (its marker moved) while the walk read: the object was
            # deleted after the marker, as a trim does; walk the chain as it is now.
        return self._check_pass(self._list())

    def _check_pass(self, listing: _Listing) -> ObjectWalCheck:
        """One walk of `check` over the chain `listing` shows."""
        records = record_bytes = 0
        damage: str | None = None
        vanished = False
        identity: int | None = None
        identity_damage: str | None = None
        try:
            read = self._read_identity()
            identity = None if read is None else read.uid
        except CorruptionError as exc:
            # Recovery refuses to open past it (whose records these are cannot be told).
            identity_damage = str(exc)
        plan, end = self._plan(listing, listing.anchor)
        with ThreadPoolExecutor(_RECOVERY_READ_AHEAD, "s3stream-wal-check") as pool:
            for step in plan:
                if not self._must_read(step, listing.trim, read_records=True):
                    continue
                try:
                    data = self._store.get(step.key)
                    header = self._check_object(step, data)
                    if not step.seal:
                        for pos, rec in self._records(step, header, data):
                            if pos > listing.trim:
                                records += 1
                                record_bytes += len(rec)
                except ObjectNotFoundError:
                    damage = f"WAL object {step.key!r} vanished while it was read"
                    vanished = True
                    break
                except CorruptionError as exc:
                    damage = str(exc)
                    break
            past = self._past_end(listing, end, pool) if damage is None else []
        proof = next((p for p in past if p.proves), None)
        if proof is not None:
            damage = (
                f"WAL object {self.object_key(end)!r} (position {end}) is missing, but "
                f"{proof.key!r} past it shows that it had landed ({proof.proof})"
            )
        return ObjectWalCheck(
            prefix=f"{self._dir}/",
            node_id=self._node_id,
            objects=len(listing.objects),
            records=records,
            record_bytes=record_bytes,
            torn_tail=len(past) if proof is None else 0,
            damage=identity_damage or damage,
            identity=identity,
            vanished=vanished and identity_damage is None,
        )

    def _past_end(self, listing: _Listing, end: int, pool: ThreadPoolExecutor) -> list[_PastEnd]:
        """The objects `listing` shows past the chain end `end`, in position order, each with
        what its header proves (headers read in parallel: normally a torn tail of fewer than
        `max_inflight_puts` objects). Objects of an older, fenced writer never show here:
        they lie below the jump of the seal that fenced it, and the chain goes on past it."""
        found = sorted((first, entry) for first, entry in listing.objects.items() if first > end)
        proofs = [pool.submit(self._proof_of_landing, key, size, end) for _, (key, size) in found]
        return [
            _PastEnd(first, key, proof.result())
            for (first, (key, _)), proof in zip(found, proofs, strict=True)
        ]

    def _proof_of_landing(self, key: str, size: int, end: int) -> str:
        """Why object `key` (listed with `size`), past the chain end `end`, proves that the
        chain object at `end` had landed; "" if it does not (a torn tail)."""
        try:
            head = self._store.get(key, 0, HEADER.size)
        except ObjectNotFoundError:
            return ""  # deleted since the LIST: nothing to go by
        try:
            header = decode_object_header(head, node_id=self._node_id, key=key, size=size)
            if (header.kind == KIND_SEAL) != (size == HEADER.size):
                raise CorruptionError(f"WAL object {key!r}: its kind does not match its size")
        except CorruptionError as exc:
            # Objects land whole: a crash never leaves one unreadable, so this is damage too.
            return f"it is damaged too, so nothing says the tail was never acknowledged: {exc}"
        if header.kind == KIND_SEAL:
            # Seals are written at the end of a walked chain, so the chain once went on past
            # `end`; a seal is never deleted, and a data object only below a trim's anchor.
            return f"it is a seal of epoch {header.epoch}: its owner walked the chain past {end}"
        if header.acked_through is not None and header.acked_through > end:
            return (
                f"when its writer (epoch {header.epoch}) cut it, every chain object below "
                f"position {header.acked_through} had landed"
            )
        return ""

    def _lost(self, end: int, proof: _PastEnd, listing: _Listing) -> int | None:
        """The chain object at `end` is missing though `proof` shows it had landed: raise
        `CorruptionError`, or with `accept_loss` warn and say where recovery goes on: at the
        first seal past it, where later owners' chain goes on (sealing at `end` instead could
        make this owner's positions run into theirs), or None, the chain ending at `end`."""
        key = self.object_key(end)
        check_wal_loss(
            f"{self.describe()}: WAL object {key!r} (position {end}) is missing, but "
            f"{proof.key!r} past it shows that it had landed ({proof.proof}): acknowledged "
            f"records from position {end} on cannot be recovered unless it is restored",
            location=key,
            accept_loss=self._accept_loss,
            node_id=self._node_id,
        )
        seals = [f for f, (_, size) in listing.objects.items() if f > end and size == HEADER.size]
        if not seals:
            return None
        self._log.warning(
            "%s: recovery goes on at the seal at position %d; the WAL objects between %d and "
            "it are dropped",
            self.describe(),
            min(seals),
            end,
        )
        return min(seals)

    def preflight(self) -> None:
        """Refuse, read-only, what `recover` would refuse before writing anything: a prefix
        wiped while the node's streams are open (`must_exist`), a prefix of another identity
        than `expect_uid` whose chain holds records, or any while the node's streams are
        open. For a client to call before it registers the node, which fences a live process
        of it (a take-over naming the wrong WAL fenced the node and was then refused). A
        newer epoch's trim marker is not judged here: the registration makes it older."""
        self._check_open()
        found = self._read_identity()
        found_uid = None if found is None else found.uid
        listing = self._list(fence=False)
        self._check_not_wiped(listing)
        if self._expect_uid is None or found_uid == self._expect_uid:
            return
        plan, _ = self._plan(listing, listing.anchor)
        if any(not step.seal and step.next - 1 > listing.trim for step in plan):
            raise self._foreign_error(found_uid)
        self._check_own_elsewhere(found_uid)

    def _check_not_wiped(self, listing: _Listing) -> None:
        """With `must_exist`, a prefix holding no WAL object is a loss (`check_open_node_wal`):
        every open writes a seal, and seals are never deleted, so the prefix was wiped."""
        if self._must_exist and not listing.objects:
            markers = " (only trim markers)" if listing.markers else " and no trim marker"
            check_open_node_wal(
                self._node_id,
                f"its WAL prefix {self._dir}/ in {self._raw_store.describe()} holds no WAL "
                f"object{markers}: they are lost unless the objects are restored",
                location=f"{self._dir}/",
                accept_loss=self._accept_loss,
            )

    def _check_own_elsewhere(self, found_uid: int | None) -> None:
        """With `must_exist`, a WAL of another identity (holding no records) is a loss: the
        node's own WAL, which may hold acknowledged appends, is elsewhere."""
        if self._must_exist:
            check_open_node_wal(
                self._node_id,
                f"the WAL {self.describe()} is not the one the store recorded for it (its "
                f"identity is {found_uid}, the node's {self._expect_uid}): the node's own "
                "WAL is elsewhere",
                location=f"{self._dir}/",
                accept_loss=self._accept_loss,
            )

    # ------------------------------------------------------------------ identity

    def _identity_key(self) -> str:
        return f"{self._dir}/{_IDENTITY_NAME}"

    def _read_identity(self) -> _Identity | None:
        """The prefix's identity; None if it has none (new, or written before identities)."""
        key = self._identity_key()
        try:
            data = self._store.get(key)
        except ObjectNotFoundError:
            return None
        if len(data) != _IDENTITY.size:
            raise CorruptionError(
                f"WAL identity object {key!r} is {len(data)} bytes, not {_IDENTITY.size}",
                location=key,
            )
        magic, version, uid, epoch, crc = _IDENTITY.unpack(data)
        if magic != _IDENTITY_MAGIC or version != 1 or crc32c.crc32c(data[:24], self._seed) != crc:
            raise CorruptionError(f"WAL identity object {key!r} is damaged", location=key)
        return _Identity(int(uid), int(epoch))

    def _identity_blob(self, identity: _Identity) -> bytes:
        head = _IDENTITY.pack(_IDENTITY_MAGIC, 1, identity.uid, identity.epoch, 0)[:24]
        return head + struct.pack("<I", crc32c.crc32c(head, self._seed))

    def _settle_identity(self, found: _Identity | None, foreign: bool, end: int) -> _Identity:
        """The identity this WAL has from now on, this open having sealed it at `end`
        (`found` read before, `foreign` judged on it): kept if it was the expected one, else
        written. Another opener racing this one (another store's, naming the same WAL) is
        caught on the way, and this open fails with `UnavailableError` (open again: the
        other is then judged by the identity it left):

        - ours, replaced meanwhile: a store taking it wrote its own (read again after the
          seal);
        - none yet: created only if absent; another opener's, created first, wins;
        - another store's, taken because it held no records: written over it, then put
          back if that store's writer sealed past this open's seal meanwhile (it opened
          judging by its own identity, so the WAL is its again)."""
        if found is not None and not foreign:
            now = self._read_identity()
            if now != found:
                raise UnavailableError(
                    f"{self.describe()}: another store took this WAL while it was opened (its "
                    f"identity is now {None if now is None else now.uid}, was {found.uid}); "
                    "open it again"
                )
            return found
        key = self._identity_key()
        # Not the RNG: it is seeded from the node id, the same in every store. The location
        # is mixed in so that two WALs made in the same millisecond differ.
        uid = (self._clock.now_ms() << 16) ^ (crc32c.crc32c(self.describe().encode()) & 0xFFFF)
        while uid in (None if found is None else found.uid, self._expect_uid):
            uid += 1
        mine = _Identity(uid, self._epoch)
        if found is None:
            if not self._store.put_if_absent(key, self._identity_blob(mine)):
                raise UnavailableError(
                    f"{self.describe()}: another writer gave this WAL an identity while this "
                    "open sealed it; open it again"
                )
            return mine
        if self._read_identity() != found:
            raise UnavailableError(
                f"{self.describe()}: another opener gave this WAL an identity while this open "
                "took it; open it again"
            )
        # (Not a conditional write: the store API has none for an overwrite. What can still
        # slip between the read and the write is caught below, or by the other opener's own
        # second look.)
        self._store.put(key, self._identity_blob(mine))
        if self._store.head(self.object_key(end + SESSION_GAP)) is not None:
            self._store.put(key, self._identity_blob(found))
            raise UnavailableError(
                f"{self.describe()}: the store whose WAL this was (identity {found.uid}) opened "
                "it while this open took it; open it again"
            )
        return mine

    def _check_identity_kept(self) -> None:
        """`FencedError` if the prefix's identity is no longer the one this writer settled
        at its open: another store took the WAL."""
        if self._ident is not None and self._read_identity() != self._ident:
            raise FencedError(
                f"{self.describe()}: another store took this WAL (its identity changed); this "
                "writer is fenced"
            )

    def _forget_other_store(self, end: int) -> None:
        """This WAL, another store's that held no records, was sealed at `end` by this open:
        trim past the seal (a marker of epoch 0, fencing nobody of that store should it stay
        its WAL) and delete the other store's trim markers, whose epochs (that store's) would
        fence this store's next open, before the identity says it is ours (a crash before
        that leaves it the other store's, to be taken again)."""
        with self._trim_lock:
            self._trim_to(end, epoch=0, must_delete=True)

    def _foreign_error(self, found: int | None) -> InvalidArgumentError:
        whose = (
            "it has none (written before identities, or its identity object was deleted)"
            if found is None
            else str(found)
        )
        if self._expect_uid == -1:
            expected = (
                "and the store recorded none for the node, which has no stream open, so no "
                "record in any WAL is of use to it"
            )
            way_out = (
                "If they are this store's, uploaded before its streams were closed, delete "
                f"the objects under {self._dir}/ to go on"
            )
        else:
            expected = f"the store recorded {self._expect_uid} for the node"
            way_out = "Name this node's own WAL"
        return InvalidArgumentError(
            f"{self.describe()} is not the WAL this store recorded for node "
            f"{self._node_id!r}: its identity is {whose}, {expected}, and it holds records "
            "that are not uploaded: another store's or another node's, which would be "
            f"replayed into this store's streams. {way_out}; the WAL is left as it is"
        )

    def _list(self, *, fence: bool = True) -> _Listing:
        """One LIST of the node's prefix; with `fence`, `FencedError` if a trim marker of a
        newer epoch is in it."""
        listing = _Listing()
        base = self._dir + "/"
        for info in self._store.list(base):
            name = info.key[len(base) :]
            if _OBJECT_NAME.match(name):
                listing.objects[int(name)] = (info.key, info.size)
                continue
            if name == _IDENTITY_NAME:
                continue
            m = _MARKER_NAME.match(name)
            if m is not None:
                listing.markers.append((int(m[1]), int(m[2]), int(m[3]), info.key))
            else:
                self._log.warning("ignoring unexpected key %r in %s", info.key, self.describe())
        newer = max((m[2] for m in listing.markers), default=-1)
        if fence and newer > self._epoch:
            raise FencedError(
                f"WAL of node {self._node_id!r} was trimmed by epoch {newer}; "
                f"epoch {self._epoch} is fenced"
            )
        return listing

    def _plan(self, listing: _Listing, start: int) -> tuple[list[_PlanStep], int]:
        """The chain from `start` as the listing shows it, and the position where it ends."""
        steps: list[_PlanStep] = []
        pos = start
        while (entry := listing.objects.get(pos)) is not None:
            key, size = entry
            seal = size == HEADER.size
            if size < HEADER.size:
                raise CorruptionError(f"WAL object {key!r} is only {size} bytes", location=key)
            nxt = pos + (SESSION_GAP if seal else size - HEADER.size)
            if nxt > _MAX_POSITION:
                raise CorruptionError(f"WAL object {key!r} ends past 2**64", location=key)
            steps.append(_PlanStep(pos, key, size, nxt, seal))
            pos = nxt
        return steps, pos

    @staticmethod
    def _must_read(step: _PlanStep, trim: int, read_records: bool) -> bool:
        # Seals are always read: their epoch says whether a newer owner exists.
        return step.seal or (read_records and step.next - 1 > trim)

    def _check_object(self, step: _PlanStep, data: bytes, *, fence: bool = True) -> WalObjectHeader:
        header = decode_object_header(data, node_id=self._node_id, key=step.key)
        expected_kind = KIND_SEAL if step.seal else KIND_DATA
        if (
            len(data) != step.size
            or header.kind != expected_kind
            or header.first != step.first
            or header.next != step.next
        ):
            raise CorruptionError(
                f"WAL object {step.key!r}: header {header} does not match its key and size "
                f"({step.size} bytes)",
                location=step.key,
            )
        if fence and header.epoch > self._epoch:
            raise FencedError(
                f"WAL of node {self._node_id!r} is owned by epoch {header.epoch} "
                f"(object {step.key!r}); epoch {self._epoch} is fenced"
            )
        return header

    def _records(
        self, step: _PlanStep, header: WalObjectHeader, data: bytes
    ) -> list[tuple[int, bytes]]:
        base = step.first - HEADER.size

        def read(position: int, length: int) -> bytes:
            return data[position - base : position - base + length]

        scanner = FrameScanner(
            read,
            start=step.first,
            bound=step.next,
            seed=self._seed,
            max_session=0xFFFFFFFF,
            max_length=step.next - step.first,
            chunk_bytes=len(data),
        )
        records = list(scanner)
        if scanner.problem is not None or len(records) != header.records:
            raise CorruptionError(
                f"WAL object {step.key!r}: {scanner.problem or 'record count mismatch'} "
                f"at position {scanner.end}",
                location=step.key,
                position=scanner.end,
            )
        return records

    def _claim(self, first: int, kind: int, *, epoch: int | None = None) -> bool:
        """Create the chain object at `first` (a seal, whose owner walked the chain up to it),
        of this writer's epoch unless `epoch` is given; False if the position is taken."""
        blob = self._object_bytes(first, kind, acked_through=first, epoch=epoch)
        return self._store.put_if_absent(self.object_key(first), blob)

    def _object_bytes(
        self,
        first: int,
        kind: int,
        body: bytes = b"",
        records: int = 0,
        *,
        acked_through: int,
        epoch: int | None = None,
    ) -> bytes:
        nxt = first + SESSION_GAP if kind == KIND_SEAL else first + len(body)
        epoch = self._epoch if epoch is None else epoch
        header = WalObjectHeader(kind, epoch, first, nxt, records, acked_through)
        return _encode_header(header, self._seed) + body

    def _check_not_closing(self) -> None:
        """Refuse to write a seal (or become ready) once `close()` began: a recovery left
        behind by a caller that gave up stops writing (a seal PUT already sent may still
        land, harmlessly: the next owner walks past it)."""
        with self._cond:
            if self._closing or self._closed:
                raise closed_error("WAL")

    def _become_ready(
        self,
        listing: _Listing,
        chain: list[_Obj],
        end: int,
        trim: int,
        live: list[tuple[int, int]],
        last_record: int,
    ) -> None:
        seal = _Obj(end, end + SESSION_GAP, self.object_key(end), -1, True)
        on_chain = {o.first for o in chain}
        with self._cond:
            if self._closing or self._closed:
                raise closed_error("WAL")
            self._objects = deque([*chain, seal])
            self._stale = [
                (first, key)
                for first, (key, size) in listing.objects.items()
                if first not in on_chain and size != HEADER.size
            ]
            self._marker_keys = [m[3] for m in listing.markers]
            self._trim = trim
            self._anchor = listing.anchor
            self._acked = max(last_record, trim)
            self._live = deque(live)
            self._live_bytes = sum(size for _, size in live)
            self._next = self._durable = end + SESSION_GAP
            self._sealed_at = end
            self._start_workers()

    def _start_workers(self) -> None:
        self._ready = True
        self._pool = ThreadPoolExecutor(self._settings.max_inflight_puts, "s3stream-wal-put")
        if self._settings.max_hedged_puts:
            self._hedge_pool = ThreadPoolExecutor(
                self._settings.max_inflight_puts * self._settings.max_hedged_puts,
                "s3stream-wal-hedge",
            )
        self._flusher = threading.Thread(
            target=self._flush_loop, name="s3stream-wal-flusher", daemon=True
        )
        self._flusher.start()

    # ------------------------------------------------------------------ room

    def _reserve(self, size: int) -> int:
        # An empty WAL takes any record (none is larger than the capacity).
        if self._live_bytes + size > self._capacity and self._live_bytes:
            return -1
        pos = self._next
        self._next = pos + size
        self._live.append((pos, size))
        self._live_bytes += size
        return pos

    def _room(self) -> tuple[int, int]:
        return self._live_bytes, self._capacity

    # ------------------------------------------------------------------ the flusher

    def _flush_loop(self) -> None:
        pool = self._pool
        assert pool is not None
        while True:
            with self._cond:
                batch = self._next_batch()
            if batch is None:
                break
            pool.submit(self._attempt, batch, 0)
        if self._close_later:  # closed from a completion callback: finish it here
            try:
                self._stop(abandon=False)
            finally:
                self._release(clean=True)

    def _next_batch(self) -> _Batch | None:
        """Wait (under `_cond`) until a batch is due and cut it, sending the hedges that fall
        due meanwhile; None once stopping (after the last batch is resolved, so the batches
        written by `close()` are hedged too). A wait ends at the next deadline (the batch
        interval, a hedge) or when notified: a record pending, a batch resolved, a flush
        asked for, close."""
        while True:
            if self._abandoned or (self._closing and not self._pending and not self._unacked):
                return None
            now = self._clock.monotonic()
            wait = self._send_due_hedges(now)
            if self._pending and self._inflight < self._settings.max_inflight_puts:
                due = self._last_cut + self._interval_s - now
                if (
                    due <= 0
                    or self._closing
                    or self._flush_now
                    or self._pending_bytes >= self._max_batch
                ):
                    return self._cut()
                wait = min(due, wait)
            self._cond.wait(None if wait == math.inf else wait)

    def _send_due_hedges(self, now: float) -> float:
        """Start a hedge of every unresolved batch whose PUT is overdue (under `_cond`);
        the seconds until the next one falls due."""
        pool = self._hedge_pool
        if pool is None:
            return math.inf
        soonest = math.inf
        for batch in self._unacked:
            if batch.done or not isinstance(batch, _Batch):
                continue
            if batch.hedge_due <= now:
                batch.attempts += 1
                batch.running += 1
                self._hedges_sent += 1
                more = batch.attempts <= self._settings.max_hedged_puts
                delay = self._hedge_delays_s[batch.size_class]
                batch.hedge_due = now + delay if more else math.inf
                pool.submit(self._attempt, batch, batch.attempts - 1)
            soonest = min(soonest, batch.hedge_due - now)
        return soonest

    def _cut(self) -> _Batch:
        records = self._cut_pending(self._max_batch)
        total = sum(r.size for r in records)
        self._last_cut = self._clock.monotonic()
        self._inflight += 1
        first = records[0].position
        obj = _Obj(first, first + total, self.object_key(first), records[-1].position, False)
        self._objects.append(obj)
        size_class = bisect.bisect(_HEDGE_CLASS_BYTES, HEADER.size + total)
        batch = _Batch(
            records,
            obj=obj,
            attempts=1,
            running=1,
            size_class=size_class,
            acked_through=self._durable,
        )
        if self._hedge_pool is not None:
            batch.hedge_due = self._last_cut + self._hedge_delays_s[size_class]
        self._unacked.append(batch)
        return batch

    def _attempt(self, batch: _Batch, index: int) -> None:
        """One PUT of `batch`'s object: the first (`index` 0) or a hedge. Every attempt sends
        the same bytes to the same key; the first to get an answer resolves the batch."""
        with self._cond:
            skip = batch.done  # resolved while this attempt waited for a thread
        outcome: bool | S3StreamError = False
        created = False
        elapsed: float | None = None
        if not skip:
            try:
                blob = batch.blob
                if blob is None:
                    blob = batch.blob = self._batch_bytes(batch)
                started = self._clock.monotonic()
                created = self._store.put_if_absent(batch.obj.key, blob)
                elapsed = self._clock.monotonic() - started
                outcome = created
                with self._cond:
                    # With a sibling attempt, "exists" may mean the sibling created it.
                    check = not created and not batch.done and batch.attempts > 1
                if check:
                    outcome = self._holds(batch.obj.key, blob)
            except S3StreamError as exc:
                outcome = exc
            except Exception as exc:  # a backend bug must not leave appenders hanging
                outcome = UnavailableError(f"{self.describe()}: WAL object PUT failed: {exc!r}")
                outcome.__cause__ = exc
        self._attempt_done(batch, index, outcome, created, elapsed)

    def _batch_bytes(self, batch: _Batch) -> bytes:
        return self._object_bytes(
            batch.obj.first,
            KIND_DATA,
            b"".join([part for r in batch.records for part in r.parts]),
            len(batch.records),
            acked_through=batch.acked_through,
        )

    def _holds(self, key: str, blob: bytes) -> bool:
        """Whether `key` holds exactly `blob`: an object of another writer (a taker's seal)
        always differs, as its header carries that writer's epoch."""
        try:
            return self._store.get(key) == blob
        except ObjectNotFoundError:
            return False  # it existed, so someone else wrote it (and has since trimmed it)

    def _attempt_done(
        self,
        batch: _Batch,
        index: int,
        outcome: bool | S3StreamError,
        created: bool,
        elapsed: float | None,
    ) -> None:
        """Account for one finished attempt; resolve the batch if this settles it."""
        with self._cond:
            batch.running -= 1
            if elapsed is not None:
                self._observe_put(batch.size_class, elapsed)
            if batch.done:
                if created and batch.error is None and batch.obj not in self._objects:
                    # A late attempt created the object again after a trim had deleted the
                    # winner's copy: below the anchor, so recovery never reads it, and the
                    # next trim deletes it.
                    self._stale.append((batch.obj.first, batch.obj.key))
                return
            error: S3StreamError | None
            if isinstance(outcome, S3StreamError):
                if batch.running:
                    return  # a sibling attempt may still succeed
                error = outcome
            elif outcome:
                error = None
                if index:
                    self._hedges_won += 1
            else:
                error = FencedError(
                    f"{self.describe()}: WAL position {batch.obj.first} was claimed by a newer "
                    "owner (the node was taken over)"
                )
            batch.done = True
            batch.error = error
            batch.blob = None
            batch.hedge_due = math.inf
            self._inflight -= 1
            if error is not None:
                self._fail_locked(error)
            self._cond.notify_all()
            ready = self._take_turn()
        if ready:
            self._complete_turn(ready)

    def _observe_put(self, size_class: int, seconds: float) -> None:
        """Feed one PUT latency to the adaptive hedge delay of its size class (under
        `_cond`)."""
        if self._settings.hedge_after_ms:
            return
        window = self._put_latencies[size_class]
        window.append(seconds)
        if len(window) >= _HEDGE_MIN_SAMPLES:
            p90 = sorted(window)[(9 * (len(window) - 1)) // 10]
            floor = self._settings.hedge_min_ms / 1000
            self._hedge_delays_s[size_class] = max(floor, _HEDGE_FACTOR * p90)

    def _acknowledged(self, group: Group) -> None:
        assert isinstance(group, _Batch)
        group.obj.landed = True
        self._durable = group.obj.next

    # ------------------------------------------------------------------ trim and reset

    def _persist_trim(self, position: int, *, wait: bool) -> None:
        # Persisted in the calling thread, never waiting for the writer: `wait` changes nothing.
        with self._trim_lock:
            with self._cond:
                if position <= self._trim:
                    return
            self._trim_to(position)

    def _trim_to(
        self, position: int, *, epoch: int | None = None, must_delete: bool = False
    ) -> None:
        """Persist the trim point (a marker of this writer's epoch unless `epoch` is given),
        then delete what it frees (holding `_trim_lock`). A failed delete is left to a later
        trim unless `must_delete`: then it raises."""
        with self._cond:
            anchor = self._next
            for o in self._objects:
                if o.last > position:
                    anchor = o.first
                    break
            else:
                if self._pending:
                    anchor = self._pending[0].position
            anchor = max(anchor, self._anchor)
        epoch = self._epoch if epoch is None else epoch
        key = f"{self._dir}/trim/{position:020d}.{anchor:020d}.{epoch:012d}"
        self._store.put(key, b"")
        with self._cond:
            self._trim = position
            self._anchor = anchor
            while self._live and self._live[0][0] <= position:
                self._live_bytes -= self._live.popleft()[1]
            # Seals stay forever: deleting one would free its position for the writer it
            # fenced, whose next PUT would then succeed off the chain (acked, never recovered).
            doomed = [o.key for o in self._objects if o.first < anchor and o.landed and o.last >= 0]
            self._objects = deque(o for o in self._objects if o.first >= anchor or not o.landed)
            doomed += [k for first, k in self._stale if first < anchor]
            self._stale = [(first, k) for first, k in self._stale if first >= anchor]
            doomed += [k for k in self._marker_keys if k != key]
            self._marker_keys = [key]
            self._cond.notify_all()
        if doomed:
            try:
                self._store.delete_many(doomed)
            except S3StreamError as exc:
                if must_delete:
                    raise
                # Harmless: recovery starts at the anchor; a later trim deletes them.
                self._log.warning(
                    "%s: deleting trimmed WAL objects failed: %s", self.describe(), exc
                )
                with self._cond:
                    self._stale += [(-1, k) for k in doomed]

    def reset(self) -> None:
        with self._trim_lock:
            super().reset()

    def _ready_without_records(self) -> None:
        for _ in self._recover(read_records=False):
            pass

    def _drop_all(self) -> None:
        with self._cond:
            target = self._next - 1
            if target <= self._trim:
                return
        self._trim_to(target)

    def _resume(self, failed: S3StreamError) -> str:
        """`reset` after a failure: make the WAL take appends again (holding `_trim_lock`).

        A failed PUT may still have created its object (the answer was lost), so the chain may
        go on past the last acknowledged object with records nobody acknowledged. They must
        never be recovered: the chain is walked as the store shows it now and sealed at its
        end, exactly as a new owner does at open (a seal of a newer epoch on the way means
        the node was taken over: `FencedError`), and a trim marker puts the anchor past that
        seal, so recovery starts beyond every old object. The marker is durable before the
        failure is cleared; until then every append keeps failing.
        """
        with self._order_lock:
            self._check_identity_kept()
            listing = self._list()
            pos = listing.anchor
            for _ in range(_SEAL_ATTEMPTS):
                plan, end = self._plan(listing, pos)
                for step in plan:
                    if step.seal:
                        header = self._check_object(step, self._store.get(step.key))
                        if step.first > self._sealed_at and header.epoch != self._epoch:
                            # Not ours, and not a newer epoch of this store's node: another
                            # store's take (epoch 0), or an older writer's. Either way the
                            # chain past this writer's seal is not its own to seal and trim.
                            raise FencedError(
                                f"{self.describe()}: a seal of epoch {header.epoch} past this "
                                f"writer's (epoch {self._epoch}) at position {step.first}: "
                                "another writer opened this WAL; this writer is fenced"
                            )
                if self._claim(end, KIND_SEAL):
                    # Again after the seal: a store that took the WAL since the check above
                    # may have appended before it; nothing of theirs may be trimmed.
                    self._check_identity_kept()
                    break
                # Claimed meanwhile (a late attempt of ours, or a taker's seal): walk again.
                listing = self._list()
                pos = max(pos, listing.anchor)
            else:
                raise UnavailableError(
                    f"{self.describe()}: could not seal the WAL to resume after: {failed}"
                )
            with self._cond:
                # Every data object below the seal, landed or not, goes with the next trim.
                listed = {
                    key: first
                    for first, (key, size) in listing.objects.items()
                    if size != HEADER.size
                }
                # ... and those of ours the listing missed (a PUT that may land yet).
                for o in self._objects:
                    if o.key and o.last >= 0:
                        listed.setdefault(o.key, o.first)
                self._stale += [(first, key) for key, first in listed.items()]
                seal = _Obj(end, end + SESSION_GAP, self.object_key(end), -1, True)
                self._objects = deque([seal])
                self._next = self._durable = end + SESSION_GAP
                self._sealed_at = end
                self._acked = max(self._acked, end)
            self._trim_to(end)
            with self._cond:
                self._live.clear()
                self._live_bytes = 0
                self._clear_failure_locked()
        return f"past a seal at position {end}"

    # ------------------------------------------------------------------ close

    def _stop(self, *, abandon: bool) -> None:
        if self._ready and not abandon:
            self._wait_idle()
        with self._cond:
            self._cond.notify_all()
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join()
        # Attempts still running finish first (bounded by the store's retry deadline), so
        # nothing of this WAL touches the store once `close()` returns.
        for pool in (self._pool, self._hedge_pool):
            if pool is not None:
                pool.shutdown(wait=True)

    def _release(self, *, clean: bool) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if clean and self._close_store:  # a crash (`_abandon`) leaves the store to its owner
            self._raw_store.close()


# ---------------------------------------------------------------------- URL factory


def check_object_wal(store: ObjectStore, node_id: str, *, prefix: str = "") -> ObjectWalCheck:
    """`ObjectWal.check` of `node_id`'s WAL under `prefix` of `store`: read-only, whatever
    epoch owns it (a checker never writes, so it cannot be fenced)."""
    wal = ObjectWal(store, node_id=node_id, node_epoch=_CHECKER_EPOCH, prefix=prefix, retry=False)
    try:
        return wal.check()
    finally:
        wal.close()


def open_object_wal(
    url: str,
    *,
    node_id: str,
    node_epoch: int = 0,
    clock: Clock,
    on_full: Callable[[], None] | None = None,
    object_settings: ObjectWalSettings | None = None,
    storage_options: Mapping[str, Any] | None = None,
    rng: random.Random | None = None,
    must_exist: bool = False,
    accept_wal_loss: bool = False,
    expect_uid: int | None = None,
    open_store: Callable[[str], ObjectStore] | None = None,
    **_other_kinds: Any,
) -> WriteAheadLog:
    """Factory of ``s3://bucket/prefix/wal`` and ``object+URL`` (any object-store URL, e.g.
    ``object+file:///var/wal``): an `ObjectWal` whose objects go under the URL. `must_exist`,
    `accept_wal_loss` and `expect_uid` are its `must_exist`, `accept_loss` and `expect_uid`.
    `open_store` opens the store of the URL (given without its query) instead of
    `open_object_store` with `storage_options` (the S3 WAL's choice of client,
    `open_s3_wal`); the WAL closes it.

    The query may override single fields of `object_settings`, by their names
    (``wal_batch_interval_ms=50``, ``max_unflushed_bytes=256MiB``, ``full_wait_ms=30s``; the
    first short names ``batch_interval_ms`` and ``batch_max_bytes`` still work), with the
    values of every settings source (`s3stream.settings_parse`, docs/configuration.md).
    """
    from ..objectstore.registry import open_object_store
    from ..settings_parse import settings_from_query

    store_url, _, query = url.partition("?")
    scheme, _ = split_scheme(store_url)
    if scheme.startswith(OBJECT_WAL_PREFIX):
        store_url = store_url[len(OBJECT_WAL_PREFIX) :]
    settings = settings_from_query(ObjectWalSettings, query, base=object_settings, url=url)
    store = (
        open_object_store(store_url, storage_options)
        if open_store is None
        else open_store(store_url)
    )
    try:
        return ObjectWal(
            store,
            node_id=node_id,
            node_epoch=node_epoch,
            settings=settings,
            clock=clock,
            rng=rng,
            on_full=on_full,
            close_store=True,
            must_exist=must_exist,
            accept_loss=accept_wal_loss,
            expect_uid=expect_uid,
        )
    except BaseException:
        with contextlib.suppress(S3StreamError):
            store.close()
        raise
