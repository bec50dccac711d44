"""The write path keeps its promise under errors and ownership changes (issue 13).

Each test uses real faults: a tmpfs that fills up and frees, a WAL whose writes really fail,
a SeaweedFS server, child processes killed with SIGKILL. Classes covered: a caller's mistake
fails one call; backpressure and transient failures resume by themselves; a dead background
thread surfaces; a stream held by another node is not taken silently; a client that dropped
acknowledged data never reports success.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream import (
    BackpressureError,
    ClientSettings,
    CompactionSettings,
    CorruptionError,
    FencedError,
    FileWalSettings,
    InvalidArgumentError,
    NodeInUseError,
    RecordBatch,
    S3StreamError,
    StreamClient,
    StreamClosedError,
    StreamOwnedError,
    UnavailableError,
    WalFullError,
)
from s3stream.objectstore.base import ObjectInfo, ObjectStore
from s3stream.objectstore.local import LocalObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.wrappers import ForwardingObjectStore
from s3stream.testing import disk_faults
from s3stream.testing.disk_faults import failing_writes
from s3stream.testing.faults import FaultRule
from s3stream.wal.file import FileWal
from s3stream.wal.memory import MemoryWal

KiB = 1 << 10
MiB = 1 << 20
HERE = Path(__file__).parent


def read_back(client: s3stream.StreamClient, stream_id: int) -> list[bytes]:
    out: list[bytes] = []
    pos = client.stream_info(stream_id).start_offset
    while True:
        got = client.read(stream_id, pos).batches
        if not got:
            return out
        out += [b.payload for b in got]
        pos = got[-1].next_offset


# ---------------------------------------------------------------------- caller mistakes


def test_oversized_append_fails_that_call_only(tmp_path: Path) -> None:
    wal = f"file://{tmp_path}/n.wal?capacity=1MiB"
    with s3stream.open(tmp_path / "store", wal=wal) as client:
        a, b = client.create_stream(), client.create_stream()
        a.append(RecordBatch(b"before"))
        with pytest.raises(InvalidArgumentError, match="at most") as err:
            a.append(RecordBatch(b"x" * (2 * MiB)))
        assert not err.value.retryable
        with pytest.raises(InvalidArgumentError):
            b.append_async(RecordBatch(b"y" * (2 * MiB)))
        # Nothing was consumed: offsets go on where they were, on every stream.
        assert a.append(RecordBatch(b"abc")).base_offset == 1
        assert b.append(RecordBatch(b"def")).base_offset == 0
        a_id, b_id = a.stream_id, b.stream_id
    with s3stream.open(tmp_path / "store", wal=wal) as client:
        assert read_back(client, a_id) == [b"before", b"abc"]
        assert read_back(client, b_id) == [b"def"]


# ---------------------------------------------------------------------- backpressure


FULL_SETTINGS = ClientSettings(
    upload_threshold_bytes=32 * KiB,
    max_pending_bytes=128 * KiB,
    backpressure_timeout_ms=300,
    upload_interval_ms=50,
    block_cache_bytes=0,
    log_cache_bytes=0,
)


def _fill_until_refused(stream: s3stream.Stream) -> list[bytes]:
    """Append until the client pushes back; the payloads acknowledged."""
    acked: list[bytes] = []
    for i in range(10_000):
        data = hashlib.sha256(str(i).encode()).digest() * 256  # 8 KiB
        try:
            stream.append(RecordBatch(data), timeout_s=5)
        except BackpressureError as exc:
            assert exc.retryable
            return acked
        acked.append(data)
    raise AssertionError("appends never pushed back while uploads failed")


def _resumes(stream: s3stream.Stream, acked: list[bytes], seconds: float = 30) -> None:
    """Appends succeed again without a reopen (retrying while the client catches up)."""
    give_up = time.monotonic() + seconds
    data = b"after the fault"
    while True:
        try:
            stream.append(RecordBatch(data), timeout_s=5)
            acked.append(data)
            return
        except (BackpressureError, UnavailableError):
            if time.monotonic() > give_up:
                raise


def test_full_disk_then_freed_appends_resume(tmp_path: Path) -> None:
    """The store's disk fills (uploads fail with ENOSPC): appends push back (retryable)
    until space is freed, then go on without a reopen; nothing acknowledged is lost."""
    wal = f"file://{tmp_path}/n.wal?capacity=1MiB&full_wait_ms=300"
    with disk_faults.tmpfs(tmp_path / "disk", "size=4m") as disk:
        store_dir = disk / "store"
        client = s3stream.open(store_dir, wal=wal, settings=FULL_SETTINGS)
        stream = client.create_stream()
        sid = stream.stream_id
        filler = disk_faults.fill_filesystem(disk)
        acked = _fill_until_refused(stream)
        assert acked, "the WAL should have taken some appends before pushing back"
        with pytest.raises(UnavailableError):
            client.flush(timeout_s=1)
        filler.unlink()
        _resumes(stream, acked)
        stream.append(RecordBatch(b"and more"))
        acked.append(b"and more")
        client.flush()
        client.close()
        with s3stream.open(store_dir, wal=wal) as again:
            assert read_back(again, sid) == acked


def _punch_hole(path: Path, offset: int, length: int) -> None:
    """Free the blocks of ``[offset, offset + length)`` of `path` (its size stays): a sparse
    region, as a sparse copy of a file or a file system that allocates on write leaves."""
    libc = ctypes.CDLL(None, use_errno=True)
    fallocate = libc.fallocate
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    fd = os.open(path, os.O_RDWR)
    try:
        # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        if fallocate(fd, 0x02 | 0x01, offset, length) != 0:
            code = ctypes.get_errno()
            pytest.skip(f"cannot punch a hole here: {os.strerror(code)}")
    finally:
        os.close(fd)


def test_appends_that_failed_on_a_full_disk_never_come_back(tmp_path: Path) -> None:
    """The WAL's ring has a hole and the disk is full: a group of appends fails part way, its
    first frames whole on the disk. Its callers were told it failed; yet after a crash (or a
    close that could not reset the WAL: its store was on the full disk too), recovery
    replayed those frames as stream data, and a caller retrying got duplicates. A failed
    commit now ends recovery at the durable records first, and a session takes no frame of an
    older one at or past the tail where it began."""
    from s3stream.wal.framing import DATA_START

    with disk_faults.tmpfs(tmp_path / "disk", "size=8m") as disk:
        wal_path = disk / "n.wal"
        wal = f"file://{wal_path}?capacity=2MiB"
        store = disk / "store"
        settings = {
            "upload_interval_ms": 60_000,
            "backpressure_timeout_ms": 1000,
            "store_timeout_ms": 1000,
        }
        client = s3stream.open(store, wal=wal, settings=settings)
        stream = client.create_stream()
        acked = [f"ok {i}".encode() for i in range(3)]
        for payload in acked:
            stream.append(RecordBatch(payload))
        _punch_hole(wal_path, DATA_START + 128 * KiB, 2 * 1024 * KiB - 128 * KiB)
        filler = disk_faults.fill_filesystem(disk)
        futures = [
            (stream.append_async(RecordBatch(bytes([i]) * 32 * KiB)), bytes([i]) * 32 * KiB)
            for i in range(8)
        ]
        failed = 0
        for future, payload in futures:
            try:
                future.result(timeout=30)
                acked.append(payload)
            except S3StreamError:
                failed += 1
        assert failed, "the hole should have failed a group"
        client.abandon()  # a crash, the store still full: no upload, no WAL reset
        filler.unlink()
        again = s3stream.open(store, wal=wal)
        got = read_back(again, stream.stream_id)
        assert got == acked, f"{len(got) - len(acked)} failed appends came back"
        # Another crash, before any append of the new session: the failed group's frames
        # lie past the tail where that session began (they came back then too).
        again.abandon()
        with s3stream.open(store, wal=wal) as third:
            got = read_back(third, stream.stream_id)
        assert got == acked, f"{len(got) - len(acked)} failed appends came back at last"


class NoSpaceStore(ForwardingObjectStore):
    """A store whose writes fail with ENOSPC while `full` (the same error a full disk
    gives the local store, for machines where a tmpfs cannot be mounted)."""

    full = False

    def _check(self) -> None:
        if self.full:
            raise UnavailableError("write failed: " + os.strerror(errno.ENOSPC))

    def put(self, key: str, data: bytes) -> None:
        self._check()
        super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._check()
        return super().put_if_absent(key, data)


def test_store_without_space_then_freed_appends_resume(tmp_path: Path) -> None:
    store = NoSpaceStore(_local(tmp_path))
    wal = FileWal(
        tmp_path / "n.wal",
        node_id="local",
        settings=FileWalSettings(capacity_bytes=MiB, full_wait_ms=300),
    )
    client = s3stream.StreamClient(store, wal, settings=FULL_SETTINGS)
    stream = client.create_stream()
    store.full = True
    acked = _fill_until_refused(stream)
    store.full = False
    _resumes(stream, acked)
    client.close()
    with s3stream.open(tmp_path / "store", wal=f"file://{tmp_path}/n.wal") as again:
        assert read_back(again, stream.stream_id) == acked


def test_waits_under_backpressure_never_add_up_and_close_says_how_it_ended(
    tmp_path: Path,
) -> None:
    """Six threads append while uploads fail (no space): each append ends within its own
    wait, not after the waits of the threads before it (waiting for room holds no lock);
    `close` ends within its deadline though appenders are waiting; a second `close` reports
    the first one's failure instead of returning as if it had worked."""
    import threading

    settings = ClientSettings(
        call_timeout_ms=3000, backpressure_timeout_ms=1000, store_timeout_ms=1000,
        upload_interval_ms=50, upload_threshold_bytes=64 * KiB, max_pending_bytes=256 * KiB,
    )  # fmt: skip
    store = NoSpaceStore(_local(tmp_path))
    wal = FileWal(
        tmp_path / "n.wal",
        node_id="local",
        settings=FileWalSettings(capacity_bytes=4 * MiB, full_wait_ms=1000),
    )
    client = s3stream.StreamClient(store, wal, settings=settings)
    stream = client.create_stream()
    store.full = True
    took: list[float] = []
    acked = [0]
    stop = threading.Event()

    def append_until_closed() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                stream.append(RecordBatch(b"x" * 50_000))
                acked[0] += 1
            except StreamClosedError:
                return
            except S3StreamError as exc:
                assert exc.retryable, exc
            took.append(time.monotonic() - started)

    threads = [threading.Thread(target=append_until_closed) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(4)
    # Bounded by the call's deadline (3 s), not by six backpressure waits one after another.
    assert took and max(took) < 3.0 + 1.0, f"an append waited {max(took):.1f} s"
    started = time.monotonic()
    with pytest.raises(UnavailableError) as first:
        client.close(timeout_s=2)
    assert time.monotonic() - started < 2 + 3
    stop.set()
    for t in threads:
        t.join(10)
    with pytest.raises(UnavailableError) as second:
        client.close()
    assert second.value is first.value
    store.full = False  # what was acknowledged is in the WAL: the next open uploads it
    reopened = FileWal(tmp_path / "n.wal", node_id="local")
    with s3stream.StreamClient(_local(tmp_path), reopened) as again:
        assert len(read_back(again, stream.stream_id)) == acked[0] > 0


def test_a_full_wal_holds_no_append_past_its_deadline(tmp_path: Path) -> None:
    """The WAL waits `full_wait_ms` for room inside the way into it (the append lock); other
    appends and close do not queue behind that past their own deadlines, call after call."""
    import threading

    store = NoSpaceStore(_local(tmp_path))
    wal = FileWal(
        tmp_path / "n.wal",
        node_id="local",
        settings=FileWalSettings(capacity_bytes=MiB, full_wait_ms=1000),
    )
    client = s3stream.StreamClient(
        store, wal, settings=ClientSettings(max_pending_bytes=64 * MiB, upload_interval_ms=50)
    )
    stream = client.create_stream()
    store.full = True
    with pytest.raises(WalFullError):
        for _ in range(200):
            stream.append(RecordBatch(b"x" * 20_000), timeout_s=5)
    took: list[float] = []

    def appends(n: int) -> None:
        for _ in range(n):
            started = time.monotonic()
            with contextlib.suppress(BackpressureError):
                stream.append(RecordBatch(b"y" * 20_000), timeout_s=0.3)
            took.append(time.monotonic() - started)

    appends(6)  # one thread, call after call
    threads = [threading.Thread(target=appends, args=(4,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(took) == 6 + 32 and max(took) < 0.3 + 0.7, sorted(took)[-5:]
    started = time.monotonic()
    with pytest.raises(UnavailableError):
        client.close(timeout_s=1)
    assert time.monotonic() - started < 1 + 2.5


# ---------------------------------------------------------------------- WAL failure


def test_wal_write_failure_is_repaired_without_reopen(tmp_path: Path) -> None:
    """A WAL write fails (the device refuses writes): the appends in flight fail retryably,
    the client repairs the WAL by itself once writes work again, offsets go on with no hole,
    and a reopen finds exactly what was acknowledged."""
    path = tmp_path / "n.wal"
    wal = FileWal(path, node_id="local", settings=FileWalSettings(capacity_bytes=4 * MiB))
    client = s3stream.StreamClient(
        _local(tmp_path), wal, settings=ClientSettings(backpressure_timeout_ms=200)
    )
    a, b = client.create_stream(), client.create_stream()
    acked = {a.stream_id: [b"a0"], b.stream_id: [b"b0"]}
    a.append(RecordBatch(b"a0"))
    b.append(RecordBatch(b"b0"))
    with failing_writes(wal):  # the device refuses writes, then works again
        with pytest.raises(UnavailableError) as err:
            a.append(RecordBatch(b"lost"))
        assert err.value.retryable
        with pytest.raises(UnavailableError, match=r"not repaired yet|write failed"):
            b.append(RecordBatch(b"lost too"))
    give_up = time.monotonic() + 30
    while True:
        try:
            r = a.append(RecordBatch(b"a1"), timeout_s=5)
            break
        except UnavailableError:
            assert time.monotonic() < give_up, "the client never repaired its WAL"
    assert r.base_offset == 1  # the failed append's offset is handed out again
    acked[a.stream_id].append(b"a1")
    assert b.append(RecordBatch(b"b1")).base_offset == 1
    acked[b.stream_id].append(b"b1")
    client.abandon()  # crash: what is acknowledged is in the WAL or uploaded
    wal._abandon()  # as the process's death would: no clean header, the holder lock released
    with s3stream.StreamClient(_local(tmp_path), FileWal(path, node_id="local")) as again:
        for sid, want in acked.items():
            assert read_back(again, sid) == want


def _local(tmp_path: Path) -> ObjectStore:
    return LocalObjectStore(tmp_path / "store")


# ---------------------------------------------------------------------- dead threads


class BuggyStore(ForwardingObjectStore):
    """A plug-in store with a bug: its data PUTs raise a plain exception."""

    def put(self, key: str, data: bytes) -> None:
        if key.startswith("data/"):
            raise RuntimeError("bug in a plug-in store")
        super().put(key, data)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return super().list(prefix)


def test_dead_uploader_surfaces_in_flush_and_close(tmp_path: Path) -> None:
    wal = FileWal(tmp_path / "n.wal", node_id="local", settings=FileWalSettings(capacity_bytes=MiB))
    client = s3stream.StreamClient(BuggyStore(_local(tmp_path)), wal)
    s = client.create_stream()
    s.append(RecordBatch(b"kept in the WAL"))
    started = time.monotonic()
    with pytest.raises(S3StreamError, match=r"uploader thread failed.*bug in a plug-in"):
        client.flush(timeout_s=20)
    with pytest.raises(S3StreamError, match="uploader thread failed"):
        s.append(RecordBatch(b"refused"))
    with pytest.raises(S3StreamError, match="uploader thread failed"):
        client.close()
    assert time.monotonic() - started < 20
    reopened = FileWal(tmp_path / "n.wal", node_id="local")
    with s3stream.StreamClient(_local(tmp_path), reopened) as again:
        assert read_back(again, s.stream_id) == [b"kept in the WAL"]


# ---------------------------------------------------------------------- ownership


def test_clean_close_releases_streams(tmp_path: Path) -> None:
    with s3stream.open(tmp_path, node_id="a") as a:
        s = a.create_stream()
        s.append(RecordBatch(b"from a"))
    with s3stream.open(tmp_path, node_id="b") as b:
        s = b.open_stream(s.stream_id)  # no StreamOwnedError: a closed cleanly
        s.append(RecordBatch(b"from b"))
        assert [x.payload for x in s.fetch(0).batches] == [b"from a", b"from b"]


def _spawn_owner(
    url: str, node: str, n: int, options: dict[str, Any] | None = None
) -> tuple[subprocess.Popen[str], int, str]:
    args = [sys.executable, str(HERE / "owner_child.py"), url, node, str(n)]
    if options is not None:
        args.append(json.dumps(options))
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline().split()
    if not line or line[0] != "ACKED":
        child.kill()
        child.wait()
        raise AssertionError(f"child failed: {line}")
    return child, int(line[1]), line[3]


def _digest(payloads: list[bytes]) -> str:
    h = hashlib.sha256()
    for p in payloads:
        h.update(p)
    return h.hexdigest()


def _crashed_owner_is_protected(url: str, options: dict[str, Any] | None) -> None:
    child, sid, digest = _spawn_owner(url, "worker1", 1000, options)
    child.send_signal(signal.SIGKILL)
    child.wait()
    with s3stream.open(url, node_id="worker2", storage_options=options) as b:
        with pytest.raises(StreamOwnedError, match="worker1") as err:
            b.open_stream(sid)
        assert err.value.owner == "worker1"
        report = b.take_over("worker1")
        assert report.recovery.uploaded_batches == 1000
        assert report.recovery.fenced == 0
        assert sid in report.released_streams
        s = b.open_stream(sid)
        assert s.start_offset == 0 and s.confirm_offset == 1000
        got: list[bytes] = []
        pos = 0
        while pos < 1000:
            res = s.fetch(pos)
            got += [x.payload for x in res.batches]
            pos = res.next_offset
        assert len(got) == 1000 and _digest(got) == digest


def test_crashed_owner_file_wal(tmp_path: Path) -> None:
    _crashed_owner_is_protected(str(tmp_path / "store"), None)


@pytest.mark.s3
def test_crashed_owner_s3_wal(seaweedfs: Any) -> None:
    import uuid

    url = f"s3://{seaweedfs.bucket}/owner-{uuid.uuid4().hex}"
    _crashed_owner_is_protected(url, seaweedfs.storage_options())


def _ask(child: subprocess.Popen[str], command: str) -> str:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(command + "\n")
    child.stdin.flush()
    return child.stdout.readline().strip()


def test_a_directory_in_use_says_so_and_take_over_stays_possible(tmp_path: Path) -> None:
    """A second process opening a live node's file WAL gets `NodeInUseError` naming the node
    and the holder's pid (the live writer goes on undisturbed); `take_over` of the live node
    is still possible on purpose, and fences it; after it dies, its node id opens again."""
    url = str(tmp_path / "store")
    child, sid, digest = _spawn_owner(url, "worker1", 200)
    try:
        with pytest.raises(NodeInUseError, match=rf"worker1.*{child.pid}") as err:
            s3stream.open(url, node_id="worker1")
        assert err.value.node_id == "worker1" and err.value.pid == child.pid
        assert _ask(child, "APPEND") == "OK 200", "the refused opener disturbed the holder"
        with s3stream.open(url, node_id="worker2") as b:
            report = b.take_over("worker1")  # explicit: a live holder is fenced
            assert report.recovery.uploaded_batches == 201
            assert _ask(child, "APPEND") == "ERR FencedError"
            got = read_back(b, sid)
            assert len(got) == 201 and _digest(got[:200]) == digest
    finally:
        child.kill()
        child.wait()
    # Dead now: its node id opens again, without a take-over (nothing was left in its WAL).
    with s3stream.open(url, node_id="worker1") as again:
        assert len(read_back(again, sid)) == 201


def test_a_crashed_node_reopens_under_its_own_id(tmp_path: Path) -> None:
    """After SIGKILL the holder lock is gone with the process: the same node id opens at
    once and recovers every acknowledged append from its WAL."""
    url = str(tmp_path / "store")
    child, sid, digest = _spawn_owner(url, "worker1", 300)
    child.send_signal(signal.SIGKILL)
    child.wait()
    with s3stream.open(url, node_id="worker1") as again:
        got = read_back(again, sid)
        assert len(got) == 300 and _digest(got) == digest
        assert again.open_stream(sid).append(RecordBatch(b"next")).base_offset == 300


def test_a_stream_whose_release_failed_is_released_by_the_next_close(tmp_path: Path) -> None:
    """`Stream.close()` while the store refuses writes raises (the stream stays owned); once
    the store works, the client's close releases it, so another node opens it freely."""
    store = NoSpaceStore(_local(tmp_path))
    client = s3stream.StreamClient(
        store, MemoryWal(), node_id="a", settings=ClientSettings(store_timeout_ms=500)
    )
    s = client.create_stream()
    s.append(RecordBatch(b"uploaded"))
    client.flush()
    store.full = True
    with pytest.raises(UnavailableError, match="stay owned"):
        s.close()
    store.full = False
    client.close()
    with s3stream.StreamClient(_local(tmp_path), MemoryWal(), node_id="b") as other:
        opened = other.open_stream(s.stream_id)  # no StreamOwnedError: it was released
        assert [b.payload for b in opened.fetch(0).batches] == [b"uploaded"]


def test_a_mistyped_wal_url_fails_before_it_can_fence_anyone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mistakes in a WAL URL are caller errors found before the node is registered: a live
    client with that node id is not fenced, and nothing is written anywhere (malformed
    ``file:`` URLs once created files relative to the working directory)."""
    monkeypatch.chdir(tmp_path)
    live = s3stream.open(tmp_path / "store", node_id="n1")
    s = live.create_stream()
    s.append(RecordBatch(b"acknowledged"))
    before = sorted(p for p in tmp_path.rglob("*"))
    for wal in (
        f"file://{tmp_path}/other.wal?capactiy=64MiB",
        f"file://{tmp_path}/other.wal?capacity=lots",
        "file:rel.wal",
        "file://otherhost/tmp/x.wal",
        "file:///",
        f"file://{tmp_path}/a%00b.wal",
    ):
        with pytest.raises(InvalidArgumentError):
            s3stream.open(tmp_path / "store", node_id="n1", wal=wal)
    assert sorted(p for p in tmp_path.rglob("*")) == before
    s.append(RecordBatch(b"still the owner"))
    live.flush()
    live.close()  # not fenced: no FencedError


def test_fenced_owner_close_raises_after_force_open(tmp_path: Path) -> None:
    a = s3stream.open(tmp_path, node_id="a", wal="memory://")
    s = a.create_stream()
    s.append(RecordBatch(b"acked, not uploaded"))
    with s3stream.open(tmp_path, node_id="b", wal="memory://") as b:
        b.open_stream(s.stream_id, force=True).append(RecordBatch(b"b's"))
    with pytest.raises(FencedError, match=r"stream 0 offsets \[0, 1\)"):
        a.close()


@pytest.mark.s3
@pytest.mark.parametrize("wal_client", ["boto3", "obstore"])
def test_default_object_wal_store_stack(seaweedfs: Any, wal_client: str) -> None:
    """The default S3 WAL has one retry layer and its PUTs show in the client's metrics: with
    boto3 it goes through the client's own store stack (one boto3 client); with obstore (the
    default where it is installed: faster small PUTs) through a stack of its own over an
    `ObstoreS3ObjectStore`, recording into the same metrics."""
    import uuid

    from s3stream.objectstore.s3_obstore import ObstoreS3ObjectStore
    from s3stream.objectstore.wrappers import MetricsObjectStore, RetryingObjectStore
    from s3stream.wal.object import ObjectWal

    url = f"s3://{seaweedfs.bucket}/stack-{uuid.uuid4().hex}"
    settings = ClientSettings(upload_interval_ms=0, upload_threshold_bytes=64 * MiB)
    with s3stream.open(
        url, storage_options=seaweedfs.storage_options(), settings=settings, wal_client=wal_client
    ) as client:
        wal = client.wal
        assert isinstance(wal, ObjectWal)
        for stack in (client.object_store, wal.store):
            assert isinstance(stack, MetricsObjectStore)
            retrying = stack.inner
            assert isinstance(retrying, RetryingObjectStore)
            assert not isinstance(retrying.inner, (RetryingObjectStore, MetricsObjectStore))
        if wal_client == "boto3":
            assert wal.store is client.object_store
        else:
            assert isinstance(wal.store, MetricsObjectStore)
            assert isinstance(wal.store.inner, RetryingObjectStore)
            assert isinstance(wal.store.inner.inner, ObstoreS3ObjectStore)
        before = client.metrics.object_store
        s = client.create_stream()
        for i in range(5):
            s.append(RecordBatch(b"x" * i))
        after = client.metrics.object_store
        assert after.conditional_puts - before.conditional_puts >= 5  # WAL objects
        assert client.metrics.storage.uploads == 0  # nothing of that was an upload
        # botocore itself makes one try per call: the retry layer above is the only one.
        data = client.object_store.inner
        assert isinstance(data, RetryingObjectStore)
        assert data.inner._s3().meta.config.retries["total_max_attempts"] == 1


# ---------------------------------------------------------------------- a lost WAL


@pytest.mark.parametrize("loss", ["deleted", "emptied"])
def test_a_lost_file_wal_of_a_node_with_open_streams_is_damage(tmp_path: Path, loss: str) -> None:
    """A node that crashed holds acknowledged appends in its WAL; if that file is then
    deleted or emptied, opening the node (or taking it over) names the file with
    `CorruptionError` instead of silently starting empty; `accept_wal_loss=True` goes on."""
    url = str(tmp_path / "store")
    child, sid, _ = _spawn_owner(url, "worker1", 60)
    child.send_signal(signal.SIGKILL)
    child.wait()
    wal = tmp_path / "store" / "wal" / "worker1.wal"
    assert wal.stat().st_size > 0
    if loss == "deleted":
        wal.unlink()
    else:
        wal.write_bytes(b"")
    with pytest.raises(CorruptionError, match=r"worker1\.wal") as err:
        s3stream.open(url, node_id="worker1")
    assert not err.value.retryable and "accept_wal_loss" in str(err.value)
    with (
        s3stream.open(url, node_id="other") as other,
        pytest.raises(CorruptionError, match=r"worker1\.wal"),
    ):
        other.take_over("worker1")
    with s3stream.open(url, node_id="worker1", accept_wal_loss=True) as again:
        assert again.stream_info(sid).end_offset == 0  # the 60 appends were only in the WAL


def test_a_deleted_wal_of_a_cleanly_closed_node_is_no_damage(tmp_path: Path) -> None:
    with s3stream.open(tmp_path, node_id="n1") as client:
        s = client.create_stream()
        s.append(RecordBatch(b"uploaded at close"))
    (tmp_path / "wal" / "n1.wal").unlink()
    with s3stream.open(tmp_path, node_id="n1") as again:
        assert read_back(again, s.stream_id) == [b"uploaded at close"]


def test_a_backlog_drains_in_bounded_uploads_without_spinning(tmp_path: Path) -> None:
    """Slow data PUTs (a real delay in the store): uploads take at most about
    `upload_threshold_bytes` each, several in flight, and the uploader thread sleeps while
    its PUTs are in flight instead of spinning (it once burned a core there)."""
    import os
    import random
    import threading
    import time

    from s3stream.clock import SystemClock
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.testing.faults import FaultRule, FaultyObjectStore
    from s3stream.wal.memory import MemoryWal

    slow = FaultyObjectStore(
        LocalObjectStore(tmp_path),
        rng=random.Random(3),
        clock=SystemClock(),
        rules=[FaultRule(latency_s=(0.4, 0.4), operations=frozenset({"put"}), key_prefix="data/")],
    )
    threshold = 64 * 1024
    settings = ClientSettings(
        upload_threshold_bytes=threshold, stream_split_bytes=1 << 30, upload_interval_ms=0
    )
    with s3stream.StreamClient(slow, MemoryWal(), settings=settings) as client:
        s = client.create_stream()
        for i in range(64):  # 1 MiB of backlog: 16 uploads' worth
            s.append(RecordBatch(bytes([i]) * 16384))
        time.sleep(0.1)
        uploader = next(t for t in threading.enumerate() if t.name == "s3stream-uploader")

        def cpu_ticks() -> int:
            assert uploader.native_id is not None
            path = f"/proc/{os.getpid()}/task/{uploader.native_id}/stat"
            with open(path) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime

        before = cpu_ticks()
        time.sleep(0.8)  # PUTs in flight all along
        assert cpu_ticks() - before <= 10, "the uploader spins while its PUTs are in flight"
        client.flush()
        objects = [o for o in client.metadata.state.objects.values()]
        assert len(objects) >= 8
        assert max(o.size for o in objects) < 2 * threshold + 16384


# ---------------------------------------------------------------------- memory (issue 19)


def test_the_log_cache_charges_what_an_entry_costs() -> None:
    """The LogCache's budgets count each batch's Python objects, not only its bytes: measured
    with tracemalloc through a whole client (memory WAL included), an append costs no more
    than the `entry_memory` it is charged."""
    import gc
    import tracemalloc

    from s3stream.cache.log_cache import ENTRY_OVERHEAD_BYTES

    settings = ClientSettings(upload_interval_ms=0, upload_threshold_bytes=64 * MiB)
    with s3stream.open("memory://", settings=settings) as client:
        s = client.create_stream()
        batch = RecordBatch(b"x" * 100)  # timestamped at append: an int of its own each
        for _ in range(2_000):
            s.append(batch)
        cache = client._storage.log_cache
        gc.collect()
        charged0 = cache.pending_bytes
        tracemalloc.start()
        try:
            used0 = tracemalloc.get_traced_memory()[0]
            n = 20_000
            for _ in range(n):
                s.append(batch)
            gc.collect()
            used = tracemalloc.get_traced_memory()[0] - used0
        finally:
            tracemalloc.stop()
        charged = cache.pending_bytes - charged0
        record = 9 + 40 + 100  # WAL prefix, batch header, payload
        assert charged == n * (record + ENTRY_OVERHEAD_BYTES)
        assert used <= charged, f"an entry costs {used / n:.0f} bytes, charged {charged / n:.0f}"
        # ... and the charge is not far above it either (it would waste the budget).
        assert used >= 0.7 * charged, f"an entry costs {used / n:.0f}, charged {charged / n:.0f}"


def test_appends_leave_nothing_for_the_cyclic_gc_to_walk() -> None:
    """What an append keeps (the LogCache entry, the memory WAL's record) is no object the
    cyclic GC tracks for long: full collections stay as cheap after a million appends as
    after a thousand. (The memory WAL kept a `WalRecord` named tuple per record, which the
    GC never untracks: the append rate halved over the first million.)"""
    import gc

    settings = ClientSettings(upload_interval_ms=0, upload_threshold_bytes=64 * MiB)
    with s3stream.open("memory://", settings=settings) as client:
        s = client.create_stream()
        batch = RecordBatch(b"x" * 100, base_timestamp=0)
        for _ in range(1_000):
            s.append(batch)
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(30_000):
            s.append(batch)
        gc.collect()
        assert len(gc.get_objects()) - before < 100


@pytest.mark.parametrize(
    ("records", "large", "split"),
    [(True, True, 20_000), (False, True, 20_000), (False, False, 20_000), (False, True, 10**9)],
    ids=str,
)
def test_uploads_pack_blocks_as_the_object_writer_would(
    records: bool, large: bool, split: int
) -> None:
    """Uploads without compression build the blocks of small batches whole (`_add_blocks`),
    not batch by batch: the objects are byte for byte those `ObjectWriter.add` makes, RECORDS
    batches (whose time ranges are in their records) included, and so are those of a stream
    with large batches (added one by one). Without RECORDS batches the blocks are cut from
    running sums (`_raw_blocks`) and handed to the writer as blocks: the same bytes again."""
    from s3stream.cache.log_cache import LogCache
    from s3stream.format.batch import WAL_PREFIX, encode_batch
    from s3stream.format.objects import ObjectWriter, decode_block, read_index
    from s3stream.objectstore.memory import MemoryObjectStore
    from s3stream.records import Record, records_batch
    from s3stream.storage.packing import KeyFactory, pack_groups

    settings = ClientSettings(block_target_bytes=4096, stream_split_bytes=split)
    cache = LogCache(0)
    offsets = [0, 0, 0]
    for i in range(300):
        sid = i % 3 if i % 7 else 2
        # Streams 0 and 1: small batches (blocks built whole); 2 has large ones too.
        size = (37 * i) % 1500 + 1 + (6000 if large and sid == 2 and i % 5 == 0 else 0)
        if records and i % 31 == 5:
            batch = records_batch([Record(value=b"v" * size, timestamp=1000 + i)])
        else:
            batch = RecordBatch(bytes([i % 251]) * size, base_timestamp=500 - i)
        record = encode_batch(
            sid, offsets[sid], batch.count, int(batch.kind), 500 - i, batch.properties,
            batch.payload, prefix=WAL_PREFIX.pack(1, 1),
        )  # fmt: skip
        cache.put(
            sid, offsets[sid], batch.count, 500 - i, int(batch.kind), batch.properties,
            batch.payload, record, WAL_PREFIX.size, i, 1,
        )  # fmt: skip
        offsets[sid] += batch.count
    taken = cache.take()
    got = pack_groups(taken.groups, settings, KeyFactory("n", 1))
    by_stream: dict[int, list[Any]] = {}
    for e in taken.entries:
        by_stream.setdefault(e[0], []).append(e)
    # The reference: every batch through `ObjectWriter.add`.
    store = MemoryObjectStore()
    own, shared = [], ObjectWriter(block_target_bytes=4096)
    for sid in sorted(by_stream):
        size = sum(len(e[6]) - e[7] for e in by_stream[sid])
        w = ObjectWriter(block_target_bytes=4096) if size >= split else shared
        for e in by_stream[sid]:
            w.add(sid, e[1], e[2], e[3], memoryview(e[6])[e[7] :])
        if w is not shared:
            own.append(w.finish())
    want = own if shared.is_empty() else [*own, shared.finish()]
    # Stream objects and a stream-set object, or all in one.
    assert len(want) >= (2 if split == 20_000 else 1)
    assert [o.data for o in got] == want
    for o in got:
        store.put(o.key, o.data)
        index = read_index(store, o.key)
        for block in index.blocks:
            raw = store.get(o.key, block.position, block.end_position)
            assert decode_block(raw, block, o.key)


def test_a_throttled_store_makes_appends_wait_in_step_with_it(tmp_path: Path) -> None:
    """Uploads limited to 2 MiB/s (the client's `background_bytes_per_s`) under a writer that
    could go far faster: appends wait for room instead of failing, get about the store's
    rate, and no wait is longer than a few of the store's seconds (uploads are sized to the
    rate, so room comes back in small steps, not once per large upload); the memory pending
    stays near its budget (packed objects in flight included)."""
    rate = 2 * MiB
    settings = ClientSettings(
        background_bytes_per_s=rate,
        upload_threshold_bytes=4 * MiB,
        max_pending_bytes=8 * MiB,
        backpressure_timeout_ms=20_000,
        log_cache_bytes=0,
    )
    with s3stream.StreamClient(
        LocalObjectStore(tmp_path), MemoryWal(), settings=settings
    ) as client:
        s = client.create_stream()
        cache = client._storage.log_cache
        batch = RecordBatch(os.urandom(32 * KiB), base_timestamp=0)
        waits: list[float] = []
        most_pending = 0
        t_start = time.monotonic()
        steady_from = t_start + 3.0  # the first 8 MiB go at once
        steady_bytes = 0
        while time.monotonic() < t_start + 6.0:
            t0 = time.monotonic()
            s.append(batch)  # never BackpressureError
            t1 = time.monotonic()
            waits.append(t1 - t0)
            most_pending = max(most_pending, cache.pending_bytes)
            if t0 >= steady_from:
                steady_bytes += len(batch.payload)
        steady_rate = steady_bytes / (time.monotonic() - steady_from)
        assert 0.4 * rate <= steady_rate <= 2.5 * rate, steady_rate
        assert max(waits) < 2.5, max(waits)
        assert most_pending <= settings.max_pending_bytes + 2 * 2 * MiB, most_pending
        client.abandon()  # no waiting for the backlog to drain at 2 MiB/s


def test_an_append_interrupted_before_it_drives_its_record_is_committed_by_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synchronous append leaves the file WAL's writer asleep and commits its record itself
    (`drive`); interrupted (Ctrl-C) before it does, the writer is woken and commits the record
    at once: it is not stranded until the next append, and close() does not wait for it."""
    wal = f"file://{tmp_path}/n.wal?capacity=4MiB&caller_commits=1"
    with s3stream.open(tmp_path / "store", wal=wal) as c:
        stream = c.create_stream()
        real = FileWal.drive
        armed = [True]

        def interrupted(self: FileWal, future: Any) -> None:
            if armed[0]:
                armed[0] = False
                raise KeyboardInterrupt("Ctrl-C between the append and its drive")
            real(self, future)

        monkeypatch.setattr(FileWal, "drive", interrupted)
        with pytest.raises(KeyboardInterrupt):
            stream.append(RecordBatch(b"interrupted"))
        deadline = time.monotonic() + 10
        while stream.confirm_offset < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stream.confirm_offset == 1  # durable, with no other append to wake the writer
        started = time.monotonic()
    assert time.monotonic() - started < 5
    with s3stream.open(tmp_path / "store", wal=f"file://{tmp_path}/n.wal?capacity=4MiB") as c:
        assert [b.payload for b in c.read(stream.stream_id, 0).batches] == [b"interrupted"]


def test_log_cache_takes_uploads_grouped_by_stream_and_evicts_whole_runs() -> None:
    """`LogCache.take` hands an upload's entries in WAL order and grouped by stream (slices of
    its per-stream lists, not a pass per entry), also when a limit cuts the upload inside a
    stream's entries; `mark_uploaded` of the groups unpins them, and eviction drops whole
    runs at once and cuts the last one entry by entry, keeping the newest readable."""
    from s3stream.cache.log_cache import ENTRY_OVERHEAD_BYTES, SID, LogCache
    from s3stream.format.batch import WAL_PREFIX, encode_batch

    record_bytes = 0
    cache = LogCache(0)
    offsets = [0] * 5
    for i in range(200):
        sid = (i * 7) % 5 if i % 3 else 4  # interleaved, stream 4 more often
        payload = bytes([i % 251]) * (10 + i % 17)
        record = encode_batch(
            sid, offsets[sid], 1, 0, i, None, payload, prefix=WAL_PREFIX.pack(1, 1)
        )  # fmt: skip
        cache.put(sid, offsets[sid], 1, i, 0, {}, payload, record, WAL_PREFIX.size, i, 1)
        offsets[sid] += 1
        record_bytes += len(record)
    uploads = []
    for limit in (900, 2500, None):
        taken = cache.take(limit)
        assert taken.entries
        want: dict[int, list[Any]] = {}
        for e in taken.entries:
            want.setdefault(e[SID], []).append(e)
        assert taken.groups == want
        uploads.append(taken)
    assert not cache.take().entries and cache.untaken_bytes == 0
    assert sum(len(t.entries) for t in uploads) == 200
    # Pending until uploaded; everything goes once the eviction budget (0) is applied.
    assert cache.pending_bytes == record_bytes + 200 * ENTRY_OVERHEAD_BYTES
    for taken in uploads[:2]:
        cache.mark_uploaded(taken)
    left = uploads[2].entries
    assert cache.pending_bytes == sum(len(e[6]) + ENTRY_OVERHEAD_BYTES for e in left)
    assert cache.cached_bytes == cache.pending_bytes  # uploaded runs evicted whole
    assert cache.oldest_unfinished_seq() == left[0][10]
    # A budget that keeps part of a run: the oldest entries go first, the newest stay.
    cache._max_uploaded = 1000
    cache.mark_uploaded(uploads[2])
    assert 0 < cache.cached_bytes <= 1000 and cache.pending_bytes == 0
    assert cache.oldest_unfinished_seq() is None
    for sid in range(5):
        first = cache.first_offset(sid)
        if first is not None:
            batches, complete = cache.read(sid, first, offsets[sid], 1 << 20)
            assert complete and [b.base_offset for b in batches] == list(range(first, offsets[sid]))


def test_a_stream_reopened_after_another_node_wrote_it_reads_that_nodes_batches() -> None:
    """Node A closes a stream, node B appends to it and closes it, A opens it again and
    appends: A's fetch, reads, record iteration and seek by time return B's batches from
    objects, not A's old cached batches followed by its new one with B's skipped. (A closed
    stream's cache tail used to stay, and a read took it and the new entries as one run.)"""
    settings = ClientSettings(upload_interval_ms=0, compaction=CompactionSettings(background=False))
    store = MemoryObjectStore()
    a = StreamClient(store, MemoryWal(), node_id="A", settings=settings)
    b = StreamClient(store, MemoryWal(), node_id="B", settings=settings)
    try:
        first = a.create_stream()
        for i in range(10):
            first.append(RecordBatch(f"A{i}".encode(), base_timestamp=i))
        first.close()
        assert a._storage.log_cache.first_offset(first.stream_id) is None  # released: dropped
        theirs = b.open_stream(first.stream_id)
        for i in range(10, 20):
            theirs.append(RecordBatch(f"B{i}".encode(), base_timestamp=i))
        theirs.close()
        again = a.open_stream(first.stream_id)
        again.append(RecordBatch(b"A20", base_timestamp=20))
        want = [f"A{i}".encode() for i in range(10)] + [f"B{i}".encode() for i in range(10, 20)]
        want.append(b"A20")
        got = again.fetch(10)
        assert [bytes(x.payload) for x in got.batches] == want[10:]
        assert [bytes(x.payload) for x in a.read(first.stream_id, 0).batches] == want
        assert [off for off, _ in again.read_records(0)] == list(range(21))
        assert again.offset_for_timestamp(15) == 15
    finally:
        a.close()
        b.close()


def test_appends_refused_by_a_close_are_not_replayed_into_the_closed_stream(
    tmp_path: Path,
) -> None:
    """Appends still in the WAL when `Stream.close` stops the writer are refused
    (`StreamClosedError`), but their records stay in the WAL. A reopen used to replay them
    into the closed stream, whose commit was refused ("closed") until the deadline: every
    reopen and take-over of the node failed."""
    import threading

    from s3stream import StreamState
    from s3stream.testing.disk_faults import _commits_paused

    settings = ClientSettings(call_timeout_ms=5000, upload_interval_ms=0)
    wal_settings = FileWalSettings(capacity_bytes=16 << 20)
    store = tmp_path / "store"
    client = s3stream.open(store, settings=settings, file_wal_settings=wal_settings)
    stream = client.create_stream()
    stream.append(RecordBatch(b"acknowledged"))
    client.flush()
    assert isinstance(client.wal, FileWal)
    with _commits_paused(client.wal):
        futures = [stream.append_async(RecordBatch(b"in flight")) for _ in range(3)]
        closer = threading.Thread(target=stream.close)
        closer.start()
        closer.join(10)
        assert not closer.is_alive()
    for future in futures:
        with pytest.raises(StreamClosedError):
            future.result(5)
    client.close()
    with s3stream.open(store, settings=settings, file_wal_settings=wal_settings) as again:
        assert again.recovery.fenced == 3 and again.recovery.uploaded_batches == 0
        info = again.stream_info(stream.stream_id)
        assert (info.state, info.end_offset) == (StreamState.CLOSED, 1)
        assert read_back(again, stream.stream_id) == [b"acknowledged"]
        assert again.open_stream(stream.stream_id).confirm_offset == 1


#: A metadata entry's create lands, its reply is lost, and reading the log back fails.
_LOST_COMMIT_REPLY = [
    FaultRule(ambiguous_rate=1.0, operations=frozenset({"put_if_absent"}), key_prefix="meta/log/"),
    FaultRule(error_rate=1.0, operations=frozenset({"get", "head", "list"}), key_prefix="meta/"),
]


def _append_and_lose_the_commit_reply(store: Any, client: StreamClient) -> s3stream.Stream:
    """A new stream with one append whose upload's metadata entry lands unseen (the flush
    fails): `_LOST_COMMIT_REPLY`."""
    with store.healthy():
        stream = client.create_stream()
    stream.append(RecordBatch(b"first"))
    with pytest.raises(UnavailableError):
        client.flush(timeout_s=1)
    assert store.counters.ambiguous["put_if_absent"] >= 1
    return stream


def _faulty_client(rules: list[Any], node_id: str, store: Any = None) -> tuple[Any, StreamClient]:
    import random

    from s3stream.testing.faults import FaultyObjectStore

    faulty = store or FaultyObjectStore(MemoryObjectStore(), rng=random.Random(7), rules=rules)
    settings = ClientSettings(
        store_timeout_ms=300,
        call_timeout_ms=5000,
        upload_interval_ms=0,
        stream_split_bytes=1000,
        compaction=CompactionSettings(background=False),
    )
    with faulty.healthy():
        client = StreamClient(faulty, MemoryWal(), node_id=node_id, settings=settings)
    return faulty, client


def test_an_upload_whose_commit_landed_unseen_is_not_committed_again() -> None:
    """The metadata entry of an upload lands, its reply is lost and reading it back fails
    too: the uploader tries the upload again later. That try used to find the streams' ends
    moved by its own entry and fail ("upload starts at 0 but the committed end is 1"),
    forever: no flush succeeded, appends hit backpressure, until the client was reopened."""
    store, client = _faulty_client(_LOST_COMMIT_REPLY, "n1")
    try:
        stream = _append_and_lose_the_commit_reply(store, client)
        with store.healthy():
            client.flush(timeout_s=5)
            stream.append(RecordBatch(b"second"))
            client.flush(timeout_s=5)
            assert client.stream_info(stream.stream_id).end_offset == 2
            assert read_back(client, stream.stream_id) == [b"first", b"second"]
    finally:
        with store.healthy():
            client.close()


def test_a_failed_delete_of_a_fenced_streams_object_leaves_the_commit_standing() -> None:
    """An upload held an object only of a stream another client took over: after the commit
    the object is deleted. When that delete failed, the committed upload was tried again
    and failed on the live streams' moved ends, forever."""
    from s3stream.testing.faults import FaultRule

    store, mine = _faulty_client(
        [FaultRule(error_rate=1.0, operations=frozenset({"delete_many"}))], "n1"
    )
    _, theirs = _faulty_client([], "n2", store)
    try:
        with store.healthy():
            live, taken = mine.create_stream(), mine.create_stream()
        live.append(RecordBatch(b"live"))
        taken.append(RecordBatch(b"B" * 5000))  # an object of its own (stream_split_bytes)
        with store.healthy():
            theirs.open_stream(taken.stream_id, force=True)
        with pytest.raises(FencedError):
            mine.flush(timeout_s=3)  # the taken stream's append is reported lost
        assert store.counters.errors["delete_many"] >= 1
        live.append(RecordBatch(b"after"))
        mine.flush(timeout_s=3)
        assert mine.stream_info(live.stream_id).end_offset == 2
    finally:
        with store.healthy():
            for c in (mine, theirs):
                with contextlib.suppress(FencedError):
                    c.close()


def test_the_log_cache_never_reads_across_a_gap_between_writers() -> None:
    """Entries of an older writer still pending when a writer starts elsewhere in the stream
    stay for their upload; reads stop at the gap and report an offset inside it as not
    cached (the caller reads objects), and a new writer's first entry after uploaded ones
    drops those."""
    from s3stream.cache.log_cache import LogCache
    from s3stream.format.batch import WAL_PREFIX, encode_batch

    cache = LogCache(1 << 20)

    def put(offset: int, epoch: int) -> None:
        payload = f"p{offset}".encode()
        record = encode_batch(7, offset, 1, 0, 0, None, payload, prefix=WAL_PREFIX.pack(1, epoch))
        cache.put(7, offset, 1, 0, 0, {}, payload, record, WAL_PREFIX.size, offset, epoch)

    for offset in range(5):
        put(offset, 1)
    put(9, 2)  # pending entries before it: kept
    batches, complete = cache.read(7, 0, 10, 1 << 20)
    assert complete and [b.base_offset for b in batches] == [0, 1, 2, 3, 4]
    assert cache.read(7, 5, 10, 1 << 20) == ([], False)
    batches, complete = cache.read(7, 9, 10, 1 << 20)
    assert complete and [b.base_offset for b in batches] == [9]
    cache.mark_uploaded(cache.take())
    put(30, 3)  # all before it uploaded: dropped
    assert cache.first_offset(7) == 30
    assert cache.cached_bytes == cache.pending_bytes > 0


def test_releasing_a_fenced_epoch_leaves_a_reopened_writer_and_its_entries(
    tmp_path: Path,
) -> None:
    """An upload that finds a stream fenced drops this client's entries of the fenced epoch
    and stops that writer, but only if the client still appends at that epoch: checked and
    done under the append lock (`Appender.release_writer(epoch=...)`), so a reopen at a
    newer epoch cannot slip in between and lose its acknowledged entries."""
    from s3stream.errors import FencedError

    with s3stream.open(tmp_path / "store", wal="memory://") as c:
        stream = c.create_stream()
        stream.append(RecordBatch(b"old epoch"))
        storage = c._storage
        appender = storage._appender
        newer = appender.register_writer(stream.stream_id, stream.epoch + 1, 1)  # a reopen
        assert not appender.release_writer(
            stream.stream_id, FencedError("fenced"), epoch=stream.epoch, discard=True
        )
        assert appender._writers[stream.stream_id] is newer and newer.error is None
        assert storage.log_cache.first_offset(stream.stream_id) == 0  # nothing discarded
        # At the epoch it appends at, the writer is stopped and its entries go.
        assert appender.release_writer(
            stream.stream_id, FencedError("fenced"), epoch=stream.epoch + 1, discard=True
        )
        assert stream.stream_id not in appender._writers
        assert isinstance(newer.error, FencedError)
        assert storage.log_cache.first_offset(stream.stream_id) is None
        c.abandon()


@pytest.mark.parametrize("wal", ["file", "memory"])
def test_destroying_a_stream_with_appends_and_an_upload_in_flight(tmp_path: Path, wal: str) -> None:
    """Appends still in the WAL when their stream is destroyed fail (they are not
    acknowledged after `destroy` returned) instead of coming back into the LogCache, and
    neither they nor an upload in flight are reported as acknowledged appends dropped: the
    client closes cleanly."""
    url = f"file://{tmp_path}/n.wal" if wal == "file" else "memory://"
    settings = ClientSettings(upload_threshold_bytes=64 * KiB, upload_interval_ms=1)
    with s3stream.open(tmp_path / "store", wal=url, settings=settings) as c:
        keep = c.create_stream()
        s = c.create_stream()
        futures = [s.append_async(RecordBatch(b"z" * 200)) for _ in range(3000)]
        keep.append(RecordBatch(b"kept"))
        s.destroy()
        outcomes = [f.exception(timeout=30) for f in futures]
        assert all(e is None or isinstance(e, StreamClosedError) for e in outcomes), {
            type(e).__name__ for e in outcomes
        }
        time.sleep(0.2)  # completions and the upload in flight land
        assert c._storage.log_cache.first_offset(s.stream_id) is None
    # close() above raised nothing (no FencedError for what this client destroyed itself)
    with s3stream.open(tmp_path / "store", wal=url) as again:
        assert read_back(again, keep.stream_id) == [b"kept"]
        assert s.stream_id not in [i.stream_id for i in again.list_streams()]


@pytest.mark.parametrize("wal", ["file", "memory"])
def test_closing_a_stream_with_appends_in_flight_acknowledges_none_after_it(
    tmp_path: Path, wal: str
) -> None:
    """Appends racing with `Stream.close()` either are acknowledged before it (and uploaded
    by it) or fail: none is acknowledged after the close, so a reopen's offsets never
    collide with them (the reviewer saw old bytes fetched at a reopen's offsets, the
    uploader die on non-contiguous offsets and acknowledged appends lost)."""
    import threading

    url = f"file://{tmp_path}/n.wal" if wal == "file" else "memory://"
    settings = ClientSettings(upload_threshold_bytes=1 << 20, upload_interval_ms=50)
    with s3stream.open(tmp_path / "store", wal=url, settings=settings) as c:
        s = c.create_stream()
        futures: list[Any] = []

        def spam() -> None:
            for i in range(3000):
                try:
                    futures.append((i, s.append_async(RecordBatch(b"OLD%05d" % i * 1200))))
                except S3StreamError:
                    return

        t = threading.Thread(target=spam)
        t.start()
        time.sleep(0.01)
        s.close()
        t.join(30)
        acked = {
            r.base_offset: i
            for i, f in futures
            if f.exception(timeout=30) is None and (r := f.result()) is not None
        }
        assert sorted(acked) == list(range(len(acked)))  # a prefix, no holes
        again = c.open_stream(s.stream_id)
        assert again.next_offset == len(acked)
        again.append(RecordBatch(b"NEW"))
        got = [b.payload for b in again.fetch(0, len(acked) + 1, max_bytes=1 << 30).batches]
        assert got == [b"OLD%05d" % acked[o] * 1200 for o in range(len(acked))] + [b"NEW"]
    with s3stream.open(tmp_path / "store", wal=url) as c2:
        assert len(read_back(c2, s.stream_id)) == len(acked) + 1


def test_a_long_poll_ends_on_a_manual_clock(tmp_path: Path) -> None:
    """On a client whose clock moves only when told to (`ManualClock`), `fetch(wait_s=...)`
    still returns after `wait_s` of real time (and at once when an append comes): a test
    clock must not turn a bounded wait into one that never ends."""
    import threading

    clock = s3stream.ManualClock()
    with s3stream.open(str(tmp_path), clock=clock) as client:
        stream = client.create_stream()

        def poll(wait_s: float) -> tuple[threading.Thread, list[list[bytes]]]:
            got: list[list[bytes]] = []
            thread = threading.Thread(
                target=lambda: got.append(
                    [b.payload for b in stream.fetch(0, wait_s=wait_s).batches]
                ),
                daemon=True,  # on failure it would wait until the client closes
            )
            thread.start()
            return thread, got

        t0 = time.monotonic()
        thread, got = poll(0.2)
        thread.join(5)
        assert got == [[]], "fetch(wait_s=0.2) did not return within 5 s"
        assert 0.15 <= time.monotonic() - t0 < 2

        thread, got = poll(30)
        time.sleep(0.1)
        stream.append(RecordBatch(b"wake"))
        thread.join(5)
        assert got == [[b"wake"]]


def test_an_append_waiting_for_room_in_a_full_wal_keeps_its_deadline(tmp_path: Path) -> None:
    """The file WAL is full and uploads cannot make room (the store's disk is full): an append
    that reaches the WAL waits for room only until its own deadline (``timeout_s``, else the
    backpressure or call timeout), not for the WAL's ``full_wait_ms`` (30 s by default)."""
    wal = f"file://{tmp_path}/n.wal?capacity_bytes=1MiB"
    settings = ClientSettings(
        call_timeout_ms=4000,
        backpressure_timeout_ms=4000,
        upload_interval_ms=100,
        store_timeout_ms=2000,
    )
    with disk_faults.tmpfs(tmp_path / "disk", "size=8m") as disk:
        client = s3stream.open(disk / "store", wal=wal, settings=settings, environ={})
        try:
            stream = client.create_stream()
            filler = disk_faults.fill_filesystem(disk)
            refused = 0
            for i in range(40):
                kwargs = {"timeout_s": 1.0} if i % 2 else {}
                limit = 1.0 if i % 2 else 4.0
                started = time.monotonic()
                try:
                    stream.append(RecordBatch(b"x" * 60_000), **kwargs)  # type: ignore[arg-type]
                except (WalFullError, BackpressureError, UnavailableError):
                    refused += 1
                took = time.monotonic() - started
                assert took <= limit + 1.5, (i, kwargs, took)
                if refused >= 4:
                    break
            assert refused >= 4
            filler.unlink()
        finally:
            client.close()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_an_upload_a_close_left_behind_writes_nothing_after_it(tmp_path: Path) -> None:
    """`close(timeout_s)` gives up on an upload retrying against a full disk and returns;
    once space is freed, the PUT left retrying (in the store's retries) must not write the
    object, nor the upload commit it, for the closed client. What it held is in the WAL: the
    next open uploads it."""
    wal = f"file://{tmp_path}/n.wal?capacity_bytes=4MiB"
    settings = ClientSettings(call_timeout_ms=3000, upload_interval_ms=100, store_timeout_ms=5000)
    with disk_faults.tmpfs(tmp_path / "disk", "size=16m") as disk:
        store_dir = disk / "store"
        client = s3stream.open(store_dir, wal=wal, settings=settings, environ={})
        stream = client.create_stream()
        filler = disk_faults.fill_filesystem(disk)
        payloads = [b"%d" % i + b"z" * 50_000 for i in range(20)]
        for p in payloads:
            stream.append(RecordBatch(p))
        with pytest.raises(UnavailableError):
            client.close(timeout_s=3)
        files_before = _files(store_dir)
        filler.unlink()
        # A PUT left retrying tries again within its backoff (at most 2 s): it must not.
        time.sleep(3)
        assert _files(store_dir) == files_before
        with s3stream.open(store_dir, wal=wal, environ={}) as again:
            got = [b.payload for b in again.open_stream(stream.stream_id).fetch(0).batches]
            assert [bytes(g) for g in got] == payloads


def test_an_in_memory_wal_is_refused_for_a_node_with_streams_open(tmp_path: Path) -> None:
    """A node that crashed with acknowledged appends in its file WAL, opened again with
    ``wal="memory://"``: the open recovered nothing and its close released the streams, so
    the appends in the real WAL could never be replayed (another node wrote over their
    offsets). Now the open is refused, as for a missing file WAL, unless accept_wal_loss."""
    store = tmp_path / "store"
    crashed = s3stream.open(store, settings={"upload_interval_ms": "1h"})
    stream = crashed.create_stream()
    for i in range(3):
        stream.append(RecordBatch(b"acked %d" % i))
    crashed.abandon()
    with pytest.raises(CorruptionError, match="in-memory WAL holds none of them"):
        s3stream.open(store, wal="memory://")
    with s3stream.open(store) as again:  # its own WAL: everything is there
        assert again.recovery.uploaded_batches == 3
        assert read_back(again, stream.stream_id) == [b"acked 0", b"acked 1", b"acked 2"]
    with s3stream.open(store, wal="memory://") as later:  # released: nothing to lose now
        assert later.stream_info(stream.stream_id).end_offset == 3


def test_a_small_wal_filled_by_appends_in_flight_is_uploaded_at_once(tmp_path: Path) -> None:
    """300 `append_async` of 1 KiB into a 256 KiB file WAL: the WAL filled before any append
    was acknowledged, so the upload it asked for found nothing to take, and the uploader
    slept until the upload interval (30 s): the append waiting for room failed with
    `WalFullError` after ``full_wait_ms``, every time. An acknowledgement now wakes an
    uploader asked to upload."""
    settings = {"file_wal.capacity_bytes": "256KiB", "file_wal.full_wait_ms": "5s"}
    with s3stream.open(tmp_path / "s", settings=settings) as client:
        stream = client.create_stream()
        started = time.monotonic()
        futures = [stream.append_async(RecordBatch(b"%04d" % i * 256)) for i in range(300)]
        assert [f.result(10).base_offset for f in futures] == list(range(300))
        assert time.monotonic() - started < 4
    with s3stream.open(tmp_path / "s", wal="memory://", node_id="r") as reader:
        got = read_back(reader, stream.stream_id)
        assert got == [b"%04d" % i * 256 for i in range(300)]


def test_a_wal_that_cannot_be_repaired_leaves_acknowledged_data_readable() -> None:
    """Only a take-over fails the stream handles (their reads included): a WAL whose repair
    failed for good made reads through every handle raise too, once handles were failed on
    the client's failure (review of the take-over mend)."""
    import random

    from s3stream.testing.faults import FaultyWal

    class ResetFails(FaultyWal):
        def reset(self) -> None:
            if self.failing:
                raise CorruptionError("injected: the WAL medium is gone for good")
            super().reset()

    wal = ResetFails(MemoryWal(), rng=random.Random(1))
    client = s3stream.open("memory://", wal=wal, node_id="n1")
    stream = client.create_stream()
    stream.append(RecordBatch(b"acked-0"))
    client.flush()
    stream.append(RecordBatch(b"acked-1"))
    wal.failing = True
    with pytest.raises(S3StreamError):
        stream.append(RecordBatch(b"x"), timeout_s=2)
    deadline = time.monotonic() + 10
    while client._storage._status.failed is None:  # the uploader's repair gives up
        assert time.monotonic() < deadline, "the repair never failed"
        time.sleep(0.05)
    got = stream.fetch(0).batches
    assert [bytes(b.payload) for b in got] == [b"acked-0", b"acked-1"]
    with contextlib.suppress(S3StreamError):
        client.close(timeout_s=5)


def test_a_refused_open_of_a_live_node_does_not_fence_it(tmp_path: Path) -> None:
    """`s3stream compact --node-id w1` beside w1's live writer (an open on a memory WAL, or
    on a file WAL that is missing, of a node with streams open): the open was refused, but
    only after it had registered the node again, which fenced the live writer (its next
    upload failed with FencedError, its appends stayed uncommitted until a take-over). The
    refusal now comes before anything is written to the log."""
    store = tmp_path / "store"
    live = s3stream.open(store, node_id="w1", settings={"upload_interval_ms": "1h"})
    stream = live.create_stream()
    stream.append(RecordBatch(b"before"))
    log = sorted((store / "meta" / "log").iterdir())
    with pytest.raises(CorruptionError, match="in-memory WAL holds none of them"):
        s3stream.open(store, node_id="w1", wal="memory://")
    missing = (tmp_path / "elsewhere.wal").as_uri()
    with pytest.raises(CorruptionError, match="missing"):
        s3stream.open(store, node_id="w1", wal=missing)
    # Another store's WAL (its identity is not the one recorded for w1): refused after the
    # registration too (review of the first mend).
    other = s3stream.open(tmp_path / "other", node_id="w1", wal=(tmp_path / "x.wal").as_uri())
    other.create_stream().append(RecordBatch(b"someone else's"))
    other.abandon()
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        s3stream.open(store, node_id="w1", wal=(tmp_path / "x.wal").as_uri())
    assert sorted((store / "meta" / "log").iterdir()) == log  # nothing committed
    stream.append(RecordBatch(b"after"))
    live.flush()  # not fenced
    live.close()
    with s3stream.open(store, node_id="w2", wal="memory://") as reader:
        assert read_back(reader, stream.stream_id) == [b"before", b"after"]


def test_an_unseen_commit_whose_objects_were_compacted_away_is_still_recognised() -> None:
    """As `test_an_upload_whose_commit_landed_unseen_is_not_committed_again`, but another node
    compacts the landed objects away before the retry: the retry no longer finds its object
    keys, and recognises its commit by the stream's end at its own epoch instead."""
    store, client = _faulty_client(_LOST_COMMIT_REPLY, "n1")
    compacting = ClientSettings(
        compaction=CompactionSettings(
            background=False, deletion_delay_ms=0, stream_set_max_age_ms=1
        )
    )
    try:
        stream = _append_and_lose_the_commit_reply(store, client)
        with store.healthy():
            landed = {o.key for o in client.object_store.list("data/")}
            with StreamClient(store, MemoryWal(), node_id="c2", settings=compacting) as other:
                other.compact()
                other.compact()
                assert not landed & set(other.metadata.state.objects)  # rewritten, purged
            client.flush(timeout_s=5)
            stream.append(RecordBatch(b"second"))
            client.flush(timeout_s=5)
            assert read_back(client, stream.stream_id) == [b"first", b"second"]
    finally:
        with store.healthy():
            client.close()


def test_a_client_on_an_in_memory_wal_takes_no_node_over_without_its_wal(
    tmp_path: Path,
) -> None:
    """A client opened with ``wal="memory://"`` has no WAL of another node to replay: its
    `take_over(node)` without `wal=` is refused before anything happens (the node is not
    fenced), as for a client given a WAL instance."""
    store = tmp_path / "store"
    node = s3stream.open(store, node_id="n1", settings={"upload_interval_ms": "1h"})
    stream = node.create_stream()
    stream.append(RecordBatch(b"acked"))
    taker = s3stream.open(store, node_id="t", wal="memory://", accept_wal_loss=True)
    with taker, pytest.raises(InvalidArgumentError, match="pass wal="):
        taker.take_over("n1")
    node.flush(timeout_s=5)  # not fenced
    node.close()
    with s3stream.open(store, node_id="n1") as again:
        assert read_back(again, stream.stream_id) == [b"acked"]
