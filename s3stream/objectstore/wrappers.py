"""Object stores that wrap another one to add a concern: retries, metrics.

Each wrapper is an `ObjectStore` itself, so they stack (``MetricsObjectStore(
RetryingObjectStore(S3ObjectStore(...), ...))`` counts calls as the application sees them).
`MetricsObjectStore` lives in ``metered`` and is re-exported here.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from .._bounded import within_deadline
from .._call_deadline import current_deadline
from ..clock import Clock
from ..errors import ContendedError, InvalidArgumentError, ObjectNotFoundError, UnavailableError
from ._common import as_bytes
from .base import ObjectInfo, ObjectStore, ObjectStoreCapabilities
from .forwarding import ForwardingObjectStore
from .metered import MetricsObjectStore, ObjectStoreMetrics
from .requests import RequestCountingStore, RequestMeter

__all__ = [
    "ForwardingObjectStore",
    "MetricsObjectStore",
    "ObjectStoreMetrics",
    "RetryingObjectStore",
]

T = TypeVar("T")


class RetryingObjectStore(ObjectStore):
    """Retries calls that fail with `UnavailableError`, with capped exponential backoff.

    The n-th retry waits a random time in ``[0, min(max_delay_s, base_delay_s * 2**(n-1))]``
    ("full jitter", drawn from `rng`, slept on `clock`). A call gives up after `max_attempts`
    tries, or when the next try could not end by `deadline_s` from the call's start (the wait
    plus `attempt_timeout_s`, the longest one try can take: None counts only the waits),
    raising `UnavailableError` that says how many tries were made. With the inner store's tries
    bounded (`store_stack` does both), a call against a frozen server ends within its deadline.
    Other errors pass through at once. The wrapper never changes the store it wraps.

    Conditional create needs care: a try that failed with `UnavailableError` may still have
    created the object (the answer was lost). If a later try then reports that the key
    exists, the wrapper reads the object back and returns True when its bytes equal ours. So
    a writer whose bytes are identical to a competitor's could be told it won; s3stream's
    contenders always write distinct bytes (each carries its writer's identity).

    `list` resumes after the last key it yielded when a page fails midway.
    """

    def __init__(
        self,
        inner: ObjectStore,
        *,
        clock: Clock,
        rng: random.Random,
        max_attempts: int = 5,
        base_delay_s: float = 0.05,
        max_delay_s: float = 2.0,
        deadline_s: float = 30.0,
        attempt_timeout_s: float | None = None,
    ) -> None:
        if not isinstance(inner, ObjectStore):
            raise InvalidArgumentError(f"inner must be an ObjectStore, got {inner!r}")
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        for name, value in (
            ("base_delay_s", base_delay_s),
            ("max_delay_s", max_delay_s),
            ("deadline_s", deadline_s),
            ("attempt_timeout_s", 0.0 if attempt_timeout_s is None else attempt_timeout_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(f"{name} must be a number >= 0, got {value!r}")
        self._inner = inner
        #: What the tries call: `inner`, or a `RequestCountingStore` over it once requests are
        #: metered and `inner` cannot report its own.
        self._calls: ObjectStore = inner
        self._clock = clock
        self._rng = rng
        self._rng_lock = threading.Lock()
        self._max_attempts = max_attempts
        self._base_delay_s = float(base_delay_s)
        self._max_delay_s = float(max_delay_s)
        self._deadline_s = float(deadline_s)
        self._attempt_timeout_s = float(attempt_timeout_s or 0.0)
        #: Set by `close`: a call still retrying (a PUT of an uploader its client's close left
        #: behind) makes no further try, so nothing is written for a closed client.
        self._closed = False

    @property
    def inner(self) -> ObjectStore:
        """The wrapped store."""
        return self._inner

    def describe(self) -> str:
        return f"retrying({self._inner.describe()})"

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        return self._inner.capabilities

    @property
    def attempt_timeout_s(self) -> float | None:
        # One call here may retry up to its deadline: that is one "try" for a caller above.
        return self._deadline_s + self._attempt_timeout_s

    def close(self) -> None:
        self._closed = True
        self._inner.close()

    def remove_leftovers(self, older_than_ms: int, prefixes: Sequence[str]) -> int:
        return self._inner.remove_leftovers(older_than_ms, prefixes)  # local work: no retries

    def meter_requests(self, meter: RequestMeter) -> bool:
        if self._calls is self._inner and self._inner.meter_requests(meter):
            return True
        # The inner store cannot report its requests: count each try made here.
        if self._calls is self._inner:
            self._calls = RequestCountingStore(self._inner)
        return self._calls.meter_requests(meter)

    def put(self, key: str, data: bytes) -> None:
        blob = as_bytes(data)
        self._run("put", key, lambda: self._calls.put(key, blob))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        blob = as_bytes(data)
        failed_tries = 0

        def attempt() -> bool:
            nonlocal failed_tries
            try:
                return self._calls.put_if_absent(key, blob)
            except UnavailableError:
                failed_tries += 1
                raise

        started = self._clock.monotonic()
        created = self._run("put_if_absent", key, attempt)
        if created or failed_tries == 0:
            return created
        # An earlier try may have created the object without us hearing back: read it back
        # within what is left of the call's deadline.
        try:
            return self._run("get", key, lambda: self._calls.get(key), started) == blob
        except ObjectNotFoundError:
            return False

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._run("get", key, lambda: self._calls.get(key, start, end))

    def get_suffix(self, key: str, length: int) -> bytes:
        return self._run("get_suffix", key, lambda: self._calls.get_suffix(key, length))

    def head(self, key: str) -> ObjectInfo | None:
        return self._run("head", key, lambda: self._calls.head(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        # Materialized so that a retry deletes the same keys (deleting twice is harmless).
        key_list = list(keys)
        self._run("delete_many", None, lambda: self._calls.delete_many(key_list))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        last: str | None = None
        failures = 0
        started = self._clock.monotonic()
        while True:
            try:
                for info in self._calls.list(prefix):
                    if last is not None and info.key <= last:
                        continue  # already yielded before the failure
                    last = info.key
                    yield info
                return
            except UnavailableError as exc:
                failures += 1
                self._wait_or_give_up("list", None, exc, failures, started)

    def _run(
        self, op: str, key: str | None, fn: Callable[[], T], started: float | None = None
    ) -> T:
        """`fn`, retried; the deadline counts from `started`, the start of the call this run
        is part of (now unless given), and a run whose first try could not end by then
        raises `UnavailableError` without trying."""
        failures = 0
        now = self._clock.monotonic()
        if started is None:
            started = now
            end = self._end(started)
            if now >= end:
                # The caller's deadline (`caller_deadline`) passed already.
                target = f" {key!r}" if key else ""
                raise UnavailableError(
                    f"{op}{target} on {self._inner.describe()} not tried: the deadline of "
                    "the call it was made for has passed"
                )
        elif now + self._attempt_timeout_s > self._end(started):
            target = f" {key!r}" if key else ""
            raise UnavailableError(
                f"{op}{target} on {self._inner.describe()} not tried: too little is left of "
                f"the call's deadline (deadline_s={self._deadline_s})"
            )
        while True:
            try:
                return self._try(op, key, fn)
            except UnavailableError as exc:
                failures += 1
                self._wait_or_give_up(op, key, exc, failures, started)

    def _try(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        """One try of `fn`, waited for until the deadline of the public call it serves
        (`caller_deadline`) if one try could outlast it."""
        caller = current_deadline(self._clock)
        if caller is None or self._clock.monotonic() + self._attempt_timeout_s <= caller:
            return fn()
        # The client's socket timeout bounds a try, not the caller's deadline: a close(1)
        # whose release commit was in flight against a store that stopped answering took
        # 4.3 s with a 20 s store timeout. The try goes on in its thread; its outcome is
        # unknown to the caller, as a try that timed out at the socket is.
        target = f" {key!r}" if key else ""
        return within_deadline(
            fn,
            clock=self._clock,
            deadline=caller,
            name=f"s3stream-store-{op}",
            timeout_error=lambda: UnavailableError(
                f"{op}{target} on {self._inner.describe()}: no answer by the deadline of the "
                "call it was made for (the request may still take effect)"
            ),
        )

    def _wait_or_give_up(
        self, op: str, key: str | None, exc: UnavailableError, failures: int, started: float
    ) -> None:
        """Sleep before the next try, or raise if the budget is spent (called in `except`).

        A `ContendedError` (a racing conditional write, not an outage) waits a fresh random
        time up to `base_delay_s` each time instead of backing off exponentially: writers of
        a metadata log that all back off for seconds after a 409 would leave the log idle.
        """
        if isinstance(exc, ContendedError):
            cap = self._base_delay_s
        else:
            cap = min(self._max_delay_s, self._base_delay_s * (2 ** (failures - 1)))
        with self._rng_lock:
            delay = self._rng.uniform(0.0, cap)
        now = self._clock.monotonic()
        elapsed = now - started
        self._raise_if_closed(op, key, exc)
        end = self._end(started)
        if failures >= self._max_attempts or now + delay + self._attempt_timeout_s > end:
            target = f" {key!r}" if key else ""
            raise UnavailableError(
                f"{op}{target} on {self._inner.describe()} failed {failures} times in "
                f"{elapsed:.2f}s (max_attempts={self._max_attempts}, "
                f"deadline_s={self._deadline_s}); last error: {exc}"
            ) from exc
        self._clock.sleep(delay)
        self._raise_if_closed(op, key, exc)

    def _end(self, started: float) -> float:
        """When a call started at `started` must end: its own deadline, or the deadline of
        the public call it is made for (`caller_deadline`), whichever is first."""
        end = started + self._deadline_s
        caller = current_deadline(self._clock)
        return end if caller is None or caller > end else caller

    def _raise_if_closed(self, op: str, key: str | None, exc: UnavailableError) -> None:
        if self._closed:
            target = f" {key!r}" if key else ""
            raise UnavailableError(
                f"{op}{target} on {self._inner.describe()} not tried again: the store was "
                f"closed; last error: {exc}"
            ) from exc
