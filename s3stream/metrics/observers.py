"""Callbacks that report, at collection time, what a client's components keep themselves: the
block cache's and the compactor's counters, the rate limiter's, cache sizes, the WAL's fill,
the metadata log's position and the data it lists, and the cost at the current rate."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import catalog as m
from .instruments import MetricSpec, Observations
from .ledger import CostLedger
from .registry import MetricsRegistry

if TYPE_CHECKING:
    from ..cache.block_cache import BlockCache
    from ..compaction import Compactor
    from ..metadata import MetadataManager
    from ..storage.engine import Storage
    from ..throttle import PriorityRateLimiter
    from ..wal.base import WriteAheadLog

__all__ = ["DataTotals", "observe_client"]


class DataTotals:
    """Objects and bytes the metadata lists, live and awaiting deletion; recounted only when
    the metadata moved (a state is immutable, its seq names it)."""

    def __init__(self, meta: MetadataManager) -> None:
        self._meta = meta
        self._lock = threading.Lock()
        self._seq = -1
        self._totals = {"live": (0, 0), "deleting": (0, 0)}

    def totals(self) -> dict[str, tuple[int, int]]:
        """State -> (objects, bytes)."""
        state = self._meta.state
        with self._lock:
            if state.seq != self._seq:
                live = [0, 0]
                deleting = [0, 0]
                for o in state.objects.values():
                    t = live if o.live else deleting
                    t[0] += 1
                    t[1] += o.size
                self._totals = {"live": (live[0], live[1]), "deleting": (deleting[0], deleting[1])}
                self._seq = state.seq
            return dict(self._totals)

    def stored_bytes(self) -> int:
        """Bytes of every data object listed (what the provider bills to store)."""
        return sum(b for _, b in self.totals().values())


def observe_client(
    registry: MetricsRegistry,
    *,
    storage: Storage,
    block_cache: BlockCache,
    compactor: Compactor,
    limiter: PriorityRateLimiter,
    wal: WriteAheadLog,
    meta: MetadataManager,
    data: DataTotals,
    ledger: CostLedger,
) -> Callable[[], None]:
    """Register the callbacks of one client's components on `registry`; the function
    returned unregisters them, for the client's close: a registry shared by many clients
    then stops reporting (and keeping alive) a closed one's gauges, and keeps its counters'
    final values."""
    registered: list[tuple[MetricSpec, Callable[[], Observations]]] = []

    def observe(spec: MetricSpec, callback: Callable[[], Observations]) -> None:
        registry.observe(spec, callback)
        registered.append((spec, callback))

    def cache_sizes() -> Observations:
        return [(("log",), storage.log_cache.cached_bytes),
                (("block",), block_cache.metrics.cached_bytes)]  # fmt: skip

    def block_requests() -> Observations:
        b = block_cache.metrics
        return [
            (("block", "hit"), b.hits),
            (("block", "miss"), b.misses),
            (("block", "joined"), b.joined),
            (("index", "hit"), b.index_hits),
            (("index", "miss"), b.index_misses),
        ]

    def evictions() -> Observations:
        return [(("block",), block_cache.metrics.evictions)]

    def readahead() -> Observations:
        b = block_cache.metrics
        return [(("fetched",), b.readahead_blocks), (("used",), b.readahead_used)]

    observe(m.CACHE_SIZE, cache_sizes)
    observe(m.CACHE_REQUESTS, block_requests)
    observe(m.CACHE_EVICTIONS, evictions)
    observe(m.CACHE_READAHEAD, readahead)
    observe(m.UPLOAD_PENDING, lambda: [((), storage.log_cache.pending_bytes)])

    used = getattr(wal, "used_bytes", None)
    if isinstance(used, int):
        observe(m.WAL_USED, lambda: [((), getattr(wal, "used_bytes", 0))])
        observe(m.WAL_CAPACITY, lambda: [((), getattr(wal, "data_capacity", 0))])

    observe(m.METADATA_SEQ, lambda: [((), meta.state.seq)])
    observe(m.DATA_STORED, lambda: [((state,), b) for state, (_, b) in data.totals().items()])
    observe(m.DATA_OBJECTS, lambda: [((state,), n) for state, (n, _) in data.totals().items()])

    def compaction(kind: str) -> Observations:
        c = compactor.metrics
        if kind == "passes":
            return [(("ok",), c.passes - c.failed_passes), (("failed",), c.failed_passes)]
        if kind == "tasks":
            return [(("done",), c.tasks), (("aborted",), c.aborted)]
        if kind == "objects":
            return [
                (("written",), c.objects_written),
                (("replaced",), c.objects_replaced),
                (("purged",), c.objects_purged),
                (("orphan_deleted",), c.orphans_deleted),
            ]
        if kind == "bytes":
            return [(("read",), c.bytes_read), (("written",), c.bytes_written)]
        return [((), c.streams_trimmed)]

    observe(m.COMPACTION_PASSES, lambda: compaction("passes"))
    observe(m.COMPACTION_TASKS, lambda: compaction("tasks"))
    observe(m.COMPACTION_OBJECTS, lambda: compaction("objects"))
    observe(m.COMPACTION_BYTES, lambda: compaction("bytes"))
    observe(m.COMPACTION_TRIMMED, lambda: compaction("trimmed"))

    def throttle(field: str) -> Observations:
        by_priority: dict[str, float] = getattr(limiter.metrics, field)
        return [((name.lower(),), value) for name, value in by_priority.items()]

    observe(m.THROTTLE_REQUESTS, lambda: throttle("requests"))
    observe(m.THROTTLE_BYTES, lambda: throttle("bytes"))
    observe(m.THROTTLE_WAITS, lambda: throttle("waits"))
    observe(m.THROTTLE_WAIT_TIME, lambda: throttle("waited_s"))

    def cost() -> Observations:
        report = ledger.cost()
        return [(("requests",), report.requests_usd_per_month),
                (("storage",), report.storage_usd_per_month)]  # fmt: skip

    observe(m.COST_MONTHLY, cost)

    def unobserve() -> None:
        while registered:
            registry.unobserve(*registered.pop())

    return unobserve
