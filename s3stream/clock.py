"""Time as an injected component.

Library code never reads ambient time: it asks a `Clock`. `SystemClock` is the production
implementation; `ManualClock` lets tests and simulations advance time deterministically.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod

from .validation import check_int, check_seconds

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(ABC):
    """Source of wall-clock and monotonic time, and of sleeping."""

    @abstractmethod
    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the Unix epoch (for record timestamps, ages)."""

    @abstractmethod
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for intervals and deadlines)."""

    @abstractmethod
    def sleep(self, seconds: float) -> None:
        """Block the calling thread for `seconds`."""


class SystemClock(Clock):
    """The real clock of the machine."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    # The builtin itself, not a method forwarding to it: hot paths (an append times itself)
    # read the clock twice per call, and a Python frame per read is measurable there.
    monotonic = staticmethod(time.monotonic)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock(Clock):
    """A clock that moves only when told to; `sleep` advances it instead of blocking."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        check_int("start_ms", start_ms)
        self._lock = threading.Lock()
        self._now_ns = start_ms * 1_000_000

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ns // 1_000_000

    def monotonic(self) -> float:
        with self._lock:
            return self._now_ns / 1e9

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds` (a clock cannot go backwards)."""
        nanos = int(check_seconds("seconds", seconds) * 1e9)
        with self._lock:
            self._now_ns += nanos
