"""`CostLedger`: what a client's object-store traffic and data cost per month, at the current
rate.

The requests are the registry's ``s3stream.objectstore.requests`` (every request sent, retries
and list pages included, by purpose and S3 API name); stored bytes come from a callback (a
client: the data objects its metadata lists). The rate is measured over a sliding window on the
injected clock: the ledger keeps snapshots of the request counts, taken when it is created and
at every `cost` call (an exporter collecting ``s3stream.cost.monthly`` makes one per scrape),
and measures from the newest snapshot at least `window_s` old, or from the oldest one while
the ledger is younger than the window. Snapshots are kept at least 2 x `window_s` / 4096
apart (a call sooner than that after the one before replaces the newest snapshot), so that
however often `cost` is called the snapshots kept span twice the window: a bounded list of
one per call had shrunk the window to under a second after a burst of calls.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from ..clock import Clock
from ..errors import InvalidArgumentError
from ..validation import check_positive
from . import catalog
from .cost import S3_STANDARD_US_EAST_1, CostReport, PriceTable, price
from .registry import MetricsRegistry

__all__ = ["CostLedger"]

_Counts = dict[tuple[str, str], int]

#: Snapshots kept at most.
_MAX_SNAPSHOTS = 4096


class CostLedger:
    """Prices a registry's object-store requests and a count of stored bytes (see the module
    docstring). Thread-safe."""

    def __init__(
        self,
        registry: MetricsRegistry,
        clock: Clock,
        *,
        prices: PriceTable = S3_STANDARD_US_EAST_1,
        stored_bytes: Callable[[], int] | None = None,
        window_s: float = 3600.0,
    ) -> None:
        if not isinstance(prices, PriceTable):
            raise InvalidArgumentError(f"prices must be a PriceTable, got {prices!r}")
        self._registry = registry
        self._clock = clock
        self._prices = prices
        self._stored_bytes = stored_bytes
        self._window_s = check_positive("window_s", window_s)
        self._lock = threading.Lock()
        #: The least time between two snapshots kept (but the newest).
        self._spacing_s = 2 * self._window_s / _MAX_SNAPSHOTS
        self._snapshots: deque[tuple[float, _Counts]] = deque(maxlen=_MAX_SNAPSHOTS)
        self._snapshots.append((clock.monotonic(), self._counts()))

    @property
    def prices(self) -> PriceTable:
        """The price table."""
        return self._prices

    @property
    def window_s(self) -> float:
        """The default window of `cost`."""
        return self._window_s

    def cost(self, window_s: float | None = None) -> CostReport:
        """Dollars per month at the current rate: the request rate over the last `window_s`
        seconds (default: the ledger's window) x the seconds of a month x the price of each
        request, plus the stored bytes x the GB-month price."""
        window = self._window_s if window_s is None else check_positive("window_s", window_s)
        stored = self._stored_bytes() if self._stored_bytes is not None else 0
        with self._lock:
            # Counted and timed together: a count read before another call's snapshot, which
            # then became this call's base, gave negative request counts.
            counts = self._counts()
            now = self._clock.monotonic()
            since, base = self._snapshots[0]
            for t, snapshot in self._snapshots:
                if t > now - window:
                    break
                since, base = t, snapshot
            snapshots = self._snapshots
            if len(snapshots) >= 2 and snapshots[-1][0] - snapshots[-2][0] < self._spacing_s:
                snapshots[-1] = (now, counts)
            else:
                snapshots.append((now, counts))
        lines = {key: (total - base.get(key, 0), total) for key, total in counts.items()}
        return price(self._prices, now - since, lines, stored)

    def _counts(self) -> _Counts:
        family = self._registry.family(catalog.STORE_REQUESTS.name)
        if family is None:
            return {}
        return {(p.labels[0], p.labels[1]): int(p.value) for p in family.points}
