"""The priority rate limiter: rates, debt, foreground precedence, priority order, shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from s3stream import InvalidArgumentError, ManualClock, SystemClock
from s3stream.throttle import Priority, PriorityRateLimiter


def test_unlimited_never_waits_and_counts() -> None:
    clock = ManualClock()
    lim = PriorityRateLimiter(clock=clock)
    assert lim.unlimited
    t0 = clock.monotonic()
    for _ in range(100):
        assert lim.acquire(1 << 30, Priority.COMPACTION) == 0.0
    assert clock.monotonic() == t0
    m = lim.metrics
    assert m.requests["compaction"] == 100
    assert m.bytes["compaction"] == 100 << 30
    assert m.waits["compaction"] == 0


def test_byte_rate_is_kept_over_time() -> None:
    clock = ManualClock()
    lim = PriorityRateLimiter(clock=clock, bytes_per_s=1000, burst_s=1.0)
    t0 = clock.monotonic()
    assert lim.acquire(1000, Priority.UPLOAD) == 0.0  # the burst
    waited = sum(lim.acquire(500, Priority.UPLOAD) for _ in range(10))
    elapsed = clock.monotonic() - t0
    # 1000 B of burst, then 5000 B at 1000 B/s, paid in slices of 250 B: the last slice is
    # admitted once the debt of the one before it is paid, so about 4.75 s pass.
    assert 4.7 <= elapsed <= 4.8
    assert waited == pytest.approx(elapsed, abs=0.01)
    assert lim.metrics.waits["upload"] == 10


def test_request_rate_is_kept() -> None:
    clock = ManualClock()
    lim = PriorityRateLimiter(clock=clock, requests_per_s=10, burst_s=1.0)
    t0 = clock.monotonic()
    for _ in range(30):
        lim.acquire(0, Priority.COMPACTION)
    # 10 requests of burst, then 20 at 10/s.
    assert 1.8 <= clock.monotonic() - t0 <= 2.1


def test_big_request_is_paid_in_slices() -> None:
    clock = ManualClock()
    lim = PriorityRateLimiter(clock=clock, bytes_per_s=100, burst_s=1.0)
    # 100 B of burst, then the rest in slices of 25 B, each after the previous one's debt.
    assert lim.acquire(1000, Priority.COMPACTION) == pytest.approx(8.75, abs=0.06)
    t0 = clock.monotonic()
    lim.acquire(1, Priority.COMPACTION)
    assert clock.monotonic() - t0 == pytest.approx(0.25, abs=0.06)  # one slice of debt


def test_higher_priority_overtakes_a_big_request_midway() -> None:
    lim = PriorityRateLimiter(clock=SystemClock(), bytes_per_s=10_000, burst_s=1.0)
    done: dict[str, float] = {}
    t0 = time.monotonic()

    def take(name: str, nbytes: int, priority: Priority) -> None:
        lim.acquire(nbytes, priority)
        done[name] = time.monotonic() - t0

    big = threading.Thread(target=take, args=("compaction", 30_000, Priority.COMPACTION))
    big.start()
    time.sleep(0.3)
    small = threading.Thread(target=take, args=("upload", 100, Priority.UPLOAD))
    small.start()
    small.join(5)
    big.join(5)
    # The upload waited at most about one slice (0.25 s), not for the compaction's 2 s.
    assert done["upload"] < 0.9
    assert done["compaction"] > 1.6
    assert done["upload"] < done["compaction"]


def test_foreground_never_waits_but_spends() -> None:
    clock = ManualClock()
    lim = PriorityRateLimiter(clock=clock, bytes_per_s=1000, burst_s=1.0)
    t0 = clock.monotonic()
    for _ in range(10):
        assert lim.acquire(1000, Priority.FOREGROUND) == 0.0
    assert clock.monotonic() == t0
    # The background now pays for the foreground's 9 s of debt.
    lim.acquire(1, Priority.READAHEAD)
    assert clock.monotonic() - t0 == pytest.approx(9.0, abs=0.06)


def test_higher_priority_waiter_goes_first() -> None:
    lim = PriorityRateLimiter(clock=SystemClock(), bytes_per_s=10_000, burst_s=1.0)
    lim.acquire(13_000, Priority.FOREGROUND)  # 0.3 s of debt
    order: list[str] = []

    def take(name: str, priority: Priority) -> None:
        lim.acquire(1000, priority)
        order.append(name)

    low = threading.Thread(target=take, args=("compaction", Priority.COMPACTION))
    high = threading.Thread(target=take, args=("upload", Priority.UPLOAD))
    low.start()
    time.sleep(0.08)  # the compaction request queues first ...
    high.start()  # ... yet the upload, arriving later, is served first
    low.join(5)
    high.join(5)
    assert order == ["upload", "compaction"]


def test_close_releases_waiters() -> None:
    lim = PriorityRateLimiter(clock=SystemClock(), bytes_per_s=1, burst_s=1.0)
    lim.acquire(1000, Priority.FOREGROUND)  # ~1000 s of debt
    done = threading.Event()

    def wait() -> None:
        lim.acquire(1, Priority.COMPACTION)
        done.set()

    t = threading.Thread(target=wait)
    t.start()
    assert not done.wait(0.2)
    lim.close()
    assert done.wait(2)
    t.join()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"bytes_per_s": -1}, "bytes_per_s"),
        ({"requests_per_s": "x"}, "requests_per_s"),
        ({"burst_s": 0}, "burst_s"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=name):
        PriorityRateLimiter(clock=ManualClock(), **kwargs)  # type: ignore[arg-type]


def test_bad_acquire_arguments() -> None:
    lim = PriorityRateLimiter(clock=ManualClock(), bytes_per_s=10)
    with pytest.raises(InvalidArgumentError, match="nbytes"):
        lim.acquire(-1, Priority.UPLOAD)
    with pytest.raises(InvalidArgumentError, match="priority"):
        lim.acquire(1, 2)  # type: ignore[arg-type]
