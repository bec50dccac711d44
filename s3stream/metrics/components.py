"""The cells each component records into, resolved once from a registry.

A component takes one of these bundles (or makes one on a private registry when used alone),
so its hot paths hold ready cells and never look a metric up by name.
"""

from __future__ import annotations

import threading

from . import catalog as m
from .instruments import CounterCell, HistogramCell
from .registry import MetricsRegistry

__all__ = [
    "MetadataInstruments",
    "StorageInstruments",
    "StoreCells",
    "StoreInstruments",
    "WalInstruments",
]


class StorageInstruments:
    """Appends, fetches, the LogCache tier and uploads (`Storage`)."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self.registry = registry
        self.append = registry.operation(m.APPEND_DURATION, m.APPEND_BYTES, m.APPEND_RECORDS)
        self._append_errors = registry.counter(m.APPEND_ERRORS)
        self.fetch = registry.operation(m.FETCH_DURATION, m.FETCH_BYTES, m.FETCH_RECORDS)
        requests = registry.counter(m.CACHE_REQUESTS)
        self.log_hit = requests.cell("log", "hit")
        self.log_miss = requests.cell("log", "miss")
        self.upload = registry.operation(m.UPLOAD_DURATION, m.UPLOAD_BYTES, m.UPLOAD_OBJECTS)
        self.upload_failures = registry.counter(m.UPLOAD_FAILURES).cell()

    def append_failed(self, exc: BaseException) -> None:
        """Count a failed append (off the hot path: errors only)."""
        self._append_errors.cell(type(exc).__name__).add()

    def snapshot(self) -> dict[str, int]:
        """The counters `StorageMetrics` reports, from the registry."""
        r = self.registry
        return {
            "appends": int(r.total(m.APPEND_DURATION.name)),
            "append_bytes": int(r.total(m.APPEND_BYTES.name)),
            "uploads": int(r.total(m.UPLOAD_DURATION.name)),
            "objects_uploaded": int(r.total(m.UPLOAD_OBJECTS.name)),
            "uploaded_bytes": int(r.total(m.UPLOAD_BYTES.name)),
            "fetches_from_cache": int(r.total(m.CACHE_REQUESTS.name, tier="log", result="hit")),
            "fetches_from_objects": int(r.total(m.CACHE_REQUESTS.name, tier="log", result="miss")),
        }


class WalInstruments:
    """Group commits of a WAL that reports them (the file WAL)."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self.commit = registry.operation(
            m.WAL_COMMIT_DURATION, m.WAL_COMMIT_BYTES, m.WAL_COMMIT_RECORDS
        )


class MetadataInstruments:
    """Commits, lost races, replays and checkpoints of a `MetadataManager`."""

    def __init__(self, registry: MetricsRegistry) -> None:
        duration = registry.histogram(m.METADATA_COMMIT_DURATION)
        self.written = duration.cell("written")
        self.noop = duration.cell("noop")
        self.failed = duration.cell("failed")
        self.conflicts = registry.counter(m.METADATA_CONFLICTS).cell()
        self.replayed = registry.counter(m.METADATA_REPLAYED).cell()
        checkpoints = registry.counter(m.METADATA_CHECKPOINTS)
        self.checkpoint_written = checkpoints.cell("written")
        self.checkpoint_failed = checkpoints.cell("failed")


class StoreCells:
    """The cells of one (purpose, operation) of the object store."""

    __slots__ = ("duration", "errors")

    def __init__(self, duration: HistogramCell, errors: CounterCell) -> None:
        self.duration = duration
        self.errors = errors


class StoreInstruments:
    """Object-store calls, bytes and billable requests by purpose (`MetricsObjectStore`)."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self.registry = registry
        self._duration = registry.histogram(m.STORE_DURATION)
        self._errors = registry.counter(m.STORE_ERRORS)
        self._transferred = registry.counter(m.STORE_TRANSFERRED)
        self._conflicts = registry.counter(m.STORE_CONFLICTS)
        self._keys = registry.counter(m.STORE_KEYS)
        self._requests = registry.counter(m.STORE_REQUESTS)
        self._lock = threading.Lock()
        self._ops: dict[tuple[str, str], StoreCells] = {}

    def op(self, purpose: str, operation: str) -> StoreCells:
        """The cells of `operation` made for `purpose`."""
        cells = self._ops.get((purpose, operation))
        if cells is None:
            with self._lock:
                cells = self._ops[(purpose, operation)] = StoreCells(
                    self._duration.cell(purpose, operation),
                    self._errors.cell(purpose, operation),
                )
        return cells

    def transferred(self, purpose: str, operation: str) -> CounterCell:
        """Bytes an operation wrote or read."""
        return self._transferred.cell(purpose, operation)

    def conflicts(self, purpose: str) -> CounterCell:
        """Conditional creates that found the key."""
        return self._conflicts.cell(purpose)

    def keys(self, purpose: str, operation: str) -> CounterCell:
        """Keys deleted or listed."""
        return self._keys.cell(purpose, operation)

    def requests(self, purpose: str, request: str) -> CounterCell:
        """Billable requests of one S3 API name."""
        return self._requests.cell(purpose, request)
