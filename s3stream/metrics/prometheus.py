"""Prometheus export: a ``prometheus_client`` collector over a `MetricsRegistry` (extra
``prometheus``: ``pip install 's3stream[prometheus]'``).

    from prometheus_client import REGISTRY, start_http_server
    from s3stream.metrics.prometheus import S3StreamCollector

    REGISTRY.register(S3StreamCollector(client.metrics.registry))
    start_http_server(9464)

Names follow Prometheus conventions: dots become underscores and the unit a suffix
(``s3stream.append.duration`` in seconds is ``s3stream_append_duration_seconds``, a histogram;
counters end in ``_total``); label names lose their dots (``error.type`` is ``error_type``).
The values are read at each scrape; nothing is kept between scrapes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ..errors import InvalidArgumentError
from . import catalog
from .instruments import Family, Kind, MetricSpec
from .registry import MetricsRegistry

__all__ = ["S3StreamCollector", "prometheus_name"]

#: Prometheus base-unit suffixes of the UCUM units s3stream uses.
_UNITS = {"s": "seconds", "By": "bytes"}
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")
#: A label name Prometheus takes (once other characters became ``_``).
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def prometheus_name(spec: MetricSpec) -> str:
    """The Prometheus name of a metric (without a counter's ``_total``)."""
    name = _NOT_NAME.sub("_", spec.name)
    unit = _UNITS.get(spec.unit)
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    return name


def _label(name: str) -> str:
    return _NOT_NAME.sub("_", name)


class S3StreamCollector:
    """Reports every metric of `registry` at each scrape. `labels` are added to every sample
    (e.g. ``{"node": client.node_id}``). Several clients of one process, each with its own
    registry, export on one endpoint through one collector: `add` each further registry
    with other values of the same labels (a second collector of the same metrics is refused
    by a ``CollectorRegistry``)."""

    def __init__(
        self, registry: MetricsRegistry, *, labels: Mapping[str, str] | None = None
    ) -> None:
        self._const = dict(labels or {})
        for key in self._const:
            name = _label(key) if isinstance(key, str) else ""
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                # Prometheus refuses the whole scrape over one bad label name.
                raise InvalidArgumentError(
                    f"labels: {key!r} is not a Prometheus label name (a letter or _ first, "
                    "then letters, digits or _; names starting with __ are reserved)"
                )
        self._const_names = [_label(k) for k in self._const]
        #: The registries reported, each with its values of the labels.
        self._sources: list[tuple[MetricsRegistry, list[str]]] = [
            (registry, [str(v) for v in self._const.values()])
        ]
        # A name a metric uses already (or "le", a histogram's bucket bound) would be
        # dropped from the samples without a word by the client library.
        taken = {"le"} | {_label(n) for s in catalog.ALL.values() for n in s.labels}
        clash = sorted(set(self._const_names) & taken)
        if clash or len(set(self._const_names)) < len(self._const_names):
            what = f"{clash[0]!r} is taken" if clash else "a name repeats"
            raise InvalidArgumentError(
                f"labels {sorted(self._const)!r}: {what} (s3stream's metrics use "
                f"{', '.join(sorted(taken))}); choose other names"
            )

    def add(self, registry: MetricsRegistry, *, labels: Mapping[str, str]) -> None:
        """Report `registry` too, its samples under `labels`: the names this collector was
        made with, with values no registry reported here has (a sample must tell its client)."""
        if not isinstance(registry, MetricsRegistry):
            raise InvalidArgumentError(f"registry must be a MetricsRegistry, got {registry!r}")
        if not self._const or not isinstance(labels, Mapping) or set(labels) != set(self._const):
            raise InvalidArgumentError(
                f"labels must have the names this collector was made with, {sorted(self._const)}"
                f" (one each, to tell the registries apart), got {labels!r}"
            )
        values = [str(labels[k]) for k in self._const]
        if any(r is registry or v == values for r, v in self._sources):
            raise InvalidArgumentError(
                f"labels {dict(labels)!r}: this registry, or these values, are reported already"
            )
        self._sources.append((registry, values))

    def describe(self) -> Iterable[Metric]:
        """The metric families this collector reports, without samples (lets a
        ``CollectorRegistry`` refuse a second collector of the same names)."""
        specs = dict(catalog.ALL)
        for registry, _ in self._sources:
            specs.update((s.name, s) for s in registry.specs())
        return [self._family(spec) for spec in specs.values()]

    def collect(self) -> Iterator[Metric]:
        """Every metric's current values (a family once, with every registry's samples)."""
        merged: dict[str, Metric] = {}
        for registry, values in self._sources:
            for family in registry.collect():
                metric = merged.get(family.spec.name)
                if metric is None:
                    metric = merged[family.spec.name] = self._family(family.spec)
                self._fill(metric, family, values)
        yield from merged.values()

    def _family(self, spec: MetricSpec) -> Metric:
        name = prometheus_name(spec)
        unit = _UNITS.get(spec.unit, "")
        labels = self._const_names + [_label(label) for label in spec.labels]
        if spec.kind is Kind.COUNTER:
            return CounterMetricFamily(name, spec.description, labels=labels, unit=unit)
        if spec.kind is Kind.GAUGE:
            return GaugeMetricFamily(name, spec.description, labels=labels, unit=unit)
        return HistogramMetricFamily(name, spec.description, labels=labels, unit=unit)

    def _fill(self, metric: Metric, family: Family, const_values: list[str]) -> None:
        spec = family.spec
        for point in family.points:
            values = const_values + list(point.labels)
            if isinstance(metric, HistogramMetricFamily):
                buckets: list[tuple[str, float]] = []
                running = 0
                for bound, count in zip(spec.bounds, point.bucket_counts, strict=False):
                    running += count
                    buckets.append((_bound(bound), running))
                buckets.append(("+Inf", point.count))
                metric.add_metric(values, buckets, point.value)
            else:
                assert isinstance(metric, CounterMetricFamily | GaugeMetricFamily)
                metric.add_metric(values, point.value)


def _bound(bound: float) -> str:
    return repr(float(bound))
