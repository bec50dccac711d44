"""`MetricsObjectStore`: the top of a client's store stack, where calls are measured.

It records each call's time, errors and bytes by *purpose* (why a component made it: the WAL,
an upload, a read, compaction, the metadata log) and by operation, and, through the
`RequestMeter` it attaches below the retry layer, the billable requests those calls sent.
Components get a view of the stack for their purpose (`for_purpose`); the view names the
purpose in a context variable of the stack for the length of each call, which is how a request
sent deep in the stack (a retry, a list page) is put down to the component that caused it. A
context variable rather than a thread-local: a try run in a thread of its own to keep the
caller's deadline (`_bounded.within_deadline`) and deletes sent from a pool
(`_common.map_in_context`) carry the caller's context, and were counted under ``other``.
Calls made on the stack itself count under `default_purpose`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import TypeVar

from ..clock import Clock, SystemClock
from ..errors import InvalidArgumentError
from ..metrics import catalog
from ..metrics.components import StoreCells, StoreInstruments
from ..metrics.instruments import CounterCell
from ..metrics.registry import MetricsRegistry
from .base import ObjectInfo, ObjectStore, ObjectStoreCapabilities
from .requests import RequestCountingStore, RequestMeter

__all__ = ["MetricsObjectStore", "ObjectStoreMetrics"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ObjectStoreMetrics:
    """Counts of calls made through a `MetricsObjectStore` (a snapshot), every purpose summed.

    Calls are counted when they end, whether they succeed or not (a `list` once its iteration
    ends); byte counts only on success.
    """

    #: `put` calls and the bytes they wrote.
    puts: int = 0
    put_bytes: int = 0
    #: `put_if_absent` calls, the bytes of those that created, and those that found the key.
    conditional_puts: int = 0
    conditional_put_bytes: int = 0
    conditional_put_conflicts: int = 0
    #: `get` and `get_suffix` calls and the bytes they returned.
    gets: int = 0
    get_bytes: int = 0
    #: `head` calls.
    heads: int = 0
    #: `delete_many` calls and the keys passed to them.
    deletes: int = 0
    deleted_keys: int = 0
    #: `list` calls and the entries they yielded.
    lists: int = 0
    listed_objects: int = 0
    #: Calls of any kind that raised.
    errors: int = 0

    @property
    def requests(self) -> int:
        """All calls counted above."""
        return (
            self.puts + self.conditional_puts + self.gets + self.heads + self.deletes + self.lists
        )


class _StackMeter(RequestMeter):
    """Counts requests under the purpose of the call they are sent for."""

    def __init__(self, stack: MetricsObjectStore) -> None:
        self._stack = stack

    def request(self, name: str, count: int = 1) -> None:
        stack = self._stack
        stack.instruments.requests(stack.current_purpose(), name).add(count)


class MetricsObjectStore(ObjectStore):
    """Measures calls by purpose and operation (see the module docstring); thread-safe.

    `metrics` is a snapshot of the call counts (all purposes), `reset` zeroes what it reports;
    the registry (`registry`, or one of the store's own) holds the full metrics and only grows.
    `clock` times the calls.
    """

    def __init__(
        self,
        inner: ObjectStore,
        *,
        registry: MetricsRegistry | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(inner, ObjectStore):
            raise InvalidArgumentError(f"inner must be an ObjectStore, got {inner!r}")
        self._inner = inner
        self._mono = (clock if clock is not None else SystemClock()).monotonic
        # One per stack: two stacks in one call chain (a take-over's) keep their own.
        self._tag: ContextVar[str | None] = ContextVar(
            f"s3stream_purpose_{id(self):x}", default=None
        )
        #: The purpose of calls made on the store itself rather than through a view.
        self.default_purpose = "other"
        self.instruments = StoreInstruments(registry if registry is not None else MetricsRegistry())
        self._reset_lock = threading.Lock()
        self._baseline = ObjectStoreMetrics()
        meter = _StackMeter(self)
        # Requests are counted where they are sent; a store that cannot say is counted per
        # call (a store stack has a `RequestCountingStore` under its retry layer already).
        self._target = inner
        if not inner.meter_requests(meter):
            self._target = RequestCountingStore(inner)
            self._target.meter_requests(meter)

    @property
    def inner(self) -> ObjectStore:
        """The wrapped store."""
        return self._inner

    @property
    def registry(self) -> MetricsRegistry:
        """The registry the store records into."""
        return self.instruments.registry

    def use_registry(self, registry: MetricsRegistry) -> None:
        """Record into `registry` from now on (a client adopting a stack built before it);
        `metrics` then counts from here (a baseline of the old registry's counts, taken by
        `reset`, made the new one's negative)."""
        if registry is not self.instruments.registry:
            with self._reset_lock:
                self.instruments = StoreInstruments(registry)
                self._baseline = self._totals()

    def for_purpose(self, purpose: str) -> ObjectStore:
        """A view of this store whose calls count under `purpose` (one of
        `s3stream.metrics.catalog.PURPOSES`). Closing the view leaves the store open."""
        if purpose not in catalog.PURPOSES:
            raise InvalidArgumentError(
                f"purpose must be one of {', '.join(catalog.PURPOSES)}, got {purpose!r}"
            )
        return _PurposeView(self, purpose)

    def current_purpose(self) -> str:
        """The purpose of the call being made through this store (in the caller's context)."""
        purpose = self._tag.get()
        return purpose if purpose is not None else self.default_purpose

    def enter_purpose(self, purpose: str) -> str | None:
        """Name `purpose` for the calls made in the caller's context (its thread, and the
        threads that carry its context); returns what to restore with `leave_purpose`."""
        previous = self._tag.get()
        self._tag.set(purpose)
        return previous

    def leave_purpose(self, previous: str | None) -> None:
        """Undo `enter_purpose`."""
        self._tag.set(previous)

    # -- snapshots ------------------------------------------------------------------------------

    @property
    def metrics(self) -> ObjectStoreMetrics:
        """A snapshot of the call counters, every purpose summed (since the last `reset`)."""
        with self._reset_lock:
            return _minus(self._totals(), self._baseline)

    def reset(self) -> ObjectStoreMetrics:
        """Zero what `metrics` reports; returns its values from just before. (The registry's
        counters keep growing: exporters need totals that never go back.)"""
        with self._reset_lock:
            totals = self._totals()
            snapshot = _minus(totals, self._baseline)
            self._baseline = totals
        return snapshot

    def _totals(self) -> ObjectStoreMetrics:
        r = self.instruments.registry
        calls = r.family(catalog.STORE_DURATION.name)
        moved = r.family(catalog.STORE_TRANSFERRED.name)
        keys = r.family(catalog.STORE_KEYS.name)

        def count(op: str) -> int:
            return 0 if calls is None else int(calls.total(operation=op))

        def moved_by(op: str) -> int:
            return 0 if moved is None else int(moved.total(operation=op))

        return ObjectStoreMetrics(
            puts=count("put"),
            put_bytes=moved_by("put"),
            conditional_puts=count("put_if_absent"),
            conditional_put_bytes=moved_by("put_if_absent"),
            conditional_put_conflicts=int(r.total(catalog.STORE_CONFLICTS.name)),
            gets=count("get") + count("get_suffix"),
            get_bytes=moved_by("get") + moved_by("get_suffix"),
            heads=count("head"),
            deletes=count("delete_many"),
            deleted_keys=0 if keys is None else int(keys.total(operation="delete_many")),
            lists=count("list"),
            listed_objects=0 if keys is None else int(keys.total(operation="list")),
            errors=int(r.total(catalog.STORE_ERRORS.name)),
        )

    # -- the ObjectStore calls ------------------------------------------------------------------

    def _timed(self, op: str, fn: Callable[[], T]) -> T:
        cells = self.instruments.op(self.current_purpose(), op)
        started = self._mono()
        try:
            return fn()
        except BaseException:
            cells.errors.add()
            raise
        finally:
            cells.duration.observe(self._mono() - started)

    def put(self, key: str, data: bytes) -> None:
        self._timed("put", lambda: self._target.put(key, data))
        self.instruments.transferred(self.current_purpose(), "put").add(len(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created = self._timed("put_if_absent", lambda: self._target.put_if_absent(key, data))
        purpose = self.current_purpose()
        if created:
            self.instruments.transferred(purpose, "put_if_absent").add(len(data))
        else:
            self.instruments.conflicts(purpose).add()
        return created

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        data = self._timed("get", lambda: self._target.get(key, start, end))
        self.instruments.transferred(self.current_purpose(), "get").add(len(data))
        return data

    def get_suffix(self, key: str, length: int) -> bytes:
        data = self._timed("get_suffix", lambda: self._target.get_suffix(key, length))
        self.instruments.transferred(self.current_purpose(), "get_suffix").add(len(data))
        return data

    def head(self, key: str) -> ObjectInfo | None:
        return self._timed("head", lambda: self._target.head(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        key_list = list(keys)
        self._timed("delete_many", lambda: self._target.delete_many(key_list))
        self.instruments.keys(self.current_purpose(), "delete_many").add(len(key_list))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        purpose = self.current_purpose()
        cells = self.instruments.op(purpose, "list")
        started = self._mono()
        try:
            entries = self._target.list(prefix)
        except BaseException:
            cells.errors.add()
            cells.duration.observe(self._mono() - started)
            raise
        return self._count_entries(entries, cells, self.instruments.keys(purpose, "list"),
                                   self._mono() - started)  # fmt: skip

    def _count_entries(
        self,
        entries: Iterator[ObjectInfo],
        cells: StoreCells,
        listed: CounterCell,
        spent: float,
    ) -> Iterator[ObjectInfo]:
        # A list's time is the time spent in the store fetching its pages, not the caller's
        # time between entries.
        try:
            while True:
                started = self._mono()
                try:
                    info = next(entries)
                except StopIteration:
                    return
                finally:
                    spent += self._mono() - started
                listed.add()
                yield info
        except GeneratorExit:
            raise
        except BaseException:
            cells.errors.add()
            raise
        finally:
            cells.duration.observe(spent)

    # -- the rest of the contract ---------------------------------------------------------------

    def meter_requests(self, meter: RequestMeter) -> bool:
        return self._target.meter_requests(meter)

    def describe(self) -> str:
        return f"metrics({self._inner.describe()})"

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        return self._inner.capabilities

    @property
    def attempt_timeout_s(self) -> float | None:
        return self._inner.attempt_timeout_s

    def bound_attempts(self, seconds: float) -> None:
        self._inner.bound_attempts(seconds)

    def remove_leftovers(self, older_than_ms: int, prefixes: Sequence[str]) -> int:
        return self._inner.remove_leftovers(older_than_ms, prefixes)

    def close(self) -> None:
        self._inner.close()


class _PurposeView(ObjectStore):
    """The calls of one component: each runs with its purpose named (see the module)."""

    def __init__(self, stack: MetricsObjectStore, purpose: str) -> None:
        self._stack = stack
        self._purpose = purpose

    @property
    def purpose(self) -> str:
        """What the calls made through this view count under."""
        return self._purpose

    def _run(self, fn: Callable[[], T]) -> T:
        previous = self._stack.enter_purpose(self._purpose)
        try:
            return fn()
        finally:
            self._stack.leave_purpose(previous)

    def put(self, key: str, data: bytes) -> None:
        self._run(lambda: self._stack.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._run(lambda: self._stack.put_if_absent(key, data))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._run(lambda: self._stack.get(key, start, end))

    def get_suffix(self, key: str, length: int) -> bytes:
        return self._run(lambda: self._stack.get_suffix(key, length))

    def head(self, key: str) -> ObjectInfo | None:
        return self._run(lambda: self._stack.head(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        self._run(lambda: self._stack.delete_many(keys))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self._tagged(self._run(lambda: self._stack.list(prefix)))

    def _tagged(self, entries: Iterator[ObjectInfo]) -> Iterator[ObjectInfo]:
        # Pages are fetched while the caller iterates: each step runs under the purpose.
        try:
            while True:
                previous = self._stack.enter_purpose(self._purpose)
                try:
                    info = next(entries)
                except StopIteration:
                    return
                finally:
                    self._stack.leave_purpose(previous)
                yield info
        finally:
            close = getattr(entries, "close", None)
            if close is not None:
                close()

    def meter_requests(self, meter: RequestMeter) -> bool:
        return self._stack.meter_requests(meter)

    def describe(self) -> str:
        return self._stack.describe()

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        return self._stack.capabilities

    @property
    def attempt_timeout_s(self) -> float | None:
        return self._stack.attempt_timeout_s

    def bound_attempts(self, seconds: float) -> None:
        self._stack.bound_attempts(seconds)

    def remove_leftovers(self, older_than_ms: int, prefixes: Sequence[str]) -> int:
        return self._stack.remove_leftovers(older_than_ms, prefixes)

    def close(self) -> None:
        """The stack belongs to whoever built it (the client closes it)."""


def _minus(a: ObjectStoreMetrics, b: ObjectStoreMetrics) -> ObjectStoreMetrics:
    return ObjectStoreMetrics(
        **{f.name: getattr(a, f.name) - getattr(b, f.name) for f in fields(ObjectStoreMetrics)}
    )
