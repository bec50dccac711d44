"""Every metric s3stream reports: name, kind, unit, labels and meaning (docs/observability.md
lists the same, and a test keeps the two in step).

Names are OpenTelemetry style (dotted, unit apart); the Prometheus collector derives
``s3stream_append_duration_seconds`` and the like from them.
"""

from __future__ import annotations

from .instruments import LATENCY_BOUNDS, Kind, MetricSpec

__all__ = ["ALL", "PURPOSES"]

C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM

#: Why a component talks to the object store; the ``purpose`` label of object-store metrics.
#: ``other``: calls made on the store stack directly, by no component of a client.
PURPOSES = ("wal", "upload", "read", "compaction", "metadata", "other")

# -- appends and fetches ---------------------------------------------------------------------

APPEND_DURATION = MetricSpec(
    "s3stream.append.duration", H, "s",
    "Time from an append call until its batch is durable in the WAL (acknowledged appends).",
    bounds=LATENCY_BOUNDS,
)  # fmt: skip
APPEND_BYTES = MetricSpec(
    "s3stream.append.bytes", C, "By", "Payload bytes of acknowledged appends."
)
APPEND_RECORDS = MetricSpec(
    "s3stream.append.records", C, "{record}", "Offsets taken by acknowledged appends."
)
APPEND_ERRORS = MetricSpec(
    "s3stream.append.errors", C, "{error}",
    "Appends that failed, by the error's class name.", ("error.type",),
)  # fmt: skip
FETCH_DURATION = MetricSpec(
    "s3stream.fetch.duration", H, "s",
    "Time of a fetch (`Stream.fetch`, `StreamClient.read`), from the caches or objects.",
    bounds=LATENCY_BOUNDS,
)  # fmt: skip
FETCH_BYTES = MetricSpec("s3stream.fetch.bytes", C, "By", "Payload bytes fetches returned.")
FETCH_RECORDS = MetricSpec(
    "s3stream.fetch.records", C, "{record}", "Offsets of the batches fetches returned."
)

# -- caches ----------------------------------------------------------------------------------

CACHE_REQUESTS = MetricSpec(
    "s3stream.cache.requests", C, "{request}",
    "Lookups per cache tier: ``log`` (a fetch the LogCache served whole: hit; one that went "
    "on to objects: miss), ``block`` (blocks: hit, miss, or joined a fetch in flight), "
    "``index`` (object indexes: hit, miss).",
    ("tier", "result"),
)  # fmt: skip
CACHE_SIZE = MetricSpec(
    "s3stream.cache.size", G, "By", "Bytes a cache tier holds now (``log``, ``block``).",
    ("tier",),
)  # fmt: skip
CACHE_EVICTIONS = MetricSpec(
    "s3stream.cache.evictions", C, "{block}",
    "Blocks evicted from the block cache to stay within its budget.", ("tier",),
)  # fmt: skip
CACHE_READAHEAD = MetricSpec(
    "s3stream.cache.readahead", C, "{block}",
    "Blocks fetched ahead of readers (``fetched``) and those a read then used (``used``).",
    ("result",),
)  # fmt: skip

# -- uploads and the WAL ---------------------------------------------------------------------

UPLOAD_DURATION = MetricSpec(
    "s3stream.upload.duration", H, "s",
    "Time of one upload: from taking the pending batches to their metadata commit (PUTs in "
    "parallel, retries included).",
    bounds=LATENCY_BOUNDS,
)  # fmt: skip
UPLOAD_BYTES = MetricSpec("s3stream.upload.bytes", C, "By", "Bytes of the objects uploaded.")
UPLOAD_OBJECTS = MetricSpec(
    "s3stream.upload.objects", C, "{object}", "Objects uploaded and committed."
)
UPLOAD_FAILURES = MetricSpec(
    "s3stream.upload.failures", C, "{attempt}", "Upload attempts that failed (and were retried)."
)
UPLOAD_PENDING = MetricSpec(
    "s3stream.upload.pending", G, "By", "Acknowledged bytes waiting for upload."
)
WAL_COMMIT_DURATION = MetricSpec(
    "s3stream.wal.commit.duration", H, "s",
    "Time of one file-WAL group commit (vectored write and fdatasync). An object WAL's commits "
    "are its conditional PUTs: ``s3stream.objectstore.operation.duration{purpose=\"wal\"}``.",
    bounds=LATENCY_BOUNDS,
)  # fmt: skip
WAL_COMMIT_BYTES = MetricSpec(
    "s3stream.wal.commit.bytes", C, "By", "Framed bytes file-WAL group commits made durable."
)
WAL_COMMIT_RECORDS = MetricSpec(
    "s3stream.wal.commit.records", C, "{record}", "Records file-WAL group commits made durable."
)
WAL_USED = MetricSpec(
    "s3stream.wal.used", G, "By", "Bytes of the file WAL's ring holding untrimmed records."
)
WAL_CAPACITY = MetricSpec("s3stream.wal.capacity", G, "By", "Size of the file WAL's ring.")

# -- the metadata log ------------------------------------------------------------------------

METADATA_COMMIT_DURATION = MetricSpec(
    "s3stream.metadata.commit.duration", H, "s",
    "Time of a metadata commit, lost races and replays included, by outcome: ``written`` (an "
    "entry was added), ``noop`` (nothing to write), ``failed``.",
    ("outcome",),
    bounds=LATENCY_BOUNDS,
)  # fmt: skip
METADATA_CONFLICTS = MetricSpec(
    "s3stream.metadata.commit.conflicts", C, "{conflict}",
    "Races for the next log entry lost to another writer (the commit then builds again).",
)  # fmt: skip
METADATA_REPLAYED = MetricSpec(
    "s3stream.metadata.entries.replayed", C, "{entry}",
    "Log entries of other writers applied by refreshes and lost races.",
)  # fmt: skip
METADATA_CHECKPOINTS = MetricSpec(
    "s3stream.metadata.checkpoints", C, "{checkpoint}",
    "Checkpoints written (``written``) or attempted in vain (``failed``).", ("result",),
)  # fmt: skip
METADATA_SEQ = MetricSpec(
    "s3stream.metadata.seq", G, "{entry}", "Sequence number of the last log entry applied."
)
DATA_STORED = MetricSpec(
    "s3stream.data.stored", G, "By",
    "Bytes of data objects the metadata lists: ``live``, or replaced and ``deleting`` (removed "
    "after the deletion delay).",
    ("state",),
)  # fmt: skip
DATA_OBJECTS = MetricSpec(
    "s3stream.data.objects", G, "{object}", "Data objects the metadata lists, by state.",
    ("state",),
)  # fmt: skip

# -- the object store ------------------------------------------------------------------------

STORE_DURATION = MetricSpec(
    "s3stream.objectstore.operation.duration", H, "s",
    "Time of an object-store call as a component makes it (retries included), by purpose and "
    "operation (``put``, ``put_if_absent``, ``get``, ``get_suffix``, ``head``, "
    "``delete_many``, ``list``: a list's time is the time spent fetching its pages).",
    ("purpose", "operation"),
    bounds=LATENCY_BOUNDS,
)  # fmt: skip
STORE_ERRORS = MetricSpec(
    "s3stream.objectstore.operation.errors", C, "{error}",
    "Object-store calls that raised (after retries), by purpose and operation.",
    ("purpose", "operation"),
)  # fmt: skip
STORE_TRANSFERRED = MetricSpec(
    "s3stream.objectstore.transferred", C, "By",
    "Bytes written (``put``, and ``put_if_absent`` calls that created) and read (``get``, "
    "``get_suffix``), by purpose and operation.",
    ("purpose", "operation"),
)  # fmt: skip
STORE_CONFLICTS = MetricSpec(
    "s3stream.objectstore.conflicts", C, "{call}",
    "Conditional creates that found the key taken, by purpose.", ("purpose",),
)  # fmt: skip
STORE_KEYS = MetricSpec(
    "s3stream.objectstore.keys", C, "{key}",
    "Keys passed to ``delete_many`` and entries ``list`` yielded, by purpose.",
    ("purpose", "operation"),
)  # fmt: skip
STORE_REQUESTS = MetricSpec(
    "s3stream.objectstore.requests", C, "{request}",
    "Requests sent to the object store, retries and list pages included, by purpose and S3 "
    "API name (``PutObject``, ``GetObject``, ``HeadObject``, ``HeadBucket``, "
    "``DeleteObjects``, ``ListObjectsV2``): what the provider bills. Stores other than S3 "
    "report one request per try of a call, as S3 would count it.",
    ("purpose", "request"),
)  # fmt: skip

# -- background work -------------------------------------------------------------------------

COMPACTION_PASSES = MetricSpec(
    "s3stream.compaction.passes", C, "{pass}", "Compaction passes, by result.", ("result",)
)
COMPACTION_TASKS = MetricSpec(
    "s3stream.compaction.tasks", C, "{task}",
    "Compaction tasks run (``done``) or given up because the metadata moved (``aborted``).",
    ("result",),
)  # fmt: skip
COMPACTION_OBJECTS = MetricSpec(
    "s3stream.compaction.objects", C, "{object}",
    "Objects compaction ``written``, ``replaced``, ``purged`` (deleted after the deletion "
    "delay) and ``orphan_deleted`` (swept).",
    ("action",),
)  # fmt: skip
COMPACTION_BYTES = MetricSpec(
    "s3stream.compaction.bytes", C, "By", "Bytes compaction read and wrote.", ("direction",)
)
COMPACTION_TRIMMED = MetricSpec(
    "s3stream.compaction.streams_trimmed", C, "{stream}", "Streams trimmed by retention."
)
THROTTLE_REQUESTS = MetricSpec(
    "s3stream.throttle.requests", C, "{request}",
    "Requests the background rate limiter admitted, by priority.", ("priority",),
)  # fmt: skip
THROTTLE_BYTES = MetricSpec(
    "s3stream.throttle.bytes", C, "By",
    "Bytes the background rate limiter admitted, by priority.", ("priority",),
)  # fmt: skip
THROTTLE_WAITS = MetricSpec(
    "s3stream.throttle.waits", C, "{request}",
    "Requests that waited for the rate limiter, by priority.", ("priority",),
)  # fmt: skip
THROTTLE_WAIT_TIME = MetricSpec(
    "s3stream.throttle.wait_time", C, "s",
    "Seconds requests waited for the rate limiter, by priority.", ("priority",),
)  # fmt: skip

# -- cost ------------------------------------------------------------------------------------

COST_MONTHLY = MetricSpec(
    "s3stream.cost.monthly", G, "{USD}",
    "Object-store cost per month at the current rate (`ClientMetrics.cost`): ``requests`` "
    "and ``storage``.",
    ("kind",),
)  # fmt: skip

#: Every metric above, by name.
ALL: dict[str, MetricSpec] = {
    spec.name: spec for spec in globals().values() if isinstance(spec, MetricSpec)
}
