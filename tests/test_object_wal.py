"""The object-store WAL beyond the kit: batching, ordering, fencing, trim, faults, S3, client."""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream.clock import SystemClock
from s3stream.errors import FencedError, InvalidArgumentError, UnavailableError
from s3stream.objectstore.base import ObjectInfo, ObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.wrappers import (
    ForwardingObjectStore,
    MetricsObjectStore,
    RetryingObjectStore,
)
from s3stream.settings import ClientSettings, ObjectWalSettings
from s3stream.testing.faults import FaultRule, FaultyObjectStore
from s3stream.types import RecordBatch
from s3stream.wal.base import WalPosition, WalRecord
from s3stream.wal.memory import MemoryWal
from s3stream.wal.object import HEADER, SESSION_GAP, ObjectWal, decode_object_header
from s3stream.wal.registry import open_wal

FAST = ObjectWalSettings(wal_batch_interval_ms=1, wal_batch_max_bytes=64 << 10)


def _wal(store: ObjectStore, epoch: int = 1, **kw: Any) -> ObjectWal:
    kw.setdefault("settings", FAST)
    return ObjectWal(store, node_id="n1", node_epoch=epoch, prefix="wal", **kw)


def _ready(store: ObjectStore, epoch: int = 1, **kw: Any) -> tuple[ObjectWal, list[WalRecord]]:
    wal = _wal(store, epoch, **kw)
    return wal, list(wal.recover())


def _chain_objects(store: ObjectStore) -> list[ObjectInfo]:
    return [i for i in store.list("wal/n1/") if "/trim/" not in i.key]


def _data_objects(store: ObjectStore) -> list[ObjectInfo]:
    return [i for i in _chain_objects(store) if i.size > HEADER.size]


class GatedStore(ForwardingObjectStore):
    """Holds conditional creates of chosen keys until released (to reorder PUTs)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.gates: dict[str, threading.Event] = {}
        self.created: list[str] = []
        self.lock = threading.Lock()
        self.hold_next_data = 0

    def put_if_absent(self, key: str, data: bytes) -> bool:
        gate = None
        with self.lock:
            if self.hold_next_data and len(data) > HEADER.size:
                self.hold_next_data -= 1
                gate = self.gates.setdefault(key, threading.Event())
        if gate is not None:
            assert gate.wait(10), "gate never opened"
        created = self.inner.put_if_absent(key, data)
        with self.lock:
            self.created.append(key)
        return created

    def release_all(self) -> None:
        with self.lock:
            for g in self.gates.values():
                g.set()


# -- layout and recovery cost ------------------------------------------------------------------


def test_keys_carry_node_and_positions_and_recovery_is_one_list() -> None:
    store = MemoryObjectStore()
    wal, _ = _ready(store)
    acked = [WalRecord(wal.append(b"r%d" % i).result(5), b"r%d" % i) for i in range(20)]
    wal.close()
    keys = [i.key for i in _chain_objects(store)]
    assert keys[0] == "wal/n1/00000000000000000000"  # the first owner's seal
    assert all(k.startswith("wal/n1/") and len(k.rsplit("/", 1)[1]) == 20 for k in keys)
    first = int(keys[1].rsplit("/", 1)[1])
    assert first == SESSION_GAP == acked[0].position
    header = decode_object_header(store.get(keys[1]), node_id="n1", key=keys[1])
    assert (header.epoch, header.first) == (1, first)
    assert header.next == first + store.head(keys[1]).size - HEADER.size  # type: ignore[union-attr]

    metered = MetricsObjectStore(store)
    again = _wal(metered, epoch=2)
    assert list(again.recover()) == acked
    m = metered.metrics
    assert m.lists == 1, "recovery must need one LIST of the node's prefix, nothing more"
    assert m.puts == 0 and m.conditional_puts == 1  # the seal
    again.close()


def test_other_nodes_and_prefixes_are_separate() -> None:
    store = MemoryObjectStore()
    a = ObjectWal(store, node_id="a", node_epoch=1, prefix="wal", settings=FAST)
    ab = ObjectWal(store, node_id="ab", node_epoch=1, prefix="wal", settings=FAST)
    list(a.recover())
    list(ab.recover())
    a.append(b"from a").result(5)
    ab.append(b"from ab").result(5)
    a.close()
    ab.close()
    again = ObjectWal(store, node_id="a", node_epoch=2, prefix="wal", settings=FAST)
    assert [r.data for r in again.recover()] == [b"from a"]
    again.close()


# -- batching and ordering -----------------------------------------------------------------------


def test_records_are_batched_by_interval() -> None:
    store = MetricsObjectStore(MemoryObjectStore())
    settings = ObjectWalSettings(wal_batch_interval_ms=200, wal_batch_max_bytes=8 << 20)
    wal, _ = _ready(store, settings=settings)
    before = store.metrics.conditional_puts
    t0 = time.monotonic()
    futures = [wal.append(b"x" * 100) for _ in range(300)]
    positions = [f.result(5) for f in futures]
    elapsed = time.monotonic() - t0
    puts = store.metrics.conditional_puts - before
    assert positions == sorted(positions)
    # One object at once (nothing was cut for an interval), the rest one interval later.
    assert 1 <= puts <= 3, f"{puts} WAL objects for 300 records appended at once"
    assert elapsed < 2.0
    wal.close()


def test_records_are_cut_at_max_bytes_without_waiting() -> None:
    store = MetricsObjectStore(MemoryObjectStore())
    settings = ObjectWalSettings(wal_batch_interval_ms=60_000, wal_batch_max_bytes=16 << 10)
    wal, _ = _ready(store, settings=settings)
    wal.append(b"first").result(5)  # the first cut happens at once, then the interval runs
    before = store.metrics.conditional_puts
    t0 = time.monotonic()
    futures = [wal.append(bytes(1000)) for _ in range(160)]
    for f in futures[:-20]:
        f.result(5)
    assert time.monotonic() - t0 < 5, "full batches must not wait for the interval"
    puts = store.metrics.conditional_puts - before
    assert puts >= 8
    for info in _chain_objects(store.inner):
        assert info.size <= (16 << 10) + HEADER.size
    wal.close()  # close writes the rest at once
    assert all(f.done() and f.exception() is None for f in futures)


def test_acks_are_in_order_when_puts_finish_out_of_order() -> None:
    gated = GatedStore(MemoryObjectStore())
    settings = ObjectWalSettings(
        wal_batch_interval_ms=1, wal_batch_max_bytes=64 << 10, max_inflight_puts=4
    )
    wal, _ = _ready(gated, settings=settings, retry=False)
    gated.hold_next_data = 1
    fired: list[int] = []
    first = wal.append(b"held back")
    first.add_done_callback(lambda f: fired.append(f.result()))
    time.sleep(0.05)  # the first batch is now in flight, held at the store
    later = [wal.append(b"later %d" % i) for i in range(10)]
    for f in later:
        f.add_done_callback(lambda f: fired.append(f.result()))
    deadline = time.monotonic() + 5
    while len(gated.created) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(gated.created) >= 2, "later batches were not written while the first was held"
    time.sleep(0.05)
    assert not any(f.done() for f in later), "a later append was acked before an earlier one"
    gated.release_all()
    positions = [f.result(5) for f in [first, *later]]
    assert fired == positions == sorted(positions)
    wal.close()


# -- fencing -------------------------------------------------------------------------------------


def test_taker_seals_the_chain_and_the_zombies_late_objects_stay_invisible() -> None:
    gated = GatedStore(MemoryObjectStore())
    settings = ObjectWalSettings(
        wal_batch_interval_ms=1, wal_batch_max_bytes=64 << 10, max_inflight_puts=4
    )
    zombie, _ = _ready(gated, epoch=1, settings=settings, retry=False)
    acked = [zombie.append(b"before %d" % i).result(5) for i in range(5)]
    gated.hold_next_data = 1
    held = zombie.append(b"in flight at the take-over")
    time.sleep(0.05)
    landed = len(gated.created)
    after_held = zombie.append(b"lands after the seal")  # its PUT is not held
    deadline = time.monotonic() + 5
    while len(gated.created) == landed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(gated.created) == landed + 1, "the second in-flight object did not land"

    taker, got = _ready(gated, epoch=2, settings=settings, retry=False)
    assert [r.position for r in got] == acked
    gated.release_all()
    for fut in (held, after_held):
        with pytest.raises(FencedError):
            fut.result(5)
    with pytest.raises(FencedError):
        zombie.append(b"after the fence")
    taker.append(b"taker").result(5)
    taker.close()
    zombie.close()
    later, records = _ready(gated.inner, epoch=3)
    assert [r.data for r in records] == [b"before %d" % i for i in range(5)] + [b"taker"]
    later.close()


def test_older_epoch_cannot_recover_a_newer_owners_wal() -> None:
    store = MemoryObjectStore()
    new, _ = _ready(store, epoch=5)
    new.append(b"x").result(5)
    new.trim(new.append(b"y").result(5))  # leaves a marker of epoch 5 only
    new.close()
    with pytest.raises(FencedError):
        list(_wal(store, epoch=4).recover())


# -- trim ----------------------------------------------------------------------------------------


def test_trim_is_persisted_and_deletes_whole_objects() -> None:
    store = MemoryObjectStore()
    wal, _ = _ready(store)
    batches = []
    for b in range(4):
        futures = [wal.append(b"batch %d record %d" % (b, i)) for i in range(3)]
        batches.append([f.result(5) for f in futures])
        time.sleep(0.01)
    objects_before = len(_chain_objects(store))
    wal.trim(batches[1][1])  # inside the second object: it must stay
    keys = [i.key for i in _chain_objects(store)]
    assert len(keys) < objects_before
    assert wal.object_key(batches[1][0]) in keys or any(
        int(k.rsplit("/", 1)[1]) <= batches[1][1] for k in keys
    )
    markers = [i.key for i in store.list("wal/n1/trim/")]
    assert len(markers) == 1 and markers[0].split("/")[-1].startswith(f"{batches[1][1]:020d}.")
    wal._abandon()
    again, got = _ready(store, epoch=2)
    assert [r.position for r in got] == [batches[1][2], *batches[2], *batches[3]]
    again.reset()
    assert _data_objects(store) == [], "reset must delete every WAL data object"
    seals = _chain_objects(store)
    assert len(seals) == 2, "the seal of each session stays (it fences that session's writer)"
    again.close()
    assert list(_wal(store, epoch=3).recover()) == []


def test_trim_past_the_acknowledged_positions_is_refused() -> None:
    wal, _ = _ready(MemoryObjectStore())
    pos = wal.append(b"one").result(5)
    with pytest.raises(InvalidArgumentError):
        wal.trim(pos + 1)
    with pytest.raises(InvalidArgumentError):
        wal.trim(True)
    wal.close()


# -- faults --------------------------------------------------------------------------------------


def test_transient_faults_lose_and_duplicate_nothing() -> None:
    """10% of WAL requests fail (half of them after taking effect), with latency."""
    base = MemoryObjectStore()
    faulty = FaultyObjectStore(
        base,
        rng=random.Random(7),
        clock=SystemClock(),
        error_rate=0.05,
        ambiguous_rate=0.05,
        latency_s=(0.0, 0.003),
    )
    settings = ObjectWalSettings(
        wal_batch_interval_ms=2, wal_batch_max_bytes=4 << 10, max_inflight_puts=4
    )
    wal = _wal(faulty, settings=settings, rng=random.Random(1))
    assert list(wal.recover()) == []
    acked: list[WalRecord] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        for window in range(120):  # small windows: many WAL objects, so many faults
            data = [b"t%d-%d-%d" % (t, window, i) for i in range(3)]
            futures = [wal.append(d) for d in data]
            for fut, d in zip(futures, data, strict=True):
                pos = fut.result(30)
                with lock:
                    acked.append(WalRecord(pos, d))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    trims = 0
    while any(th.is_alive() for th in threads):
        with lock:
            target = sorted(acked)[len(acked) // 2].position if len(acked) > 10 else None
        if target is not None:
            wal.trim(target)
            trims += 1
        time.sleep(0.01)
    for th in threads:
        th.join()
    trim_point = wal._trim
    wal._abandon()
    assert faulty.counters.injected >= 10 and trims > 3
    with faulty.healthy():
        again, got = _ready(faulty, epoch=2)
    expected = sorted(r for r in acked if r.position > trim_point)
    assert got == expected, "acknowledged records lost, duplicated or reordered"
    again.close()


def test_a_permanent_failure_fails_appends_with_unavailable_not_a_hang() -> None:
    faulty = FaultyObjectStore(
        MemoryObjectStore(),
        rng=random.Random(3),
        rules=[FaultRule(error_rate=1.0, operations=frozenset({"put_if_absent"}))],
    )
    with faulty.healthy():
        wal = _wal(faulty, retry=False)
        list(wal.recover())
    retrying = RetryingObjectStore(
        faulty, clock=SystemClock(), rng=random.Random(0), max_attempts=3, base_delay_s=0.01
    )
    wal._store = retrying  # the same wrapper the WAL builds, with a short budget
    t0 = time.monotonic()
    futures = [wal.append(b"doomed %d" % i) for i in range(5)]
    for f in futures:
        with pytest.raises(UnavailableError):
            f.result(10)
    assert time.monotonic() - t0 < 5
    with pytest.raises(UnavailableError):
        wal.append(b"after the failure")
    wal.close()


# -- URLs ----------------------------------------------------------------------------------------


def test_urls_choose_the_object_wal(tmp_path: Path) -> None:
    clock = SystemClock()
    wal = open_wal(
        f"object+file://{tmp_path}/wal?batch_interval_ms=5&batch_max_bytes=1MiB",
        node_id="n1",
        node_epoch=1,
        clock=clock,
    )
    assert isinstance(wal, ObjectWal)
    assert wal._interval_s == 0.005 and wal._max_batch == 1 << 20
    list(wal.recover())
    pos = wal.append(b"on disk").result(5)
    wal.close()
    assert (tmp_path / "wal" / "n1" / f"{pos:020d}").exists()
    assert isinstance(open_wal("object+memory://", node_id="n1", clock=clock), ObjectWal)
    assert isinstance(open_wal("memory://", node_id="n1", clock=clock), MemoryWal)
    with pytest.raises(InvalidArgumentError, match="unknown object WAL option"):
        open_wal("object+memory://?nonsense=1", node_id="n1", clock=clock)
    assert s3stream.opening.default_wal_url("s3://b/p", "n1") == "s3://b/p/wal"
    assert s3stream.opening.default_wal_url("gcs://b/p/", "n1") == "object+gcs://b/p/wal"


# -- a client over the object WAL -----------------------------------------------------------


def _acked_batches(results: list[tuple[int, Future[Any], bytes]]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for sid, fut, payload in results:
        if fut.exception(timeout=30) is None:
            out.setdefault(sid, []).append(payload)
    return out


def _read_all(client: s3stream.StreamClient, sid: int) -> list[bytes]:
    info = client.stream_info(sid)
    out: list[bytes] = []
    offset = info.start_offset
    while offset < info.end_offset:
        res = client.read(sid, offset, max_bytes=1 << 20)
        out += [b.payload for b in res.batches]
        offset = res.next_offset
    return out


def test_client_under_transient_faults_keeps_every_acked_batch_once() -> None:
    """A client whose data store and WAL store both fail 10% of requests: crash, reopen, and
    every acknowledged batch is there exactly once."""
    data, wal_base = MemoryObjectStore(), MemoryObjectStore()
    clock = SystemClock()
    faulty_data = FaultyObjectStore(
        data, rng=random.Random(11), clock=clock, error_rate=0.05, ambiguous_rate=0.05,
        latency_s=(0.0, 0.002),
    )  # fmt: skip
    faulty_wal = FaultyObjectStore(
        wal_base, rng=random.Random(12), clock=clock, error_rate=0.05, ambiguous_rate=0.05,
        latency_s=(0.0, 0.002),
    )  # fmt: skip
    settings = ClientSettings(
        upload_threshold_bytes=4 << 10, upload_interval_ms=5, max_pending_bytes=64 << 20
    )
    wal_settings = ObjectWalSettings(wal_batch_interval_ms=2, wal_batch_max_bytes=8 << 10)

    def open_client(faulty: bool) -> s3stream.StreamClient:
        d, w = (faulty_data, faulty_wal) if faulty else (data, wal_base)
        return s3stream.StreamClient(
            d,
            lambda node, epoch, on_full: ObjectWal(
                w, node_id=node, node_epoch=epoch, settings=wal_settings, on_full=on_full
            ),
            node_id="n1",
            settings=settings,
            clock=clock,
            rng=random.Random(5),
        )

    with faulty_data.healthy(), faulty_wal.healthy():
        client = open_client(True)
        streams = [client.create_stream({"i": str(i)}) for i in range(3)]
    results: list[tuple[int, Future[Any], bytes]] = []
    for i in range(900):
        s = streams[i % 3]
        payload = b"batch-%04d-" % i + bytes(random.Random(i).randrange(200))
        results.append((s.stream_id, s.append_async(RecordBatch(payload, count=1)), payload))
        if i % 6 == 5:  # small windows: many WAL objects and uploads, so many faults
            results[-1][1].exception(timeout=30)
    acked = _acked_batches(results)
    assert sum(map(len, acked.values())) >= 890
    client._storage.abandon()  # crash: nothing more is uploaded
    client._wal._abandon()  # type: ignore[attr-defined]
    assert faulty_data.counters.injected >= 3 and faulty_wal.counters.injected >= 10
    with open_client(False) as again:
        for s in streams:
            assert _read_all(again, s.stream_id) == acked.get(s.stream_id, [])


# -- against SeaweedFS ---------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_wal_appends_restart_recovery_and_trim(seaweedfs: Any) -> None:
    url = f"s3://{seaweedfs.bucket}/wal-{uuid.uuid4().hex}/wal?batch_interval_ms=20"
    opts = seaweedfs.storage_options()
    clock = SystemClock()

    def open_(epoch: int) -> ObjectWal:
        wal = open_wal(url, node_id="n1", node_epoch=epoch, clock=clock, storage_options=opts)
        assert isinstance(wal, ObjectWal)
        return wal

    wal = open_(1)
    assert list(wal.recover()) == []
    futures: list[tuple[Future[WalPosition], bytes]] = [
        (wal.append(b"rec-%d" % i * 50), b"rec-%d" % i * 50) for i in range(200)
    ]
    acked = [WalRecord(f.result(30), d) for f, d in futures]
    wal._abandon()  # crash
    wal = open_(2)
    assert list(wal.recover()) == acked
    wal.trim(acked[149].position)
    more = [WalRecord(wal.append(b"more").result(30), b"more")]
    wal.close()
    wal = open_(3)
    assert list(wal.recover()) == acked[150:] + more
    wal.reset()
    left = [i for i in wal.store.list("n1/") if "/trim/" not in i.key and i.size > HEADER.size]
    assert left == [], f"reset left WAL data objects: {left}"
    wal.close()
    wal = open_(4)
    assert list(wal.recover()) == []
    wal.close()


@pytest.mark.s3
def test_client_on_s3_defaults_to_the_object_wal_and_recovers(seaweedfs: Any) -> None:
    url = f"s3://{seaweedfs.bucket}/client-{uuid.uuid4().hex}"
    opts = seaweedfs.storage_options()
    wal_settings = ObjectWalSettings(wal_batch_interval_ms=10)
    client = s3stream.open(
        url, node_id="n1", storage_options=opts, object_wal_settings=wal_settings
    )
    assert isinstance(client.wal, ObjectWal)
    stream = client.create_stream()
    payloads = [b"payload %d" % i for i in range(50)]
    futures = [stream.append_async(RecordBatch(p, count=1)) for p in payloads]
    for f in futures:
        f.result(30)
    client._storage.abandon()  # crash before any upload
    client._wal._abandon()  # type: ignore[attr-defined]
    with s3stream.open(url, node_id="n1", storage_options=opts) as again:
        assert again.recovery.uploaded_batches == 50
        assert _read_all(again, stream.stream_id) == payloads
