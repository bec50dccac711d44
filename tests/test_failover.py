"""Node failover: a writer killed with SIGKILL, its node taken over, a zombie fenced.

The writers are real child processes (this file run as a script) that report every
acknowledged append on stdout (``ACK <stream> <id>``); the parent kills them with SIGKILL and
takes their node over, then checks that every acknowledged batch is readable exactly once and
that nothing the zombie wrote after the fence is visible. Each test runs with the metadata log
in the object store and in PostgreSQL (`metadata_url`): fencing must hold on either.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import IO, Any

import pytest

from s3stream.testing.store_servers import LoopbackStoreServer

ROOT = Path(__file__).resolve().parents[1]
_CHILD_TIMEOUT_S = 60


# -- the child processes -------------------------------------------------------------------------


def _child_main(mode: str, config: dict[str, Any]) -> None:
    import s3stream
    from s3stream.errors import S3StreamError
    from s3stream.settings import ClientSettings, ObjectWalSettings
    from s3stream.types import AppendResult, RecordBatch

    lock = threading.Lock()

    def out(line: str) -> None:
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    client = s3stream.open(
        config["url"],
        node_id="A",
        storage_options=config["options"],
        settings=ClientSettings(upload_threshold_bytes=64 << 10, upload_interval_ms=300),
        object_wal_settings=ObjectWalSettings(wal_batch_interval_ms=20),
        metadata=config.get("metadata"),
    )
    out(f"EPOCH {client.node_epoch}")
    tag = config["tag"]

    def payload(seq: int) -> bytes:
        return f"{tag}:{seq}:".encode() + bytes(300 + seq % 500)

    if mode == "zombie":
        stream = client.create_stream({"writer": tag})
        out(f"STREAMS {stream.stream_id}")
        for i in range(20):
            stream.append(RecordBatch(payload(i), count=1))
            out(f"ACK {stream.stream_id} {tag}:{i}")
        out("PAUSED")
        sys.stdin.readline()
        for i in range(20, 40):
            try:
                stream.append_async(RecordBatch(payload(i), count=1)).result(10)
                out(f"ZACK {i}")
            except S3StreamError as exc:
                out(f"ZERR {i} {type(exc).__name__}")
        out("DONE")
        os._exit(0)

    if config["streams"]:
        streams = [client.open_stream(sid) for sid in config["streams"]]
    else:
        streams = [client.create_stream({"writer": tag, "i": str(i)}) for i in range(2)]
    out("STREAMS " + " ".join(str(s.stream_id) for s in streams))

    def report(sid: int, seq: int, fut: Future[AppendResult]) -> None:
        if fut.exception() is None:
            out(f"ACK {sid} {tag}:{seq}")

    window: deque[Future[AppendResult]] = deque()
    seq = 0
    while True:  # until killed
        s = streams[seq % len(streams)]
        fut = s.append_async(RecordBatch(payload(seq), count=1))
        fut.add_done_callback(partial(report, s.stream_id, seq))
        window.append(fut)
        if len(window) >= 32:
            window.popleft().result(30)
        seq += 1
        time.sleep(0.002)


# -- the parent's side ---------------------------------------------------------------------------


class Child:
    """A child process whose stdout lines are collected by a thread."""

    def __init__(self, mode: str, config: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, mode, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._lock = threading.Lock()
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            if line.endswith("\n"):  # a line cut by SIGKILL is not a report
                with self._lock:
                    self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate: Any, what: str) -> None:
        deadline = time.monotonic() + _CHILD_TIMEOUT_S
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(self.lines):
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
        raise AssertionError(f"child never {what}; lines {self.lines[-5:]}; stderr {err[-2000:]}")

    def acked(self) -> set[str]:
        with self._lock:
            return {line.split()[2] for line in self.lines if line.startswith("ACK ")}

    def streams(self) -> list[int]:
        with self._lock:
            line = next(x for x in self.lines if x.startswith("STREAMS "))
        return [int(x) for x in line.split()[1:]]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture(params=["store", "postgres"])
def metadata_url(request: pytest.FixtureRequest) -> str | None:
    """Where the metadata log lives: None (in the object store) or a PostgreSQL namespace of
    the test's own on the session's server."""
    if request.param == "store":
        return None
    server = request.getfixturevalue("postgres")
    url: str = server.url(namespace=f"failover-{uuid.uuid4().hex[:12]}")
    return url


#: (object-store server, metadata) pairs of the take-over test: the object-store log on each
#: server of the matrix (tests/conftest.py ``STORE_SERVERS``), and PostgreSQL beside SeaweedFS.
FAILOVER_TARGETS = [
    ("seaweedfs", "store"),
    ("moto", "store"),
    ("gcs", "store"),
    ("azure", "store"),
    ("seaweedfs", "postgres"),
]


@pytest.fixture(params=[pytest.param(t, id="-".join(t)) for t in FAILOVER_TARGETS])
def failover_target(
    request: pytest.FixtureRequest, store_server_of: Callable[[str], LoopbackStoreServer]
) -> tuple[LoopbackStoreServer, str | None]:
    """A server of the matrix, and where the metadata log lives (None: in its store)."""
    kind, metadata = request.param
    server = store_server_of(kind)
    if metadata == "store":
        return server, None
    pg = request.getfixturevalue("postgres")
    url: str = pg.url(namespace=f"failover-{uuid.uuid4().hex[:12]}")
    return server, url


def _count_acks(n: int) -> Any:
    return lambda lines: sum(line.startswith("ACK ") for line in lines) >= n


def _visible(reader: Any, stream_ids: list[int]) -> dict[int, list[str]]:
    """Payload ids of every committed batch, per stream, in offset order."""
    out: dict[int, list[str]] = {}
    for sid in stream_ids:
        info = reader.stream_info(sid)
        ids: list[str] = []
        offset = info.start_offset
        while offset < info.end_offset:
            res = reader.read(sid, offset, max_bytes=4 << 20)
            ids += [b":".join(b.payload.split(b":", 2)[:2]).decode() for b in res.batches]
            offset = res.next_offset
        out[sid] = ids
    return out


@pytest.mark.s3
@pytest.mark.slow
def test_sigkilled_writer_is_taken_over_and_its_zombie_is_fenced(
    failover_target: tuple[LoopbackStoreServer, str | None],
) -> None:
    import s3stream
    from s3stream.settings import ObjectWalSettings
    from s3stream.types import RecordBatch

    server, metadata_url = failover_target
    url = server.url(f"failover-{uuid.uuid4().hex}")
    options = server.storage_options()
    base = {"url": url, "options": options, "streams": [], "metadata": metadata_url}
    children: list[Child] = []
    try:
        # The zombie: an earlier holder of node A, still running with epoch 1.
        zombie = Child("zombie", {**base, "tag": "Z"})
        children.append(zombie)
        zombie.wait_for(lambda ls: "PAUSED" in ls, "paused")
        zombie_streams = zombie.streams()

        # Round 1: A (epoch 2) appends until it is killed; B takes over in-process.
        a1 = Child("writer", {**base, "tag": "A1"})
        children.append(a1)
        a1.wait_for(_count_acks(150), "acknowledged 150 appends")
        time.sleep(0.1)
        a1.kill()
        a_streams = a1.streams()

        taker = s3stream.open(
            url,
            node_id="B",
            storage_options=options,
            object_wal_settings=ObjectWalSettings(wal_batch_interval_ms=10),
            metadata=metadata_url,
        )
        with taker:
            report = taker.take_over("A")
            assert report.node_epoch == 3
            assert set(report.released_streams) == set(a_streams) | set(zombie_streams)

            # The zombie wakes up: nothing it writes may become visible.
            assert zombie.proc.stdin is not None
            zombie.proc.stdin.write("GO\n")
            zombie.proc.stdin.flush()
            zombie.wait_for(lambda ls: "DONE" in ls, "finished")
            errors = [x.split()[2] for x in zombie.lines if x.startswith("ZERR")]
            assert errors == ["FencedError"] * 20, zombie.lines[-25:]

            # Round 2: A restarts (epoch 4), reopens its streams, is killed again; the take-over
            # runs as a command this time.
            a2 = Child("writer", {**base, "tag": "A2", "streams": a_streams})
            children.append(a2)
            a2.wait_for(_count_acks(100), "acknowledged 100 appends")
            a2.kill()
            cli = subprocess.run(
                [sys.executable, "-m", "s3stream", "take-over", url, "A"]
                + [f"-o{k}={v}" for k, v in options.items()]
                + (["--metadata", metadata_url] if metadata_url else []),
                capture_output=True,
                text=True,
                timeout=_CHILD_TIMEOUT_S,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                check=False,
            )
            assert cli.returncode == 0, cli.stderr
            cli_report = json.loads(cli.stdout)
            assert cli_report["node_epoch"] == 5
            # The writers never stop, so their last batches were only in the WAL when they died.
            assert report.recovery.uploaded_batches + cli_report["uploaded_batches"] > 0

            visible = _visible(taker, a_streams + zombie_streams)
            every = [x for ids in visible.values() for x in ids]
            assert len(every) == len(set(every)), "a batch is visible twice"
            acked = a1.acked() | a2.acked() | zombie.acked()
            missing = acked - set(every)
            assert not missing, (
                f"{len(missing)} acknowledged batches lost, e.g. {sorted(missing)[:5]}"
            )
            assert all(x.split(":")[0] in ("A1", "A2", "Z") for x in every)
            zombie_ids = [int(x.split(":")[1]) for x in every if x.startswith("Z:")]
            assert max(zombie_ids) < 20, "the zombie wrote after the fence and it became visible"
            for ids in visible.values():  # each writer's batches in the order it sent them
                for tag in ("A1", "A2", "Z"):
                    seqs = [int(x.split(":")[1]) for x in ids if x.startswith(tag + ":")]
                    assert seqs == sorted(seqs)

            # The streams were released: the taker can open and use them.
            stream = taker.open_stream(a_streams[0])
            stream.append(RecordBatch(b"B:0:after the take-over", count=1))
            taker.flush()
            assert _visible(taker, [a_streams[0]])[a_streams[0]][-1] == "B:0"
    finally:
        for child in children:
            child.close()


def test_take_over_of_a_file_wal_given_by_path(tmp_path: Path, metadata_url: str | None) -> None:
    """In-process: node A's file WAL (a local directory store) recovered by node B."""
    import s3stream
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a = s3stream.open(root, node_id="A", metadata=metadata_url)
    stream = a.create_stream()
    payloads = [b"A:%d:" % i for i in range(30)]
    for p in payloads:
        stream.append(RecordBatch(p, count=1))
    a._storage.abandon()  # crash: everything is only in A's WAL
    a._wal._abandon()  # type: ignore[attr-defined]
    with s3stream.open(root, node_id="B", metadata=metadata_url) as b:
        wal_path = root.resolve() / "wal" / "A.wal"
        report = b.take_over("A", wal=f"file://{wal_path}")
        assert report.recovery.uploaded_batches == 30
        assert report.released_streams == (stream.stream_id,)
        assert _visible(b, [stream.stream_id])[stream.stream_id] == [f"A:{i}" for i in range(30)]
        again = b.take_over("A")  # the default WAL of a local store, by node id
        assert again.recovery.records == 0 and again.node_epoch == report.node_epoch + 1


def test_a_take_over_refused_for_its_wal_does_not_fence_the_node(tmp_path: Path) -> None:
    """`take_over("w1", wal=<w2's WAL>)` and `wal=<another store's w1 WAL>` were refused,
    by the WAL's open, after the take-over had registered w1 (its epoch bumped once per
    attempt): a live, healthy w1 was fenced by a call that was refused. Now the WAL's header
    is read first and nothing is registered."""
    import s3stream
    from s3stream.types import RecordBatch

    root, other = tmp_path / "store", tmp_path / "other"
    for store, nodes in ((root, ("w1", "w2")), (other, ("w1",))):
        for node in nodes:
            c = s3stream.open(
                store,
                node_id=node,
                wal=f"file://{tmp_path}/{store.name}-{node}.wal?capacity_bytes=1MiB",
            )
            c.create_stream().append(RecordBatch(node.encode()))
            c.abandon()

    def epoch() -> int:
        with s3stream.open_reader(root) as r:
            return r.metadata.state.nodes["w1"].epoch

    before = epoch()
    with s3stream.open(root, node_id="t", wal="memory://") as t:
        with pytest.raises(s3stream.InvalidArgumentError, match="belongs to node 'w2'"):
            t.take_over("w1", wal=f"file://{tmp_path}/store-w2.wal")
        with pytest.raises(s3stream.InvalidArgumentError, match="not the WAL this store"):
            t.take_over("w1", wal=f"file://{tmp_path}/other-w1.wal")
        assert epoch() == before
        report = t.take_over("w1", wal=f"file://{tmp_path}/store-w1.wal")
        assert report.recovery.records == 1 and report.node_epoch == before + 1


def test_a_wal_refused_for_its_header_does_not_fence_the_live_node(tmp_path: Path) -> None:
    """A WAL of the node with both header slots damaged, or another store's WAL of the node
    cut to half its size, passed the pre-registration check (it judged only readable
    headers): the open and the take-over that named it were refused by the WAL's own open,
    after registering the node, and the live node was fenced."""
    import s3stream
    from s3stream.types import RecordBatch
    from s3stream.wal.framing import SLOT_BYTES

    root = tmp_path / "store"
    wal = f"file://{tmp_path}/{{}}.wal?capacity_bytes=1MiB"
    for store, name in ((tmp_path / "a", "spare"), (tmp_path / "b", "cut")):
        c = s3stream.open(store, node_id="n1", wal=wal.format(name))
        c.create_stream().append(RecordBatch(b"x"))
        c.abandon()
    with open(tmp_path / "spare.wal", "r+b") as f:  # both slots fail their checksums
        for slot in range(2):
            f.seek(slot * SLOT_BYTES + 100)
            f.write(b"\xff" * 8)
    os.truncate(tmp_path / "cut.wal", os.path.getsize(tmp_path / "cut.wal") // 2)

    def epoch() -> int:
        with s3stream.open_reader(root) as r:
            return r.metadata.state.nodes["n1"].epoch

    with s3stream.open(root, node_id="n1", wal=wal.format("live")) as live:
        live.create_stream().append(RecordBatch(b"live"))
        before = epoch()
        with s3stream.open(root, node_id="t", wal="memory://") as t:
            for name in ("spare", "cut"):
                with pytest.raises((s3stream.CorruptionError, s3stream.InvalidArgumentError)):
                    t.take_over("n1", wal=wal.format(name), timeout_s=10)
        assert epoch() == before
        live.create_stream().append(RecordBatch(b"still live"))  # not fenced


def test_an_object_wal_refused_for_its_node_does_not_fence_it(tmp_path: Path) -> None:
    """An object WAL's refusals (a prefix holding nothing while the node's streams are open,
    or another store's WAL holding records) came from its recovery, after the open or the
    take-over had registered the node: a live node was fenced by a call that was refused.
    `ObjectWal.preflight` judges them read-only first."""
    import s3stream
    from s3stream.types import RecordBatch

    root, other = tmp_path / "store", tmp_path / "other"
    for store in (root, other):
        c = s3stream.open(store, node_id="w1", wal=f"object+file://{tmp_path}/{store.name}-wal")
        c.create_stream().append(RecordBatch(store.name.encode()))
        c.abandon()

    def epoch() -> int:
        with s3stream.open_reader(root) as r:
            return r.metadata.state.nodes["w1"].epoch

    before = epoch()
    empty, others = f"object+file://{tmp_path}/empty-wal", f"object+file://{tmp_path}/other-wal"
    with pytest.raises(s3stream.CorruptionError, match="holds no WAL object"):
        s3stream.open(root, node_id="w1", wal=empty)
    with s3stream.open(root, node_id="t", wal="memory://") as t:
        with pytest.raises(s3stream.CorruptionError, match="holds no WAL object"):
            t.take_over("w1", wal=empty)
        with pytest.raises(s3stream.InvalidArgumentError, match="not the WAL this store"):
            t.take_over("w1", wal=others)
        assert epoch() == before
        report = t.take_over("w1", wal=f"object+file://{tmp_path}/store-wal")
        assert report.recovery.records == 1 and report.node_epoch == before + 1


@pytest.mark.s3
def test_a_wiped_default_object_wal_is_refused_before_the_node_is_registered(
    seaweedfs: LoopbackStoreServer,
) -> None:
    """A remote store's default WAL (``wal/`` of the store) found wiped while the node's
    streams are open: refused by its recovery, after the open had registered the node."""
    import s3stream
    from s3stream.objectstore.registry import open_object_store
    from s3stream.types import RecordBatch

    url = f"s3://{seaweedfs.bucket}/wiped-{uuid.uuid4().hex}"
    opts = seaweedfs.storage_options()
    c = s3stream.open(url, node_id="w1", storage_options=opts)
    c.create_stream().append(RecordBatch(b"only in the WAL"))
    c.abandon()
    store = open_object_store(url, opts)
    try:
        store.delete_many([info.key for info in store.list("wal/w1/")])
    finally:
        store.close()

    def epoch() -> int:
        with s3stream.open_reader(url, storage_options=opts) as r:
            return r.metadata.state.nodes["w1"].epoch

    before = epoch()
    with pytest.raises(s3stream.CorruptionError, match="holds no WAL object"):
        s3stream.open(url, node_id="w1", storage_options=opts)
    assert epoch() == before


def test_a_take_over_releases_all_the_nodes_streams_in_one_entry(
    tmp_path: Path, metadata_url: str | None
) -> None:
    """The streams of the node taken over are released in one metadata entry, as a client's
    close releases its own (one commit per stream made a node with tens of thousands of open
    streams impossible to take over within a deadline); a stream another client reopened
    before is left to it."""
    import s3stream
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a = s3stream.open(root, node_id="A", metadata=metadata_url)
    streams = a.create_streams([None] * 300)
    streams[0].append(RecordBatch(b"kept", count=1))
    a._storage.abandon()  # crash: the append is only in A's WAL
    a._wal._abandon()  # type: ignore[attr-defined]
    with s3stream.open(root, node_id="B", metadata=metadata_url) as b:
        reopened = b.open_stream(streams[1].stream_id, force=True)
        b._meta.refresh()
        before = b._meta.state.seq
        report = b.take_over("A")
        b._meta.refresh()
        after = b._meta.state.seq
        # One entry registers the take-over's epoch, one commits the replayed append's object,
        # one releases the 299 streams.
        assert after - before == 3
        assert report.released_streams == tuple(s.stream_id for s in streams if s is not streams[1])
        assert report.recovery.uploaded_batches == 1
        assert [s.state for s in b.list_streams() if s.stream_id != reopened.stream_id] == [
            s3stream.StreamState.CLOSED
        ] * 299
        reopened.append(RecordBatch(b"still B's", count=1))
        assert _visible(b, [streams[0].stream_id])[streams[0].stream_id] == ["kept"]


@pytest.mark.parametrize("left_open", [True, False])
def test_a_take_over_leaves_the_streams_of_a_session_newer_than_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, left_open: bool
) -> None:
    """The node restarts on its WAL just after the take-over's replay let go of it, reopens
    its stream and appends: the take-over's release closed that new session's stream, whose
    next acknowledged append was then lost. It raises `FencedError` now and closes nothing;
    also when the node had no stream left open (it reported success at an epoch that was no
    longer the node's)."""
    import s3stream
    from s3stream import failover
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    wal = f"file://{tmp_path}/v.wal?capacity_bytes=1MiB"
    v = s3stream.open(root, node_id="v", wal=wal)
    stream = v.create_stream()
    stream.append(RecordBatch(b"old"))
    v.flush()
    if not left_open:
        stream.close()
    v.abandon()
    restarted: list[Any] = []
    real_close = failover.Storage.close

    def close_then_restart(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = real_close(self, *args, **kwargs)
        if not restarted:
            again = s3stream.open(root, node_id="v", wal=wal)
            restarted.append(again)
            if left_open:
                handle = again.open_stream(stream.stream_id)
                handle.append(RecordBatch(b"new-1"))
                again.flush()
                restarted.append(handle)
            t.list_streams()  # the taking client's view sees the restart
        return result

    monkeypatch.setattr(failover.Storage, "close", close_then_restart)
    with s3stream.open(root, node_id="t", wal="memory://") as t:
        with pytest.raises(s3stream.FencedError, match="registered again"):
            t.take_over("v", wal=wal)
        monkeypatch.setattr(failover.Storage, "close", real_close)
        if not left_open:
            restarted[0].close()
            return
        again, handle = restarted
        assert [s.state for s in t.list_streams()] == [s3stream.StreamState.OPEN]
        handle.append(RecordBatch(b"new-2"))
        again.close()
        got = t.read(stream.stream_id, 0).batches
        assert [bytes(b.payload) for b in got] == [b"old", b"new-1", b"new-2"]


def test_a_stream_force_opened_during_the_replay_leaves_the_others_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client force-opens one of the node's streams while the take-over replays the
    node's WAL: that stream's replayed appends are dropped (what a force-open does), and the
    take-over used to raise that drop report, releasing none of the node's other streams."""
    import s3stream
    from s3stream import failover
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    wal = f"file://{tmp_path}/v.wal?capacity_bytes=1MiB"
    v = s3stream.open(root, node_id="v", wal=wal)
    streams = v.create_streams([None] * 4)
    for s in streams:
        s.append(RecordBatch(b"v%d" % s.stream_id))
    v.abandon()
    with (
        s3stream.open(root, node_id="z", wal="memory://") as z,
        s3stream.open(root, node_id="t", wal="memory://") as t,
    ):
        real_recover = failover.Storage.recover

        def force_open_then_recover(self: Any, *args: Any, **kwargs: Any) -> Any:
            monkeypatch.setattr(failover.Storage, "recover", real_recover)
            z.open_stream(streams[0].stream_id, force=True)
            return real_recover(self, *args, **kwargs)

        monkeypatch.setattr(failover.Storage, "recover", force_open_then_recover)
        report = t.take_over("v", wal=wal)
        others = [s.stream_id for s in streams[1:]]
        assert report.released_streams == tuple(others)
        states = {i.stream_id: i.state for i in t.list_streams()}
        assert states[streams[0].stream_id] is s3stream.StreamState.OPEN
        assert [states[sid] for sid in others] == [s3stream.StreamState.CLOSED] * 3
        assert [[bytes(b.payload) for b in t.read(sid, 0).batches] for sid in others] == [
            [b"v%d" % sid] for sid in others
        ]


def test_a_client_taken_over_creates_no_stream(tmp_path: Path) -> None:
    """A client whose node was taken over could still create streams: open on the fenced
    node, never writable nor released by it, and the node's next take-over then called its
    WAL lost (`CorruptionError`, "open with accept_wal_loss=True")."""
    import s3stream

    root = tmp_path / "store"
    a = s3stream.open(root, node_id="w1")
    with s3stream.open(root, node_id="t1") as b:
        b.take_over("w1")
        with pytest.raises(s3stream.FencedError, match="fenced and creates no stream"):
            a.create_stream(tags={"x": "1"})
        with pytest.raises(s3stream.FencedError):
            a.create_streams([{"y": "1"}, None])
        assert b.list_streams() == []  # undone: nothing left open on w1
        with contextlib.suppress(s3stream.S3StreamError):
            a.close(timeout_s=5)
        assert b.take_over("w1").released_streams == ()
    # A take-over between two entries of one create_streams call: the streams of the first
    # entry, closed by the take-over at their create's epoch and handed to nobody, stayed.
    c = s3stream.open(root, node_id="w2")
    with s3stream.open(root, node_id="t2") as b:
        real = c._meta.create_streams
        calls: list[int] = []

        def taken_over_after_the_first_entry(*args: Any, **kwargs: Any) -> Any:
            made = real(*args, **kwargs)
            calls.append(len(made))
            if len(calls) == 1:
                b.take_over("w2")
            return made

        c._meta.create_streams = taken_over_after_the_first_entry  # type: ignore[method-assign]
        with pytest.raises(s3stream.FencedError):
            c.create_streams([None] * 1500)  # two entries of at most 1,024
        assert calls[0] == 1024
        assert b.list_streams() == []
    with contextlib.suppress(s3stream.S3StreamError):
        c.close(timeout_s=5)


def test_a_take_over_given_up_at_its_deadline_lets_go_of_the_wal(
    tmp_path: Path, metadata_url: str | None
) -> None:
    """A take-over that misses its `timeout_s` mid-replay, its client then closed: the replay
    left behind stops at that deadline (not `call_timeout_ms` later, retrying against a
    closed store and metadata log while it holds the node's WAL), and a take-over by another
    client recovers everything."""
    import threading

    import s3stream
    from s3stream.errors import UnavailableError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a = s3stream.open(root, node_id="A", metadata=metadata_url)
    stream = a.create_stream()
    payloads = [b"A:%d:" % i + b"x" * 20_000 for i in range(600)]
    for p in payloads:
        stream.append(RecordBatch(p, count=1))
    a._storage.abandon()  # crash: everything is only in A's WAL
    a._wal._abandon()  # type: ignore[attr-defined]
    b = s3stream.open(root, node_id="B", metadata=metadata_url)
    with pytest.raises(UnavailableError):
        b.take_over("A", timeout_s=0.05)
    b.close()
    for t in threading.enumerate():
        if t.name == "s3stream-take-over:A":
            t.join(10)
            assert not t.is_alive(), "the take-over left behind still runs after its client closed"
    with s3stream.open(root, node_id="C", metadata=metadata_url) as c:
        c.take_over("A")
        got: list[bytes] = []
        while len(got) < len(payloads):
            page = c.read(stream.stream_id, len(got), len(payloads)).batches
            assert page, f"nothing at offset {len(got)}"
            got += [bytes(b.payload) for b in page]
        assert got == payloads


# -- a handle fenced by another client, in-process ------------------------------------------------


def _owner_of_a0(root: Path, metadata_url: str | None = None) -> tuple[Any, Any]:
    """Client "a" on `root` and its new stream, holding b"a0" at offset 0, uploaded."""
    import s3stream
    from s3stream.types import RecordBatch

    a = s3stream.open(root, node_id="a", metadata=metadata_url)
    s = a.create_stream()
    s.append(RecordBatch(b"a0"))
    a.flush()
    return a, s


def _payloads(client: Any, sid: int) -> list[bytes]:
    info = client.stream_info(sid)
    return [b.payload for b in client.read(sid, info.start_offset, info.end_offset).batches]


def test_a_client_reopens_a_stream_another_client_fenced(
    tmp_path: Path, metadata_url: str | None
) -> None:
    """After another client force-opens its stream, a client is not stuck with its fenced
    handle: `open_stream` sees the newer epoch, drops what the fenced handle acknowledged
    and did not upload (reported once by `flush`, naming the offsets), and opens the
    stream anew; the old handle's appends raise `FencedError` and its close is a no-op."""
    import s3stream
    from s3stream.errors import FencedError, StreamOwnedError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a, old = _owner_of_a0(root, metadata_url)
    sid = old.stream_id
    b = s3stream.open(root, node_id="b", metadata=metadata_url)
    mine = b.open_stream(sid, force=True)
    mine.append(RecordBatch(b"b1"))
    b.flush()
    # A does not know yet: its append is acknowledged into its own WAL only.
    assert old.append(RecordBatch(b"a-lost")).base_offset == 1
    with pytest.raises(StreamOwnedError, match="'b'"):
        a.open_stream(sid)  # b still has it open
    new = a.open_stream(sid, force=True)
    assert new is not old and new.epoch > mine.epoch and not new.closed
    with pytest.raises(FencedError):
        old.append(RecordBatch(b"too late"))
    with pytest.raises(FencedError, match=r"stream \d+ offsets \[1, 2\) \(node 'b'"):
        a.flush()
    a.flush()  # reported once
    assert new.append(RecordBatch(b"a2")).base_offset == 2
    assert a.open_stream(sid) is new
    old.close()  # replaced: nothing of it is left to release
    assert old.closed and not new.closed
    b.flush()  # b's handle is fenced in turn, but nothing of it was lost
    mine.append(RecordBatch(b"b-lost"))
    with pytest.raises(FencedError, match=r"offsets \[2, 3\) \(node 'a'"):
        b.flush()
    with pytest.raises(FencedError, match="node 'a' opened it"):
        mine.close()
    assert mine.closed
    with pytest.raises(FencedError, match=r"offsets \[2, 3\)"):
        b.close()
    a.flush()
    assert _payloads(a, sid) == [b"a0", b"b1", b"a2"]
    with pytest.raises(FencedError, match=r"offsets \[1, 2\)"):
        a.close()  # a client that dropped acknowledged appends says so when it closes


@pytest.mark.parametrize("pending", [False, True])
def test_closing_a_fenced_handle_closes_it(
    tmp_path: Path, metadata_url: str | None, pending: bool
) -> None:
    """`Stream.close` of a handle another client fenced raises `FencedError` once (naming
    what was dropped, if anything was) and the handle is closed: a second close is a no-op,
    the client can open the stream again once the other client released it, and a client
    that lost nothing closes cleanly."""
    import s3stream
    from s3stream.errors import FencedError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a, s = _owner_of_a0(root, metadata_url)
    with s3stream.open(root, node_id="b", metadata=metadata_url) as b:
        b.open_stream(s.stream_id, force=True).close()
    if pending:
        s.append(RecordBatch(b"a-lost"))
    match = r"offsets \[1, 2\)" if pending else "another client opened it at epoch 2"
    with pytest.raises(FencedError, match=match):
        s.close()
    assert s.closed
    s.close()
    again = a.open_stream(s.stream_id)
    assert again.append(RecordBatch(b"a1")).base_offset == 1
    if pending:
        with pytest.raises(FencedError, match=r"offsets \[1, 2\)"):
            a.close()
    else:
        a.close()
    with s3stream.open(root, node_id="c", metadata=metadata_url) as c:
        assert _payloads(c, s.stream_id) == [b"a0", b"a1"]


def test_destroying_a_fenced_stream_reports_what_it_dropped(
    tmp_path: Path, metadata_url: str | None
) -> None:
    """A destroy that finds the stream taken by another client deletes nothing, raises
    `FencedError`, closes the handle, and what the handle had acknowledged and not uploaded
    is reported dropped (not silently let go as if it had been deleted)."""
    import s3stream
    from s3stream.errors import FencedError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a, s = _owner_of_a0(root, metadata_url)
    with s3stream.open(root, node_id="b", metadata=metadata_url) as b:
        theirs = b.open_stream(s.stream_id, force=True)
        s.append(RecordBatch(b"a-lost"))
        with pytest.raises(FencedError):
            s.destroy()
        assert s.closed
        with pytest.raises(FencedError, match=r"offsets \[1, 2\) \(node 'b'"):
            a.flush()
        theirs.append(RecordBatch(b"b1"))
        b.flush()
        assert _payloads(b, s.stream_id) == [b"a0", b"b1"]
    with pytest.raises(FencedError, match=r"offsets \[1, 2\)"):
        a.close()


def _paused_after(obj: Any, name: str, when: Callable[..., bool]) -> tuple[Any, Any]:
    """Wrap `obj.name` so that a call for which `when(*args)` holds sets the first event
    after the call and waits for the second before returning: a window held open where a
    thread of the library is between two steps (here, in the client's own threads)."""
    reached, go = threading.Event(), threading.Event()
    original = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if when(*args):
            reached.set()
            go.wait(10)
        return out

    setattr(obj, name, wrapped)
    return reached, go


def test_an_append_acknowledged_as_its_stream_is_dropped_is_reported(tmp_path: Path) -> None:
    """An append in the LogCache but not yet acknowledged when `open_stream` drops the
    fenced handle's entries is acknowledged afterwards: the report must cover it (the
    writer's confirm offset, read as it stopped, lags it)."""
    import s3stream
    from s3stream.errors import FencedError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a, s = _owner_of_a0(root)  # the file WAL acknowledges from its completion
    inserted, go = _paused_after(a._storage.log_cache, "put", lambda *args: args[6] == b"late")
    with s3stream.open(root, node_id="b") as b:
        b.open_stream(s.stream_id, force=True).close()
    acked: list[Any] = []
    t = threading.Thread(target=lambda: acked.append(s.append(RecordBatch(b"late"))))
    t.start()
    assert inserted.wait(10)
    new = a.open_stream(s.stream_id)  # drops the fenced handle's entries, "late" among them
    go.set()
    t.join()
    assert acked and acked[0].base_offset == 1  # acknowledged...
    with pytest.raises(FencedError, match=r"offsets \[1, 2\)"):
        a.flush()  # ...and reported lost
    new.close()
    with pytest.raises(FencedError):
        a.close()


@pytest.mark.parametrize("how", ["reopen", "destroy"])
def test_entries_committed_just_before_a_drop_are_not_reported_lost(
    tmp_path: Path, how: str
) -> None:
    """An upload whose commit has landed but whose entries are not marked uploaded yet, when
    another thread drops the fenced stream's entries (`open_stream` after a force-open
    elsewhere, or `destroy`): the committed offsets are readable, so they must not be
    reported as dropped (drops wait for the commit's bookkeeping)."""
    import s3stream
    from s3stream.errors import FencedError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a = s3stream.open(root, node_id="a")
    reached, go = _paused_after(a._storage.log_cache, "mark_uploaded", lambda *args: True)
    s = a.create_stream()
    for i in range(3):
        s.append(RecordBatch(b"a%d" % i))
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            a.flush()
        except BaseException as exc:
            errors.append(exc)

    flusher = threading.Thread(target=flush)
    flusher.start()
    assert reached.wait(10)  # offsets [0, 3) committed, not yet marked uploaded
    b = s3stream.open(root, node_id="b")
    theirs = b.open_stream(s.stream_id, force=True)
    assert theirs.next_offset == 3
    done = threading.Event()
    outcome: list[BaseException | None] = []

    def drop() -> None:
        try:
            if how == "reopen":
                a.open_stream(s.stream_id, force=True)
            else:
                s.destroy()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            done.set()

    dropper = threading.Thread(target=drop)
    dropper.start()
    assert not done.wait(0.3)  # the drop waits for the commit's bookkeeping
    go.set()
    dropper.join()
    flusher.join()
    if how == "reopen":
        assert outcome == [None]
    else:
        assert isinstance(outcome[0], FencedError) and "not destroyed" in str(outcome[0])
    a.flush()  # nothing was lost: no report
    assert not errors
    assert _payloads(b, s.stream_id) == [b"a0", b"a1", b"a2"]
    a.close()
    b.close()


def test_destroying_a_stream_deleted_elsewhere_reports_what_it_held(tmp_path: Path) -> None:
    """`destroy` of a handle whose stream another client deleted: `FencedError`, the handle
    closed, and its acknowledged, not uploaded append reported dropped (as `close` does)."""
    import s3stream
    from s3stream.errors import FencedError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a, s = _owner_of_a0(root)
    with s3stream.open(root, node_id="b") as b:
        b.open_stream(s.stream_id, force=True).destroy()
    s.append(RecordBatch(b"lost"))
    with pytest.raises(FencedError, match="it was deleted"):
        s.destroy()
    assert s.closed
    with pytest.raises(FencedError, match=r"offsets \[1, 2\) \(it was deleted\)"):
        a.flush()
    with pytest.raises(FencedError):
        a.close()


def test_a_failed_release_does_not_use_up_a_drop_report(tmp_path: Path) -> None:
    """Closing stream Y flushes; when Y's release then fails (the metadata unreachable), a
    drop report of another stream X that this flush saw is still raised by the next flush."""
    import s3stream
    from s3stream.errors import FencedError, UnavailableError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    a = s3stream.open(root, node_id="a")
    x, y = a.create_stream(), a.create_stream()
    x.append(RecordBatch(b"x0"))
    y.append(RecordBatch(b"y0"))
    a.flush()
    b = s3stream.open(root, node_id="b")
    b.open_stream(x.stream_id, force=True)
    x.append(RecordBatch(b"x-lost"))
    meta = a._meta
    close_stream = meta.close_stream
    failures = [UnavailableError("the metadata store is unreachable (a stand-in outage)")]

    def failing_once(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return close_stream(*args)

    meta.close_stream = failing_once  # type: ignore[method-assign]
    with pytest.raises(UnavailableError, match="stay owned"):
        y.close()
    assert not y.closed
    with pytest.raises(FencedError, match=rf"stream {x.stream_id} offsets \[1, 2\)"):
        a.flush()
    y.close()
    with pytest.raises(FencedError):
        a.close()
    b.close()


def test_a_stale_session_closing_leaves_the_current_sessions_streams(
    tmp_path: Path, metadata_url: str | None
) -> None:
    """A client whose node was registered again meanwhile (a take-over, or a restart of the
    node elsewhere) closes: it releases no stream the node's current session owns, and that
    session keeps appending and closes cleanly."""
    import s3stream
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    stale = s3stream.open(root, node_id="n", wal="memory://", metadata=metadata_url)
    current = s3stream.open(root, node_id="n", wal="memory://", metadata=metadata_url)
    assert current.node_epoch > stale.node_epoch
    s = current.create_stream()
    s.append(RecordBatch(b"current"))
    assert [i.stream_id for i in stale.list_streams()] == [s.stream_id]  # it sees the stream
    stale.close()
    with s3stream.open(root, node_id="other", wal="memory://", metadata=metadata_url) as other:
        assert other.stream_info(s.stream_id).state is s3stream.StreamState.OPEN
    s.append(RecordBatch(b"still current"))
    current.close()
    with s3stream.open(root, node_id="other", wal="memory://", metadata=metadata_url) as other:
        assert _payloads(other, s.stream_id) == [b"current", b"still current"]


def test_destroying_through_a_replaced_handle_leaves_the_current_one(tmp_path: Path) -> None:
    """`destroy()` of a handle this client replaced (it reopened the stream) is refused: it
    would stop the current handle's writer and drop what that one acknowledged."""
    import s3stream
    from s3stream.errors import StreamClosedError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    with s3stream.open(root, node_id="a") as a:
        old = a.create_stream()
        old.append(RecordBatch(b"a0"))
        old.close()
        new = a.open_stream(old.stream_id)
        new.append(RecordBatch(b"a1"))  # acknowledged, not uploaded
        with pytest.raises(StreamClosedError, match="newer handle"):
            old.destroy()
        new.append(RecordBatch(b"a2"))
        a.flush()
        assert _payloads(a, old.stream_id) == [b"a0", b"a1", b"a2"]


if __name__ == "__main__":
    _child_main(sys.argv[1], json.loads(sys.argv[2]))


def test_a_live_node_taken_over_does_not_report_its_replayed_appends_as_lost(
    tmp_path: Path,
) -> None:
    """Node n1 is alive with acknowledged appends not uploaded; another client takes it
    over, which replays n1's WAL and commits those very appends. n1's next flush and close
    said they were "dropped" (with an ERROR), which tells a caller to resend them: twice
    in the stream. Now they are reported as handed to the take-over."""
    import contextlib

    import s3stream
    from s3stream.errors import FencedError
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    wal = f"object+file://{tmp_path / 'wal-objects'}"  # an object WAL, as on S3
    lazy = {"upload_interval_ms": 3_600_000, "upload_threshold_bytes": 1 << 20}
    a = s3stream.open(root, node_id="n1", wal=wal, settings=lazy)
    s = a.create_stream()
    for i in range(3):
        s.append(RecordBatch(b"a%d" % i))
    with s3stream.open(root, node_id="n2", wal="memory://") as b:
        b.take_over("n1", wal=wal)
        b.open_stream(s.stream_id)  # and goes on with the stream
        assert _payloads(b, s.stream_id) == [b"a0", b"a1", b"a2"]
        with pytest.raises(
            FencedError, match=r"offsets \[0, 3\) \(this node was taken over"
        ) as err:
            a.flush()
        assert (
            "replayed its WAL" in str(err.value) and "dropped" not in str(err.value).split(":")[-1]
        )
        with contextlib.suppress(FencedError):
            a.close()
    with s3stream.open_reader(root) as reader:
        got = [b.payload for b in reader.read(s.stream_id, 0).batches]
    assert got == [b"a0", b"a1", b"a2"]


def test_a_live_node_whose_upload_a_take_over_overtook_is_fenced(tmp_path: Path) -> None:
    """A take-over replayed part of a live node's appends (the rest were acknowledged after
    its replay read the WAL: an old writer appending every 2 ms) and moved the stream's end
    into the node's next upload. That upload's commit stopped at the offsets, a
    CorruptionError retried for ever, so the node was never fenced and went on taking
    appends. It is fenced now, as the entry's own node check (I14) would say."""
    import s3stream
    from s3stream.errors import FencedError
    from s3stream.metadata import CommitObjects, ObjectKind, ObjectMeta, StreamRange
    from s3stream.types import RecordBatch

    root = tmp_path / "store"
    lazy = {"upload_interval_ms": 3_600_000, "upload_threshold_bytes": 1 << 20}
    a = s3stream.open(root, node_id="n1", wal="memory://", settings=lazy)
    s = a.create_stream()
    for i in range(3):
        s.append(RecordBatch(b"a%d" % i))
    with s3stream.open(root, node_id="n2", wal="memory://") as b:
        # What the take-over does to the metadata: n1 registered again, then its replay's
        # commit of the first two appends (as the take-over's own node).
        b.metadata.register_node("n1")
        replayed = ObjectMeta(
            key="data/n2/replayed",
            kind=ObjectKind.STREAM_SET,
            size=1,
            ranges=(StreamRange(s.stream_id, 0, 2),),
            committed_ms=0,
            node_id="n2",
        )
        b.metadata.commit(lambda state: [CommitObjects((replayed,), {s.stream_id: s.epoch})])
    with pytest.raises(FencedError, match="taken over"):
        a.flush(timeout_s=10)
    with pytest.raises(FencedError):
        s.append(RecordBatch(b"after"))
    with contextlib.suppress(FencedError):
        a.close()
