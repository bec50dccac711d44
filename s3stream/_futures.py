"""Futures: cheap already-completed ones for the append hot path, and running a call into one.

`concurrent.futures.Future()` builds a `threading.Condition` per instance, which costs more
than the rest of an in-memory append. A future that is complete at birth never blocks anyone,
so it can share one condition with its siblings. This relies on `Future`'s private attribute
names, which have been stable since Python 3.2; `tests/test_futures.py` pins the behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["CompletedFutures", "run_into"]

T = TypeVar("T")


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
