"""A storage-level state machine: a whole client against a plain model.

`StorageStateMachine` drives a `StreamClient` with stream creation, synchronous and pipelined
appends, fetches, trims, flushes, clean restarts, crashes (the client stops without uploading
or closing its WAL; the next client recovers the WAL), and compaction passes, and checks after
every step that each stream holds exactly the batches the model says: nothing acknowledged is
lost, nothing trimmed comes back, offsets stay dense.

Subclass it and override `make_store` / `open_client` to run it against another object store
or WAL; the defaults use a `MemoryObjectStore` and a `MemoryWal` whose medium survives the
crash.
"""

from __future__ import annotations

from ..client import StreamClient
from ..errors import OffsetOutOfRangeError
from ..objectstore.base import ObjectStore
from ..objectstore.memory import MemoryObjectStore
from ..settings import ClientSettings
from ..stream import Stream
from ..types import RecordBatch
from ..wal.memory import MemoryWal, MemoryWalMedium
from . import MISSING_DEPENDENCIES_MESSAGE

try:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
except ImportError as exc:  # pragma: no cover - only without the testing extras
    raise ImportError(MISSING_DEPENDENCIES_MESSAGE) from exc

__all__ = ["SMALL_SETTINGS", "StorageStateMachine"]

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
        if len(self.streams) < self.max_streams:
            self.streams.append(self.client.create_stream())
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
        if pipelined == 1:
            results = [s.append(RecordBatch(payloads[0], count=count))]
        else:
            futures = [s.append_async(RecordBatch(p, count=count)) for p in payloads]
            results = [f.result() for f in futures]
        for r, p in zip(results, payloads, strict=True):
            assert r.base_offset == self._end(i), "offsets must be dense"
            batches.append((r.base_offset, count, p))

    @precondition(lambda self: self.streams)
    @rule(i=st.integers(0, 15), frac=st.floats(0, 1), max_bytes=st.integers(1, 3000))
    def fetch(self, i: int, frac: float, max_bytes: int) -> None:
        i %= len(self.streams)
        start = self.starts[i] + int((self._end(i) - self.starts[i]) * frac)
        res = self.streams[i].fetch(start, max_bytes=max_bytes)
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
        self.client.flush()

    @rule()
    def restart(self) -> None:
        """Clean shutdown and a new client."""
        self.client.close()
        self._reopen()

    @rule()
    def crash(self) -> None:
        """The client dies: nothing more is uploaded and the WAL is not closed."""
        self.client.abandon()
        self._reopen()

    @rule()
    def compact(self) -> None:
        self.client.compact()

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

    def _end(self, i: int) -> int:
        batches = self.model[i]
        return batches[-1][0] + batches[-1][1] if batches else 0

    def _reopen(self) -> None:
        ids = [s.stream_id for s in self.streams]
        self.client = self.open_client()
        self.streams = [self.client.open_stream(sid) for sid in ids]
