"""Settings: frozen, keyword-only dataclasses of plain values, units in the names.

Settings configure behaviour; components (object store, WAL, clock) are passed in as objects,
never chosen by flags here. Each class validates itself so a bad value fails at construction
(`InvalidArgumentError` naming the field), not later in a background thread: every field is
checked against its annotation (an int field refuses bools, floats and strings; a bool field
refuses anything but a bool), sizes and counts must be > 0 unless 0 is documented to mean
something, ``*_ms`` durations fit the platform's timers, and the cross-field limits hold.

Each name means one thing: a field's name is also its name in a settings mapping, a WAL URL's
query and an ``S3STREAM_*`` environment variable, all read by `s3stream.settings_parse`
(docs/configuration.md). Nested classes are sections of `ClientSettings`: ``compaction``,
``file_wal`` and ``object_wal``.
"""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass, field, fields

from .errors import InvalidArgumentError
from .units import GiB, KiB, MiB
from .validation import (
    I64_MAX,
    MAX_DURATION_MS,
    check_bool,
    check_choice,
    check_instance,
    check_int,
    check_zstd_level,
)

__all__ = [
    "MIN_ORPHAN_GRACE_MS",
    "ClientSettings",
    "CompactionSettings",
    "FileWalSettings",
    "ObjectWalSettings",
]

#: The shortest `CompactionSettings.orphan_grace_ms`: an orphan sweep must never race an
#: upload between its PUT and its commit (a session's own keys are not swept at all; this is
#: the second line of defence).
MIN_ORPHAN_GRACE_MS = 600_000

#: Largest data block an object may hold (its size is stored in 32 bits): the upper bound of
#: `ClientSettings.block_target_bytes` and of `ObjectWriter`'s block target.
MAX_BLOCK_TARGET_BYTES = 1 << 31
#: Largest `ObjectWalSettings.max_unflushed_bytes`; ``wal.object.SESSION_GAP`` is twice it, so
#: that a new owner's WAL positions never meet the old owner's (docs/s3-wal.md).
MAX_OBJECT_WAL_UNFLUSHED_BYTES = 1 << 39

_STREAM_SET_SPLIT_BYTES = 8 * MiB


def _check_fields(
    obj: object, *, allow_zero: tuple[str, ...] = (), own_checks: tuple[str, ...] = ()
) -> None:
    """Check every field of settings `obj` against its annotation (fields in `own_checks` are
    checked by the class itself). A field of a type with no rule here is a programming error,
    so that a new field cannot go unchecked."""
    cls = type(obj).__name__
    for f in fields(obj):  # type: ignore[arg-type]
        if f.name in own_checks:
            continue
        name = f"{cls}.{f.name}"
        value = getattr(obj, f.name)
        # Annotations are strings here (``from __future__ import annotations``).
        if f.type == "bool":
            check_bool(name, value)
        elif f.type == "int":
            check_int(
                name,
                value,
                minimum=0 if f.name in allow_zero else 1,
                maximum=MAX_DURATION_MS if f.name.endswith("_ms") else I64_MAX,
            )
        else:
            raise TypeError(f"{name}: no validation rule for fields of type {f.type}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactionSettings:
    """What the compactor merges, splits, trims and deletes, and how often (docs/compaction.md)."""

    #: Run the compactor in a background thread of the client (else only `client.compact()`).
    background: bool = False
    #: Pause between two background passes.
    interval_ms: int = 60_000
    #: Stream-set objects smaller than this are merged; a merged one this big is left alone.
    stream_set_object_target_bytes: int = 256 * MiB
    #: A stream with at least this many bytes in the merged stream-set objects leaves them as
    #: stream objects of its own (at upload time `ClientSettings.stream_split_bytes` decides).
    stream_set_split_bytes: int = _STREAM_SET_SPLIT_BYTES
    #: Stream-set objects holding data older than this are split completely (0: never).
    stream_set_max_age_ms: int = 3_600_000
    #: Merge stream-set objects only when at least this many can be merged.
    stream_set_min_objects: int = 2
    #: Adjacent stream objects of a stream are merged into objects of up to this size.
    stream_object_target_bytes: int = 64 * MiB
    #: Most bytes one compaction task reads (and holds in memory while writing).
    max_task_bytes: int = 256 * MiB
    #: Retention by age for streams without a ``retention.ms`` tag (0: keep forever).
    retention_ms: int = 0
    #: Retention by size for streams without a ``retention.bytes`` tag (0: unlimited).
    retention_bytes: int = 0
    #: Replaced and expired objects are deleted this long after they were marked deleted,
    #: because readers holding an older metadata snapshot may still read them.
    deletion_delay_ms: int = 600_000
    #: An object PUT but never committed is deleted once it was seen unreferenced for this
    #: long, and only once its writer's session has ended (docs/compaction.md); at least
    #: `MIN_ORPHAN_GRACE_MS`.
    orphan_grace_ms: int = 86_400_000
    #: How often the (listing) orphan sweep runs; 0 disables it.
    orphan_sweep_interval_ms: int = 3_600_000
    #: Most keys one orphan sweep looks at; the next sweep goes on where it stopped.
    orphan_sweep_max_keys: int = 10_000
    #: Most bytes per second the compactor reads plus writes (0: no limit of its own); the
    #: client's `background_bytes_per_s` applies as well. Compaction traffic delays appends
    #: on the same machine (docs/compaction.md has the measurements behind the default);
    #: raise it when compaction falls behind the ingest.
    bytes_per_s: int = 4 * MiB
    #: Deprecated spelling of `stream_set_split_bytes` (it read like the upload-time
    #: `ClientSettings.stream_split_bytes`, which has another meaning and default).
    stream_split_bytes: InitVar[int | None] = None

    def __post_init__(self, stream_split_bytes: int | None) -> None:
        if stream_split_bytes is not None:
            warnings.warn(
                "CompactionSettings.stream_split_bytes is deprecated: it is now "
                "stream_set_split_bytes (ClientSettings.stream_split_bytes is the upload-time "
                "split)",
                DeprecationWarning,
                stacklevel=3,
            )
            if self.stream_set_split_bytes != _STREAM_SET_SPLIT_BYTES:
                raise InvalidArgumentError(
                    "CompactionSettings: give stream_set_split_bytes or its deprecated "
                    "spelling stream_split_bytes, not both"
                )
            object.__setattr__(self, "stream_set_split_bytes", stream_split_bytes)
        grace = self.orphan_grace_ms
        if type(grace) is int and grace < MIN_ORPHAN_GRACE_MS:
            # Before the general check, whose "at least 1" would be the wrong floor to name.
            raise InvalidArgumentError(
                f"CompactionSettings.orphan_grace_ms must be at least {MIN_ORPHAN_GRACE_MS} "
                f"(10 minutes: far above any upload's PUT-to-commit time), got {grace}"
            )
        _check_fields(
            self,
            allow_zero=(
                "interval_ms",
                "stream_set_max_age_ms",
                "retention_ms",
                "retention_bytes",
                "deletion_delay_ms",
                "orphan_sweep_interval_ms",
                "bytes_per_s",
            ),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientSettings:
    """How a `StreamClient` batches, uploads, caches and waits."""

    #: Upload once this many bytes sit in the WAL un-uploaded.
    upload_threshold_bytes: int = 64 * MiB
    #: Upload at least this often while anything is pending (0 disables the timer).
    upload_interval_ms: int = 30_000
    #: A stream with at least this many pending bytes gets its own stream object when
    #: uploaded (the compactor's threshold is `CompactionSettings.stream_set_split_bytes`).
    stream_split_bytes: int = 16 * MiB
    #: Target size of one data block inside an object (one stream per block; at most 2 GiB).
    block_target_bytes: int = 1 * MiB
    #: Compress data blocks with zstd when it saves space ("none" or "zstd").
    block_compression: str = "none"
    #: zstd level for block compression: 1 (fast) to 22 (small); libzstd's negative "fast"
    #: levels (down to -131072) and 0 (its default, 3) are accepted too.
    zstd_level: int = 3
    #: Parallel PUTs during one upload.
    upload_parallelism: int = 4
    #: Memory of un-uploaded batches at which appends block until an upload frees room: each
    #: batch's record plus about 384 bytes of Python objects, and packed objects in flight.
    max_pending_bytes: int = 512 * MiB
    #: Longest an append waits for room before `BackpressureError`.
    backpressure_timeout_ms: int = 30_000
    #: Deadline of a blocking client call made without a timeout of its own: a synchronous
    #: append waiting to be durable, `flush`, `close` (docs/architecture.md, "Deadlines").
    call_timeout_ms: int = 60_000
    #: Longest one object-store call may take, retries included; each try is bounded as
    #: well by the store's own connect and read timeouts.
    store_timeout_ms: int = 30_000
    #: Memory of already-uploaded batches the LogCache keeps for tail readers (each batch's
    #: record plus about 384 bytes of Python objects).
    log_cache_bytes: int = 128 * MiB
    #: Write a metadata checkpoint after this many log entries.
    metadata_checkpoint_interval: int = 64
    #: Times a metadata commit may lose the race for the next log entry before it gives up;
    #: 0 (the default): no limit, lost races are retried (re-reading what the winners
    #: wrote) until the commit's deadline, so contention alone is never an error.
    metadata_commit_attempts: int = 0
    #: How long a metadata commit may keep retrying lost races (re-reading what the winners
    #: wrote) before it fails with `UnavailableError` saying the log is overloaded.
    metadata_commit_timeout_ms: int = 60_000
    #: Bytes of object blocks the BlockCache keeps.
    block_cache_bytes: int = 256 * MiB
    #: Readahead of a sequential (catch-up) reader starts at this many bytes ...
    readahead_initial_bytes: int = 1 * MiB
    #: ... and doubles per sequential fetch up to this (0 disables readahead).
    readahead_max_bytes: int = 64 * MiB
    #: How often a `StreamReader.tail` that has caught up looks for newly committed data
    #: (one GET and one HEAD of the metadata log per look).
    tail_poll_ms: int = 500
    #: An idempotent producer idle this long is forgotten (its next append starts afresh).
    producer_expiry_ms: int = 15 * 60_000
    #: At most this many bytes of a reopened stream's newest data are read to rebuild its
    #: producers (on its first idempotent append), back to `producer_expiry_ms` ago.
    producer_scan_bytes: int = 64 * MiB
    #: Rate limit of background object-store traffic (uploads, compaction, readahead), in
    #: bytes and requests per second; 0 means unlimited. Foreground reads are never delayed.
    background_bytes_per_s: int = 0
    background_requests_per_s: int = 0
    #: The compactor (merging objects, retention, deleting garbage).
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    #: The file WAL, when the client opens one from a URL (`s3stream.open`, `take_over`);
    #: None: that WAL's defaults (a WAL URL's query still overrides single fields).
    file_wal: FileWalSettings | None = None
    #: The object WAL, when the client opens one (the default WAL of a remote store, a WAL
    #: URL, `take_over`); None: that WAL's defaults.
    object_wal: ObjectWalSettings | None = None

    def __post_init__(self) -> None:
        _check_fields(
            self,
            allow_zero=(
                "metadata_commit_attempts",
                "upload_interval_ms",
                "log_cache_bytes",
                "block_cache_bytes",
                "readahead_initial_bytes",
                "readahead_max_bytes",
                "background_bytes_per_s",
                "background_requests_per_s",
            ),
            own_checks=("block_compression", "zstd_level", "compaction", "file_wal", "object_wal"),
        )
        check_instance("ClientSettings.compaction", self.compaction, CompactionSettings)
        check_instance("ClientSettings.file_wal", self.file_wal, FileWalSettings, allow_none=True)
        check_instance(
            "ClientSettings.object_wal", self.object_wal, ObjectWalSettings, allow_none=True
        )
        check_choice("ClientSettings.block_compression", self.block_compression, ("none", "zstd"))
        # Checked even with compression off: a level libzstd refuses would otherwise only
        # fail once compression is turned on, in the uploader thread.
        check_zstd_level("ClientSettings.zstd_level", self.zstd_level)
        check_int(
            "ClientSettings.block_target_bytes",
            self.block_target_bytes,
            minimum=1,
            maximum=MAX_BLOCK_TARGET_BYTES,
        )
        if self.max_pending_bytes < self.upload_threshold_bytes:
            raise InvalidArgumentError(
                "ClientSettings.max_pending_bytes must be >= upload_threshold_bytes, got "
                f"{self.max_pending_bytes} < {self.upload_threshold_bytes}"
            )

    def call_limit_s(self, timeout_s: float | None = None) -> float:
        """Seconds a blocking call may take: its own `timeout_s`, or `call_timeout_ms`."""
        return self.call_timeout_ms / 1000 if timeout_s is None else timeout_s


@dataclass(frozen=True, kw_only=True, slots=True)
class FileWalSettings:
    """The file / block-device write-ahead log."""

    #: Size of the ring buffer (ignored for an existing WAL, whose header records it).
    capacity_bytes: int = 2 * GiB
    #: Write with O_DIRECT from aligned buffers, bypassing the page cache, where the filesystem
    #: allows it (else buffered writes are used, equally durable). Off by default: measured
    #: slower for small records under concurrency (docs/file-wal.md).
    direct_io: bool = False
    #: Write zeros over the whole ring when a new WAL file is created (a device, or an existing
    #: WAL, is never filled). A preallocated block is *unwritten* until its first write, and the
    #: ``fdatasync`` that follows that write must also persist the extent's conversion: on the
    #: ring's first lap every sync costs a metadata write besides the data (measured 0.6-0.7x
    #: of the later laps' rate, docs/file-wal.md). Filling makes the first lap run like the
    #: later ones, at the price of writing the capacity once while the WAL is created (about a
    #: second per GiB here). Off by default: the first hour and short-lived test stores pay for
    #: it without using it.
    zero_fill: bool = False
    #: Let a synchronous append (`Stream.append` without `timeout_s`) write and sync its own
    #: record in its own thread when no commit is under way, instead of waking the WAL's
    #: writer thread and waiting for it: one thread wake-up per append instead of three
    #: (measured 5-20% more appends/s for one synchronous writer, lower p50). Off by default
    #: because it gives up the call's deadline on a device that stops answering: the caller
    #: is then inside ``fdatasync``, which cannot be interrupted, until the device answers.
    #: With it off, the writer thread waits on the device and the caller raises
    #: `UnavailableError` at its deadline (docs/file-wal.md, "Caller-driven commits").
    caller_commits: bool = False
    #: Largest group commit written with one vectored write.
    max_group_bytes: int = 8 * MiB
    #: Longest an append waits for ring space before `WalFullError` (0: fail at once).
    full_wait_ms: int = 30_000
    #: Positions past the last write that are promised (in the header) before data goes there;
    #: nothing is ever written past the promise, so recovery and `reset()` never trust bytes
    #: beyond it. Larger means rarer extra header writes (one per window).
    recovery_window_bytes: int = 64 * MiB
    #: Size of one read while recovery scans the ring.
    recovery_read_bytes: int = 8 * MiB

    def __post_init__(self) -> None:
        _check_fields(self, allow_zero=("full_wait_ms",))
        if self.capacity_bytes % (4 * KiB) or self.capacity_bytes < 16 * KiB:
            raise InvalidArgumentError(
                "FileWalSettings.capacity_bytes must be a multiple of 4096 and >= 16 KiB, "
                f"got {self.capacity_bytes}"
            )
        if self.max_group_bytes < 4 * KiB:
            raise InvalidArgumentError(
                f"FileWalSettings.max_group_bytes must be >= 4096, got {self.max_group_bytes}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectWalSettings:
    """The write-ahead log kept in object storage (the "S3 WAL")."""

    #: Write pending records as one WAL object at least this often.
    wal_batch_interval_ms: int = 250
    #: ... or as soon as this many bytes are pending.
    wal_batch_max_bytes: int = 8 * MiB
    #: WAL object PUTs allowed in flight at once.
    max_inflight_puts: int = 4
    #: Un-trimmed WAL bytes at which appends block.
    max_unflushed_bytes: int = 256 * MiB
    #: Longest an append waits for room before `WalFullError`.
    full_wait_ms: int = 30_000
    #: Send an identical second PUT of a WAL object (a *hedge*) when the first has not
    #: finished after this long, since one slow PUT holds up every later acknowledgement;
    #: 0 = adaptive: twice the p90 of the last 64 PUTs, at least `hedge_min_ms`.
    hedge_after_ms: int = 0
    #: Lower bound of the adaptive hedge delay (so fast stores are not hedged on noise).
    hedge_min_ms: int = 10
    #: Hedges at most per WAL object, one delay apart (0: never hedge).
    max_hedged_puts: int = 1

    def __post_init__(self) -> None:
        _check_fields(self, allow_zero=("hedge_after_ms", "max_hedged_puts"))
        check_int(
            "ObjectWalSettings.max_unflushed_bytes",
            self.max_unflushed_bytes,
            minimum=1,
            maximum=MAX_OBJECT_WAL_UNFLUSHED_BYTES,
        )
