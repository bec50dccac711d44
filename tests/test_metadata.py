"""Metadata log: every op and invariant, replay, checkpoints, corruption, races and fencing.

Tests take a `backend` (the conformance kit's `MetadataBackend`): the object-store log on a
`MemoryObjectStore` and on a `LocalObjectStore` (a tmp dir), and the PostgreSQL log on the
session's server, so the manager is checked on every backend. Failures and races are injected
at the log by `HookLog`, which also records the calls. The few tests of the object-store log's
own requests take a `store` and count them with `CountingStore`, a wrapper over the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3stream.clock import ManualClock, SystemClock
from s3stream.errors import (
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    S3StreamError,
    StreamClosedError,
    StreamNotFoundError,
    StreamOwnedError,
    UnavailableError,
)
from s3stream.metadata import (
    CloseStream,
    CommitObjects,
    CompactObjects,
    CreateStream,
    DeleteStream,
    LogEntry,
    MetadataManager,
    MetadataState,
    NodeMeta,
    ObjectKind,
    ObjectMeta,
    Op,
    OpenStream,
    PurgeObjects,
    RegisterNode,
    StreamRange,
    StreamState,
    TrimStream,
    check_state,
    decode_entry,
    encode_checkpoint,
    encode_entry,
)
from s3stream.metadata.base import MetadataLogStore
from s3stream.metadata.codec import validate_entry
from s3stream.metadata.log import MetadataLog
from s3stream.metadata.model import Checkpoint
from s3stream.objectstore.base import ObjectInfo, ObjectStore
from s3stream.objectstore.local import LocalObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.testing.metadata import MetadataBackend, ObjectStoreBackend, PostgresBackend

# -- helpers --------------------------------------------------------------------------------


class CountingStore(ObjectStore):
    """Passes every call to `inner`, recording each (method, key).

    With ``yield_gil=True`` each call first lets other threads run, as the network I/O of a
    real store would, so that threads sharing an in-memory store really interleave.
    """

    def __init__(self, inner: ObjectStore, *, yield_gil: bool = False) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._yield_gil = yield_gil

    def _note(self, method: str, key: str) -> None:
        if self._yield_gil:
            time.sleep(0)
        with self._lock:
            self.calls.append((method, key))

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    def keys(self, method: str) -> list[str]:
        return [k for m, k in self.calls if m == method]

    def put(self, key: str, data: bytes) -> None:
        self._note("put", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._note("put_if_absent", key)
        return self.inner.put_if_absent(key, data)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self._note("get", key)
        return self.inner.get(key, start, end)

    def head(self, key: str) -> ObjectInfo | None:
        self._note("head", key)
        return self.inner.head(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for key in keys:
            self._note("delete", key)
        self.inner.delete_many(keys)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._note("list", prefix)
        return self.inner.list(prefix)


class HookLog(MetadataLogStore):
    """Passes every call to the log `inner`, whatever its backend, recording each (method,
    seq); runs `before_create(seq, data)` before one `create_entry`, and fails checkpoint writes
    while `fail_checkpoints`. With ``yield_gil=True`` each call first lets other threads run, as
    the I/O of a remote backend would, so that threads sharing an in-memory store interleave.
    """

    def __init__(self, inner: MetadataLogStore, *, yield_gil: bool = False) -> None:
        self.inner = inner
        self.calls: list[tuple[str, int | None]] = []
        self._lock = threading.Lock()
        self._yield_gil = yield_gil
        self.before_create: Callable[[int, bytes], bool | None] | None = None
        self.fail_checkpoints = False

    def _note(self, method: str, seq: int | None = None) -> None:
        if self._yield_gil:
            time.sleep(0)
        with self._lock:
            self.calls.append((method, seq))

    def seqs(self, method: str) -> list[int | None]:
        return [q for m, q in self.calls if m == method]

    def describe(self) -> str:
        return self.inner.describe()

    @property
    def namespace(self) -> str:
        return self.inner.namespace

    def entry_key(self, seq: int) -> str:
        return self.inner.entry_key(seq)

    def checkpoint_key(self, seq: int) -> str:
        return self.inner.checkpoint_key(seq)

    @property
    def pointer_key(self) -> str:
        return self.inner.pointer_key

    def read_entry(self, seq: int) -> tuple[LogEntry, bytes]:
        self._note("read_entry", seq)
        return self.inner.read_entry(seq)

    def read_entries(self, first: int) -> Iterator[tuple[LogEntry, bytes]]:
        self._note("read_entries", first)
        return self.inner.read_entries(first)

    def create_entry(self, seq: int, payload: bytes) -> bool:
        self._note("create_entry", seq)
        hook = self.before_create
        if hook is not None:
            self.before_create = None
            if hook(seq, payload):
                # The hook asked to raise *after* writing: an ambiguous failure.
                assert self.inner.create_entry(seq, payload)
                raise UnavailableError(f"injected: lost the response to create_entry {seq}")
        return self.inner.create_entry(seq, payload)

    def has_entry(self, seq: int) -> bool:
        self._note("has_entry", seq)
        return self.inner.has_entry(seq)

    def check_writable(self) -> None:
        self.inner.check_writable()

    def read_pointer(self) -> int | None:
        self._note("read_pointer")
        return self.inner.read_pointer()

    def read_checkpoint(self, seq: int) -> Checkpoint:
        self._note("read_checkpoint", seq)
        return self.inner.read_checkpoint(seq)

    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._note("write_checkpoint", checkpoint.seq)
        if self.fail_checkpoints:
            raise UnavailableError(f"injected: checkpoint {checkpoint.seq} failed")
        self.inner.write_checkpoint(checkpoint)

    def listed_seqs(self, *, checkpoints: bool = False) -> set[int]:
        self._note("listed_seqs")
        return self.inner.listed_seqs(checkpoints=checkpoints)

    def close(self) -> None:
        self.inner.close()


STORE_KINDS = ["memory", "local"]


def make_store(kind: str, tmp_path: Path) -> ObjectStore:
    if kind == "memory":
        return MemoryObjectStore()
    return LocalObjectStore(tmp_path / "bucket")


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    return make_store(request.param, tmp_path)


#: Where the log of the backend-independent tests lives: the object-store log on both stores,
#: and PostgreSQL (the session's server: tests/conftest.py).
BACKENDS = [*STORE_KINDS, "postgres"]


def make_backend(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> MetadataBackend:
    if kind == "postgres":
        return PostgresBackend(request.getfixturevalue("postgres").url())
    return ObjectStoreBackend(make_store(kind, tmp_path))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataBackend]:
    """An empty log (the kit's `MetadataBackend`): each manager gets a handle of its own."""
    made = make_backend(request.param, tmp_path, request)
    try:
        yield made
    finally:
        made.close()


def manager(
    where: ObjectStore | MetadataBackend | MetadataLogStore, writer: str = "w1", **kwargs: Any
) -> MetadataManager:
    """A loaded manager on an object store's log, a new handle of a backend, or a log."""
    kwargs.setdefault("clock", ManualClock())
    target = where.open_log() if isinstance(where, MetadataBackend) else where
    m = MetadataManager(target, writer_id=writer, **kwargs)
    m.load()
    return m


def obj(key: str, *ranges: tuple[int, int, int], kind: ObjectKind | None = None) -> ObjectMeta:
    rs = tuple(StreamRange(*r) for r in sorted(ranges))
    if kind is None:
        kind = ObjectKind.STREAM if len(rs) == 1 else ObjectKind.STREAM_SET
    return ObjectMeta(key=key, kind=kind, size=100, ranges=rs, committed_ms=1, node_id="n1")


def upload(m: MetadataManager, key: str, counts: dict[int, int]) -> ObjectMeta:
    """Commit one object holding `counts[sid]` records of each stream at its end offset."""
    made: list[ObjectMeta] = []

    def build(state: MetadataState) -> list[Op]:
        ranges = [
            (sid, state.streams[sid].end_offset, state.streams[sid].end_offset + n)
            for sid, n in counts.items()
        ]
        made[:] = [obj(key, *ranges)]
        return [CommitObjects(tuple(made), {sid: state.streams[sid].epoch for sid in counts})]

    m.commit(build)
    return made[0]


def fixed(*ops: Op) -> Callable[[MetadataState], Sequence[Op]]:
    return lambda state: ops


def open_new(m: MetadataManager, node: str = "n1", **tags: str) -> int:
    sid = m.create_stream(tags).stream_id
    m.open_stream(sid, node)
    return sid


def log_keys(where: ObjectStore | MetadataBackend) -> list[str]:
    """The names of the entries stored (listed in the store, or through the backdoor)."""
    if isinstance(where, MetadataBackend):
        names = where.open_log()
        return [names.entry_key(seq) for seq in where.entry_seqs()]
    return [info.key for info in where.list("meta/log/")]


def assert_rejected_unwritten(
    m: MetadataManager, backend: MetadataBackend, err: type[Exception], *ops: Op
) -> None:
    """The commit of `ops` raises `err`, writes no entry and leaves the state alone."""
    before = m.state
    seqs = backend.entry_seqs()
    with pytest.raises(err):
        m.commit(fixed(*ops))
    assert backend.entry_seqs() == seqs
    assert not m.log.has_entry(before.seq + 1)
    assert m.state is before


def same_state(a: MetadataState, b: MetadataState) -> bool:
    return a.to_checkpoint() == b.to_checkpoint()


# -- ops and invariants -----------------------------------------------------------------------


def test_stream_lifecycle(backend: MetadataBackend) -> None:
    clock = ManualClock(start_ms=5_000)
    m = manager(backend, clock=clock)
    s = m.create_stream({"topic": "orders", "partition": "0"})
    assert (s.stream_id, s.epoch, s.start_offset, s.end_offset) == (0, 0, 0, 0)
    assert s.state is StreamState.CLOSED and s.owner is None and s.created_ms == 5_000
    assert m.create_stream({}).stream_id == 1
    assert m.state.next_stream_id == 2

    s = m.open_stream(0, "n1")
    assert (s.epoch, s.state, s.owner) == (1, StreamState.OPEN, "n1")
    upload(m, "o1", {0: 10})
    s = m.trim_stream(0, 1, 4)
    assert (s.start_offset, s.end_offset) == (4, 10)
    s = m.close_stream(0, 1)
    assert (s.state, s.owner, s.epoch) == (StreamState.CLOSED, None, 1)
    seq = m.seq
    assert m.close_stream(0, 1).state is StreamState.CLOSED  # closing twice writes nothing
    assert m.trim_stream(0, 1, 4).start_offset == 4  # so does a trim to where it is
    assert m.seq == seq
    s = m.open_stream(0, "n2")
    assert (s.epoch, s.owner) == (2, "n2")
    m.delete_stream(0, 2)
    with pytest.raises(StreamNotFoundError):
        m.get_stream(0)
    with pytest.raises(StreamNotFoundError):
        m.open_stream(0, "n1")
    with pytest.raises(StreamNotFoundError):
        m.objects_for(0, 0)
    assert [s.stream_id for s in m.list_streams()] == [1]
    assert m.state.streams[0].state is StreamState.DELETED
    assert m.get_stream(1).to_info().tags == {}
    assert check_state(m.state) == []


def test_list_streams_matches_tag_subsets(backend: MetadataBackend) -> None:
    m = manager(backend)
    m.create_stream({"topic": "a", "partition": "0"})
    m.create_stream({"topic": "a", "partition": "1"})
    m.create_stream({"topic": "b", "partition": "0"})
    ids = lambda tags: [s.stream_id for s in m.list_streams(tags)]  # noqa: E731
    assert ids(None) == [0, 1, 2]
    assert ids({}) == [0, 1, 2]
    assert ids({"topic": "a"}) == [0, 1]
    assert ids({"partition": "0"}) == [0, 2]
    assert ids({"topic": "a", "partition": "1"}) == [1]
    assert ids({"topic": "c"}) == []
    with pytest.raises(InvalidArgumentError, match="tags"):
        m.create_stream({"topic": 1})  # type: ignore[dict-item]


def test_commit_advances_end_offsets_and_indexes_objects(backend: MetadataBackend) -> None:
    m = manager(backend)
    a, b = open_new(m), open_new(m)
    o1 = upload(m, "o1", {a: 10, b: 5})
    # Two objects of one stream in a single commit: contiguous, in any order.
    o2, o3 = obj("o2", (a, 10, 20)), obj("o3", (a, 20, 25))
    m.commit(fixed(CommitObjects((o3, o2), {a: 1})))
    assert (m.get_stream(a).end_offset, m.get_stream(b).end_offset) == (25, 5)
    keys = lambda objs: [o.key for o in objs]  # noqa: E731
    assert keys(m.objects_for(a, 0)) == ["o1", "o2", "o3"]
    assert keys(m.objects_for(a, 9, 10)) == ["o1"]
    assert keys(m.objects_for(a, 10, 11)) == ["o2"]
    assert keys(m.objects_for(a, 9, 21)) == ["o1", "o2", "o3"]
    assert keys(m.objects_for(a, 19, 20)) == ["o2"]
    assert keys(m.objects_for(a, 25)) == []
    assert keys(m.objects_for(a, 12, 12)) == []
    assert keys(m.objects_for(b, 0)) == ["o1"]
    assert o1.range_of(b) == StreamRange(b, 0, 5)
    assert o1.range_of(99) is None
    with pytest.raises(InvalidArgumentError, match="end_offset"):
        m.objects_for(a, 5, 4)
    with pytest.raises(InvalidArgumentError, match="start_offset"):
        m.objects_for(a, -1)
    with pytest.raises(StreamNotFoundError):
        m.objects_for(99, 0)
    assert check_state(m.state) == []


def test_commit_at_wrong_offset_is_rejected_and_not_written(backend: MetadataBackend) -> None:
    m = manager(backend)
    a, b = open_new(m), open_new(m)
    upload(m, "o1", {a: 10, b: 10})
    bad = InvalidArgumentError
    assert_rejected_unwritten(
        m, backend, bad, CommitObjects((obj("x", (a, 11, 20)),), {a: 1})
    )  # gap
    assert_rejected_unwritten(
        m, backend, bad, CommitObjects((obj("x", (a, 9, 20)),), {a: 1})
    )  # overlap
    assert_rejected_unwritten(
        m, backend, bad, CommitObjects((obj("x", (a, 0, 10)),), {a: 1})
    )  # again
    # Contiguous per stream across the objects of one commit, or nothing.
    gap = (obj("x", (a, 10, 12)), obj("y", (a, 13, 15)))
    assert_rejected_unwritten(m, backend, bad, CommitObjects(gap, {a: 1}))
    dup = (obj("x", (a, 10, 12)), obj("y", (a, 11, 15)))
    assert_rejected_unwritten(m, backend, bad, CommitObjects(dup, {a: 1}))
    # One stream right, the other wrong: the whole entry is rejected.
    both = obj("x", (a, 10, 12), (b, 11, 12))
    assert_rejected_unwritten(m, backend, bad, CommitObjects((both,), {a: 1, b: 1}))
    # Epochs must name exactly the streams committed.
    assert_rejected_unwritten(m, backend, bad, CommitObjects((obj("x", (a, 10, 12)),), {}))
    extra = CommitObjects((obj("x", (a, 10, 12)),), {a: 1, b: 1})
    assert_rejected_unwritten(m, backend, bad, extra)
    assert_rejected_unwritten(m, backend, bad, CommitObjects((), {}))
    # ... and a valid ops list after a rejected one in the same entry does not help.
    ok = CommitObjects((obj("x", (a, 10, 12)),), {a: 1})
    assert_rejected_unwritten(m, backend, bad, ok, CommitObjects((obj("y", (a, 13, 14)),), {a: 1}))
    m.commit(fixed(ok))
    assert m.get_stream(a).end_offset == 12


def test_commit_epochs_and_states(backend: MetadataBackend) -> None:
    m = manager(backend)
    a = open_new(m)
    c = m.create_stream({}).stream_id  # never opened
    m.open_stream(a, "n2", force=True)  # epoch 2 now
    one = lambda sid, e: CommitObjects((obj("x", (sid, 0, 1)),), {sid: e})  # noqa: E731
    assert_rejected_unwritten(m, backend, FencedError, one(a, 1))
    assert_rejected_unwritten(m, backend, FencedError, one(a, 3))
    assert_rejected_unwritten(m, backend, StreamClosedError, one(c, 0))
    assert_rejected_unwritten(m, backend, StreamNotFoundError, one(77, 0))
    m.close_stream(a, 2)
    assert_rejected_unwritten(m, backend, StreamClosedError, one(a, 2))
    m.delete_stream(a, 2)
    assert_rejected_unwritten(m, backend, StreamNotFoundError, one(a, 2))
    for op in (CloseStream(a, 2), TrimStream(a, 2, 0), DeleteStream(a, 2), OpenStream(a, 3, "n")):
        assert_rejected_unwritten(m, backend, StreamNotFoundError, op)


def test_object_shape_invariants(backend: MetadataBackend) -> None:
    m = manager(backend)
    a, b = open_new(m), open_new(m)
    upload(m, "o1", {a: 5})
    bad = InvalidArgumentError

    def commit_of(o: ObjectMeta) -> CommitObjects:
        return CommitObjects((o,), {r.stream_id: 1 for r in o.ranges})

    assert_rejected_unwritten(m, backend, bad, commit_of(obj("o1", (a, 5, 6))))  # key reused
    twice = CommitObjects((obj("x", (a, 5, 6)), obj("x", (a, 6, 7))), {a: 1})
    assert_rejected_unwritten(m, backend, bad, twice)
    unsorted = ObjectMeta(
        key="x",
        kind=ObjectKind.STREAM_SET,
        size=1,
        ranges=(StreamRange(b, 0, 1), StreamRange(a, 5, 6)),
        committed_ms=0,
        node_id="n",
    )
    assert_rejected_unwritten(m, backend, bad, commit_of(unsorted))
    assert_rejected_unwritten(m, backend, bad, commit_of(obj("x", (a, 5, 5))))  # empty range
    two = obj("x", (a, 5, 6), (b, 0, 1), kind=ObjectKind.STREAM)
    assert_rejected_unwritten(m, backend, bad, commit_of(two))
    marked = ObjectMeta(
        key="x",
        kind=ObjectKind.STREAM,
        size=1,
        ranges=(StreamRange(a, 5, 6),),
        committed_ms=0,
        node_id="n",
        marked_deleted_ms=1,
    )
    assert_rejected_unwritten(m, backend, bad, commit_of(marked))
    assert_rejected_unwritten(m, backend, bad, commit_of(obj("/abs", (a, 5, 6))))
    norange = ObjectMeta(
        key="x", kind=ObjectKind.STREAM_SET, size=1, ranges=(), committed_ms=0, node_id="n"
    )
    assert_rejected_unwritten(m, backend, bad, CommitObjects((norange,), {}))
    # Field types and ranges are checked by decoding the encoded entry before writing.
    negative = ObjectMeta(
        key="x",
        kind=ObjectKind.STREAM,
        size=-1,
        ranges=(StreamRange(a, 5, 6),),
        committed_ms=0,
        node_id="n",
    )
    assert_rejected_unwritten(m, backend, bad, commit_of(negative))
    assert_rejected_unwritten(m, backend, bad, TrimStream(a, 1, "3"))  # type: ignore[arg-type]


def test_open_trim_register_rules(backend: MetadataBackend) -> None:
    m = manager(backend)
    a = open_new(m)
    assert_rejected_unwritten(m, backend, FencedError, OpenStream(a, 1, "n"))  # not previous + 1
    assert_rejected_unwritten(m, backend, FencedError, OpenStream(a, 3, "n"))
    upload(m, "o1", {a: 10})
    m.trim_stream(a, 1, 5)
    assert_rejected_unwritten(m, backend, InvalidArgumentError, TrimStream(a, 1, 4))  # backwards
    assert_rejected_unwritten(m, backend, InvalidArgumentError, TrimStream(a, 1, 11))  # past end
    assert_rejected_unwritten(m, backend, FencedError, TrimStream(a, 0, 6))
    m.trim_stream(a, 1, 10)
    assert m.get_stream(a).start_offset == 10
    with pytest.raises(InvalidArgumentError, match="start_offset"):
        m.trim_stream(a, 1, -1)
    assert_rejected_unwritten(m, backend, FencedError, CloseStream(a, 0))
    assert_rejected_unwritten(m, backend, FencedError, DeleteStream(a, 2))
    assert_rejected_unwritten(m, backend, InvalidArgumentError, CreateStream(5, {}, 0))
    assert m.register_node("n1") == 1
    assert m.register_node("n1") == 2
    assert m.register_node("n2") == 1
    assert_rejected_unwritten(m, backend, FencedError, RegisterNode("n1", 2))
    assert_rejected_unwritten(m, backend, FencedError, RegisterNode("n3", 2))
    assert m.state.nodes["n1"].epoch == 2


def test_compaction_and_purge(backend: MetadataBackend) -> None:
    clock = ManualClock(start_ms=1_000)
    m = manager(backend, clock=clock)
    a, b = open_new(m), open_new(m)
    upload(m, "s1", {a: 10, b: 4})
    upload(m, "s2", {a: 5, b: 6})
    upload(m, "s3", {a: 5})
    bad = InvalidArgumentError
    replaced = ("s1", "s2")
    sa = obj("a1", (a, 0, 15))
    sb = obj("b1", (b, 0, 10))
    # Coverage mismatches.
    cases = [
        (sa,),  # drops b entirely
        (obj("a1", (a, 0, 14)), sb),  # drops a record of a
        (obj("a1", (a, 0, 16)), sb),  # claims data of s3 (not replaced)
        (obj("a1", (a, 0, 10)), obj("a2", (a, 9, 15)), sb),  # new objects overlap
        (sa, obj("b1", (b, 1, 10))),  # drops b's first record (b not trimmed)
    ]
    for new in cases:
        assert_rejected_unwritten(m, backend, bad, CompactObjects(new, replaced))
    assert_rejected_unwritten(m, backend, bad, CompactObjects((sa, sb), ("s1", "s2", "nope")))
    assert_rejected_unwritten(m, backend, bad, CompactObjects((sa, sb), ("s1", "s1", "s2")))
    assert_rejected_unwritten(m, backend, bad, CompactObjects((sa, sb), ()))
    assert_rejected_unwritten(
        m, backend, bad, CompactObjects((obj("s3", (a, 0, 15)), sb), replaced)
    )

    clock.advance(1)
    m.commit(fixed(CompactObjects((sa, sb), replaced)))
    st = m.state
    assert st.objects["s1"].marked_deleted_ms == 2_000 and not st.objects["s2"].live
    assert [o.key for o in m.objects_for(a, 0)] == ["a1", "s3"]
    assert [o.key for o in m.objects_for(b, 3, 4)] == ["b1"]
    assert m.get_stream(a).end_offset == 20  # compaction moves no offsets
    assert check_state(st) == []
    # A replaced object cannot be replaced again, nor be reused as a key.
    assert_rejected_unwritten(m, backend, bad, CompactObjects((obj("z", (a, 0, 15)),), ("s1",)))
    assert_rejected_unwritten(m, backend, bad, CompactObjects((obj("s1", (a, 0, 15)),), ("a1",)))

    # Data wholly below the start offset may be dropped; a straddling piece may be kept.
    m.trim_stream(a, 1, 12)
    keep_tail = CompactObjects((obj("a2", (a, 12, 20)),), ("a1", "s3"))
    straddle = CompactObjects((obj("a2", (a, 11, 20)),), ("a1", "s3"))
    too_short = CompactObjects((obj("a2", (a, 13, 20)),), ("a1", "s3"))
    assert_rejected_unwritten(m, backend, bad, too_short)
    m.commit(fixed(straddle))
    assert [o.key for o in m.objects_for(a, 0)] == ["a2"]
    del keep_tail
    # A deleted stream's data may all go: the replacement may be nothing at all.
    m.delete_stream(b, 1)
    m.commit(fixed(CompactObjects((), ("b1",))))
    assert m.state.stream_objects(b) == []

    # Purge: only objects marked deleted.
    assert_rejected_unwritten(m, backend, bad, PurgeObjects(("a2",)))
    assert_rejected_unwritten(m, backend, bad, PurgeObjects(("nope",)))
    assert_rejected_unwritten(m, backend, bad, PurgeObjects(()))
    m.commit(fixed(PurgeObjects(("s1", "s2"))))
    assert "s1" not in m.state.objects and "s3" in m.state.objects
    assert_rejected_unwritten(m, backend, bad, PurgeObjects(("s1",)))
    assert check_state(m.state) == []


def test_build_without_ops_writes_nothing_and_build_errors_propagate(
    backend: MetadataBackend,
) -> None:
    m = manager(backend)
    m.create_stream({})
    entry, state = m.commit(lambda s: [])
    assert entry.ops == () and entry.seq == 1 and state is m.state
    assert log_keys(backend) == [m.log.entry_key(1)]

    class Abort(Exception):
        pass

    def build(state: MetadataState) -> list[Op]:
        raise Abort

    with pytest.raises(Abort):
        m.commit(build)
    assert m.seq == 1


def test_manager_arguments_and_lifecycle(store: ObjectStore) -> None:
    clock = ManualClock()
    with pytest.raises(InvalidArgumentError, match="writer_id"):
        MetadataManager(store, clock=clock, writer_id="")
    with pytest.raises(InvalidArgumentError, match="checkpoint_interval"):
        MetadataManager(store, clock=clock, writer_id="w", checkpoint_interval=0)
    with pytest.raises(InvalidArgumentError, match="commit_attempts"):
        MetadataManager(store, clock=clock, writer_id="w", commit_attempts=-1)
    with pytest.raises(InvalidArgumentError, match="commit_timeout_s"):
        MetadataManager(store, clock=clock, writer_id="w", commit_timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="prefix"):
        MetadataManager(store, clock=clock, writer_id="w", prefix="/x")
    m = MetadataManager(store, clock=clock, writer_id="w")
    with pytest.raises(S3StreamError, match="load"):
        m.state  # noqa: B018
    with pytest.raises(S3StreamError, match="load"):
        m.create_stream({})
    m.load()
    with pytest.raises(S3StreamError, match="already"):
        m.load()
    with pytest.raises(InvalidArgumentError, match="node_id"):
        m.open_stream(0, "")


# -- replay and checkpoints -------------------------------------------------------------------


def busy_history(m: MetadataManager, rounds: int) -> None:
    """A mix of every op kind."""
    m.register_node("n1")
    for i in range(rounds):
        sid = open_new(m, topic=f"t{i % 3}")
        upload(m, f"u{i}a", {sid: 3})
        upload(m, f"u{i}b", {sid: 4})
        m.trim_stream(sid, 1, 2)
        m.commit(fixed(CompactObjects((obj(f"c{i}", (sid, 2, 7)),), (f"u{i}a", f"u{i}b"))))
        if i % 2:
            m.commit(fixed(PurgeObjects((f"u{i}a",))))
            m.close_stream(sid, 1)
        if i % 3 == 2:
            m.delete_stream(sid, 1)


def test_replay_equals_live_state(backend: MetadataBackend) -> None:
    m = manager(backend, checkpoint_interval=1000)
    busy_history(m, 6)
    fresh = manager(backend, writer="w2")
    assert fresh.seq == m.seq
    assert same_state(fresh.state, m.state)
    assert check_state(fresh.state) == []
    # Replay from scratch, entry by entry, gives the same too.
    state = MetadataState.empty()
    for seq in range(1, m.seq + 1):
        data = backend.get_entry(seq)
        assert data is not None
        state = state.apply(decode_entry(data, "k"))
    assert same_state(state, m.state)


def test_load_reads_checkpoint_then_only_later_entries_and_never_lists(
    store: ObjectStore,
) -> None:
    counting = CountingStore(store)
    m = manager(counting, checkpoint_interval=10)
    while m.seq < 35:
        m.create_stream({"n": str(m.seq)})
    assert counting.count("list") == 0
    assert counting.keys("put") == [
        key for c in (10, 20, 30) for key in (m.log.checkpoint_key(c), m.log.pointer_key)
    ]
    reader = CountingStore(store)
    fresh = manager(reader, writer="w2", checkpoint_interval=10)
    assert same_state(fresh.state, m.state)
    assert reader.calls[:2] == [("get", "meta/checkpoint"), ("get", m.log.checkpoint_key(30))]
    # Entry 30 (the checkpoint's: still there, the rollback check), entries 31-35 one GET
    # each, then the missing 36; past the first two the log reads runs in parallel
    # (MetadataLog.read_entries), so 37 and 38 were asked for with 35 and 36. Then HEADs
    # past the tip (35 + 1 + 2**j): none exists, so 36 is the tip, not a hole.
    entry_gets = reader.calls[2:-17]
    assert entry_gets[0] == ("get", m.log.entry_key(30))
    assert sorted(entry_gets[1:]) == [("get", m.log.entry_key(s)) for s in range(31, 39)]
    heads = sorted(reader.calls[-17:], key=lambda call: call[1])
    assert heads == [("head", m.log.entry_key(36 + (1 << j))) for j in range(17)]
    # A refresh with nothing new costs two GETs: the newest entry applied, which must still
    # be there with the bytes applied (else the log was rolled back), and the next, missing;
    # commits use no LIST either.
    reader.calls.clear()
    assert fresh.refresh() is False
    assert reader.calls == [("get", m.log.entry_key(35)), ("get", m.log.entry_key(36))]
    fresh.create_stream({})
    assert reader.count("list") == 0 and reader.count("put_if_absent") == 1


def test_stale_pointer_and_failed_checkpoint_writes_are_harmless(
    backend: MetadataBackend, caplog: pytest.LogCaptureFixture
) -> None:
    hooked = HookLog(backend.open_log())
    m = manager(hooked, checkpoint_interval=5)
    while m.seq < 12:
        m.create_stream({})
    assert manager(backend, writer="x").seq == 12
    # Point back at checkpoint 5: a longer replay, same state.
    backend.set_pointer(5)
    assert same_state(manager(backend, writer="y").state, m.state)
    hooked.fail_checkpoints = True
    with caplog.at_level(logging.WARNING, logger="s3stream.metadata.manager"):
        while m.seq < 16:
            m.create_stream({})
    assert "could not write metadata checkpoint 15" in caplog.text
    assert same_state(manager(backend, writer="z").state, m.state)
    # An explicit checkpoint writes one now.
    hooked.fail_checkpoints = False
    assert m.write_checkpoint() == 16
    reader = HookLog(backend.open_log())
    manager(reader, writer="v")
    assert reader.calls[:4] == [
        ("read_pointer", None),
        ("read_checkpoint", 16),
        ("read_entry", 16),  # the checkpoint's own entry: the rollback check
        ("read_entries", 17),
    ]


# -- corruption -------------------------------------------------------------------------------


def test_corrupt_entry_is_reported_with_its_key(backend: MetadataBackend) -> None:
    m = manager(backend, checkpoint_interval=1000)
    busy_history(m, 2)
    key = m.log.entry_key(3)
    good = backend.get_entry(3)
    assert good is not None
    bad = bytearray(good)
    bad[-1] ^= 0x40
    for blob in (bytes(bad), good[:5], b"XXXX" + good[4:], b""):
        backend.put_entry(3, blob)
        with pytest.raises(CorruptionError, match=key) as info:
            manager(backend, writer="r")
        assert info.value.location == key
    # Well framed, but an entry from another position.
    backend.put_entry(3, backend.get_entry(4) or b"")
    with pytest.raises(CorruptionError, match="holds entry 4"):
        manager(backend, writer="r")
    backend.put_entry(3, good)
    assert same_state(manager(backend, writer="r").state, m.state)


def test_entry_breaking_an_invariant_is_corruption(backend: MetadataBackend) -> None:
    m = manager(backend)
    a = open_new(m)
    reader = manager(backend, writer="r")
    # A foreign writer that skipped validation: a commit at the wrong offset, epoch from nowhere.
    rogue = LogEntry(
        seq=m.seq + 1,
        ops=(CommitObjects((obj("x", (a, 5, 6)),), {a: 1}),),
        writer="rogue",
        ts_ms=0,
    )
    assert backend.open_log().create_entry(rogue.seq, encode_entry(rogue))
    with pytest.raises(CorruptionError, match=m.log.entry_key(rogue.seq)):
        reader.refresh()
    assert reader.seq == rogue.seq - 1  # progress before the bad entry is kept
    with pytest.raises(CorruptionError, match="I8"):
        manager(backend, writer="r2")


def test_corrupt_or_missing_checkpoint(backend: MetadataBackend) -> None:
    m = manager(backend, checkpoint_interval=4)
    while m.seq < 9:
        m.create_stream({})
    key = m.log.checkpoint_key(8)
    good = backend.get_checkpoint(8)
    assert good is not None
    backend.put_checkpoint(8, good[:-3])
    with pytest.raises(CorruptionError, match=key):
        manager(backend, writer="r")
    # Decodes, but breaks invariants (stream ids past next_stream_id).
    cp = m.state.to_checkpoint()
    broken = type(cp)(seq=8, next_stream_id=1, streams=cp.streams[:8], objects=(), nodes=())
    backend.put_checkpoint(8, encode_checkpoint(broken))
    with pytest.raises(CorruptionError, match="breaks invariants"):
        manager(backend, writer="r")
    backend.delete_checkpoint(8)
    with pytest.raises(CorruptionError, match=key):
        manager(backend, writer="r")
    backend.put_checkpoint(8, good)
    assert same_state(manager(backend, writer="r").state, m.state)


# -- concurrency ------------------------------------------------------------------------------


def run_writer(
    m: MetadataManager, name: str, errors: list[BaseException], start: threading.Barrier
) -> None:
    """200 commits: 20 streams created and opened, then 160 uploads to them, round robin.

    A writer pauses briefly after each commit, as a real one does between uploads: in a
    tight loop the writer that just won (whose view is fresh) keeps beating the one that must
    re-read first, until that one runs out of `commit_attempts` (see docs/metadata.md).
    """
    try:
        start.wait()
        sids = []
        for i in range(20):
            sids.append(open_new(m, name, writer=name, n=str(i)))
            time.sleep(0.0001)
        for i in range(160):
            upload(m, f"{name}/{i}", {sids[i % 20]: 1 + i % 3})
            time.sleep(0.0001)
    except BaseException as exc:
        errors.append(exc)


def test_race_two_writers_every_op_lands_once(backend: MetadataBackend) -> None:
    logs = [HookLog(backend.open_log(), yield_gil=True) for _ in "AB"]
    # Real time: the jittered backoff after repeated lost races must really wait.
    ma = manager(logs[0], writer="A", checkpoint_interval=50, clock=SystemClock())
    mb = manager(logs[1], writer="B", checkpoint_interval=50, clock=SystemClock())
    errors: list[BaseException] = []
    start = threading.Barrier(2)
    threads = [
        threading.Thread(target=run_writer, args=(m, m.writer_id, errors, start)) for m in (ma, mb)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ma.refresh()
    mb.refresh()
    assert ma.seq == mb.seq == 400
    assert same_state(ma.state, mb.state)
    assert check_state(ma.state) == []
    # Dense seqs; every op exactly once; both writers' entries interleaved.
    entries = [ma.log.read_entry(s)[0] for s in range(1, 401)]
    assert [e.seq for e in entries] == list(range(1, 401))
    assert backend.entry_seqs() == list(range(1, 401))
    assert Counter(e.writer for e in entries) == {"A": 200, "B": 200}
    # The writers really raced: some creates lost and were retried. (A writer that keeps
    # losing backs off with jitter, so entries need not interleave much.)
    assert sum(len(log.seqs("create_entry")) for log in logs) > 400
    committed = [
        o.key for e in entries for op in e.ops if isinstance(op, CommitObjects) for o in op.objects
    ]
    assert sorted(committed) == sorted(f"{w}/{i}" for w in "AB" for i in range(160))
    st = ma.state
    assert sorted(st.streams) == list(range(40))
    for w in "AB":
        mine = ma.list_streams({"writer": w})
        assert len(mine) == 20 and all(s.owner == w and s.epoch == 1 for s in mine)
        ends = [s.end_offset for s in sorted(mine, key=lambda s: int(s.tags["n"]))]
        assert ends == [sum(1 + i % 3 for i in range(j, 160, 20)) for j in range(20)]
    assert not any(log.seqs("listed_seqs") for log in logs)
    fresh = manager(backend, writer="C")
    assert same_state(fresh.state, st)


def test_threads_sharing_one_manager(backend: MetadataBackend) -> None:
    m = manager(backend)
    sids = [open_new(m) for _ in range(4)]
    errors: list[BaseException] = []

    def work(sid: int) -> None:
        try:
            for i in range(25):
                upload(m, f"{sid}/{i}", {sid: 2})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [m.get_stream(s).end_offset for s in sids] == [50] * 4
    # Group commit may fold concurrent uploads into one entry, never drop or repeat one.
    assert m.seq <= 8 + 100
    entries = [m.log.read_entry(s)[0] for s in range(9, m.seq + 1)]
    keys = [
        o.key for e in entries for op in e.ops if isinstance(op, CommitObjects) for o in op.objects
    ]
    assert sorted(keys) == sorted(f"{sid}/{i}" for sid in sids for i in range(25))
    assert same_state(manager(backend, writer="r").state, m.state)


def test_fenced_writer_gets_fenced_error_after_rereading(backend: MetadataBackend) -> None:
    counting = HookLog(backend.open_log())
    ma = manager(counting, writer="A")
    sid = ma.create_stream({}).stream_id
    assert ma.open_stream(sid, "node-a").epoch == 1
    upload(ma, "a/0", {sid: 5})
    # A prepares its next upload commit with the epoch it holds ...
    commit = CommitObjects((obj("a/1", (sid, 5, 9)),), {sid: 1})
    # ... while B takes the stream over (after catching up on the log).
    mb = manager(backend, writer="B")
    assert mb.open_stream(sid, "node-b", force=True).epoch == 2
    counting.calls.clear()
    with pytest.raises(FencedError, match="epoch"):
        ma.commit(fixed(commit))
    # A tried once, lost the race for the entry, re-read B's entry, then refused to write.
    assert counting.seqs("create_entry") == [4]
    assert ma.get_stream(sid).epoch == 2 and ma.get_stream(sid).owner == "node-b"
    assert ma.seq == mb.seq == 4
    assert log_keys(backend) == [ma.log.entry_key(s) for s in range(1, 5)]
    # A's later attempts fail fast, without writing; B commits at the same offset freely.
    with pytest.raises(FencedError):
        ma.commit(fixed(commit))
    mb.commit(fixed(CommitObjects((obj("b/1", (sid, 5, 9)),), {sid: 2})))
    assert [o.key for o in mb.objects_for(sid, 0)] == ["a/0", "b/1"]


def test_stale_view_is_refreshed_before_a_commit_is_refused(backend: MetadataBackend) -> None:
    ma, mb = manager(backend, writer="A"), manager(backend, writer="B")
    sid = ma.create_stream({}).stream_id
    # B has not seen the stream: its build and validation fail on its stale view, so it
    # re-reads the log and succeeds instead of reporting StreamNotFoundError.
    assert mb.open_stream(sid, "nb").epoch == 1
    assert mb.seq == 2


def rival_wins_next(hooked: HookLog, rival: MetadataManager, times: int) -> list[int]:
    """Make `rival` commit just before each of the next `times` creates through `hooked`, so
    that each loses the race; the returned one-item list counts the races lost so far."""
    losses = [0]

    def sneak_in(seq: int, data: bytes) -> None:
        losses[0] += 1
        rival.create_stream({})
        hooked.before_create = sneak_in if losses[0] < times else None

    hooked.before_create = sneak_in
    return losses


def test_commit_gives_up_after_losing_the_race_commit_attempts_times(
    backend: MetadataBackend,
) -> None:
    hooked = HookLog(backend.open_log())
    mine = manager(hooked, writer="me", commit_attempts=3)
    rival = manager(backend, writer="rival")
    losses = rival_wins_next(hooked, rival, 3)
    with pytest.raises(UnavailableError, match="3 times"):
        mine.create_stream({})
    assert losses == [3] and mine.seq == rival.seq == 3
    assert mine.create_stream({}).stream_id == 3


def test_contention_is_retried_until_the_deadline_not_reported(backend: MetadataBackend) -> None:
    """By default a lost race is never an error while the deadline lasts (40 losses here);
    the deadline, on the manager's clock, is the only limit, and says so."""
    clock = ManualClock()
    hooked = HookLog(backend.open_log())
    mine = manager(hooked, writer="me", clock=clock, commit_timeout_s=10.0)
    rival = manager(backend, writer="rival")
    losses = rival_wins_next(hooked, rival, 40)
    assert mine.create_stream({}).stream_id == 40
    assert losses == [40] and mine.seq == rival.seq + 1 == 41

    def sneak_in_slowly(seq: int, data: bytes) -> None:
        clock.advance(3.0)  # each lost race takes 3 s: the 4th try is past the deadline
        rival.create_stream({})
        hooked.before_create = sneak_in_slowly

    hooked.before_create = sneak_in_slowly
    with pytest.raises(UnavailableError, match=r"did not land within its deadline \(10 s"):
        mine.create_stream({})
    hooked.before_create = None
    # A deadline of the call's own; the next commit, uncontended, lands.
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        mine.commit(fixed(), timeout_s="1")  # type: ignore[arg-type]
    assert mine.create_stream({}).stream_id == mine.seq - 1


def queue_behind_a_blocked_commit(
    m: MetadataManager, hooked: HookLog, builds: list[Callable[[MetadataState], Sequence[Op]]]
) -> tuple[list[Any], list[threading.Thread]]:
    """Start a commit whose create blocks until every one of `builds` is queued behind it (in
    threads); return the outcomes (each an entry/state pair or an error) and the threads."""
    outcomes: list[Any] = [None] * len(builds)

    def run(i: int) -> None:
        try:
            outcomes[i] = m.commit(builds[i])
        except Exception as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(builds))]

    def hold(seq: int, data: bytes) -> None:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(m._queue) < len(builds):  # the followers have queued up
            assert time.monotonic() < deadline, "followers did not queue"
            time.sleep(0.001)

    hooked.before_create = hold
    return outcomes, threads


def test_group_commit_folds_concurrent_commits_into_one_entry(backend: MetadataBackend) -> None:
    hooked = HookLog(backend.open_log())
    m = manager(hooked)
    builds: list[Callable[[MetadataState], Sequence[Op]]] = []
    for i in range(5):

        def create(state: MetadataState, i: int = i) -> list[Op]:
            return [CreateStream(state.next_stream_id, {"n": str(i)}, 1)]

        builds.append(create)
    builds.append(fixed())  # a no-op folded along
    outcomes, threads = queue_behind_a_blocked_commit(m, hooked, builds)
    first = m.create_stream({"n": "first"})
    for t in threads:
        t.join()
    assert first.stream_id == 0
    # The 5 creates queued behind the first commit went out as ONE entry, in queue order,
    # each built on the state staged by those before it (consecutive stream ids).
    assert m.seq == 2 and backend.entry_seqs() == [1, 2]
    entry = m.log.read_entry(2)[0]
    assert [type(op) for op in entry.ops] == [CreateStream] * 5
    assert [op.stream_id for op in entry.ops if isinstance(op, CreateStream)] == [1, 2, 3, 4, 5]
    for got, state in outcomes[:5]:
        assert got == entry and state.seq == 2 and len(state.streams) == 6
    noop, state = outcomes[5]
    assert noop.ops == () and noop.seq == 2 and state is outcomes[0][1]
    assert sorted(s.tags["n"] for s in m.list_streams()) == ["0", "1", "2", "3", "4", "first"]
    assert same_state(manager(backend, writer="r").state, m.state)
    assert check_state(m.state) == []


def test_create_stream_open_for_is_one_entry_and_creates_fold(backend: MetadataBackend) -> None:
    hooked = HookLog(backend.open_log())
    m = manager(hooked)
    s = m.create_stream({"a": "1"}, open_for="n1")
    assert (s.stream_id, s.epoch, s.owner, s.state) == (0, 1, "n1", StreamState.OPEN)
    assert m.seq == 1 and [type(op) for op in m.log.read_entry(1)[0].ops] == [
        CreateStream,
        OpenStream,
    ]
    with pytest.raises(InvalidArgumentError, match="open_for"):
        m.create_stream({}, open_for="")
    # Concurrent creates of one manager fold: 4 streams, created and opened, in one entry.
    builds = []
    for i in range(4):

        def create(state: MetadataState, i: int = i) -> list[Op]:
            sid = state.next_stream_id
            return [CreateStream(sid, {"i": str(i)}, 1), OpenStream(sid, 1, "n1")]

        builds.append(create)
    outcomes, threads = queue_behind_a_blocked_commit(m, hooked, builds)
    m.create_stream({}, open_for="n1")
    for t in threads:
        t.join()
    assert all(isinstance(o, tuple) and o[0].seq == 3 for o in outcomes)
    assert m.seq == 3 and len(m.log.read_entry(3)[0].ops) == 8
    assert [(st.stream_id, st.owner, st.epoch) for st in m.list_streams()] == [
        (i, "n1", 1) for i in range(6)
    ]


def test_create_streams_is_one_entry_in_order(backend: MetadataBackend) -> None:
    from s3stream.metadata.manager import MAX_CREATES_PER_ENTRY

    m = manager(backend)
    made = m.create_streams([{"p": "0"}, {}, {"p": "2"}], open_for="n1")
    assert [(s.stream_id, s.tags, s.owner, s.epoch) for s in made] == [
        (0, {"p": "0"}, "n1", 1),
        (1, {}, "n1", 1),
        (2, {"p": "2"}, "n1", 1),
    ]
    entry = m.log.read_entry(1)[0]
    assert m.seq == 1 and [type(op) for op in entry.ops] == [CreateStream, OpenStream] * 3
    closed = m.create_streams(({"q": "x"}, {"q": "y"}))
    assert [(s.stream_id, s.state, s.epoch) for s in closed] == [
        (3, StreamState.CLOSED, 0),
        (4, StreamState.CLOSED, 0),
    ]
    assert m.seq == 2 and [type(op) for op in m.log.read_entry(2)[0].ops] == [CreateStream] * 2
    bad: list[Any] = [
        [],
        {"p": "0"},
        "abc",
        3,
        [{"a": 1}],
        [None],
        [{}] * (MAX_CREATES_PER_ENTRY + 1),
    ]
    for tags in bad:
        with pytest.raises(InvalidArgumentError):
            m.create_streams(tags)
    with pytest.raises(InvalidArgumentError, match="open_for"):
        m.create_streams([{}], open_for="")
    assert m.seq == 2 and m.state.next_stream_id == 5  # nothing written by the bad calls
    assert same_state(manager(backend, writer="r").state, m.state)


def test_group_commit_bounds_the_weight_of_an_entry() -> None:
    """Requests saying they build many ops (a batch of creates) fold only up to
    _MAX_GROUP_WEIGHT per entry: the rest go in the next entry, in queue order."""
    from s3stream.metadata.manager import _MAX_GROUP_WEIGHT, _Request

    m = manager(MemoryObjectStore(), writer="w")
    deadline = m._clock.monotonic() + 60
    heavy = _MAX_GROUP_WEIGHT // 2 + 1
    queued = [
        _Request(fixed(RegisterNode("a", 1)), deadline, weight=heavy),
        _Request(fixed(RegisterNode("b", 1)), deadline, weight=heavy),
        _Request(fixed(RegisterNode("c", 1)), deadline),
    ]
    m._queue.extend(queued)  # as waiting callers would leave them
    m.commit(fixed(RegisterNode("mine", 1)))
    assert all(r.done and r.error is None for r in queued) and not m._queue
    nodes = [[op.node_id for op in m.log.read_entry(seq)[0].ops] for seq in (1, 2)]
    assert m.seq == 2 and nodes == [["a"], ["b", "c", "mine"]]


def test_published_state_is_what_replay_computes(backend: MetadataBackend) -> None:
    """The leader publishes the state it staged, not the entry replayed: an op that reads
    the entry's timestamp (compaction's deletion mark) must stage the entry's own, even if
    the clock moves while the group builds."""
    clock = ManualClock(start_ms=1_000)
    m = manager(backend, clock=clock)
    a = open_new(m)
    upload(m, "s1", {a: 3})
    upload(m, "s2", {a: 2})

    def compact(state: MetadataState) -> list[Op]:
        clock.advance(7)  # time passes while the build runs
        return [CompactObjects((obj("c1", (a, 0, 5)),), ("s1", "s2"))]

    entry, state = m.commit(compact)
    assert state.objects["s1"].marked_deleted_ms == entry.ts_ms
    assert m.log.read_entry(entry.seq)[0] == entry
    assert same_state(manager(backend, writer="r").state, m.state)


def test_a_run_of_entries_applies_as_one_entry_after_the_other(backend: MetadataBackend) -> None:
    """`apply_run` (a serialized commit's catch-up, in one go) computes exactly what applying
    the entries one by one does, including an op that reads its own entry's timestamp
    (compaction's deletion mark); it refuses a gap and a bad op without touching its state."""
    clock = ManualClock(start_ms=1_000)
    m = manager(backend, clock=clock)
    a = open_new(m, "n1", topic="a")
    b = open_new(m, "n2")
    m.register_node("n1")
    upload(m, "s1", {a: 3, b: 1})
    clock.advance(5)
    upload(m, "s2", {a: 2})
    upload(m, "s3", {b: 4})
    clock.advance(11)
    m.commit(fixed(CompactObjects((obj("c1", (a, 0, 5), (b, 0, 1)),), ("s1", "s2"))))
    clock.advance(3)
    m.trim_stream(b, 1, 2)
    upload(m, "s4", {a: 1})
    m.close_stream(a, 1)
    m.create_streams([{"x": "1"}, {"x": "2"}], open_for="n3")
    entries = [m.log.read_entry(seq)[0] for seq in range(1, m.seq + 1)]
    for start in (0, 3, 7):
        base = MetadataState.empty()
        for entry in entries[:start]:
            base = base.apply(entry)
        one_by_one = base
        for entry in entries[start:]:
            one_by_one = one_by_one.apply(entry)
        in_one_go = base.apply_run(entries[start:])
        assert in_one_go.seq == m.seq and same_state(in_one_go, one_by_one)
        assert same_state(in_one_go, m.state) and not check_state(in_one_go)
        for sid in (a, b):
            assert in_one_go.stream_objects(sid) == one_by_one.stream_objects(sid)
    assert MetadataState.empty().apply_run([]).seq == 0
    with pytest.raises(InvalidArgumentError, match="dense"):
        MetadataState.empty().apply_run([entries[0], entries[2]])
    base = MetadataState.empty().apply(entries[0])
    bad = LogEntry(seq=3, ops=(TrimStream(a, 9, 0),), writer="rogue", ts_ms=0)
    with pytest.raises(FencedError):
        base.apply_run([entries[1], bad])
    assert base.seq == 1 and same_state(base, MetadataState.empty().apply(entries[0]))


def test_a_serialized_commit_reports_a_bad_missed_entry_keeping_those_before(
    backend: MetadataBackend,
) -> None:
    """A serializing log hands a commit the entries it missed, applied in one go: one that
    breaks an invariant is corruption naming that entry, and the entries before it stay
    applied (as a catch-up one by one keeps them)."""
    m = manager(backend)
    if not m.log.serializes_commits:
        pytest.skip("the object-store log does not serialize commits")
    a = open_new(m)
    other = manager(backend, writer="w2")
    upload(other, "good", {a: 2})
    rogue = LogEntry(
        seq=other.seq + 1,
        ops=(CommitObjects((obj("x", (a, 5, 6)),), {a: 1}),),
        writer="rogue",
        ts_ms=0,
    )
    assert backend.open_log().create_entry(rogue.seq, encode_entry(rogue))
    with pytest.raises(CorruptionError, match=m.log.entry_key(rogue.seq)):
        m.create_stream({})
    assert m.seq == rogue.seq - 1 and [o.key for o in m.objects_for(a, 0)] == ["good"]


def test_group_commit_a_failing_build_fails_only_its_caller(backend: MetadataBackend) -> None:
    hooked = HookLog(backend.open_log())
    m = manager(hooked)
    sid = open_new(m, "node-a")
    upload(m, "a/0", {sid: 3})

    def good(key: str) -> Callable[[MetadataState], Sequence[Op]]:
        def build(state: MetadataState) -> list[Op]:
            end = state.streams[sid].end_offset
            return [CommitObjects((obj(key, (sid, end, end + 2)),), {sid: 1})]

        return build

    def buggy(state: MetadataState) -> list[Op]:
        raise KeyError("a bug in one caller")

    builds = [
        good("a/1"),
        fixed(CommitObjects((obj("stale", (sid, 0, 2)),), {sid: 1})),  # I: wrong offset
        fixed(TrimStream(sid, 7, 0)),  # fenced: epoch 7 is not current
        buggy,
        good("a/2"),
        fixed(TrimStream(sid, 1, "3")),  # type: ignore[arg-type]  # malformed op
    ]
    outcomes, threads = queue_behind_a_blocked_commit(m, hooked, builds)
    upload(m, "a/blocked", {sid: 1})
    for t in threads:
        t.join()
    assert isinstance(outcomes[1], InvalidArgumentError)
    assert isinstance(outcomes[2], FencedError)
    assert isinstance(outcomes[3], KeyError)
    assert isinstance(outcomes[5], InvalidArgumentError)
    # The good ones went out together, each checked on the state the one before it staged.
    entry = m.log.read_entry(m.seq)[0]
    assert outcomes[0][0] == outcomes[4][0] == entry and m.seq == 5
    assert [o.key for o in m.objects_for(sid, 0)] == ["a/0", "a/blocked", "a/1", "a/2"]
    assert m.get_stream(sid).end_offset == 3 + 1 + 2 + 2
    assert same_state(manager(backend, writer="r").state, m.state)


def test_a_writer_that_won_under_contention_pauses_before_its_next_try(
    backend: MetadataBackend,
) -> None:
    """Courtesy: after a win that followed lost races, the next commit waits a jittered while
    (on the injected clock), so writers still catching up get a turn; without contention it
    never waits."""
    clock = ManualClock()
    hooked = HookLog(backend.open_log())
    mine = manager(hooked, writer="me", clock=clock)
    rival = manager(backend, writer="rival")
    t0 = clock.monotonic()
    mine.create_stream({})
    mine.create_stream({})
    assert clock.monotonic() == t0  # uncontended: no pause

    def sneak_in(seq: int, data: bytes) -> None:
        clock.advance(0.01)  # the create takes 10 ms, as on S3
        rival.create_stream({})

    hooked.before_create = sneak_in
    mine.create_stream({})
    after_win = clock.monotonic()
    waited = []
    for _ in range(20):
        before = clock.monotonic()
        mine.create_stream({})
        waited.append(clock.monotonic() - before)
    assert after_win > t0
    # Jittered up to a fifth of a create (twice a tenth) after a contended win.
    assert max(waited) > 0 and all(w <= 0.002 + 1e-9 for w in waited)


def test_ambiguous_create_that_landed_is_recognised(backend: MetadataBackend) -> None:
    hooked = HookLog(backend.open_log())
    m = manager(hooked)
    hooked.before_create = lambda seq, data: True  # write, then report a failure
    s = m.create_stream({"x": "1"})
    assert s.stream_id == 0 and m.seq == 1
    assert log_keys(backend) == [m.log.entry_key(1)]
    assert same_state(manager(backend, writer="r").state, m.state)


def test_ambiguous_create_that_did_not_land_raises_unavailable(backend: MetadataBackend) -> None:
    hooked = HookLog(backend.open_log())
    m = manager(hooked)

    def fail(seq: int, data: bytes) -> None:
        raise UnavailableError("injected: backend unreachable")

    hooked.before_create = fail
    with pytest.raises(UnavailableError, match="unreachable"):
        m.create_stream({})
    assert m.seq == 0 and log_keys(backend) == []
    assert m.create_stream({}).stream_id == 0


def test_in_memory_commit_cost_stays_small_with_10k_objects() -> None:
    m = manager(MemoryObjectStore(), checkpoint_interval=1 << 30)
    sids = [open_new(m) for _ in range(50)]
    for i in range(10_000):
        upload(m, f"o{i}", {sids[i % 50]: 1})
    assert len(m.state.objects) == 10_000
    state = m.state
    entries = []
    for i in range(200):
        sid = sids[i % 50]
        end = state.streams[sid].end_offset
        op = CommitObjects((obj(f"p{i}", (sid, end, end + 1)),), {sid: 1})
        entry = LogEntry(seq=state.seq + 1, ops=(op,), writer="w", ts_ms=0)
        state = state.apply(entry)
        entries.append(entry)
    # A guard against work that grows with the objects (copying the whole map per commit
    # costs milliseconds here), not a speed target: the best of three passes, so that one
    # collection by the garbage collector or a stolen core cannot fail it (one pass once
    # took 4 ms per commit in a full run, and 0.1 ms alone).
    passes = []
    for _ in range(3):
        state = m.state
        started = time.process_time()
        for entry in entries:
            state = state.apply(validate_entry(encode_entry(entry)))
        passes.append((time.process_time() - started) / len(entries))
    per_commit = min(passes)
    assert per_commit < 0.5e-3, f"{per_commit * 1e6:.0f} us per commit (passes: {passes})"
    assert len(m.objects_for(sids[0], 0)) == 200
    assert [o.key for o in m.objects_for(sids[7], 100, 102)] == ["o5007", "o5057"]


# -- model-based ------------------------------------------------------------------------------


class Model:
    """The metadata as plain dicts, with the rules written out the naive way (offset sets)."""

    def __init__(self) -> None:
        self.streams: dict[int, dict[str, Any]] = {}
        self.objects: dict[str, tuple[list[tuple[int, int, int]], bool]] = {}  # ranges, live
        self.nodes: dict[str, int] = {}

    def stream(self, sid: int) -> dict[str, Any] | None:
        s = self.streams.get(sid)
        return s if s is not None and s["state"] != "deleted" else None

    def live_keys(self, sid: int) -> list[str]:
        pieces = [
            (a, key)
            for key, (ranges, live) in self.objects.items()
            if live
            for (x, a, _) in ranges
            if x == sid
        ]
        return [key for _, key in sorted(pieces)]

    def expect(self, op: Op) -> type[Exception] | None:
        """The error the op must raise, or None if it must succeed."""
        if isinstance(op, CreateStream):
            return None if op.stream_id == len(self.streams) else InvalidArgumentError
        if isinstance(op, OpenStream | CloseStream | TrimStream | DeleteStream):
            s = self.stream(op.stream_id)
            if s is None:
                return StreamNotFoundError
            wanted = s["epoch"] + 1 if isinstance(op, OpenStream) else s["epoch"]
            if op.epoch != wanted:
                return FencedError
            if isinstance(op, TrimStream) and not s["start"] <= op.start_offset <= s["end"]:
                return InvalidArgumentError
            return None
        if isinstance(op, CommitObjects):
            ranges = [r for o in op.objects for r in o.ranges]
            if any(r.stream_id not in self.streams for r in ranges):
                return StreamNotFoundError
            for r in sorted(ranges, key=lambda r: r.stream_id):
                s = self.streams[r.stream_id]
                if s["state"] == "deleted":
                    return StreamNotFoundError
                if op.epochs[r.stream_id] != s["epoch"]:
                    return FencedError
                if s["state"] != "open":
                    return StreamClosedError
                if r.start_offset != s["end"]:
                    return InvalidArgumentError
            return None
        if isinstance(op, CompactObjects):
            if any(not self.objects.get(k, ([], False))[1] for k in op.replaced_keys):
                return InvalidArgumentError
            old: dict[int, set[int]] = {}
            for k in op.replaced_keys:
                for x, a, b in self.objects[k][0]:
                    old.setdefault(x, set()).update(range(a, b))
            new: dict[int, set[int]] = {}
            for o in op.new_objects:
                for r in o.ranges:
                    offsets = set(range(r.start_offset, r.end_offset))
                    if offsets & new.get(r.stream_id, set()):
                        return InvalidArgumentError
                    new.setdefault(r.stream_id, set()).update(offsets)
            for x in old.keys() | new.keys():
                s = self.streams[x]
                kept = {o for o in old.get(x, set()) if s["state"] != "deleted" and o >= s["start"]}
                if not kept <= new.get(x, set()) <= old.get(x, set()):
                    return InvalidArgumentError
            return None
        if isinstance(op, PurgeObjects):
            return None if all(not self.objects[k][1] for k in op.keys) else InvalidArgumentError
        assert isinstance(op, RegisterNode)
        return None if op.epoch == self.nodes.get(op.node_id, 0) + 1 else FencedError

    def apply(self, op: Op) -> None:
        if isinstance(op, CreateStream):
            self.streams[op.stream_id] = {"epoch": 0, "start": 0, "end": 0, "state": "closed"}
        elif isinstance(op, OpenStream):
            self.streams[op.stream_id].update(epoch=op.epoch, state="open")
        elif isinstance(op, CloseStream | DeleteStream):
            state = "closed" if isinstance(op, CloseStream) else "deleted"
            self.streams[op.stream_id]["state"] = state
        elif isinstance(op, TrimStream):
            self.streams[op.stream_id]["start"] = op.start_offset
        elif isinstance(op, CommitObjects | CompactObjects):
            if isinstance(op, CompactObjects):
                for k in op.replaced_keys:
                    self.objects[k] = (self.objects[k][0], False)
            objects = op.objects if isinstance(op, CommitObjects) else op.new_objects
            for o in objects:
                ranges = [(r.stream_id, r.start_offset, r.end_offset) for r in o.ranges]
                self.objects[o.key] = (ranges, True)
                if isinstance(op, CommitObjects):
                    for x, _, b in ranges:
                        self.streams[x]["end"] = b
        elif isinstance(op, PurgeObjects):
            for k in op.keys:
                del self.objects[k]
        else:
            self.nodes[op.node_id] = op.epoch


def draw_compaction(data: st.DataObject, model: Model, next_key: Callable[[], str]) -> Op | None:
    """Replace 1-3 live objects; the proposal is exact, clipped at start offsets, or off by
    one at a span's end (too short or too long), sometimes naming an already replaced key."""
    live = sorted(k for k, (_, is_live) in model.objects.items() if is_live)
    dead = sorted(k for k, (_, is_live) in model.objects.items() if not is_live)
    if not live:
        return None
    keys = sorted(data.draw(st.sets(st.sampled_from(live), min_size=1, max_size=3)))
    mode = data.draw(st.sampled_from(["exact", "clip", "short", "long"]))
    new_objects = []
    for x in sorted({r[0] for k in keys for r in model.objects[k][0]}):
        spans: list[list[int]] = []
        for a, b in sorted((a, b) for k in keys for (y, a, b) in model.objects[k][0] if y == x):
            if spans and a == spans[-1][1]:
                spans[-1][1] = b
            else:
                spans.append([a, b])
        s = model.streams[x]
        for a, b in spans:
            if mode == "clip":
                a = b if s["state"] == "deleted" else max(a, s["start"])
            b += {"short": -1, "long": 1}.get(mode, 0)
            if a < b:
                new_objects.append(obj(next_key(), (x, a, b)))
    if dead and data.draw(st.booleans()):
        keys.append(dead[0])
    return CompactObjects(tuple(new_objects), tuple(keys))


def draw_op(data: st.DataObject, model: Model, next_key: Callable[[], str]) -> Op | None:
    ids = sorted(model.streams)
    sid = data.draw(st.sampled_from([*ids, len(ids)]), label="stream")
    delta = data.draw(st.sampled_from([0, 0, 0, -1, 1]), label="delta")
    s = model.stream(sid)
    epoch = max(0, (s["epoch"] if s else 0) + delta)
    kinds = ["create", "open", "close", "trim", "delete", "commit", "compact", "purge", "node"]
    kind = data.draw(st.sampled_from(kinds), label="op")
    if kind == "create":
        return CreateStream(len(ids) + max(0, delta), {"k": str(sid)}, 0)
    if kind == "open":
        return OpenStream(sid, epoch + 1, "n")
    if kind == "close":
        return CloseStream(sid, epoch)
    if kind == "delete":
        return DeleteStream(sid, epoch)
    if kind == "trim":
        return TrimStream(sid, epoch, data.draw(st.integers(0, (s["end"] if s else 0) + 2)))
    if kind == "commit":
        chosen = sorted(data.draw(st.sets(st.sampled_from([*ids, len(ids)]), max_size=3)) | {sid})
        ranges, epochs = [], {}
        for x in chosen:
            known = model.streams.get(x, {"end": 0, "epoch": 0})
            start = max(0, known["end"] + data.draw(st.sampled_from([0, 0, 0, -1, 1])))
            ranges.append((x, start, start + data.draw(st.integers(1, 5))))
            epochs[x] = epoch if x == sid else known["epoch"]
        return CommitObjects((obj(next_key(), *ranges),), epochs)
    if kind == "compact":
        return draw_compaction(data, model, next_key)
    if kind == "purge":
        if not model.objects:
            return None
        return PurgeObjects((data.draw(st.sampled_from(sorted(model.objects))),))
    node = data.draw(st.sampled_from(["n1", "n2"]))
    return RegisterNode(node, max(0, model.nodes.get(node, 0) + 1 + delta))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_ops_match_a_simple_model(data: st.DataObject) -> None:
    """Two managers on one store take turns; each op succeeds or fails exactly as the
    model says, whichever manager commits it, though its view is usually stale. A third
    manager that only refreshes checks the state after every step."""
    store = MemoryObjectStore()
    clock = ManualClock()
    managers = [
        MetadataManager(store, clock=clock, writer_id=w, checkpoint_interval=4) for w in "ABO"
    ]
    for m in managers:
        m.load()
    observer = managers.pop()
    model = Model()
    counter = iter(range(1 << 30))
    next_key = lambda: f"k{next(counter)}"  # noqa: E731
    for _ in range(data.draw(st.integers(5, 30), label="steps")):
        m = data.draw(st.sampled_from(managers), label="writer")
        op = draw_op(data, model, next_key)
        if op is None:
            continue
        expected = model.expect(op)
        seq = observer.seq
        if expected is None:
            entry, _ = m.commit(fixed(op))
            model.apply(op)
            assert entry.seq == seq + 1
        else:
            with pytest.raises(expected):
                m.commit(fixed(op))
        observer.refresh()
        assert observer.seq == seq + (expected is None)
        state = observer.state
        for sid, ms in model.streams.items():
            got = state.streams[sid]
            assert (got.epoch, got.start_offset, got.end_offset, got.state.value) == (
                ms["epoch"],
                ms["start"],
                ms["end"],
                ms["state"],
            )
            assert [o.key for o in state.stream_objects(sid)] == model.live_keys(sid)
        assert {k: o.live for k, o in state.objects.items()} == {
            k: live for k, (_, live) in model.objects.items()
        }
        assert {n: x.epoch for n, x in state.nodes.items()} == model.nodes
    assert check_state(observer.state) == []
    for m in managers:
        m.refresh()
        assert same_state(m.state, observer.state)
    fresh = MetadataManager(store, clock=clock, writer_id="C")
    fresh.load()
    assert same_state(fresh.state, observer.state)


def test_open_stream_owned_by_another_node(backend: MetadataBackend) -> None:
    ma, mb = manager(backend, writer="A"), manager(backend, writer="B")
    sid = ma.create_stream({}).stream_id
    ma.open_stream(sid, "node-a")
    seq = ma.seq
    # B's view is stale (it never saw the open): judged on the state it commits after.
    with pytest.raises(StreamOwnedError, match="open on node 'node-a'") as err:
        mb.open_stream(sid, "node-b")
    assert (err.value.stream_id, err.value.owner) == (sid, "node-a")
    assert mb.seq == seq  # nothing written
    assert ma.open_stream(sid, "node-a").epoch == 2  # the owner itself may reopen
    ma.close_stream(sid, 2)
    assert mb.open_stream(sid, "node-b").epoch == 3  # closed: free for anyone
    assert ma.open_stream(sid, "node-a", force=True).epoch == 4


def test_a_rolled_back_log_is_refused_by_a_client_that_saw_more(
    backend: MetadataBackend,
) -> None:
    """Entries are never deleted: a client that applied entry N and finds it gone (someone
    deleted the newest entries) raises `CorruptionError` instead of writing a different
    history under the same numbers."""
    m = manager(backend)
    for _ in range(5):
        m.create_stream({})
    seen = m.state.seq
    assert m.refresh() is False  # nothing new, nothing wrong
    other = manager(backend, writer="w2")
    other.create_stream({})
    backend.delete_entries([seen - 1, seen, seen + 1])
    with pytest.raises(CorruptionError, match="gone") as err:
        m.refresh()
    assert err.value.location == m.log.entry_key(seen)
    with pytest.raises(CorruptionError):
        m.create_stream({})


@pytest.mark.parametrize("how", ["refresh", "commit"])
def test_a_log_rolled_back_and_written_again_is_refused(backend: MetadataBackend, how: str) -> None:
    """A restored older log on which other writers committed again holds entries of the seqs
    a client applied, with other bytes: the client refuses (on a refresh, and in a commit,
    whose serialized path reads that entry anyway) instead of applying the new entries on
    top of the old ones and writing on that mix."""
    m = manager(backend)
    for n in range(3):
        m.create_stream({"who": "m", "n": str(n)})
    seen = m.state.seq
    backend.delete_entries([seen - 1, seen])  # rolled back to an older copy ...
    other = manager(backend, writer="w2")
    while other.state.seq < seen + 1:  # ... and written again, with other entries
        other.create_stream({"who": "other"})
    with pytest.raises(CorruptionError, match="other bytes") as err:
        if how == "refresh":
            m.refresh()
        else:
            m.create_stream({"who": "m", "n": "late"})
    assert err.value.location == m.log.entry_key(seen)
    with pytest.raises(CorruptionError):
        m.create_stream({})
    replay = manager(backend, writer="w3")
    assert not any(st.tags.get("n") == "late" for st in replay.list_streams())


def test_a_hole_in_the_log_is_damage_not_the_end_of_the_log(backend: MetadataBackend) -> None:
    """An entry missing while later ones exist is damage: a loading writer raises instead of
    taking the entries before it as the whole log (and writing its own into the hole)."""
    m = manager(backend, checkpoint_interval=1000)
    for _ in range(6):
        m.create_stream({})
    backend.delete_entries([3])
    with pytest.raises(CorruptionError, match="00000000000000000003"):
        manager(backend, writer="w2", checkpoint_interval=1000)


def test_a_caller_left_out_of_a_full_group_leads_the_next_one(tmp_path: Path) -> None:
    """A group takes at most 256 requests in queue order: a caller whose request was left for
    the next group commits it (leading that group) instead of being told it failed while its
    op is written later."""
    from s3stream.metadata.manager import _MAX_GROUP, _Request

    m = manager(MemoryObjectStore(), writer="w")
    queued = [
        _Request(lambda s, i=i: [RegisterNode(f"other{i}", 1)], m._clock.monotonic() + 60)
        for i in range(_MAX_GROUP + 44)
    ]
    m._queue.extend(queued)  # as that many waiting callers would leave them
    m.commit(lambda s: [RegisterNode("mine", 1)])
    assert "mine" in m.state.nodes and not m._queue
    assert all(r.done and r.error is None for r in queued)


def test_a_commit_interrupted_while_queued_is_withdrawn(tmp_path: Path) -> None:
    """Ctrl-C in a commit queued behind a leader: its request leaves the queue, so no later
    group writes the ops of a call its caller saw fail."""
    import signal

    class Slow(MemoryObjectStore):
        def put_if_absent(self, key: str, data: bytes) -> bool:
            time.sleep(1.0)
            return super().put_if_absent(key, data)

    m = manager(Slow(), writer="w", clock=SystemClock())
    leader = threading.Thread(target=lambda: m.commit(lambda s: [RegisterNode("leader", 1)]))
    leader.start()
    time.sleep(0.2)  # the leader is writing its entry
    timer = threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        m.commit(lambda s: [RegisterNode("interrupted", 1)])
    leader.join(10)
    assert not m._queue
    m.commit(lambda s: [RegisterNode("unrelated", 1)])
    assert "interrupted" not in m.state.nodes and "unrelated" in m.state.nodes


def test_a_checksummed_entry_with_a_string_that_is_not_utf8_is_damage() -> None:
    """Bytes that pass the frame's crc32c but hold a string that is not UTF-8 (a writer bug,
    or damage before the checksum was computed) are `CorruptionError`, like any entry that
    does not decode: never a bare `UnicodeDecodeError` out of load or `s3stream verify`."""
    import struct

    import crc32c
    import msgspec

    from s3stream.metadata.audit import audit_log
    from s3stream.metadata.codec import decode_entry, encode_entry

    good = msgspec.msgpack.encode({"seq": 1, "ops": [], "writer": "WW", "ts_ms": 0})
    body = good.replace(b"\xa2WW", b"\xa2\xff\xfe")
    data = encode_entry(LogEntry(seq=1, ops=(), writer="WW", ts_ms=0))
    head = data[: len(data) - len(good)]
    magic, version, _ = struct.unpack("<4sHI", head)
    bad = struct.pack("<4sHI", magic, version, crc32c.crc32c(body)) + body
    with pytest.raises(CorruptionError, match="does not decode"):
        decode_entry(bad, "meta/log/1")
    store = MemoryObjectStore()
    store.put("meta/log/00000000000000000001", bad)
    with pytest.raises(CorruptionError):
        manager(store, writer="r")
    report = audit_log(MetadataLog(store))
    assert report  # damage reported, not raised


def test_an_op_the_format_cannot_hold_is_an_invalid_argument() -> None:
    """A str that is not UTF-8 (a lone surrogate) or an int past 64 bits in an op fails that
    commit with `InvalidArgumentError`, not a bare encoding error."""
    m = manager(MemoryObjectStore())
    with pytest.raises(InvalidArgumentError):
        m.commit(lambda s: [RegisterNode("bad\ud800", 1)])
    with pytest.raises(InvalidArgumentError):
        m.commit(lambda s: [RegisterNode("big", 1 << 70)])
    m.create_stream({})  # the manager goes on


def test_a_slow_checkpoint_write_keeps_the_commits_deadline() -> None:
    """A commit whose entry lands on a checkpoint seq returns by its deadline even when the
    checkpoint's PUT is slow: the checkpoint is finished in the background, and a manager
    loaded afterwards starts from it."""

    class SlowCheckpoints(MemoryObjectStore):
        def put(self, key: str, data: bytes) -> None:
            if "/checkpoints/" in key:
                time.sleep(1.5)
            super().put(key, data)

    store = SlowCheckpoints()
    m = manager(store, clock=SystemClock(), checkpoint_interval=2, commit_timeout_s=0.4)
    m.create_stream({})
    started = time.monotonic()
    m.create_stream({})  # entry 2: a checkpoint
    assert time.monotonic() - started < 1.0
    assert store.head("meta/checkpoint") is None
    deadline = time.monotonic() + 10
    while store.head("meta/checkpoint") is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    later = manager(store, "w2", clock=SystemClock())
    assert len(later.list_streams()) == 2


def test_a_checkpoint_left_to_the_background_is_finished_before_close_returns(
    tmp_path: Path,
) -> None:
    """A commit past its deadline leaves its checkpoint write to the background; the
    client's close waits for it (within its own deadline) before closing the store, so
    nothing is written for a client whose close returned (a store moved away after close
    reappeared with meta/checkpoint in it) and no write is cut at the interpreter's exit."""
    import shutil

    import s3stream
    from s3stream import ClientSettings
    from s3stream.wal.memory import MemoryWal

    class SlowCheckpoints(LocalObjectStore):
        def put(self, key: str, data: bytes) -> None:
            if "/checkpoints/" in key:
                time.sleep(1.0)
            super().put(key, data)

    root = tmp_path / "store"
    settings = ClientSettings(
        metadata_checkpoint_interval=4, metadata_commit_timeout_ms=300, call_timeout_ms=300
    )
    client = s3stream.StreamClient(
        SlowCheckpoints(root), MemoryWal(), node_id="n1", settings=settings
    )
    started = time.monotonic()
    for _ in range(3):
        client.create_stream()  # entries 2-4: 4 is a checkpoint
    assert time.monotonic() - started < 0.9  # the commit kept its deadline
    client.close(timeout_s=10)
    assert (root / "meta" / "checkpoint").exists()
    shutil.move(root, tmp_path / "moved")
    time.sleep(1.2)
    assert not root.exists()
    with s3stream.open(tmp_path / "moved", wal="memory://") as again:
        assert len(again.list_streams()) == 3


@pytest.mark.parametrize("hole", [1, 2, 5])
def test_a_hole_at_the_tip_of_a_run_is_found_at_load(backend: MetadataBackend, hole: int) -> None:
    """Entries from 4 on are gone, `hole` of them (damage, or a partial copy, whose tools
    copy keys in any order): the replay stops there, and nothing in its run tells the hole
    from the tip. Loading read a short, older history without a word (and a writer then
    filled the hole with entries of its own, under which the later ones were replayed); the
    load looks past the tip and finds it (a hole of 2 or more went unseen: one HEAD at
    tip + 2)."""
    m = manager(backend, checkpoint_interval=1000)
    for _ in range(14):
        m.create_stream({})
    backend.delete_entries(list(range(4, 4 + hole)))
    with pytest.raises(CorruptionError, match=r"00000000000000000004"):
        manager(backend, writer="w3", checkpoint_interval=1000)
    backend.delete_entries(list(range(4 + hole, 15)))
    assert manager(backend, writer="w3").seq == 3  # the tip, not a hole: loads


def test_a_node_keeps_the_wal_identity_its_last_stream_open_recorded(
    backend: MetadataBackend,
) -> None:
    """`OpenStream.wal_uid` becomes the node's `NodeMeta.wal_uid`; a registration (every open
    of the node) keeps it, an open without one (a WAL without identity, or a client from
    before identities) makes it unknown again, checkpoints and replays carry it; and an op
    without it encodes as before (old readers see the same bytes)."""
    m = manager(backend)
    assert m.register_node("n1") == 1
    assert m.state.nodes["n1"].wal_uid is None
    sid = m.create_stream({}, open_for="n1", wal_uid=111).stream_id
    assert m.state.nodes["n1"].wal_uid == 111
    m.register_node("n1")
    assert m.state.nodes["n1"] == NodeMeta("n1", 2, 111)
    m.open_stream(sid, "n1")
    assert m.state.nodes["n1"].wal_uid is None
    m.open_stream(sid, "n1", wal_uid=222)
    m.open_stream(m.create_stream({}).stream_id, "other", wal_uid=333)  # an unregistered node
    assert m.state.nodes["n1"].wal_uid == 222 and "other" not in m.state.nodes
    assert same_state(manager(backend, writer="r").state, m.state)
    assert MetadataState.from_checkpoint(m.state.to_checkpoint()).nodes["n1"].wal_uid == 222
    plain = LogEntry(seq=1, ops=(OpenStream(0, 1, "n1"),), writer="w", ts_ms=0)
    assert b"wal_uid" not in encode_entry(plain)
    with pytest.raises(InvalidArgumentError, match="wal_uid"):
        m.open_stream(sid, "n1", wal_uid=-5)


def test_registered_again_judges_a_node_session_the_same_for_every_caller() -> None:
    def register(state: MetadataState, node: str, epoch: int) -> MetadataState:
        entry = LogEntry(seq=state.seq + 1, ops=(RegisterNode(node, epoch),), writer="w", ts_ms=0)
        return state.apply(entry)

    first = register(MetadataState.empty(), "n1", 1)
    assert first.registered_again("n1", 1) is None
    # A state that never saw the node cannot say its session ended.
    assert first.registered_again("n2", 1) is None
    second = register(first, "n1", 2)
    ended = second.registered_again("n1", 1)
    assert ended is not None and "'n1'" in ended and "epoch is 2" in ended
    assert second.registered_again("n1", 2) is None
