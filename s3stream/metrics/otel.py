"""OpenTelemetry export: observable instruments over a `MetricsRegistry`, on a given
``MeterProvider`` (extra ``otel``: ``pip install 's3stream[otel]'``).

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from s3stream.metrics.otel import register_otel

    provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(exporter)])
    register_otel(client.metrics.registry, provider, bucket="my-bucket")

Each metric becomes an observable instrument whose callback reads the registry when the
provider's readers collect, so the append path pays nothing for the export. Counters are
observable counters, gauges observable gauges. OpenTelemetry has no observable histogram, so a
latency histogram ``X`` becomes three observable counters: ``X.count`` (observations),
``X.sum`` (their total, in the histogram's unit) and ``X.bucket`` (observations at or below
the attribute ``le``, cumulative, as Prometheus' ``_bucket``); the Prometheus collector
exports them as native histograms.

Semantic conventions where they fit: labels become attributes named by the conventions
(``error.type``) or under ``s3stream.``; append and fetch metrics carry ``messaging.system``
``s3stream`` and ``messaging.operation.name`` / ``messaging.operation.type``
(``append``/``send``, ``fetch``/``receive``), and the records they move are also reported as
``messaging.client.sent.messages`` and ``messaging.client.consumed.messages``; object-store
request counts carry ``rpc.system`` ``aws-api``, ``rpc.service`` ``S3``, ``rpc.method`` (the
S3 API name) and, given `bucket`, ``aws.s3.bucket`` (which every object-store metric gets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from . import catalog
from .instruments import Family, Kind, MetricSpec, Point
from .registry import MetricsRegistry

__all__ = ["OtelBridge", "otel_attributes", "register_otel"]

_Attrs = dict[str, str]

#: Label names that have a semantic-conventions attribute of their own.
_CONVENTIONAL = {"error.type": "error.type", "request": "rpc.method"}

_MESSAGING = {
    "s3stream.append.": {
        "messaging.system": "s3stream",
        "messaging.operation.name": "append",
        "messaging.operation.type": "send",
    },
    "s3stream.fetch.": {
        "messaging.system": "s3stream",
        "messaging.operation.name": "fetch",
        "messaging.operation.type": "receive",
    },
}

#: Semantic-conventions counters reported besides s3stream's own, from the same values.
_ALIASES = {
    "messaging.client.sent.messages": (
        catalog.APPEND_RECORDS, "Number of messages producer attempted to send to the broker."
    ),
    "messaging.client.consumed.messages": (
        catalog.FETCH_RECORDS, "Number of messages that were delivered to the application."
    ),
}  # fmt: skip


def otel_attributes(spec: MetricSpec, point: Point, bucket: str | None = None) -> _Attrs:
    """The attributes of one point of `spec` in OpenTelemetry."""
    attrs: _Attrs = {}
    for prefix, constant in _MESSAGING.items():
        if spec.name.startswith(prefix):
            attrs.update(constant)
    if spec.name.startswith("s3stream.objectstore."):
        if bucket is not None:
            attrs["aws.s3.bucket"] = bucket
        if spec.name == catalog.STORE_REQUESTS.name:
            attrs.update({"rpc.system": "aws-api", "rpc.service": "S3"})
    for name, value in zip(spec.labels, point.labels, strict=True):
        attrs[_CONVENTIONAL.get(name, f"s3stream.{name}")] = value
    return attrs


@dataclass(frozen=True, slots=True)
class OtelBridge:
    """What `register_otel` registered (the meter keeps the instruments alive)."""

    meter: Meter
    #: OpenTelemetry instrument names, in registration order.
    names: tuple[str, ...]


def register_otel(
    registry: MetricsRegistry,
    meter_provider: MeterProvider,
    *,
    bucket: str | None = None,
    attributes: Mapping[str, str] | None = None,
    specs: Iterable[MetricSpec] | None = None,
) -> OtelBridge:
    """Register an observable instrument for every metric of `registry` (and of the catalog:
    metrics made later report once they exist) on a meter of `meter_provider`. `attributes`
    are added to every observation (e.g. ``{"service.instance.id": node_id}``); `bucket` is
    the ``aws.s3.bucket`` of object-store metrics. `specs` narrows the metrics registered."""
    from .. import __version__

    meter = meter_provider.get_meter("s3stream", __version__)
    const = dict(attributes or {})
    chosen = (
        list(specs)
        if specs is not None
        else list({**catalog.ALL, **{s.name: s for s in registry.specs()}}.values())
    )
    names: list[str] = []

    def points(spec: MetricSpec) -> tuple[Point, ...]:
        family: Family | None = registry.family(spec.name)
        return () if family is None else family.points

    def observe(
        spec: MetricSpec, value: Callable[[Point], Iterable[tuple[float, _Attrs]]]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            out = []
            for point in points(spec):
                base = {**const, **otel_attributes(spec, point, bucket)}
                for v, extra in value(point):
                    out.append(Observation(v, {**base, **extra}))
            return out

        return callback

    def plain(point: Point) -> Iterable[tuple[float, _Attrs]]:
        return [(point.value, {})]

    for spec in chosen:
        if spec.kind is Kind.COUNTER:
            meter.create_observable_counter(
                spec.name, [observe(spec, plain)], spec.unit, spec.description
            )
            names.append(spec.name)
        elif spec.kind is Kind.GAUGE:
            meter.create_observable_gauge(
                spec.name, [observe(spec, plain)], spec.unit, spec.description
            )
            names.append(spec.name)
        else:
            names.extend(_register_histogram(meter, spec, observe))
    for alias, (spec, description) in _ALIASES.items():
        if any(s.name == spec.name for s in chosen):
            meter.create_observable_counter(alias, [observe(spec, plain)], "{message}", description)
            names.append(alias)
    return OtelBridge(meter, tuple(names))


def _register_histogram(
    meter: Meter,
    spec: MetricSpec,
    observe: Callable[
        [MetricSpec, Callable[[Point], Iterable[tuple[float, _Attrs]]]],
        Callable[[CallbackOptions], Iterable[Observation]],
    ],
) -> list[str]:
    def count(point: Point) -> Iterable[tuple[float, _Attrs]]:
        return [(point.count, {})]

    def total(point: Point) -> Iterable[tuple[float, _Attrs]]:
        return [(point.value, {})]

    def buckets(point: Point) -> Iterable[tuple[float, _Attrs]]:
        out: list[tuple[float, _Attrs]] = []
        running = 0
        for bound, n in zip(spec.bounds, point.bucket_counts, strict=False):
            running += n
            out.append((running, {"le": repr(float(bound))}))
        out.append((point.count, {"le": "+Inf"}))
        return out

    per = "{observation}"
    meter.create_observable_counter(
        f"{spec.name}.count", [observe(spec, count)], per,
        f"Observations of {spec.name}: {spec.description}",
    )  # fmt: skip
    meter.create_observable_counter(
        f"{spec.name}.sum", [observe(spec, total)], spec.unit, f"Sum of {spec.name}."
    )
    meter.create_observable_counter(
        f"{spec.name}.bucket", [observe(spec, buckets)], per,
        f"Observations of {spec.name} at or below the attribute le (cumulative).",
    )  # fmt: skip
    return [f"{spec.name}.count", f"{spec.name}.sum", f"{spec.name}.bucket"]
