"""`within_deadline`: keep a deadline around work that may block in the kernel for good.

A thread blocked in a system call on a device that stopped answering (a filesystem frozen with
``fsfreeze``, a SAN path failing over, a hung NFS server) cannot be interrupted: the only way a
caller keeps its deadline is not to be that thread. The work runs in a daemon thread of its
own; the caller waits for it until the deadline (read from the injected clock) and then raises,
leaving the work to finish in its thread. What the work makes after that is nobody's but that
thread's: it hands it to `abandoned` (which closes it), so nothing the work still holds (a
file, a lock) is ever touched by two threads at once or left held for good.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from .clock import Clock
from .errors import UnavailableError

__all__ = ["stop_if_given_up", "within_deadline"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def within_deadline(
    work: Callable[[], T],
    *,
    clock: Clock,
    deadline: float,
    name: str,
    timeout_error: Callable[[], BaseException],
    abandoned: Callable[[T], None] | None = None,
    given_up: threading.Event | None = None,
) -> T:
    """Run `work` in a daemon thread named `name` (in the caller's context variables) and
    return what it returns, or raise what it raises, if it ends by `deadline` (on `clock`'s
    ``monotonic``); otherwise raise ``timeout_error()``.

    Work left behind goes on in its thread; if it then returns a value, the thread passes it
    to `abandoned` (errors logged), and if it raises, the error is logged. `given_up`, when
    given, is set the moment the caller stops waiting (a deadline passed or the wait itself
    was interrupted), so that the work can stop at its next step instead of going on for
    nobody. A result that arrives while the caller's wait is being interrupted (Ctrl-C) is
    handed to `abandoned` too, in a thread of its own.
    """
    guard = threading.Lock()
    done = threading.Event()
    results: list[T] = []
    failures: list[BaseException] = []
    gave_up = False
    context = contextvars.copy_context()

    def dispose(value: T) -> None:
        if abandoned is None:
            return
        try:
            abandoned(value)
        except Exception:
            log.warning("%s: cleaning up after its caller gave up failed", name, exc_info=True)

    def run() -> None:
        try:
            value = context.run(work)
        except BaseException as exc:
            with guard:
                if not gave_up:
                    failures.append(exc)
                    done.set()
                    return
            log.info("%s failed after its caller's deadline: %r", name, exc)
            return
        with guard:
            if not gave_up:
                results.append(value)
                done.set()
                return
        log.info("%s finished after its caller's deadline; closing what it made", name)
        dispose(value)

    threading.Thread(target=run, name=name, daemon=True).start()
    interrupted = True
    try:
        done.wait(max(0.0, deadline - clock.monotonic()))
        interrupted = False
    finally:
        with guard:
            if not done.is_set():
                gave_up = True
                if given_up is not None:
                    given_up.set()
        if interrupted and results:
            # Done just as the wait was interrupted (Ctrl-C): the caller never sees it.
            left = results[0]
            threading.Thread(
                target=dispose, args=(left,), name=f"{name}-cleanup", daemon=True
            ).start()
    if gave_up:
        raise timeout_error()
    if failures:
        raise failures[0]
    return results[0]


def stop_if_given_up(given_up: threading.Event | None, what: str) -> None:
    """Raise `UnavailableError` if `given_up` (`within_deadline`'s) is set: work whose caller
    stopped waiting starts nothing new, as a retry of it may be under way already. `what`
    names the work for the message ("the open of node 'n1'")."""
    if given_up is not None and given_up.is_set():
        raise UnavailableError(f"{what} was given up at its deadline; not going on")
