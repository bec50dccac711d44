"""The one stack of wrappers a client puts over its object store.

``MetricsObjectStore(RetryingObjectStore(raw))``: the retry layer is the only one (remote stores
make one try per call, see `S3ObjectStore`), bounded by one deadline per call; metrics count
calls as the application's components make them, and the requests those calls send, every try
included (`s3stream.objectstore.requests`: reported by `raw`, or counted per try by the retry
layer when `raw` cannot report them).
Everything a client does with its store goes through this stack, the object WAL under the same
store included, so its traffic shows in `StreamClient.metrics` and one store object (one boto3
client) serves them all.
"""

from __future__ import annotations

import random

from ..clock import Clock
from .base import ObjectStore
from .wrappers import MetricsObjectStore, RetryingObjectStore

__all__ = ["MAX_TRIES", "TRIES_PER_DEADLINE", "store_stack"]

#: A try of a call gets at most this share of the call's deadline (its socket timeouts are
#: lowered to fit), so a call has room for a few tries when the first ones hang.
TRIES_PER_DEADLINE = 3

#: Tries per call: the deadline is what bounds a call (a server restarting answers 500 for a
#: while; a few quick tries would give up long before the deadline).
MAX_TRIES = 1000


def store_stack(
    raw: ObjectStore, *, clock: Clock, rng: random.Random, timeout_s: float
) -> MetricsObjectStore:
    """Wrap `raw` for a client: every call retried within `timeout_s`, and counted.

    A store that is already such a stack is returned as it is, so that nothing is wrapped
    twice. Lowers `raw`'s per-try timeouts to ``timeout_s / TRIES_PER_DEADLINE`` where they
    are longer (`ObjectStore.bound_attempts`), and has the retry layer count them, so that no
    try starts that could not end by the deadline.
    """
    if isinstance(raw, MetricsObjectStore):
        return raw
    raw.bound_attempts(timeout_s / TRIES_PER_DEADLINE)
    return MetricsObjectStore(
        RetryingObjectStore(
            raw,
            clock=clock,
            rng=rng,
            deadline_s=timeout_s,
            max_attempts=MAX_TRIES,
            attempt_timeout_s=raw.attempt_timeout_s,
        ),
        clock=clock,
    )
