"""Statistics the bench scripts share (imported as ``_stats``: the scripts run from bench/)."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
