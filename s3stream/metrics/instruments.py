"""Instruments: counters, histograms and observed values, as a `MetricsRegistry` holds them.

Each instrument has a `MetricSpec` (name, kind, unit, labels) and one cell per combination of
label values. Components resolve their cells once and update them on their hot paths; cells
add into per-thread rows (`SlotRows`), so an update takes no lock. Values a component keeps
itself (a cache's size, a compactor's totals) are reported by callbacks instead, read when the
registry is collected: a `Gauge` has only those, a `Counter` may add them to its cells.
"""

from __future__ import annotations

import enum
import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from threading import get_ident
from typing import TypeVar

from ..errors import InvalidArgumentError
from .cells import SlotRows

_log = logging.getLogger(__name__)

__all__ = [
    "LATENCY_BOUNDS",
    "Counter",
    "CounterCell",
    "Family",
    "Gauge",
    "Histogram",
    "HistogramCell",
    "Kind",
    "MetricSpec",
    "Observations",
    "OperationCell",
    "Point",
]

#: Upper bounds (seconds) of the latency buckets: from 10 us (an append to a memory WAL) to
#: 30 s (a store call retried up to its deadline).
LATENCY_BOUNDS: tuple[float, ...] = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class Kind(enum.Enum):
    """What an instrument measures: a total that only grows, a value now, a distribution."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """The definition of one metric: its name (dotted, OpenTelemetry style), kind, unit (UCUM,
    as OpenTelemetry writes it: ``s``, ``By``, ``{request}``), meaning, and label names."""

    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    #: Bucket upper bounds of a histogram (ascending); an implicit last bucket takes the rest.
    bounds: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Point:
    """One label combination of a collected metric.

    Counters and gauges carry `value`. Histograms carry `count`, `sum` (in `value` too) and
    `bucket_counts`: observations per bucket, not cumulative, one more than the spec's bounds.
    """

    labels: tuple[str, ...]
    value: float
    count: int = 0
    bucket_counts: tuple[int, ...] = ()

    def label(self, spec: MetricSpec, name: str) -> str:
        """The value of label `name` in this point."""
        return self.labels[spec.labels.index(name)]


@dataclass(frozen=True, slots=True)
class Family:
    """A collected metric: its spec and a point per label combination."""

    spec: MetricSpec
    points: tuple[Point, ...]

    def total(self, **labels: str) -> float:
        """Sum of the values (a histogram's: its observations' count) of the points whose
        labels match `labels`."""
        unknown = sorted(set(labels) - set(self.spec.labels))
        if unknown:
            known = ", ".join(self.spec.labels) or "none"
            raise InvalidArgumentError(
                f"metric {self.spec.name!r} has no label {unknown[0]!r} (its labels: {known})"
            )
        idx = [(self.spec.labels.index(k), v) for k, v in labels.items()]
        total = 0.0
        for p in self.points:
            if all(p.labels[i] == v for i, v in idx):
                total += p.count if self.spec.kind is Kind.HISTOGRAM else p.value
        return total


def _check_labels(spec: MetricSpec, values: Sequence[str]) -> tuple[str, ...]:
    if len(values) != len(spec.labels):
        raise InvalidArgumentError(
            f"{spec.name} takes labels {spec.labels}, got values {tuple(values)!r}"
        )
    return tuple(str(v) for v in values)


class CounterCell:
    """One label combination of a counter: ``cell.add(amount=1)``."""

    __slots__ = ("add",)

    def __init__(self, rows: SlotRows, slot: int) -> None:
        self.add: Callable[..., None] = _adder(rows, slot)


class HistogramCell:
    """One label combination of a histogram: ``cell.observe(value)``."""

    __slots__ = ("observe",)

    def __init__(self, rows: SlotRows, slot: int, bounds: tuple[float, ...]) -> None:
        self.observe: Callable[[float], None] = _observer(rows, slot, bounds)


class OperationCell:
    """A histogram cell of durations and counter cells of bytes and items, updated by one
    call: ``cell.record(seconds, nbytes, items)``. An append or a fetch records its latency,
    bytes and records at the cost of one update."""

    __slots__ = ("record",)

    def __init__(self, rows: SlotRows, slot: int, bounds: tuple[float, ...]) -> None:
        self.record: Callable[[float, int, int], None] = _recorder(rows, slot, bounds)


# The updates are closures over their slots, the rows and `get_ident`: on the append path,
# attribute lookups and a bound method per call cost about a third of the update.


def _adder(slots: SlotRows, slot: int) -> Callable[..., None]:
    rows = slots.rows

    def add(amount: float = 1) -> None:
        """Add `amount` (>= 0; not checked, this is a hot path)."""
        try:
            rows[get_ident()][slot] += amount
        except (KeyError, IndexError):
            slots.row()[slot] += amount

    return add


def _observer(slots: SlotRows, slot: int, bounds: tuple[float, ...]) -> Callable[[float], None]:
    rows = slots.rows
    first_bucket = slot + 1  # the sum, then the buckets

    def observe(value: float) -> None:
        """Record one observation."""
        bucket = first_bucket + bisect_left(bounds, value)
        try:
            row = rows[get_ident()]
            row[bucket] += 1
        except (KeyError, IndexError):
            row = slots.row()
            row[bucket] += 1
        row[slot] += value

    return observe


def _recorder(
    slots: SlotRows, slot: int, bounds: tuple[float, ...]
) -> Callable[[float, int, int], None]:
    rows = slots.rows
    # Slots: duration sum, bytes, items, then the duration buckets.
    bytes_slot, items_slot, first_bucket = slot + 1, slot + 2, slot + 3

    def record(seconds: float, nbytes: int, items: int) -> None:
        """One operation that took `seconds` and moved `nbytes` bytes in `items` items."""
        bucket = first_bucket + bisect_left(bounds, seconds)
        try:
            row = rows[get_ident()]
            row[bucket] += 1
        except (KeyError, IndexError):
            row = slots.row()
            row[bucket] += 1
        row[slot] += seconds
        row[bytes_slot] += nbytes
        row[items_slot] += items

    return record


#: What an observing callback returns: (label values, value) pairs.
Observations = Iterable[tuple[tuple[str, ...], float]]


_C = TypeVar("_C")


class _Instrument:
    """Cells by label values, made on first use, and callbacks that report values kept
    elsewhere (a component's own counters, a cache's size), read at collection."""

    def __init__(self, spec: MetricSpec, rows: SlotRows) -> None:
        self.spec = spec
        self._rows = rows
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], Observations]] = []
        #: By callback (its id, while it is in `_callbacks`): what it reported last, and
        #: whether it has failed (logged once).
        self._last: dict[int, list[tuple[tuple[str, ...], float]]] = {}
        self._failed: set[int] = set()

    def add_callback(self, callback: Callable[[], Observations]) -> None:
        """Have `callback` report values at every collection (values of one label combination
        add up, over callbacks and cells alike)."""
        with self._lock:
            self._callbacks.append(callback)

    def drop_callback(self, callback: Callable[[], Observations], *, keep_last: bool) -> None:
        """Stop calling `callback` (its component is closed, and is no longer kept alive by
        this instrument); with `keep_last`, report what it returns now from then on (a
        counter's total must not go backwards), else nothing."""
        last: list[tuple[tuple[str, ...], float]] | None = None
        if keep_last:
            last = self._observed_by(callback)
        with self._lock:
            self._last.pop(id(callback), None)
            self._failed.discard(id(callback))
            for i, known in enumerate(self._callbacks):
                if known is callback:
                    if last is None:
                        del self._callbacks[i]
                    else:
                        self._callbacks[i] = lambda: last
                    return

    def _observed(self, totals: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            for key, value in self._observed_by(callback):
                totals[key] = totals.get(key, 0) + value
        return totals

    def _observed_by(
        self, callback: Callable[[], Observations]
    ) -> list[tuple[tuple[str, ...], float]]:
        try:
            observed = [(_check_labels(self.spec, v), value) for v, value in callback()]
        except Exception:
            # One component's failing callback must not take the whole scrape down (an
            # exporter would then report nothing at all): it reports what it reported last
            # (a counter must not go back), and the failure is logged once.
            with self._lock:
                observed = self._last.get(id(callback), [])
                first = id(callback) not in self._failed
                self._failed.add(id(callback))
            if first:
                _log.warning("%s: a callback failed at collection", self.spec.name, exc_info=True)
            return observed
        with self._lock:
            self._last[id(callback)] = observed
        return observed

    def collect(self) -> Family:
        raise NotImplementedError

    def _cell(
        self,
        cells: dict[tuple[str, ...], _C],
        label_values: tuple[str, ...],
        make: Callable[[tuple[str, ...]], _C],
    ) -> _C:
        """The cell of `label_values` in `cells`, made by `make(checked values)` under the
        lock on first use; later lookups, by the values as given, take no lock."""
        cell = cells.get(label_values)
        if cell is not None:
            return cell
        values = _check_labels(self.spec, label_values)
        with self._lock:
            cell = cells.get(values)
            if cell is None:
                cell = cells[values] = make(values)
            cells[label_values] = cell
            return cell


class Counter(_Instrument):
    """A total that only grows (cells: `CounterCell`)."""

    def __init__(self, spec: MetricSpec, rows: SlotRows) -> None:
        super().__init__(spec, rows)
        self._slots: dict[tuple[str, ...], int] = {}
        self._cells: dict[tuple[str, ...], CounterCell] = {}

    def cell(self, *label_values: str) -> CounterCell:
        """The cell of these label values (in the spec's label order)."""
        return self._cell(self._cells, label_values, self._new_cell)

    def _new_cell(self, values: tuple[str, ...]) -> CounterCell:
        slot = self._slots.get(values)
        if slot is None:
            slot = self._slots[values] = self._rows.allocate(1)
        return CounterCell(self._rows, slot)

    def _attach(self, values: tuple[str, ...], slot: int) -> None:
        """Count these label values in `slot`, which an `OperationCell` updates."""
        with self._lock:
            if values in self._slots:
                raise InvalidArgumentError(f"{self.spec.name}{values} is already counted")
            self._slots[values] = slot

    def collect(self) -> Family:
        with self._lock:
            slots = list(self._slots.items())
        totals = self._observed({values: self._rows.sums(slot, 1)[0] for values, slot in slots})
        return Family(self.spec, tuple(Point(k, v) for k, v in sorted(totals.items())))


class Histogram(_Instrument):
    """A distribution over the spec's bucket bounds (cells: `HistogramCell`)."""

    def __init__(self, spec: MetricSpec, rows: SlotRows) -> None:
        if not spec.bounds or list(spec.bounds) != sorted(set(spec.bounds)):
            raise InvalidArgumentError(f"{spec.name}: bounds must ascend, got {spec.bounds}")
        super().__init__(spec, rows)
        #: Label values -> (slot of the sum, slot of the first bucket).
        self._slots: dict[tuple[str, ...], tuple[int, int]] = {}
        self._cells: dict[tuple[str, ...], HistogramCell] = {}

    def cell(self, *label_values: str) -> HistogramCell:
        """The cell of these label values (in the spec's label order)."""
        return self._cell(self._cells, label_values, self._new_cell)

    def _new_cell(self, values: tuple[str, ...]) -> HistogramCell:
        if values in self._slots:
            raise InvalidArgumentError(f"{self.spec.name}{values} is an operation's")
        slot = self._rows.allocate(len(self.spec.bounds) + 2)
        self._slots[values] = (slot, slot + 1)
        return HistogramCell(self._rows, slot, self.spec.bounds)

    def _attach(self, values: tuple[str, ...], sum_slot: int, first_bucket: int) -> None:
        with self._lock:
            if values in self._slots:
                raise InvalidArgumentError(f"{self.spec.name}{values} is already recorded")
            self._slots[values] = (sum_slot, first_bucket)

    def collect(self) -> Family:
        with self._lock:
            slots = list(self._slots.items())
        n = len(self.spec.bounds) + 1
        points = []
        for values, (sum_slot, first) in sorted(slots):
            buckets = tuple(int(c) for c in self._rows.sums(first, n))
            points.append(Point(values, self._rows.sums(sum_slot, 1)[0], sum(buckets), buckets))
        return Family(self.spec, tuple(points))


def operation_cell(
    rows: SlotRows,
    duration: Histogram,
    nbytes: Counter,
    items: Counter,
    *label_values: str,
) -> OperationCell:
    """An `OperationCell` recording into `duration`, `nbytes` and `items` (which take the same
    label values)."""
    values = tuple(label_values)
    for inst in (duration, nbytes, items):
        _check_labels(inst.spec, values)
    slot = rows.allocate(3 + len(duration.spec.bounds) + 1)
    duration._attach(values, slot, slot + 3)
    nbytes._attach(values, slot + 1)
    items._attach(values, slot + 2)
    return OperationCell(rows, slot, duration.spec.bounds)


class Gauge(_Instrument):
    """A value now, as callbacks report it (several callbacks of one label combination, such
    as several clients sharing a registry, add up)."""

    def collect(self) -> Family:
        totals = self._observed({})
        return Family(self.spec, tuple(Point(k, v) for k, v in sorted(totals.items())))
