"""Cheap already-completed futures for the append hot path.

`concurrent.futures.Future()` builds a `threading.Condition` per instance, which costs more
than the rest of an in-memory append. A future that is complete at birth never blocks anyone,
so it can share one condition with its siblings. This relies on `Future`'s private attribute
names, which have been stable since Python 3.2; `tests/test_futures.py` pins the behaviour.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["CompletedFutures"]

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
