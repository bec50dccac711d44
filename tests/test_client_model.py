"""Property test: any interleaving of appends, fetches, trims, flushes and client restarts
(memory WAL over a local-directory store) returns exactly what a plain list model says."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import s3stream
from s3stream import ClientSettings, OffsetOutOfRangeError, RecordBatch

SETTINGS = ClientSettings(
    upload_threshold_bytes=4096,
    stream_split_bytes=2048,
    block_target_bytes=512,
    max_pending_bytes=1 << 20,
    upload_interval_ms=0,
    log_cache_bytes=1024,  # tiny: reads go to objects often
)


class ClientModel(RuleBasedStateMachine):
    """Model: per stream, the list of (base_offset, count, payload) and the start offset."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="s3s-model-"))
        self.client = self._open()
        self.streams: list[s3stream.Stream] = []
        self.model: list[list[tuple[int, int, bytes]]] = []
        self.starts: list[int] = []

    def _open(self) -> s3stream.StreamClient:
        return s3stream.open(str(self.dir), wal="memory://", settings=SETTINGS)

    def teardown(self) -> None:
        self.client.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule()
    def create(self) -> None:
        if len(self.streams) < 4:
            self.streams.append(self.client.create_stream())
            self.model.append([])
            self.starts.append(0)

    @precondition(lambda self: self.streams)
    @rule(
        i=st.integers(0, 3),
        count=st.integers(1, 5),
        size=st.integers(0, 700),
        asynchronous=st.booleans(),
    )
    def append(self, i: int, count: int, size: int, asynchronous: bool) -> None:
        i %= len(self.streams)
        records = self.model[i]
        payload = bytes([len(records) % 251]) * size
        batch = RecordBatch(payload, count=count)
        s = self.streams[i]
        r = s.append_async(batch).result() if asynchronous else s.append(batch)
        expected_base = records[-1][0] + records[-1][1] if records else 0
        assert r.base_offset == expected_base
        records.append((r.base_offset, count, payload))

    @precondition(lambda self: self.streams)
    @rule(i=st.integers(0, 3), frac=st.floats(0, 1), max_bytes=st.integers(1, 3000))
    def fetch(self, i: int, frac: float, max_bytes: int) -> None:
        i %= len(self.streams)
        s, records = self.streams[i], self.model[i]
        end = records[-1][0] + records[-1][1] if records else 0
        start = self.starts[i] + int((end - self.starts[i]) * frac)
        res = s.fetch(start, max_bytes=max_bytes)
        expected = [r for r in records if r[0] + r[1] > start]
        got = [(b.base_offset, b.count, b.payload) for b in res.batches]
        if expected:
            assert got, "at least one batch when data exists"
            assert got == expected[: len(got)]
        else:
            assert got == []

    @precondition(lambda self: self.streams)
    @rule(i=st.integers(0, 3), frac=st.floats(0, 1))
    def trim(self, i: int, frac: float) -> None:
        i %= len(self.streams)
        records = self.model[i]
        end = records[-1][0] + records[-1][1] if records else 0
        new_start = self.starts[i] + int((end - self.starts[i]) * frac)
        self.streams[i].trim(new_start)
        self.starts[i] = max(self.starts[i], new_start)
        if self.starts[i] > 0:
            try:
                self.streams[i].fetch(self.starts[i] - 1)
            except OffsetOutOfRangeError:
                pass
            else:
                raise AssertionError("fetch below start_offset must fail")

    @rule()
    def flush(self) -> None:
        self.client.flush()

    @rule()
    def restart(self) -> None:
        ids = [s.stream_id for s in self.streams]
        self.client.close()
        self.client = self._open()
        self.streams = [self.client.open_stream(sid) for sid in ids]

    @invariant()
    def offsets_agree(self) -> None:
        for s, records, start in zip(self.streams, self.model, self.starts, strict=True):
            end = records[-1][0] + records[-1][1] if records else 0
            assert s.confirm_offset == s.next_offset == end
            assert s.start_offset == start

    @invariant()
    def full_read_agrees(self) -> None:
        for s, records, start in zip(self.streams, self.model, self.starts, strict=True):
            got: list[tuple[int, int, bytes]] = []
            off = start
            while off < s.confirm_offset:
                res = s.fetch(off, max_bytes=2000)
                assert res.batches and res.next_offset > off, f"no progress at {off}"
                got.extend((b.base_offset, b.count, b.payload) for b in res.batches)
                off = res.next_offset
            assert got == [r for r in records if r[0] + r[1] > start]


TestClientModel = ClientModel.TestCase
TestClientModel.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
