"""`caller_deadline`: the deadline of the public call a thread is working for, for the store
calls made on its behalf.

A store call has a deadline of its own (`store_timeout_ms`, `RetryingObjectStore`), which
says nothing of the caller's: `client.close(timeout_s=2)` whose release commit makes two
store calls in turn against a store that stopped answering took 12.7 s, each call retrying
for its full time. Threading a deadline argument through the metadata log, the manager and
every store wrapper would change all their signatures; a context variable carries it to
the retry layer instead, which then gives up at the earlier of the two. It is per thread
(and per asyncio task): background threads started without the caller's context (the
uploader, a checkpoint left to finish) keep only their own deadlines. Set where one
thread's store calls serve one caller only: the release commit of `StreamClient.close` (a
metadata commit group may hold requests of other callers with later deadlines, which the
leader's deadline must not cut short). Read by the object stores' retry layer and by the
PostgreSQL metadata log's session (its waits for the lock it serializes calls with, for a
connection and for the server).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from .clock import Clock

__all__ = ["caller_deadline", "current_deadline", "the_deadline", "time_left"]

#: (the clock the deadline is on, the deadline), or None outside any bounded call.
_DEADLINE: ContextVar[tuple[Clock, float] | None] = ContextVar(
    "s3stream_caller_deadline", default=None
)


@contextlib.contextmanager
def caller_deadline(clock: Clock, deadline: float) -> Iterator[None]:
    """While inside, store calls of this thread end by `deadline` (on `clock`'s
    ``monotonic``) at the latest; nested, the earlier deadline wins."""
    outer = _DEADLINE.get()
    if outer is not None and outer[0] is clock and outer[1] < deadline:
        deadline = outer[1]
    token = _DEADLINE.set((clock, deadline))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def current_deadline(clock: Clock) -> float | None:
    """The deadline `caller_deadline` set for this thread, if it is on `clock` (a deadline
    on another clock cannot be compared), else None."""
    found = _DEADLINE.get()
    if found is None or found[0] is not clock:
        return None
    return found[1]


def time_left() -> float | None:
    """Seconds left before the deadline `caller_deadline` set for this thread, measured on
    that deadline's own clock (for waits on the real clock, such as a socket's, by code that
    has no clock of the client's), or None outside any bounded call."""
    found = the_deadline()
    if found is None:
        return None
    clock, deadline = found
    return deadline - clock.monotonic()


def the_deadline() -> tuple[Clock, float] | None:
    """The deadline `caller_deadline` set for this thread with the clock it is on (for
    `_bounded.within_deadline`), or None outside any bounded call."""
    return _DEADLINE.get()
