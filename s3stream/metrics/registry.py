"""`MetricsRegistry`: the instruments of one client, and their collection for exporters.

There is no process-wide registry: a client makes its own (or is given one), hands it to its
components, and exporters read it (`s3stream.metrics.prometheus`, `s3stream.metrics.otel`).
Asking twice for an instrument of one name returns the same instrument, so components, and
clients sharing a registry, add into the same totals.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from ..errors import InvalidArgumentError
from .cells import SlotRows
from .instruments import (
    Counter,
    Family,
    Gauge,
    Histogram,
    Kind,
    MetricSpec,
    Observations,
    OperationCell,
    _Instrument,
    operation_cell,
)

__all__ = ["MetricsRegistry"]

_I = TypeVar("_I", bound=_Instrument)


class MetricsRegistry:
    """Counters, histograms and observed values by name. Thread-safe."""

    def __init__(self) -> None:
        self._rows = SlotRows()
        self._lock = threading.Lock()
        self._instruments: dict[str, _Instrument] = {}
        self._operations: dict[tuple[str, ...], OperationCell] = {}

    def counter(self, spec: MetricSpec) -> Counter:
        """The counter `spec` defines (made on first request)."""
        return self._get(spec, Counter)

    def histogram(self, spec: MetricSpec) -> Histogram:
        """The histogram `spec` defines (made on first request)."""
        return self._get(spec, Histogram)

    def observe(self, spec: MetricSpec, callback: Callable[[], Observations]) -> None:
        """Report what `callback` returns, ``[(label values, value), ...]``, as the counter
        or gauge `spec` defines, at every collection (added to what cells of a counter
        count, and to what other callbacks report)."""
        if spec.kind is Kind.COUNTER:
            self.counter(spec).add_callback(callback)
        elif spec.kind is Kind.GAUGE:
            self._get(spec, Gauge).add_callback(callback)
        else:
            raise InvalidArgumentError(f"{spec.name}: a histogram cannot be observed")

    def unobserve(self, spec: MetricSpec, callback: Callable[[], Observations]) -> None:
        """Stop calling `callback` (given to `observe`): a counter keeps reporting the values
        it returns now (totals never go backwards), a gauge no longer reports it."""
        if spec.kind is Kind.COUNTER:
            self.counter(spec).drop_callback(callback, keep_last=True)
        elif spec.kind is Kind.GAUGE:
            self._get(spec, Gauge).drop_callback(callback, keep_last=False)

    def operation(
        self,
        duration: MetricSpec,
        nbytes: MetricSpec,
        items: MetricSpec,
        *label_values: str,
    ) -> OperationCell:
        """A cell recording one operation's duration, bytes and items into three metrics
        (the same cell each time: clients sharing the registry add into one total)."""
        key = (duration.name, nbytes.name, items.name, *label_values)
        with self._lock:
            cell = self._operations.get(key)
        if cell is None:
            made = operation_cell(
                self._rows,
                self.histogram(duration),
                self.counter(nbytes),
                self.counter(items),
                *label_values,
            )
            with self._lock:
                cell = self._operations.setdefault(key, made)
        return cell

    def collect(self) -> list[Family]:
        """Every metric's current values, by name."""
        with self._lock:
            instruments = sorted(self._instruments.items())
        return [inst.collect() for _, inst in instruments]

    def specs(self) -> list[MetricSpec]:
        """The specs of every metric made so far."""
        with self._lock:
            return [inst.spec for _, inst in sorted(self._instruments.items())]

    def family(self, name: str) -> Family | None:
        """The current values of metric `name` (None if nothing made it)."""
        with self._lock:
            inst = self._instruments.get(name)
        return None if inst is None else inst.collect()

    def total(self, name: str, **labels: str) -> float:
        """Sum of metric `name`'s values (a histogram's: its count) over the points matching
        `labels`; 0 for a metric nothing made."""
        family = self.family(name)
        return 0.0 if family is None else family.total(**labels)

    def _get(self, spec: MetricSpec, cls: type[_I]) -> _I:
        with self._lock:
            inst = self._instruments.get(spec.name)
            if inst is None:
                inst = self._instruments[spec.name] = cls(spec, self._rows)
        if not isinstance(inst, cls) or inst.spec != spec:
            raise InvalidArgumentError(
                f"metric {spec.name!r} exists already as {inst.spec}, not {spec}"
            )
        return inst

    def __repr__(self) -> str:
        with self._lock:
            return f"MetricsRegistry({len(self._instruments)} metrics)"
