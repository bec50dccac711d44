"""Futures: cheap already-completed ones for the append hot path, running a call into one, and
waves of store calls that stop at the first outage (`StopAtOutage`).

`concurrent.futures.Future()` builds a `threading.Condition` per instance, which costs more
than the rest of an in-memory append. A future that is complete at birth never blocks anyone,
so it can share one condition with its siblings. This relies on `Future`'s private attribute
names, which have been stable since Python 3.2; `tests/test_futures.py` pins the behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import ParamSpec, TypeVar

from .errors import UnavailableError

__all__ = ["CompletedFutures", "StopAtOutage", "run_into"]

T = TypeVar("T")
P = ParamSpec("P")


class CompletedFutures:
    """Makes futures that are already resolved, sharing one condition."""

    def __init__(self) -> None:
        self._condition = threading.Condition()

    def result(self, value: T) -> Future[T]:
        """A future already resolved with `value`."""
        f: Future[T] = Future.__new__(Future)
        f._condition = self._condition
        f._state = "FINISHED"
        f._result = value
        f._exception = None
        f._waiters = []
        f._done_callbacks = []  # type: ignore[attr-defined]
        return f


def run_into(future: Future[T], call: Callable[[], T]) -> None:
    """Run `call` for `future` (as a pool's thread does), unless it was cancelled first: its
    result or error completes the future."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = call()
    except BaseException as exc:
        future.set_exception(exc)
    else:
        future.set_result(result)


class StopAtOutage:
    """Calls a pool runs for one consumer (GETs of a Spark task, index reads of a plan): once
    one fails with `UnavailableError` (the store stopped answering), the calls not started
    yet fail at once instead of each waiting out its own store deadline. A thread freed by
    the failed call took the next queued GET before the consumer saw the failure, and a
    pool's shutdown cannot cancel a call already started: a frozen store held a Spark read
    for twice the store deadline (40.8 s against 20.5 s)."""

    def __init__(self) -> None:
        self._outage: UnavailableError | None = None

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, unless a call made through this failed with an outage."""
        outage = self._outage
        if outage is not None:
            raise UnavailableError(f"not tried: the store stopped answering ({outage})")
        try:
            return fn(*args, **kwargs)
        except UnavailableError as exc:
            self._outage = exc
            raise
