"""Fault injection: `FaultyObjectStore` around any object store, `FaultyWal` around any WAL.

`FaultyObjectStore` is a seeded fault-injecting wrapper around any object store.

After SlateDB's fault-injecting object store. Faults come from `FaultRule`s, each matching
operations by name and keys by prefix:

- *errors*: the call fails with `UnavailableError` before reaching the inner store (nothing
  happened; a retry can succeed);
- *ambiguous* failures: the call reaches the inner store and takes effect, then the caller
  gets `UnavailableError` anyway (the lost reply of a PUT that succeeded). For `delete_many`
  only a random prefix of the keys is deleted; `list` yields a random number of objects,
  then fails;
- *latency*: a uniformly drawn delay, slept on the injected `Clock` (a `ManualClock` makes it
  free and deterministic).

Every draw comes from the seeded `random.Random`, so a run with one seed and one sequence of
calls injects the same faults. `healthy()` suspends injection; `counters` tells what was
injected. Arguments are validated before any fault, so bad input always gets
`InvalidArgumentError`. Needs neither pytest nor Hypothesis.

`FaultyWal` is a WAL whose medium fails for a while, as a full disk or an unreachable store
does, and keeps the `WriteAheadLog` contract while doing so: a failing append never reaches
the inner WAL, every later append fails too until `reset()`, and `reset()` fails retryably
while the fault lasts, then resumes the WAL. It injects faults while `failing` is set, or at
random (`error_rate`, drawn from a seeded `random.Random`).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType

from ..clock import Clock
from ..errors import InvalidArgumentError, UnavailableError
from ..objectstore.base import (
    ObjectInfo,
    ObjectStore,
    ObjectStoreCapabilities,
    check_key,
    check_range,
)
from ..validation import check_number
from ..wal.base import WalCapabilities, WalPosition, WalRecord, WriteAheadLog

__all__ = [
    "OPERATIONS",
    "FaultCounters",
    "FaultRule",
    "FaultyObjectStore",
    "FaultyWal",
    "slow_reads",
]

#: Names of the operations faults can target.
OPERATIONS = frozenset({"put", "put_if_absent", "get", "get_suffix", "head", "delete_many", "list"})


@dataclass(frozen=True, slots=True)
class FaultRule:
    """Faults for the calls of `operations` (None: all) on keys starting with `key_prefix`.

    A `list` call matches when its prefix and `key_prefix` overlap (one starts with the
    other); a `delete_many` call when any of its keys matches.
    """

    #: Probability that a matching call fails before reaching the store.
    error_rate: float = 0.0
    #: Probability that a matching call takes effect and then fails anyway.
    ambiguous_rate: float = 0.0
    #: Bounds, in seconds, of the delay added to a matching call.
    latency_s: tuple[float, float] = (0.0, 0.0)
    #: Operation names (see `OPERATIONS`), or None for every operation.
    operations: frozenset[str] | None = None
    #: Only keys starting with this are affected.
    key_prefix: str = ""

    def __post_init__(self) -> None:
        # Probabilities: numbers in [0, 1].
        check_number("error_rate", self.error_rate, maximum=1.0)
        check_number("ambiguous_rate", self.ambiguous_rate, maximum=1.0)
        if self.error_rate + self.ambiguous_rate > 1:
            raise InvalidArgumentError("error_rate + ambiguous_rate must be <= 1")
        lat = self.latency_s
        if (
            not isinstance(lat, tuple)
            or len(lat) != 2
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in lat)
            or not 0 <= lat[0] <= lat[1]
        ):
            raise InvalidArgumentError(
                f"latency_s must be (low, high) with 0 <= low <= high, got {lat!r}"
            )
        if self.operations is not None:
            ops = frozenset(self.operations)
            unknown = sorted(ops - OPERATIONS)
            if unknown or isinstance(self.operations, str):
                known = ", ".join(sorted(OPERATIONS))
                raise InvalidArgumentError(
                    f"unknown operations {unknown or self.operations!r} (known: {known})"
                )
            object.__setattr__(self, "operations", ops)
        if not isinstance(self.key_prefix, str):
            raise InvalidArgumentError(f"key_prefix must be a str, got {self.key_prefix!r}")

    def matches(self, operation: str, keys: Iterable[str]) -> bool:
        """Whether a call of `operation` on `keys` is subject to this rule."""
        if self.operations is not None and operation not in self.operations:
            return False
        prefix = self.key_prefix
        if not prefix:
            return True
        if operation == "list":
            return any(k.startswith(prefix) or prefix.startswith(k) for k in keys)
        return any(k.startswith(prefix) for k in keys)


@dataclass(frozen=True, slots=True)
class FaultCounters:
    """A snapshot of what a `FaultyObjectStore` did, per operation name."""

    calls: Mapping[str, int] = field(default_factory=dict)
    errors: Mapping[str, int] = field(default_factory=dict)
    ambiguous: Mapping[str, int] = field(default_factory=dict)
    delays: Mapping[str, int] = field(default_factory=dict)
    #: Seconds of latency injected in total.
    delay_s: float = 0.0

    @property
    def injected(self) -> int:
        """Errors plus ambiguous failures injected, over all operations."""
        return sum(self.errors.values()) + sum(self.ambiguous.values())


class FaultyObjectStore(ObjectStore):
    """Wraps `inner`, injecting seeded faults per `FaultRule`.

    `error_rate`, `ambiguous_rate` and `latency_s` given directly form one rule for every
    operation and key; `rules` adds more (each matching rule may delay a call; the first
    whose draw says so fails it). Latency needs a `clock`.
    """

    def __init__(
        self,
        inner: ObjectStore,
        *,
        rng: random.Random,
        clock: Clock | None = None,
        error_rate: float = 0.0,
        ambiguous_rate: float = 0.0,
        latency_s: tuple[float, float] = (0.0, 0.0),
        rules: Iterable[FaultRule] = (),
    ) -> None:
        if not isinstance(inner, ObjectStore):
            raise InvalidArgumentError(f"inner must be an ObjectStore, got {inner!r}")
        if not isinstance(rng, random.Random):
            raise InvalidArgumentError(f"rng must be a random.Random, got {rng!r}")
        if clock is not None and not isinstance(clock, Clock):
            raise InvalidArgumentError(f"clock must be a Clock, got {clock!r}")
        all_rules = [FaultRule(error_rate, ambiguous_rate, latency_s)]
        for r in rules:
            if not isinstance(r, FaultRule):
                raise InvalidArgumentError(f"rules must hold FaultRule objects, got {r!r}")
            all_rules.append(r)
        self._rules = tuple(
            r for r in all_rules if r.error_rate or r.ambiguous_rate or r.latency_s[1]
        )
        if clock is None and any(r.latency_s[1] > 0 for r in self._rules):
            raise InvalidArgumentError("latency_s needs a clock to sleep on")
        self._inner = inner
        self._rng = rng
        self._clock = clock
        self._lock = threading.Lock()
        self._suspended = 0
        self._calls: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._ambiguous: Counter[str] = Counter()
        self._delays: Counter[str] = Counter()
        self._delay_s = 0.0

    @property
    def inner(self) -> ObjectStore:
        """The wrapped store."""
        return self._inner

    @property
    def counters(self) -> FaultCounters:
        """What was called and injected so far."""
        with self._lock:
            return FaultCounters(
                calls=MappingProxyType(dict(self._calls)),
                errors=MappingProxyType(dict(self._errors)),
                ambiguous=MappingProxyType(dict(self._ambiguous)),
                delays=MappingProxyType(dict(self._delays)),
                delay_s=self._delay_s,
            )

    @contextmanager
    def healthy(self) -> Iterator[FaultyObjectStore]:
        """Inject no faults (and no latency) while inside; nests, and spans threads."""
        with self._lock:
            self._suspended += 1
        try:
            yield self
        finally:
            with self._lock:
                self._suspended -= 1

    # -- the decision for one call ----------------------------------------------------------

    def _decide(self, operation: str, keys: Iterable[str]) -> str | None:
        """Count the call, sleep any latency; "error", "ambiguous" or None (healthy)."""
        keys = list(keys)
        delay = 0.0
        outcome: str | None = None
        with self._lock:
            self._calls[operation] += 1
            if self._suspended:
                return None
            for r in self._rules:
                if not r.matches(operation, keys):
                    continue
                low, high = r.latency_s
                if high > 0:
                    delay += self._rng.uniform(low, high)
                if outcome is None and (r.error_rate or r.ambiguous_rate):
                    draw = self._rng.random()
                    if draw < r.error_rate:
                        outcome = "error"
                    elif draw < r.error_rate + r.ambiguous_rate:
                        outcome = "ambiguous"
            if delay > 0:
                self._delays[operation] += 1
                self._delay_s += delay
            if outcome == "error":
                self._errors[operation] += 1
            elif outcome == "ambiguous":
                self._ambiguous[operation] += 1
        if delay > 0 and self._clock is not None:
            self._clock.sleep(delay)
        if outcome == "error":
            raise UnavailableError(
                f"injected fault: {operation} {_keys_text(keys)} on {self.describe()} failed "
                "before reaching the store"
            )
        return outcome

    def _lost_reply(self, operation: str, keys: Iterable[str]) -> UnavailableError:
        return UnavailableError(
            f"injected fault: {operation} {_keys_text(list(keys))} on {self.describe()} took "
            "effect, but its reply was lost"
        )

    def _draw_below(self, n: int) -> int:
        with self._lock:
            return self._rng.randrange(n + 1)

    # -- the ObjectStore API ----------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        outcome = self._decide("put", [key])
        self._inner.put(key, data)
        if outcome == "ambiguous":
            raise self._lost_reply("put", [key])

    def put_if_absent(self, key: str, data: bytes) -> bool:
        check_key(key)
        outcome = self._decide("put_if_absent", [key])
        created = self._inner.put_if_absent(key, data)
        if outcome == "ambiguous":
            raise self._lost_reply("put_if_absent", [key])
        return created

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(start, end)
        outcome = self._decide("get", [key])
        data = self._inner.get(key, start, end)
        if outcome == "ambiguous":
            raise self._lost_reply("get", [key])
        return data

    def get_suffix(self, key: str, length: int) -> bytes:
        check_key(key)
        if type(length) is not int or length <= 0:
            raise InvalidArgumentError(f"suffix length must be an int > 0, got {length!r}")
        outcome = self._decide("get_suffix", [key])
        data = self._inner.get_suffix(key, length)
        if outcome == "ambiguous":
            raise self._lost_reply("get_suffix", [key])
        return data

    def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        outcome = self._decide("head", [key])
        info = self._inner.head(key)
        if outcome == "ambiguous":
            raise self._lost_reply("head", [key])
        return info

    def delete_many(self, keys: Iterable[str]) -> None:
        checked = [check_key(k) for k in keys]
        outcome = self._decide("delete_many", checked)
        if outcome == "ambiguous":
            # A batch delete that died part-way: some prefix of the keys is gone.
            done = checked[: self._draw_below(len(checked))]
            self._inner.delete_many(done)
            raise self._lost_reply("delete_many", checked)
        self._inner.delete_many(checked)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if not isinstance(prefix, str):
            raise InvalidArgumentError(f"prefix must be a str, got {prefix!r}")
        outcome = self._decide("list", [prefix])
        found = self._inner.list(prefix)
        if outcome != "ambiguous":
            return found
        return self._broken_listing(prefix, found)

    def _broken_listing(self, prefix: str, found: Iterator[ObjectInfo]) -> Iterator[ObjectInfo]:
        # A paginated listing whose later page failed: the first items, then the error.
        items = list(found)
        yield from items[: self._draw_below(len(items))]
        raise self._lost_reply("list", [prefix])

    def close(self) -> None:
        self._inner.close()

    def remove_leftovers(self, older_than_ms: int, prefixes: Sequence[str]) -> int:
        return self._inner.remove_leftovers(older_than_ms, prefixes)

    def describe(self) -> str:
        return f"faulty({self._inner.describe()})"

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        # Injected failures are transient: what the inner store guarantees still holds.
        return self._inner.capabilities


def slow_reads(
    inner: ObjectStore, delay_s: float, *, clock: Clock, key_prefix: str = "data/"
) -> FaultyObjectStore:
    """`inner` whose reads (`get`, `get_suffix`) of keys below `key_prefix` each take
    `delay_s` longer: a slow or distant store for deadline tests, no faults otherwise."""
    return FaultyObjectStore(
        inner,
        rng=random.Random(0),
        clock=clock,
        rules=[
            FaultRule(
                latency_s=(delay_s, delay_s),
                operations=frozenset({"get", "get_suffix"}),
                key_prefix=key_prefix,
            )
        ],
    )


def _keys_text(keys: list[str]) -> str:
    if len(keys) == 1:
        return repr(keys[0])
    return f"{len(keys)} keys"


class FaultyWal(WriteAheadLog):
    """Wraps `inner`, failing its appends transiently (see the module docstring).

    Args:
        inner: The WAL that stores what gets through.
        rng: Draws the random faults.
        error_rate: Probability that an append starts a fault of its own (which, like a set
            `failing`, lasts until `reset()`; such a fault is over by the time `reset` runs).
    """

    def __init__(
        self, inner: WriteAheadLog, *, rng: random.Random, error_rate: float = 0.0
    ) -> None:
        if not isinstance(inner, WriteAheadLog):
            raise InvalidArgumentError(f"inner must be a WriteAheadLog, got {inner!r}")
        if not isinstance(rng, random.Random):
            raise InvalidArgumentError(f"rng must be a random.Random, got {rng!r}")
        self._inner = inner
        self._rng = rng
        self._error_rate = check_number("error_rate", error_rate, maximum=1.0)
        self._lock = threading.Lock()
        #: While set, the medium fails: appends and `reset` raise retryably.
        self.failing = False
        self._failure: UnavailableError | None = None
        self.injected = 0

    @property
    def inner(self) -> WriteAheadLog:
        """The wrapped WAL."""
        return self._inner

    @property
    def capabilities(self) -> WalCapabilities:
        return self._inner.capabilities

    def recover(self) -> Iterator[WalRecord]:
        return self._inner.recover()

    def append(self, data: bytes) -> Future[WalPosition]:
        if type(data) is not bytes or len(data) > self.capabilities.max_record_bytes:
            return self._inner.append(data)  # refused at the call, failing or not
        with self._lock:
            if self._failure is None and (
                self.failing or (self._error_rate and self._rng.random() < self._error_rate)
            ):
                self.injected += 1
                self._failure = UnavailableError(
                    f"injected fault: {self.describe()} failed a write; appends fail until reset()"
                )
            failure = self._failure
            if failure is None:
                # Under the lock: a later append can never overtake this one's position.
                return self._inner.append(data)
        failed: Future[WalPosition] = Future()
        failed.set_exception(failure)
        return failed

    def drive(self, future: Future[WalPosition]) -> None:
        self._inner.drive(future)

    def trim(self, position: WalPosition) -> None:
        self._inner.trim(position)

    def trim_soon(self, position: WalPosition) -> None:
        self._inner.trim_soon(position)

    def in_completion(self) -> bool:
        return self._inner.in_completion()

    def reset(self) -> None:
        with self._lock:
            if self.failing:
                raise UnavailableError(f"injected fault: {self.describe()} still fails")
            self._failure = None
            self._inner.reset()

    def close(self) -> None:
        self._inner.close()

    def describe(self) -> str:
        return f"faulty({self._inner.describe()})"
