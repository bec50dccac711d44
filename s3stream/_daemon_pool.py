"""`DaemonPool`: threads for background work that must never hold up the interpreter's exit.

`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter exits, so work
left running after its owner stopped waiting for it (a readahead GET, at a close with a
deadline, against a store that stopped answering) delays the exit until the store's timeout:
the owner kept its deadline, and the process then did not end. These threads are daemons,
started on demand up to a bound; `shutdown` drops what has not started and never waits.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from typing import Any, ParamSpec, TypeVar

from ._futures import run_into
from .validation import check_int, check_text

__all__ = ["DaemonPool"]

P = ParamSpec("P")
T = TypeVar("T")

_Job = tuple[Future[Any], Callable[[], Any]]


class DaemonPool:
    """Up to `max_workers` daemon threads named after `name`, running submitted calls in
    submission order (as many at once as there are threads). Thread-safe."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max = check_int("max_workers", max_workers, minimum=1)
        self._name = check_text("name", name)
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        #: Threads waiting for work, not yet spoken for by a submit.
        self._idle = 0
        self._shut = False
        #: Calls submitted and not done (`shutdown(wait=True)` waits for the running ones).
        self._unfinished: set[Future[Any]] = set()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a thread of the pool; its future. Raises
        `RuntimeError` once the pool is shut down (as `ThreadPoolExecutor` does)."""
        future: Future[T] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError(f"the {self._name} pool is shut down")
            self._queue.put((future, functools.partial(fn, *args, **kwargs)))
            self._unfinished.add(future)
            if self._idle:
                self._idle -= 1
            elif self._threads < self._max:
                self._threads += 1
                name = f"{self._name}_{self._threads - 1}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: Future[Any]) -> None:
        with self._lock:
            self._unfinished.discard(future)

    def shutdown(self, *, wait: bool = False) -> None:
        """Take no more work, cancel what has not started, and let the threads end once
        their current call has; with `wait`, wait for the calls running (else never: the
        threads are daemons, and nothing holds up the interpreter's exit). Idempotent."""
        with self._lock:
            self._shut = True
            threads = self._threads
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in range(threads):
            self._queue.put(None)  # wakes a waiting thread, which then ends
        if wait:
            with self._lock:
                running = list(self._unfinished)
            futures_wait(running)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            run_into(*job)
            del job  # nothing of a finished call stays referenced while idle
            with self._lock:
                if self._shut:
                    return
                self._idle += 1
