"""Observability: metrics, their exporters, the cost ledger, and logs with context.

Roles:

* ``registry`` / ``instruments`` / ``cells`` — `MetricsRegistry`: a client's counters,
  histograms and observed values (no global state: each client owns one, or is given one),
  updated through per-thread cells that take no lock on the append path.
* ``catalog`` — every metric s3stream reports (docs/observability.md lists them).
* ``components`` / ``observers`` — what each component records, and the callbacks reading
  what components keep themselves.
* ``cost`` / ``ledger`` / ``inventory`` — `PriceTable` (S3 Standard us-east-1 by default),
  `CostLedger` (a client's $ per month at the current rate, ``client.metrics.cost()``),
  `store_cost` (what a store's contents cost, for ``s3stream inspect --cost``).
* ``prometheus`` (extra ``prometheus``) and ``otel`` (extra ``otel``) — exporters; imported
  only when used.
* ``logs`` — `ContextLogger`: records carrying ``node_id`` and ``stream_id``.
"""

from __future__ import annotations

from .catalog import ALL, PURPOSES
from .cost import S3_STANDARD_US_EAST_1, CostReport, PriceTable, RequestClass, RequestCost
from .instruments import Family, Kind, MetricSpec, Point
from .inventory import StoreCost, store_cost
from .ledger import CostLedger
from .logs import ContextLogger
from .registry import MetricsRegistry

__all__ = [
    "ALL",
    "PURPOSES",
    "S3_STANDARD_US_EAST_1",
    "ContextLogger",
    "CostLedger",
    "CostReport",
    "Family",
    "Kind",
    "MetricSpec",
    "MetricsRegistry",
    "Point",
    "PriceTable",
    "RequestClass",
    "RequestCost",
    "StoreCost",
    "store_cost",
]
