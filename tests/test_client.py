"""End-to-end behaviour of StreamClient and Stream on the memory WAL over real stores."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import (
    ClientSettings,
    CorruptionError,
    FencedError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    RecordBatch,
    S3StreamError,
    StreamClosedError,
    StreamNotFoundError,
    StreamOwnedError,
    UnavailableError,
)
from s3stream.objectstore.local import LocalObjectStore
from s3stream.wal.memory import MemoryWal

SMALL = ClientSettings(
    upload_threshold_bytes=64 * 1024,
    stream_split_bytes=32 * 1024,
    block_target_bytes=8 * 1024,
    max_pending_bytes=1 << 20,
    upload_interval_ms=0,
)


def open_local(path: Path, **kw: object) -> s3stream.StreamClient:
    kw.setdefault("wal", "memory://")
    kw.setdefault("settings", SMALL)
    return s3stream.open(str(path), **kw)  # type: ignore[arg-type]


def payload(i: int, size: int = 100) -> bytes:
    return (f"{i:08d}".encode() * (size // 8 + 1))[:size]


def read_all(stream: s3stream.Stream, start: int | None = None) -> list[s3stream.FetchedBatch]:
    out = []
    offset = stream.start_offset if start is None else start
    while offset < stream.confirm_offset:
        res = stream.fetch(offset, max_bytes=10_000)
        assert res.batches, f"no progress at {offset}"
        out.extend(res.batches)
        offset = res.next_offset
    return out


def test_append_fetch_offsets(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream(tags={"topic": "t"})
        assert (s.start_offset, s.confirm_offset, s.next_offset, s.epoch) == (0, 0, 0, 1)
        r1 = s.append(RecordBatch(b"a", count=3, base_timestamp=5, properties={"k": "v"}))
        r2 = s.append(RecordBatch(b"bb"))
        assert (r1.base_offset, r1.next_offset, r2.base_offset) == (0, 3, 3)
        assert s.confirm_offset == 4
        res = s.fetch(1)
        assert [(b.base_offset, b.count, b.payload) for b in res.batches] == [
            (0, 3, b"a"),
            (3, 1, b"bb"),
        ]
        assert res.batches[0].properties == {"k": "v"}
        assert res.batches[0].base_timestamp == 5
        assert res.batches[0].last_offset == 2
        assert res.next_offset == 4
        assert s.fetch(4).batches == []


def test_reopen_sees_everything_after_close(tmp_path: Path) -> None:
    expected: dict[int, list[bytes]] = {}
    with open_local(tmp_path) as client:
        streams = [client.create_stream(tags={"p": str(i)}) for i in range(5)]
        for i in range(2000):
            s = streams[i % 5]
            s.append(RecordBatch(payload(i, 50 + i % 300), count=1 + i % 3))
            expected.setdefault(s.stream_id, []).append(payload(i, 50 + i % 300))
        client.flush()
        assert client.metrics.storage.uploads >= 1
    with open_local(tmp_path) as client2:
        for sid, payloads in expected.items():
            s = client2.open_stream(sid)
            assert s.epoch == 2
            got = read_all(s)
            assert [b.payload for b in got] == payloads
            offs = [b.base_offset for b in got]
            assert offs == sorted(offs) and offs[0] == 0
        infos = client2.list_streams()
        assert sorted(i.stream_id for i in infos) == sorted(expected)
        assert [i.stream_id for i in client2.list_streams(tags={"p": "3"})] == [
            streams[3].stream_id
        ]


def test_threshold_triggers_upload_without_flush(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream()
        for i in range(100):
            s.append(RecordBatch(payload(i, 1000)))  # 100 KB > 64 KiB threshold
        deadline = time.monotonic() + 10
        while client.metrics.storage.uploads == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.metrics.storage.uploads >= 1
        assert client.metadata.state.get_stream(s.stream_id).end_offset > 0


def test_stream_objects_and_stream_set_objects(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        big = client.create_stream()
        small = client.create_stream()
        for i in range(40):
            big.append(RecordBatch(payload(i, 1000)))
        small.append(RecordBatch(b"x"))
        client.flush()
        kinds = sorted(o.kind.value for o in client.metadata.state.objects.values())
        assert "stream" in kinds and "stream_set" in kinds
        # reads now come from objects (the LogCache is bypassed for offsets it never held)
        assert [b.payload for b in read_all(big)] == [payload(i, 1000) for i in range(40)]


def test_concurrent_appends_many_threads(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        streams = [client.create_stream() for _ in range(4)]
        errors: list[BaseException] = []

        def worker(t: int) -> None:
            try:
                for i in range(300):
                    streams[(t + i) % 4].append(RecordBatch(f"{t}:{i}".encode()))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        total = 0
        for s in streams:
            got = read_all(s)
            assert [b.base_offset for b in got] == list(range(len(got)))
            total += len(got)
        assert total == 8 * 300
        # per thread, the order of its appends to one stream is preserved
        for s in streams:
            seen: dict[str, int] = {}
            for b in read_all(s):
                t, i = b.payload.decode().split(":")
                assert seen.get(t, -1) < int(i)
                seen[t] = int(i)


def test_append_async_futures_resolve_in_order(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream()
        order: list[int] = []
        futs = [s.append_async(RecordBatch(b"x", count=2)) for _ in range(100)]
        for f in futs:
            f.add_done_callback(lambda f: order.append(f.result().base_offset))
        assert [f.result().base_offset for f in futs] == list(range(0, 200, 2))
        assert order == sorted(order)


def test_synchronous_appends_drive_the_file_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Stream.append` lets the WAL commit in the calling thread (`WriteAheadLog.drive`);
    appends with a timeout and asynchronous ones leave it to the WAL's writer."""
    from s3stream.wal.file import FileWal

    driven: list[int] = []
    real = FileWal.drive

    def spy(self: FileWal, future: object) -> None:
        driven.append(threading.get_ident())
        real(self, future)  # type: ignore[arg-type]

    monkeypatch.setattr(FileWal, "drive", spy)
    wal = f"file://{tmp_path}/node.wal?caller_commits=1"
    with open_local(tmp_path / "store", wal=wal) as client:
        s = client.create_stream()
        assert s.append(RecordBatch(b"a")).base_offset == 0
        assert driven == [threading.get_ident()]
        assert s.append(RecordBatch(b"b"), timeout_s=10).base_offset == 1
        assert s.append_async(RecordBatch(b"c")).result(timeout=10).base_offset == 2
        assert len(driven) == 1
        assert [b.payload for b in read_all(s)] == [b"a", b"b", b"c"]


def test_trim(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream()
        for i in range(10):
            s.append(RecordBatch(payload(i), count=2))
        s.trim(7)  # beyond the committed end: flushes first
        assert s.start_offset == 7
        with pytest.raises(OffsetOutOfRangeError):
            s.fetch(6)
        first = s.fetch(7).batches[0]
        assert first.base_offset == 6  # whole batches: the first may begin before start
        with pytest.raises(OffsetOutOfRangeError):
            s.trim(21)
        sid = s.stream_id
    with open_local(tmp_path) as client:
        s = client.open_stream(sid)
        assert s.start_offset == 7


def test_a_trim_below_a_start_that_another_process_moved_is_a_no_op(tmp_path: Path) -> None:
    """Retention in another process (a standalone compaction) moved the start to 12 after
    this owner last read the metadata: its trim to 5 is done already, not an internal
    invariant error ("I5: ... a trim never moves back")."""
    from s3stream.clock import ManualClock
    from s3stream.metadata import MetadataManager

    with open_local(tmp_path) as client:
        s = client.create_stream()
        for i in range(10):
            s.append(RecordBatch(payload(i), count=2))
        client.flush()
        other = MetadataManager(LocalObjectStore(tmp_path), clock=ManualClock(), writer_id="job")
        other.load()
        other.trim_stream(s.stream_id, other.get_stream(s.stream_id).epoch, 12)
        s.trim(5)
        assert s.start_offset == 12
        with pytest.raises(OffsetOutOfRangeError):
            s.fetch(11)


def test_destroy_and_unknown_stream(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream()
        s.append(RecordBatch(b"x"))
        sid = s.stream_id
        s.destroy()
        with pytest.raises(StreamClosedError):
            s.append(RecordBatch(b"y"))
        with pytest.raises(StreamClosedError):
            s.fetch(0)
        with pytest.raises(StreamNotFoundError):
            client.open_stream(sid)
        with pytest.raises(StreamNotFoundError):
            client.open_stream(12345)
        assert client.list_streams() == []


def test_closed_stream_and_client(tmp_path: Path) -> None:
    client = open_local(tmp_path)
    s = client.create_stream()
    s.append(RecordBatch(b"x"))
    s.close()
    with pytest.raises(StreamClosedError):
        s.append(RecordBatch(b"y"))
    s2 = client.open_stream(s.stream_id)
    assert s2.fetch(0).batches[0].payload == b"x"
    client.close()
    with pytest.raises(StreamClosedError):
        s2.append(RecordBatch(b"z"))
    with pytest.raises(StreamClosedError):
        client.create_stream()
    client.close()  # idempotent


def hold_first_entry(
    client: s3stream.StreamClient, monkeypatch: pytest.MonkeyPatch, until: Callable[[], bool]
) -> threading.Event:
    """Make the client's next metadata entry wait, before it is written, until `until()` is
    true (at most 10 s); the event is set once it waits."""
    log = client.metadata.log
    create = log.create_entry
    waiting = threading.Event()
    first = [True]

    def held(seq: int, data: bytes) -> bool:
        if first[0]:
            first[0] = False
            waiting.set()
            deadline = time.monotonic() + 10
            while not until() and time.monotonic() < deadline:
                time.sleep(0.001)
        return create(seq, data)

    monkeypatch.setattr(log, "create_entry", held)
    return waiting


def test_create_streams_one_entry_ids_in_order_usable(tmp_path: Path) -> None:
    from s3stream.metadata import CreateStream, OpenStream

    with open_local(tmp_path, node_id="n1") as client:
        first = client.create_stream({"topic": "t"})
        seq = client.metadata.seq
        streams = client.create_streams([{"p": str(i)} for i in range(5)] + [None])
        # One entry: each stream created and opened, in the order given, ids consecutive.
        assert client.metadata.seq == seq + 1
        ops = client.metadata.log.read_entry(seq + 1)[0].ops
        assert [type(op) for op in ops] == [CreateStream, OpenStream] * 6
        ids = [s.stream_id for s in streams]
        assert ids == list(range(first.stream_id + 1, first.stream_id + 7))
        assert [op.stream_id for op in ops[::2]] == ids
        assert [dict(s.tags) for s in streams] == [{"p": str(i)} for i in range(5)] + [{}]
        for s in streams:
            assert s.epoch == 1
            s.append(RecordBatch(b"in %d" % s.stream_id))
        assert client.open_stream(ids[2]) is streams[2]  # the client's own handle
        infos = client.list_streams()
        assert [i.stream_id for i in infos] == [first.stream_id, *ids]
    with open_local(tmp_path, node_id="n2") as other:
        # Released by close(): another node opens them without a take-over.
        for sid in ids:
            got = other.open_stream(sid).fetch(0).batches
            assert [b.payload for b in got] == [b"in %d" % sid]


def test_create_streams_splits_big_batches_into_entries(tmp_path: Path) -> None:
    from s3stream.metadata.manager import MAX_CREATES_PER_ENTRY

    with open_local(tmp_path) as client:
        seq = client.metadata.seq
        streams = client.create_streams([{"n": str(i)} for i in range(MAX_CREATES_PER_ENTRY + 3)])
        assert client.metadata.seq == seq + 2
        sizes = [len(client.metadata.log.read_entry(q)[0].ops) for q in (seq + 1, seq + 2)]
        assert sizes == [2 * MAX_CREATES_PER_ENTRY, 6]
        assert [s.stream_id for s in streams] == list(range(MAX_CREATES_PER_ENTRY + 3))
        assert streams[-1].tags == {"n": str(MAX_CREATES_PER_ENTRY + 2)}


def test_create_streams_refuses_bad_input(tmp_path: Path) -> None:
    from s3stream.client import MAX_CREATE_BATCH

    with open_local(tmp_path) as client:
        seq = client.metadata.seq
        bad: list[tuple[Any, str]] = [
            ([], "number of streams"),
            ((), "number of streams"),
            ({"topic": "t"}, "sequence"),  # one mapping: a likely slip for [tags]
            ("topic", "sequence"),
            (b"topic", "sequence"),
            (3, "sequence"),
            (None, "sequence"),
            ({None}, "sequence"),  # a set has no order
            ([{"a": "1"}, {"a": 1}], r"tags\[1\]"),
            ([None, "x"], r"tags\[1\]"),
            ([{"retention.ms": "soon"}], r"tags\[0\].*retention"),
            ([None] * (MAX_CREATE_BATCH + 1), "number of streams"),
        ]
        for tags, message in bad:
            with pytest.raises(InvalidArgumentError, match=message):
                client.create_streams(tags)
        # Nothing was written, no id was used.
        assert client.metadata.seq == seq and client.list_streams() == []
        assert client.create_streams([None])[0].stream_id == 0
    with pytest.raises(StreamClosedError):
        client.create_streams([None])


def test_create_streams_whose_commit_fails_creates_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from s3stream.errors import UnavailableError

    with open_local(tmp_path) as client:
        log = client.metadata.log
        create = log.create_entry
        fail_at: list[int] = []

        def failing(seq: int, data: bytes) -> bool:
            if seq in fail_at:
                fail_at.remove(seq)  # once per listing
                raise UnavailableError(f"injected: entry {seq} not written")
            return create(seq, data)

        monkeypatch.setattr(log, "create_entry", failing)
        seq = client.metadata.seq
        fail_at += [seq + 1, seq + 1]
        with pytest.raises(UnavailableError, match="injected"):
            client.create_streams([{"p": "0"}, {"p": "1"}])
        with pytest.raises(UnavailableError, match="injected"):
            client.create_stream()
        assert client.metadata.seq == seq and client.list_streams() == []
        assert client.metadata.state.next_stream_id == 0 and not client._streams
        # A batch of two entries whose second fails: the first one's streams are deleted.
        monkeypatch.setattr(s3stream.client, "MAX_CREATES_PER_ENTRY", 2)
        fail_at[:] = [seq + 2]
        with pytest.raises(UnavailableError, match="injected"):
            client.create_streams([None] * 3)
        assert client.list_streams() == [] and not client._streams
        # Entry seq+1 created 0 and 1; seq+2, after the failed one, deleted them.
        assert client.metadata.seq == seq + 2
        undo = client.metadata.log.read_entry(seq + 2)[0].ops
        assert [(type(op).__name__, op.stream_id) for op in undo] == [  # type: ignore[union-attr]
            ("DeleteStream", 0),
            ("DeleteStream", 1),
        ]
        assert [s.stream_id for s in client.create_streams([None] * 3)] == [2, 3, 4]


def test_concurrent_create_stream_calls_fold_into_one_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creates of several threads do not queue on the client's lock: while one entry is
    being written, the others' creates queue in the metadata manager and go out as ONE
    entry, each stream created and opened."""
    with open_local(tmp_path) as client:
        meta = client.metadata
        seq = meta.seq
        waiting = hold_first_entry(client, monkeypatch, lambda: len(meta._queue) >= 7)
        made: list[s3stream.Stream] = []
        lock = threading.Lock()

        def create(i: int) -> None:
            s = client.create_stream({"i": str(i)})
            with lock:
                made.append(s)

        pool = [threading.Thread(target=create, args=(0,))]
        pool[0].start()
        assert waiting.wait(10)
        pool += [threading.Thread(target=create, args=(i,)) for i in range(1, 8)]
        for t in pool[1:]:
            t.start()
        for t in pool:
            t.join(30)
        assert meta.seq == seq + 2
        assert len(meta.log.read_entry(seq + 2)[0].ops) == 14
        assert sorted(s.stream_id for s in made) == list(range(8))
        assert sorted(s.tags["i"] for s in made) == [str(i) for i in range(8)]
        for s in made:
            assert s.append(RecordBatch(b"x")).base_offset == 0


def test_a_create_whose_stream_another_call_reopened_meanwhile_refuses_its_stale_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a create's commit and its return (no client lock held), another call of the
    same client opens the new stream (epoch 2) and closes it: the create must not hand back
    a handle of epoch 1, whose appends would be acknowledged and then fenced at upload."""
    client = s3stream.open(str(tmp_path / "store"), wal="memory://")
    try:
        real = client.metadata.create_streams

        def racing(tags: object, **kwargs: object) -> object:
            metas = real(tags, **kwargs)  # type: ignore[arg-type]
            client.open_stream(metas[0].stream_id).close()
            return metas

        monkeypatch.setattr(client.metadata, "create_streams", racing)
        with pytest.raises(FencedError, match="opened by another call"):
            client.create_stream()
        monkeypatch.undo()
        again = client.open_stream(0)
        assert again.epoch == 3
        again.append(RecordBatch(b"kept"))
        client.flush()
    finally:
        client.close()


def test_close_racing_a_create_releases_its_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create in flight when close() starts is waited for: its stream is attached, then
    released with the others (another node opens it without a take-over)."""
    client = open_local(tmp_path, node_id="n1")
    waiting = hold_first_entry(client, monkeypatch, lambda: client.closed)
    got: list[Any] = []
    creator = threading.Thread(target=lambda: got.append(client.create_streams([None, None])))
    creator.start()
    assert waiting.wait(10)
    client.close()
    creator.join(10)
    streams = got[0]
    assert [s.stream_id for s in streams] == [0, 1]
    with pytest.raises(StreamClosedError):
        streams[0].append(RecordBatch(b"late"))
    with open_local(tmp_path, node_id="n2") as other:
        assert [i.state for i in other.list_streams()] == [s3stream.StreamState.CLOSED] * 2
        other.open_stream(1)  # not owned by n1


def test_close_whose_deadline_passes_during_a_create_leaves_nothing_owned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() waits for a create in flight only until its deadline: the create, ending
    later, raises `StreamClosedError` and releases the streams it made itself."""
    client = open_local(tmp_path, node_id="n1")
    waiting = hold_first_entry(client, monkeypatch, client._close_done.is_set)
    got: list[Any] = []

    def create() -> None:
        try:
            got.append(client.create_streams([None, None]))
        except StreamClosedError as exc:
            got.append(exc)

    creator = threading.Thread(target=create)
    creator.start()
    assert waiting.wait(10)
    started = time.monotonic()
    client.close(timeout_s=0.2)
    assert time.monotonic() - started < 5
    creator.join(10)
    assert isinstance(got[0], StreamClosedError) and "released" in str(got[0])
    with open_local(tmp_path, node_id="n2") as other:
        assert [i.state for i in other.list_streams()] == [s3stream.StreamState.CLOSED] * 2


@pytest.mark.parametrize(
    "make",
    [
        lambda: RecordBatch("text"),  # type: ignore[arg-type]
        lambda: RecordBatch(b"x", count=0),
        lambda: RecordBatch(b"x", count=-1),
        lambda: RecordBatch(b"x", count=1.5),  # type: ignore[arg-type]
        lambda: RecordBatch(b"x", base_timestamp="now"),  # type: ignore[arg-type]
        lambda: RecordBatch(b"x", properties={"a": 1}),  # type: ignore[dict-item]
    ],
)
def test_bad_batches(make: object) -> None:
    with pytest.raises(InvalidArgumentError):
        make()  # type: ignore[operator]


def test_bad_fetch_and_trim_arguments(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream()
        s.append(RecordBatch(b"x", count=5))
        for bad in (-1, "0", 1.0, True, None):
            with pytest.raises(InvalidArgumentError):
                s.fetch(bad)  # type: ignore[arg-type]
        with pytest.raises(OffsetOutOfRangeError):
            s.fetch(6)
        with pytest.raises(InvalidArgumentError):
            s.fetch(3, 2)
        with pytest.raises(InvalidArgumentError):
            s.fetch(0, max_bytes=0)
        with pytest.raises(InvalidArgumentError):
            s.trim(-3)
        with pytest.raises(InvalidArgumentError):
            s.append(b"raw bytes")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            client.open_stream("1")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            client.create_stream(tags={"a": 1})  # type: ignore[dict-item]
        # nothing was lost by the bad calls
        assert s.fetch(0).batches[0].count == 5


def test_max_bytes_is_soft(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream()
        for i in range(20):
            s.append(RecordBatch(payload(i, 1000)))
        assert len(s.fetch(0, max_bytes=1).batches) == 1
        assert len(s.fetch(0, max_bytes=3000).batches) == 3
        client.flush()
    with open_local(tmp_path) as client:
        s = client.open_stream(s.stream_id)
        assert len(s.fetch(0, max_bytes=1).batches) == 1
        got = s.fetch(0, max_bytes=3000).batches
        assert 1 <= len(got) <= 3
        assert s.fetch(5, 7).batches[0].base_offset == 5


def test_fencing_between_two_clients(tmp_path: Path) -> None:
    store_a = open_local(tmp_path, node_id="a")
    s_a = store_a.create_stream()
    s_a.append(RecordBatch(b"committed"))
    store_a.flush()
    s_a.append(RecordBatch(b"never committed"))
    with open_local(tmp_path, node_id="b") as client_b:
        # A still has the stream open, with an acknowledged batch not uploaded.
        with pytest.raises(StreamOwnedError, match="open on node 'a'") as owned:
            client_b.open_stream(s_a.stream_id)
        assert (owned.value.owner, owned.value.stream_id) == ("a", s_a.stream_id)
        assert not owned.value.retryable
        s_b = client_b.open_stream(s_a.stream_id, force=True)
        assert s_b.epoch == 2
        assert s_b.next_offset == 1  # B starts at the committed end
        s_b.append(RecordBatch(b"from b"))
        client_b.flush()
        # A's upload loses: its stream is fenced and its acknowledged batch dropped, which
        # A's flush reports (once), and so does its close.
        with pytest.raises(FencedError, match=r"stream 0 offsets \[1, 2\).*node 'b'"):
            store_a.flush()
        store_a.flush()
        with pytest.raises(FencedError):
            s_a.append(RecordBatch(b"zombie"))
        with pytest.raises(FencedError):
            s_a.fetch(0)
        assert [b.payload for b in read_all(s_b, 0)] == [b"committed", b"from b"]
    with pytest.raises(FencedError, match="dropped"):
        store_a.close()
    with open_local(tmp_path, node_id="c") as c:
        assert [b.payload for b in c.read(s_a.stream_id, 0).batches] == [b"committed", b"from b"]


def test_read_without_opening(tmp_path: Path) -> None:
    with open_local(tmp_path, node_id="w") as writer:
        s = writer.create_stream()
        for i in range(10):
            s.append(RecordBatch(payload(i)))
        writer.flush()
        with open_local(tmp_path, node_id="r") as reader:
            got = reader.read(s.stream_id, 0).batches
            assert [b.payload for b in got] == [payload(i) for i in range(10)]
            assert reader.stream_info(s.stream_id).epoch == 1  # not fenced
        s.append(RecordBatch(b"still the owner"))


def test_corrupted_object_names_object_and_position(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream()
        for i in range(10):
            s.append(RecordBatch(payload(i, 500)))
        sid = s.stream_id
    store = LocalObjectStore(tmp_path)
    (key,) = [o.key for o in store.list("data/")]
    path = tmp_path / key
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with open_local(tmp_path) as client:
        with pytest.raises(CorruptionError) as err:
            client.read(sid, 0)
        assert key in str(err.value)
        assert err.value.location == key
        assert err.value.position is not None


def test_no_list_on_append_and_fetch_path(tmp_path: Path) -> None:
    with open_local(tmp_path) as client:
        s = client.create_stream()
        lists_before = client.metrics.object_store.lists
        for i in range(500):
            s.append(RecordBatch(payload(i, 300)))
        client.flush()
        read_all(s)
        assert client.metrics.object_store.lists == lists_before == 0


def test_wal_records_recovered_after_crash(tmp_path: Path) -> None:
    """A client that dies without closing leaves its batches in the WAL; the next one
    recovers and uploads them (memory WAL medium shared across the 'crash')."""
    wal = MemoryWal()
    client = s3stream.StreamClient(LocalObjectStore(tmp_path), wal, settings=SMALL)
    s = client.create_stream()
    s.append(RecordBatch(b"committed"))
    client.flush()
    for i in range(5):
        s.append(RecordBatch(payload(i)))
    client._storage.abandon()  # crash: no upload, no WAL close
    medium = wal.medium
    client2 = s3stream.StreamClient(LocalObjectStore(tmp_path), MemoryWal(medium), settings=SMALL)
    assert client2.recovery.uploaded_batches == 5
    assert client2.recovery.already_committed == 0
    s2 = client2.open_stream(s.stream_id)
    assert [b.payload for b in read_all(s2)] == [b"committed"] + [payload(i) for i in range(5)]
    client2.close()


def test_close_after_a_restart_releases_the_streams_the_node_did_not_reopen(
    tmp_path: Path,
) -> None:
    """A node restarted after a crash recovers its WAL (everything uploaded) and reopens only
    some of its streams: `close()` releases the others too (the metadata says this node owns
    them and nothing of theirs is in its WAL), so another node opens them without a
    take-over; a stream another node owns is left alone."""
    root = tmp_path / "store"
    a = s3stream.open(root, node_id="n")
    kept, left = a.create_stream(), a.create_stream()
    kept.append(RecordBatch(b"kept"))
    left.append(RecordBatch(b"left"))
    a.abandon()  # crash
    other = s3stream.open(root, node_id="other")
    theirs = other.create_stream()
    again = s3stream.open(root, node_id="n")
    assert again.recovery.uploaded_batches == 2
    again.open_stream(kept.stream_id).append(RecordBatch(b"kept 2"))
    again.close()
    info = other.stream_info(left.stream_id)
    assert info.state is s3stream.StreamState.CLOSED
    s = other.open_stream(left.stream_id)  # no StreamOwnedError: released by n's close
    assert [b.payload for b in read_all(s)] == [b"left"]
    assert other.stream_info(theirs.stream_id).state is s3stream.StreamState.OPEN
    other.close()


def test_backpressure_when_uploads_fail_then_nothing_lost(
    tmp_path: Path, stuck_uploads_client: Callable[[int], Any]
) -> None:
    """Uploads fail (data PUTs rejected): appends block at max_pending_bytes, then raise
    BackpressureError; once the store heals, everything acknowledged is uploaded."""
    client, faulty = stuck_uploads_client(300)
    s = client.create_stream()
    acked = []
    with pytest.raises(s3stream.BackpressureError):
        for i in range(1000):
            acked.append(s.append(RecordBatch(payload(i, 1000))).base_offset)
    assert 40 <= len(acked) < 1000
    with pytest.raises(s3stream.UnavailableError):
        client.flush(timeout_s=0.5)
    with faulty.healthy():
        client.flush()
        got = [b.payload for b in read_all(s)]
        assert got == [payload(i, 1000) for i in range(len(acked))]
        client.close()
    with open_local(tmp_path) as c2:
        assert c2.stream_info(s.stream_id).end_offset == len(acked)


def test_unreachable_s3_endpoint_is_unavailable_after_bounded_retries() -> None:
    import socket

    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(s3stream.UnavailableError):
        s3stream.open(
            "s3://bucket/prefix",
            wal="memory://",
            storage_options={
                "endpoint_url": f"http://127.0.0.1:{port}",
                "aws_access_key_id": "k",
                "aws_secret_access_key": "s",
                "region_name": "us-east-1",
            },
            # The retries are bounded by the store timeout (the default's 30 s took ~19 s).
            settings={"store_timeout_ms": 4000},
        )
    assert time.monotonic() - t0 < 4 + 5


def test_owner_sees_start_offset_moved_by_retention_elsewhere(tmp_path: Path) -> None:
    """Retention run by another process's compactor moves the owner's `start_offset` once
    the owner has read the trim from the metadata log (at its next upload commit)."""
    clock = s3stream.ManualClock()
    url = str(tmp_path / "store")
    settings = s3stream.ClientSettings(compaction=s3stream.CompactionSettings(deletion_delay_ms=0))
    with s3stream.open(
        url, wal="memory://", node_id="owner", clock=clock, settings=settings
    ) as owner:
        s = owner.create_stream(tags=s3stream.RetentionPolicy(retention_ms=30_000).to_tags())
        for _ in range(6):
            s.append(RecordBatch(b"x" * 1000, count=2))
            owner.flush()
            clock.advance(10)
        assert s.start_offset == 0
        with s3stream.open(
            url, wal="memory://", node_id="compactor", clock=clock, settings=settings
        ) as other:
            assert other.compact().streams_trimmed == 1
            trimmed = other.stream_info(s.stream_id).start_offset
        assert trimmed > 0
        s.append(RecordBatch(b"y" * 1000, count=2))
        owner.flush()  # the owner's next commit reads the trim
        assert s.start_offset == trimmed
        with pytest.raises(OffsetOutOfRangeError):
            s.fetch(trimmed - 1)
        assert s.fetch(trimmed).batches[0].base_offset == trimmed
        s.trim(trimmed - 2)  # below the start already: nothing to do
        assert s.start_offset == trimmed


def _reopen_once_the_wal_closed(tmp_path: Path) -> s3stream.StreamClient:
    """The store of a client closed from an append's callback, reopened on its WAL once the
    WAL's thread has finished closing it (after the callback returned)."""
    for _ in range(100):
        try:
            return open_local(tmp_path / "store", wal=f"file://{tmp_path}/node.wal")
        except s3stream.NodeInUseError:
            time.sleep(0.05)
    return open_local(tmp_path / "store", wal=f"file://{tmp_path}/node.wal")


def test_close_from_an_append_callback_closes_cleanly(tmp_path: Path) -> None:
    """`close()` called in an append's completion callback (a WAL thread completing futures)
    succeeds within its deadline: the append is no longer in flight once its outcome is
    known, and the WAL's close is finished by that thread once the callback returns. It took
    most of its deadline (60 s by default): the upload's WAL trim waited for the thread the
    callback held; the uploader's trim does not wait now (`WriteAheadLog.trim_soon`)."""
    outcome: list[object] = []
    client = open_local(tmp_path / "store", wal=f"file://{tmp_path}/node.wal")
    s = client.create_stream()
    s.append(RecordBatch(b"a"))

    def close_now(_: object) -> None:
        started = time.monotonic()
        try:
            client.close(timeout_s=2)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        outcome.append(time.monotonic() - started)

    s.append_async(RecordBatch(b"b")).add_done_callback(close_now)
    deadline = time.monotonic() + 20
    while len(outcome) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outcome and outcome[0] is None, outcome
    assert isinstance(outcome[1], float) and outcome[1] < 1.0, outcome
    with _reopen_once_the_wal_closed(tmp_path) as again:
        assert [b.payload for b in read_all(again.open_stream(s.stream_id))] == [b"a", b"b"]


def test_blocking_calls_in_an_append_callback_fail_at_once_instead_of_at_their_deadline(
    tmp_path: Path,
) -> None:
    """An append's callback runs on the file WAL's thread. A synchronous append made there
    waited for that thread (itself) until its deadline, holding every other append of the
    client the same time; a close made there while another append was queued waited for it
    the same way. Both fail at once now, and the queued append is acknowledged and kept."""
    settings = ClientSettings(upload_interval_ms=0, call_timeout_ms=5000)
    client = open_local(tmp_path / "store", wal=f"file://{tmp_path}/node.wal", settings=settings)
    s, other = client.create_stream(), client.create_stream()
    outcome: list[tuple[str, float]] = []
    queued = threading.Event()

    def call(what: Callable[[], object]) -> Callable[[object], None]:
        def callback(_: object) -> None:
            queued.wait(5)
            time.sleep(0.1)  # the other thread's append is in the WAL's queue by now
            started = time.monotonic()
            try:
                what()
                outcome.append(("returned", time.monotonic() - started))
            except S3StreamError as exc:
                outcome.append((type(exc).__name__, time.monotonic() - started))

        return callback

    def append_other() -> object:
        queued.set()
        return other.append(RecordBatch(b"queued"), timeout_s=10)

    for n, what in enumerate((lambda: s.append(RecordBatch(b"inner")), client.close), 1):
        queued.clear()
        # The WAL's commit takes the file's flock: held here, the append cannot complete
        # before its callback is attached (else the callback runs at once in this thread).
        fd = os.open(tmp_path / "node.wal", os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            s.append_async(RecordBatch(b"outer")).add_done_callback(call(what))
        finally:
            os.close(fd)
        started = time.monotonic()
        assert append_other() is not None
        assert time.monotonic() - started < 2.0  # not held up by the callback
        for _ in range(200):
            if len(outcome) == n:
                break
            time.sleep(0.01)
    assert [name for name, _ in outcome] == ["InvalidArgumentError", "UnavailableError"], outcome
    assert all(took < 1.0 for _, took in outcome), outcome
    with contextlib.suppress(UnavailableError):
        client.close()
    with _reopen_once_the_wal_closed(tmp_path) as again:
        assert [b.payload for b in read_all(again.open_stream(s.stream_id))] == [b"outer"] * 2
        assert [b.payload for b in read_all(again.open_stream(other.stream_id))] == [b"queued"] * 2


def test_close_keeps_its_deadline_while_a_stream_close_holds_the_client() -> None:
    """`Stream.close` uploads under the client's lock; `close(timeout_s=1)` from another
    thread used to wait for it (its whole flush deadline, 8 s here). Now it raises
    `UnavailableError` at its own deadline, closing nothing, and a later close works."""
    settings = s3stream.ClientSettings(
        background_bytes_per_s=2000, call_timeout_ms=4000, upload_interval_ms=0
    )
    client = s3stream.open("memory://", settings=settings)
    stream = client.create_stream()
    stream.append(RecordBatch(b"x" * 60000))  # 30 s of upload at 2 kB/s
    closer = threading.Thread(target=lambda: _ignore_errors(stream.close))
    closer.start()
    time.sleep(0.3)
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="did not start within 1 s"):
        client.close(timeout_s=1)
    assert time.monotonic() - started < 2.0
    assert not client.closed
    closer.join(10)
    client.close(timeout_s=10)  # the limiter lets the upload through once closing
    with pytest.raises(StreamClosedError):
        stream.append(RecordBatch(b"late"))


def _ignore_errors(call: Callable[[], object]) -> None:
    with contextlib.suppress(S3StreamError):
        call()


def test_a_client_whose_wal_failed_still_uploads_what_it_acknowledged(tmp_path: Path) -> None:
    """A failed WAL (here deleted under the writer) stops appends, not uploads: `flush`
    raised the WAL's error at once having uploaded nothing, and `close` left the streams
    open, so the next open demanded accept_wal_loss for appends that were all uploaded."""
    settings = ClientSettings(upload_threshold_bytes=64 << 20, upload_interval_ms=600_000)
    store = tmp_path / "store"
    client = s3stream.open(str(store), settings=settings)
    s = client.create_stream()
    acked = [s.append(RecordBatch(b"rec%d" % i)).base_offset for i in range(3)]
    (store / "wal" / "local.wal").unlink()
    with pytest.raises(CorruptionError, match="deleted under this writer"):
        s.append(RecordBatch(b"after"))
    client.flush(timeout_s=10)  # uploads what was acknowledged
    with pytest.raises(CorruptionError, match="deleted under this writer"):
        client.close(timeout_s=10)  # says the client stopped short, after releasing
    with s3stream.open(str(store), settings=settings) as again:
        got = read_all(again.open_stream(s.stream_id))
    assert [b.base_offset for b in got] == acked
    assert [b.payload for b in got] == [b"rec0", b"rec1", b"rec2"]


def test_a_node_whose_wal_a_take_over_fenced_still_gets_fenced_error_at_once(
    tmp_path: Path,
) -> None:
    """A WAL fenced by a take-over means the node lost its streams, not a WAL failure alone:
    flush must raise FencedError at once (review of the change that lets flush upload past a
    failed WAL: it returned success, or UnavailableError at its deadline)."""
    settings = ClientSettings(upload_threshold_bytes=64 << 20, upload_interval_ms=600_000)
    store = str(tmp_path / "store")
    a = s3stream.open(store, node_id="n1", wal=f"file://{tmp_path}/n1.wal", settings=settings)
    s = a.create_stream()
    for i in range(3):
        s.append(RecordBatch(b"r%d" % i))
    with s3stream.open(store, node_id="n2", wal="memory://", settings=settings) as b:
        b.take_over("n1", wal=f"file://{tmp_path}/n1.wal")
        with pytest.raises(FencedError):
            s.append(RecordBatch(b"after"))
        started = time.monotonic()
        with pytest.raises(FencedError, match="taken over"):
            a.flush(timeout_s=5)
        with pytest.raises(FencedError):
            a.close(timeout_s=5)
        assert time.monotonic() - started < 2.0
        assert [x.payload for x in read_all(b.open_stream(s.stream_id))] == [b"r0", b"r1", b"r2"]


def test_a_metadata_log_rolled_back_under_a_writer_stops_it_for_good(tmp_path: Path) -> None:
    """Newest log entries deleted under a live writer (a restore of an older copy) and
    written again by another: its next upload finds the entry it applied changed. No retry
    can change that, so the flush raises `CorruptionError` naming it at once, and appends are
    refused, instead of every upload retrying for ever behind a retryable "upload keeps
    failing" `UnavailableError`."""
    root = tmp_path / "store"
    client = open_local(root, wal=f"file://{tmp_path / 'a.wal'}?capacity_bytes=1MiB")
    stream = client.create_stream()
    for i in range(3):
        stream.append(RecordBatch(payload(i), count=1))
        client.flush()
    log = client._meta.log
    seq = client._meta.state.seq
    for n in (seq - 1, seq):
        (root / log.entry_key(n)).unlink()  # type: ignore[attr-defined]
    with open_local(root, node_id="other") as other:  # ... and written again
        while other._meta.state.seq <= seq:
            other.create_stream()
    stream.append(RecordBatch(payload(3), count=1))
    started = time.monotonic()
    with pytest.raises(CorruptionError, match="rolled back") as err:
        client.flush()
    assert not err.value.retryable
    assert time.monotonic() - started < 5
    with pytest.raises(CorruptionError):
        stream.append(RecordBatch(payload(4), count=1))
    with pytest.raises(CorruptionError):
        client.close(timeout_s=5)


def test_an_open_whose_recovery_cannot_upload_says_so(tmp_path: Path) -> None:
    """A node reopened with acknowledged appends in its WAL and a store disk with room for
    metadata but not for their object: the open ran out of `call_timeout_ms` retrying the
    upload, and its error blamed a device that was "not answering" (it answered at once,
    with ENOSPC). It names failing uploads (and the log's warnings) too."""
    from s3stream.testing import disk_faults

    wal = f"file://{tmp_path / 'n.wal'}?capacity_bytes=1MiB"
    settings = ClientSettings(upload_interval_ms=60_000, call_timeout_ms=2000)
    with disk_faults.tmpfs(tmp_path / "disk", "size=1m") as disk:
        store = disk / "store"
        client = s3stream.open(store, wal=wal, settings=settings)
        stream = client.create_stream()
        stream.append(RecordBatch(payload(0, 200 << 10)))
        client.abandon()  # a crash: the append is in the WAL only
        filler = disk_faults.fill_filesystem(disk)
        os.truncate(filler, filler.stat().st_size - 16 * 1024)  # room for log entries only
        with pytest.raises(UnavailableError, match="uploads of what its WAL holds kept failing"):
            s3stream.open(store, wal=wal, settings=settings)
        filler.unlink()
        # The open given up goes on in the background: with room now, it uploads and lets go
        # of the WAL.
        deadline = time.monotonic() + 30
        while True:
            try:
                again = s3stream.open(store, wal=wal, settings=settings)
                break
            except s3stream.NodeInUseError:
                assert time.monotonic() < deadline, "the open given up still holds the WAL"
                time.sleep(0.1)
        with again:
            assert [len(b.payload) for b in again.read(stream.stream_id, 0).batches] == [200 << 10]
