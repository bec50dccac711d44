"""A storage-level state machine: a whole client against a plain model.

`StorageStateMachine` drives a `StreamClient` with stream creation, synchronous and pipelined
appends, fetches, trims, flushes, clean restarts, crashes (the client stops without uploading
or closing its WAL; the next client recovers the WAL), and compaction passes, and checks after
every step that each stream holds exactly the batches the model says: nothing acknowledged is
lost, nothing trimmed comes back, offsets stay dense.

Subclass it and override `make_store` / `open_client` to run it against another object store
or WAL; the defaults use a `MemoryObjectStore` and a `MemoryWal` whose medium survives the
crash. `FaultyStorageStateMachine` adds store and WAL faults that come and go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from typing import Any

from ..client import StreamClient
from ..errors import OffsetOutOfRangeError, S3StreamError
from ..objectstore.base import ObjectStore
from ..objectstore.memory import MemoryObjectStore
from ..settings import ClientSettings
from ..stream import Stream
from ..types import RecordBatch
from ..wal.memory import MemoryWal, MemoryWalMedium
from . import MISSING_DEPENDENCIES_MESSAGE
from .faults import FaultyObjectStore, FaultyWal

try:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
except ImportError as exc:  # pragma: no cover - only without the testing extras
    raise ImportError(MISSING_DEPENDENCIES_MESSAGE) from exc

__all__ = [
    "FAULT_SETTINGS",
    "SMALL_SETTINGS",
    "FaultyStorageStateMachine",
    "StorageStateMachine",
]

#: Tiny thresholds, so a short run uploads, splits streams, evicts the LogCache and reads
#: objects often.
SMALL_SETTINGS = ClientSettings(
    upload_threshold_bytes=4096,
    stream_split_bytes=2048,
    block_target_bytes=512,
    max_pending_bytes=1 << 20,
    upload_interval_ms=0,
    log_cache_bytes=1024,
)

_Batch = tuple[int, int, bytes]  # (base_offset, count, payload)


class StorageStateMachine(RuleBasedStateMachine):
    """A client checked against per-stream lists of batches (see the module docstring)."""

    #: Most streams a run creates.
    max_streams = 4
    #: Largest payload appended.
    max_payload_bytes = 700

    def __init__(self) -> None:
        super().__init__()
        self.store = self.make_store()
        self.medium = MemoryWalMedium()
        self.client = self.open_client()
        self.streams: list[Stream] = []
        self.model: list[list[_Batch]] = []
        self.starts: list[int] = []

    # -- hooks -----------------------------------------------------------------------------

    def make_store(self) -> ObjectStore:
        """The object store of the run; one instance outlives every client of the run."""
        return MemoryObjectStore()

    def open_client(self) -> StreamClient:
        """A new client over `self.store` whose WAL recovers what is in `self.medium`."""
        return StreamClient(self.store, MemoryWal(self.medium), settings=SMALL_SETTINGS)

    def teardown(self) -> None:
        self.client.close()

    # -- rules -----------------------------------------------------------------------------

    @rule()
    def create(self) -> None:
        if len(self.streams) >= self.max_streams:
            return
        try:
            stream = self.client.create_stream()
        except S3StreamError as exc:
            self._tolerate(exc)
            return
        self.streams.append(stream)
        self.model.append([])
        self.starts.append(0)

    @precondition(lambda self: self.streams)
    @rule(
        i=st.integers(0, 15),
        count=st.integers(1, 5),
        size=st.integers(0, 700),
        pipelined=st.integers(1, 4),
    )
    def append(self, i: int, count: int, size: int, pipelined: int) -> None:
        i %= len(self.streams)
        s, batches = self.streams[i], self.model[i]
        payloads = [
            bytes([(len(batches) + k) % 251]) * min(size, self.max_payload_bytes)
            for k in range(pipelined)
        ]
        results: list[tuple[bytes, Any]] = []
        for p in payloads:
            try:
                if pipelined == 1:  # the synchronous path (it drives the WAL itself)
                    results.append((p, s.append(RecordBatch(p, count=count))))
                else:
                    results.append((p, s.append_async(RecordBatch(p, count=count))))
            except S3StreamError as exc:
                self._tolerate(exc)
        for p, r in results:
            if pipelined > 1:
                try:
                    r = r.result()
                except S3StreamError as exc:
                    self._tolerate(exc)
                    continue
            assert r.base_offset == self._end(i), (
                f"acknowledged at offset {r.base_offset}, expected {self._end(i)}: offsets "
                "must be dense (across failed appends too)"
            )
            batches.append((r.base_offset, count, p))

    @precondition(lambda self: self.streams)
    @rule(i=st.integers(0, 15), frac=st.floats(0, 1), max_bytes=st.integers(1, 3000))
    def fetch(self, i: int, frac: float, max_bytes: int) -> None:
        i %= len(self.streams)
        start = self.starts[i] + int((self._end(i) - self.starts[i]) * frac)
        try:
            res = self.streams[i].fetch(start, max_bytes=max_bytes)
        except S3StreamError as exc:
            self._tolerate(exc)
            return
        expected = [b for b in self.model[i] if b[0] + b[1] > start]
        got = [(b.base_offset, b.count, b.payload) for b in res.batches]
        assert got == expected[: len(got)]
        assert bool(got) == bool(expected), "at least one batch when data exists"

    @precondition(lambda self: self.streams)
    @rule(i=st.integers(0, 15), frac=st.floats(0, 1))
    def trim(self, i: int, frac: float) -> None:
        i %= len(self.streams)
        new_start = self.starts[i] + int((self._end(i) - self.starts[i]) * frac)
        self.streams[i].trim(new_start)
        self.starts[i] = max(self.starts[i], new_start)
        if self.starts[i] > 0:
            try:
                self.streams[i].fetch(self.starts[i] - 1)
            except OffsetOutOfRangeError:
                pass
            else:
                raise AssertionError("a fetch below start_offset must fail")

    @rule()
    def flush(self) -> None:
        try:
            self.client.flush()
        except S3StreamError as exc:
            self._tolerate(exc)

    @rule()
    def restart(self) -> None:
        """Clean shutdown (if it fails, what it could not upload stays in the WAL) and a new
        client."""
        try:
            self.client.close()
        except S3StreamError as exc:
            self._tolerate(exc)
        self._reopen()

    @rule()
    def crash(self) -> None:
        """The client dies: nothing more is uploaded and the WAL is not closed."""
        self.client.abandon()
        self._reopen()

    @rule()
    def compact(self) -> None:
        try:
            self.client.compact()
        except S3StreamError as exc:
            self._tolerate(exc)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def offsets_agree(self) -> None:
        for i, s in enumerate(self.streams):
            assert s.confirm_offset == s.next_offset == self._end(i)
            assert s.start_offset == self.starts[i]

    @invariant()
    def everything_reads_back(self) -> None:
        for i, s in enumerate(self.streams):
            got: list[_Batch] = []
            off = self.starts[i]
            while off < s.confirm_offset:
                res = s.fetch(off, max_bytes=2000)
                assert res.batches and res.next_offset > off, f"no progress at offset {off}"
                got.extend((b.base_offset, b.count, b.payload) for b in res.batches)
                off = res.next_offset
            assert got == [b for b in self.model[i] if b[0] + b[1] > self.starts[i]]

    # -- helpers ---------------------------------------------------------------------------

    def _tolerate(self, exc: S3StreamError) -> None:
        """A call failed with `exc`: re-raise it unless this machine's faults explain it."""
        raise exc

    def _end(self, i: int) -> int:
        batches = self.model[i]
        return batches[-1][0] + batches[-1][1] if batches else 0

    def _reopen(self) -> None:
        ids = [s.stream_id for s in self.streams]
        self.client = self.open_client()
        self.streams = [self.client.open_stream(sid) for sid in ids]


#: Short waits, so a run with faults does not spend its time waiting them out.
FAULT_SETTINGS = dataclasses.replace(
    SMALL_SETTINGS,
    backpressure_timeout_ms=100,
    call_timeout_ms=3_000,
    store_timeout_ms=2_000,
)


class FaultyStorageStateMachine(StorageStateMachine):
    """`StorageStateMachine` with faults that come and go: the object store fails (errors
    before reaching it, and ambiguous ones that took effect) and the WAL fails transiently
    (a `FaultyWal`), each switched on and off by rules.

    While faults are on, a call may fail, but only with a retryable error, and only what was
    acknowledged counts. At every step, every acknowledged append reads back exactly once,
    byte-identical (read with the store healthy: "after recovery"); `heal_and_progress`
    checks that once faults stop, the same client takes appends and uploads them again,
    without a reopen.
    """

    #: Share of store calls failing before the store while the store fails.
    store_error_rate = 0.25
    #: Share of store calls that take effect and fail anyway while the store fails.
    store_ambiguous_rate = 0.1
    #: Share of appends starting a short WAL fault of their own, at any time.
    wal_error_rate = 0.02
    #: The fault-injecting WAL around each client's `MemoryWal`.
    wal_class: type[FaultyWal] = FaultyWal
    #: Longest `heal_and_progress` may take to append again once faults stop.
    progress_timeout_s = 20.0

    def __init__(self) -> None:
        self.rng = random.Random(0)
        super().__init__()
        self._healthy: contextlib.ExitStack | None = None
        self.store_heals()
        for _ in range(2):  # streams from the start: the faults are what a run explores
            self.create()

    def make_store(self) -> FaultyObjectStore:
        return FaultyObjectStore(
            MemoryObjectStore(),
            rng=self.rng,
            error_rate=self.store_error_rate,
            ambiguous_rate=self.store_ambiguous_rate,
        )

    def open_client(self) -> StreamClient:
        wal = self.wal_class(MemoryWal(self.medium), rng=self.rng, error_rate=self.wal_error_rate)
        #: The current client's WAL (each client gets a new one over the same medium).
        self.faulty_wal = wal
        faulty = self._faulty_store()
        # A new client recovers with the store healthy: a recovery under faults is
        # `test_crash`'s and the failover tests' business; this machine is about one client.
        with faulty.healthy():
            return StreamClient(faulty, wal, settings=FAULT_SETTINGS)

    def teardown(self) -> None:
        self._all_healthy()
        self.client.close()

    def _reopen(self) -> None:
        # Like open_client: the new client recovers and reopens its streams healthy.
        with self._faulty_store().healthy():
            super()._reopen()

    # -- the faults ------------------------------------------------------------------------

    def _faulty_store(self) -> FaultyObjectStore:
        assert isinstance(self.store, FaultyObjectStore)
        return self.store

    @rule(seed=st.integers(0, 2**32 - 1))
    def store_fails(self, seed: int) -> None:
        self.rng.seed(seed)
        if self._healthy is not None:
            self._healthy.close()
            self._healthy = None

    @rule()
    def store_heals(self) -> None:
        if self._healthy is None:
            self._healthy = contextlib.ExitStack()
            self._healthy.enter_context(self._faulty_store().healthy())

    @rule()
    def wal_fails(self) -> None:
        self.faulty_wal.failing = True

    @rule()
    def wal_heals(self) -> None:
        self.faulty_wal.failing = False

    def _tolerate(self, exc: S3StreamError) -> None:
        """While faults come and go, a call may fail, but only retryably."""
        if not exc.retryable:
            raise AssertionError(f"a transient fault made a non-retryable error: {exc!r}") from exc

    def _all_healthy(self) -> None:
        self.store_heals()
        self.wal_heals()

    # -- rules that may fail while faults are on (the others tolerate it via `_tolerate`) --

    @precondition(lambda self: self.streams)
    @rule(i=st.integers(0, 15), frac=st.floats(0, 1))
    def trim(self, i: int, frac: float) -> None:
        i %= len(self.streams)
        new_start = self.starts[i] + int((self._end(i) - self.starts[i]) * frac)
        try:
            self.streams[i].trim(new_start)
        except S3StreamError as exc:
            # It may have taken effect or not; trims are idempotent, so once more, healthy.
            self._tolerate(exc)
            with self._faulty_store().healthy():
                self.streams[i].trim(new_start)
        self.starts[i] = max(self.starts[i], new_start)

    @rule()
    def heal_and_progress(self) -> None:
        """Faults stop: the same client appends to every stream and uploads, no reopen."""
        self._all_healthy()
        give_up = time.monotonic() + self.progress_timeout_s
        for i, s in enumerate(self.streams):
            while True:
                try:
                    r = s.append(RecordBatch(b"after the faults"))
                    break
                except S3StreamError as exc:
                    self._tolerate(exc)
                    assert time.monotonic() < give_up, (
                        f"no append succeeded {self.progress_timeout_s:.0f} s after the faults "
                        f"stopped: {exc!r}"
                    )
            assert r.base_offset == self._end(i)
            self.model[i].append((r.base_offset, 1, b"after the faults"))
        self.client.flush(timeout_s=self.progress_timeout_s)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def offsets_agree(self) -> None:
        for i, s in enumerate(self.streams):
            assert s.confirm_offset == self._end(i)
            # Offsets of failed appends are handed out again once the WAL is repaired.
            assert s.next_offset >= s.confirm_offset
            assert s.start_offset == self.starts[i]

    @invariant()
    def everything_reads_back(self) -> None:
        with self._faulty_store().healthy():
            super().everything_reads_back()
