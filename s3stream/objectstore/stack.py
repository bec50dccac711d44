"""The one stack of wrappers a client puts over its object store.

``MetricsObjectStore(RetryingObjectStore(raw))``: the retry layer is the only one (remote stores
make one try per call, see `S3ObjectStore`), bounded by one deadline per call; metrics count
calls as the application's components make them. Everything a client does with its store goes
through this stack, the object WAL under the same store included, so its traffic shows in
`StreamClient.metrics` and one store object (one boto3 client) serves them all.
"""

from __future__ import annotations

import random

from ..clock import Clock
from .base import ObjectStore
from .wrappers import MetricsObjectStore, RetryingObjectStore

__all__ = ["MAX_TRIES", "store_stack"]

#: Tries per call: the deadline is what bounds a call (a server restarting answers 500 for a
#: while; a few quick tries would give up long before the deadline).
MAX_TRIES = 1000


def store_stack(
    raw: ObjectStore, *, clock: Clock, rng: random.Random, timeout_s: float
) -> MetricsObjectStore:
    """Wrap `raw` for a client: every call retried within `timeout_s`, and counted.

    A store that is already such a stack is returned as it is, so that nothing is wrapped
    twice. The retry layer bounds `raw`'s tries to fit the deadline (`RetryingObjectStore`).
    """
    if isinstance(raw, MetricsObjectStore):
        return raw
    return MetricsObjectStore(
        RetryingObjectStore(
            raw, clock=clock, rng=rng, deadline_s=timeout_s, max_attempts=MAX_TRIES
        )
    )
