"""The priority rate limiter for object-store traffic.

One token bucket with two dimensions (bytes per second and requests per second) is shared by
every kind of object-store traffic of a client. Foreground traffic (demand reads of a fetch)
never waits: it only spends tokens, so the background yields to it. Background traffic waits
for tokens in priority order — uploads first (they free the WAL), then catch-up readahead,
then compaction — and first come, first served within one priority.

The bucket may go into debt: a request is admitted as soon as both balances are non-negative
and then pays for all of it, so the long-run rate is exact. A background request larger than
a quarter of the byte burst is paid in slices of that size, each queued anew: a higher
priority arriving meanwhile overtakes it, and no request leaves more than one slice of debt
for others to wait out.

Time comes from an injected `Clock`: the waiter at the head of the line sleeps on it, so a
`ManualClock` makes every wait deterministic (and instant).
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field

from .clock import Clock
from .errors import InvalidArgumentError
from .validation import check_instance, check_int, check_number

__all__ = ["Priority", "PriorityRateLimiter", "ThrottleMetrics"]

# How long a waiter sleeps at most before it looks again (a higher priority may have come).
_SLICE_S = 0.05


class Priority(enum.IntEnum):
    """Who is asking; a lower value is served first."""

    #: Demand reads of a fetch and anything an application thread waits for: never waits.
    FOREGROUND = 0
    #: Uploads of WAL data to objects (they free WAL space, so appends depend on them).
    UPLOAD = 1
    #: Readahead for sequential (catch-up) readers.
    READAHEAD = 2
    #: Compaction reads and writes, orphan sweeping.
    COMPACTION = 3


@dataclass(frozen=True, slots=True)
class ThrottleMetrics:
    """What a `PriorityRateLimiter` admitted, per priority name (a snapshot)."""

    requests: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    #: Requests that had to wait, and the seconds they waited in total.
    waits: dict[str, int] = field(default_factory=dict)
    waited_s: dict[str, float] = field(default_factory=dict)


class PriorityRateLimiter:
    """A priority token bucket of `bytes_per_s` and `requests_per_s` (0: that dimension is
    unlimited). Each bucket holds at most `burst_s` seconds of its rate. Thread-safe.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        bytes_per_s: float = 0,
        requests_per_s: float = 0,
        burst_s: float = 1.0,
    ) -> None:
        if not isinstance(clock, Clock):
            raise InvalidArgumentError(f"clock must be a Clock, got {clock!r}")
        self._clock = clock
        self._bytes_rate = check_number("bytes_per_s", bytes_per_s)
        self._req_rate = check_number("requests_per_s", requests_per_s)
        burst = check_number("burst_s", burst_s)
        if burst <= 0:
            raise InvalidArgumentError(f"burst_s must be > 0, got {burst_s!r}")
        self._bytes_cap = self._bytes_rate * burst
        self._req_cap = self._req_rate * burst
        self._bytes_tokens = self._bytes_cap
        self._req_tokens = self._req_cap
        self._last = clock.monotonic()
        self._cond = threading.Condition(threading.Lock())
        # One FIFO line per background priority; entries are tickets.
        self._lines: dict[Priority, deque[int]] = {p: deque() for p in Priority}
        self._tickets = itertools.count()
        self._closed = False
        names = [p.name.lower() for p in Priority]
        self._requests = dict.fromkeys(names, 0)
        self._bytes = dict.fromkeys(names, 0)
        self._waits = dict.fromkeys(names, 0)
        self._waited_s = dict.fromkeys(names, 0.0)

    @property
    def unlimited(self) -> bool:
        """True if neither rate is set: `acquire` never waits."""
        return self._bytes_rate == 0 and self._req_rate == 0

    @property
    def closed(self) -> bool:
        """True once `close` was called: nothing waits any more."""
        return self._closed

    @property
    def metrics(self) -> ThrottleMetrics:
        """A snapshot of the counters."""
        with self._cond:
            return ThrottleMetrics(
                dict(self._requests), dict(self._bytes), dict(self._waits), dict(self._waited_s)
            )

    def acquire(self, nbytes: int, priority: Priority, requests: int = 1) -> float:
        """Wait until `priority` may send `requests` requests carrying `nbytes` bytes, and
        spend the tokens; returns the seconds waited. `FOREGROUND` never waits."""
        check_int("nbytes", nbytes)
        check_int("requests", requests)
        check_instance("priority", priority, Priority)
        name = priority.name.lower()
        if self.unlimited or priority is Priority.FOREGROUND:
            with self._cond:
                if not self.unlimited:
                    self._refill()
                    self._spend(nbytes, requests)
                self._count(name, nbytes, requests)
            return 0.0
        started = self._clock.monotonic()
        # A big request is paid in slices of a quarter of the byte burst, each queued anew,
        # so a higher priority arriving meanwhile goes first and the debt a lower priority
        # leaves behind never exceeds one slice.
        step = max(1, int(self._bytes_cap // 4)) if self._bytes_rate else max(1, nbytes)
        remaining, reqs = nbytes, requests
        while True:
            part = min(remaining, step)
            self._admit(priority, part, reqs)
            remaining -= part
            reqs = 0
            if remaining <= 0:
                break
        waited = max(0.0, self._clock.monotonic() - started)
        with self._cond:
            self._count(name, nbytes, requests)
            if waited > 0:
                self._waits[name] += 1
                self._waited_s[name] += waited
        return waited

    def _admit(self, priority: Priority, nbytes: int, requests: int) -> None:
        """Queue at `priority`, wait to be first in line with a non-negative balance, spend."""
        ticket = next(self._tickets)
        line = self._lines[priority]
        with self._cond:
            line.append(ticket)
            try:
                while not self._closed:
                    self._refill()
                    if self._is_next(priority, ticket):
                        wait = self._deficit_s()
                        if wait <= 0:
                            self._spend(nbytes, requests)
                            return
                        # Sleep outside the lock so others can queue (and outrank us).
                        self._cond.release()
                        try:
                            self._clock.sleep(min(wait, _SLICE_S))
                        finally:
                            self._cond.acquire()
                    else:
                        self._cond.wait(_SLICE_S)
            finally:
                line.remove(ticket)
                self._cond.notify_all()

    def close(self) -> None:
        """Let every waiter through at once and stop limiting (shutdown must not block)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- internals (called with the lock held) ---------------------------------------------

    def _is_next(self, priority: Priority, ticket: int) -> bool:
        for p in Priority:
            if p is priority:
                return self._lines[p][0] == ticket
            if self._lines[p]:
                return False
        return False  # pragma: no cover - every priority is in Priority

    def _refill(self) -> None:
        now = self._clock.monotonic()
        elapsed = now - self._last
        if elapsed <= 0:
            return
        self._last = now
        if self._bytes_rate:
            self._bytes_tokens = min(
                self._bytes_cap, self._bytes_tokens + elapsed * self._bytes_rate
            )
        if self._req_rate:
            self._req_tokens = min(self._req_cap, self._req_tokens + elapsed * self._req_rate)

    def _deficit_s(self) -> float:
        wait = 0.0
        if self._bytes_rate and self._bytes_tokens < 0:
            wait = -self._bytes_tokens / self._bytes_rate
        if self._req_rate and self._req_tokens < 0:
            wait = max(wait, -self._req_tokens / self._req_rate)
        return wait

    def _spend(self, nbytes: int, requests: int) -> None:
        if self._bytes_rate:
            self._bytes_tokens -= nbytes
        if self._req_rate:
            self._req_tokens -= requests

    def _count(self, name: str, nbytes: int, requests: int) -> None:
        self._requests[name] += requests
        self._bytes[name] += nbytes

    def __repr__(self) -> str:
        return (
            f"PriorityRateLimiter(bytes_per_s={self._bytes_rate:g}, "
            f"requests_per_s={self._req_rate:g})"
        )
