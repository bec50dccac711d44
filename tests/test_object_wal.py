"""The object-store WAL beyond the kit: batching, ordering, fencing, trim, faults, S3, client."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream.clock import SystemClock
from s3stream.errors import CorruptionError, FencedError, InvalidArgumentError, UnavailableError
from s3stream.objectstore.base import ObjectInfo, ObjectStore
from s3stream.objectstore.local import LocalObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.s3 import S3ObjectStore
from s3stream.objectstore.wrappers import (
    ForwardingObjectStore,
    MetricsObjectStore,
    RetryingObjectStore,
)
from s3stream.settings import ClientSettings, ObjectWalSettings
from s3stream.testing.faults import FaultRule, FaultyObjectStore
from s3stream.types import RecordBatch
from s3stream.wal import object as object_wal
from s3stream.wal.base import WalPosition, WalRecord
from s3stream.wal.memory import MemoryWal
from s3stream.wal.object import (
    HEADER,
    KIND_DATA,
    SESSION_GAP,
    ObjectWal,
    check_object_wal,
    decode_object_header,
)
from s3stream.wal.registry import open_wal

FAST = ObjectWalSettings(wal_batch_interval_ms=1, wal_batch_max_bytes=64 << 10)


def _wal(store: ObjectStore, epoch: int = 1, **kw: Any) -> ObjectWal:
    kw.setdefault("settings", FAST)
    return ObjectWal(store, node_id="n1", node_epoch=epoch, prefix="wal", **kw)


def _ready(store: ObjectStore, epoch: int = 1, **kw: Any) -> tuple[ObjectWal, list[WalRecord]]:
    wal = _wal(store, epoch, **kw)
    return wal, list(wal.recover())


def _chain_objects(store: ObjectStore) -> list[ObjectInfo]:
    return [i for i in store.list("wal/n1/") if "/trim/" not in i.key and "identity" not in i.key]


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


def test_keys_carry_node_and_positions_and_recovery_is_two_lists() -> None:
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
    # One LIST to walk the chain, one to check that no trim moved it past the seal meanwhile.
    assert m.lists == 2, "recovery must need two LISTs of the node's prefix, nothing more"
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


#: For tests that hold a PUT at the store: no hedging, since a hedge would bypass the held PUT.
HELD_PUT_SETTINGS = ObjectWalSettings(
    wal_batch_interval_ms=1,
    wal_batch_max_bytes=64 << 10,
    max_inflight_puts=4,
    max_hedged_puts=0,
)


def test_acks_are_in_order_when_puts_finish_out_of_order() -> None:
    gated = GatedStore(MemoryObjectStore())
    settings = HELD_PUT_SETTINGS
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
    settings = HELD_PUT_SETTINGS
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


class _BeforeSeal(ForwardingObjectStore):
    """Runs `hook` once, just before the first seal PUT through it (a taker's view)."""

    def __init__(self, inner: ObjectStore, hook: Any) -> None:
        super().__init__(inner)
        self.hook = hook

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.hook is not None and len(data) == HEADER.size:
            hook, self.hook = self.hook, None
            hook()
        return self.inner.put_if_absent(key, data)


class _LostReply(ForwardingObjectStore):
    """The next data PUT lands but its caller is told it failed (the reply was lost)."""

    lose_next = False

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created = self.inner.put_if_absent(key, data)
        if self.lose_next and len(data) > HEADER.size:
            self.lose_next = False
            raise UnavailableError(f"the reply of PUT {key} was lost")
        return created


@pytest.mark.parametrize("how", ["trim", "reset"])
def test_a_taker_seals_on_the_chain_when_the_old_writer_trims_past_its_end_meanwhile(
    how: str,
) -> None:
    """Between the taker's LIST and its seal PUT, the old writer fills the chain end E and
    moves its anchor past E, deleting E (a trim after a commit; or a reset after a PUT whose
    reply was lost, which seals further on). E is free again, so the taker's seal there
    lands, off the chain: it must notice (the marker is written before the delete) and seal
    the chain's real end, so the old writer is fenced and every acknowledged append of both
    is recovered by the next owner."""
    mem = MemoryObjectStore()
    zs = _LostReply(mem)
    settings = replace(FAST, max_hedged_puts=0)
    old, _ = _ready(zs, epoch=1, settings=settings, retry=False)
    acked = {old.append(b"old %d" % i).result(5): b"old %d" % i for i in range(3)}

    def old_writer_goes_on() -> None:
        if how == "trim":
            pos = old.append(b"committed at E").result(5)
            old.trim(pos)  # uploaded: E is deleted, the anchor moves past it
        else:
            zs.lose_next = True
            with pytest.raises(UnavailableError):
                old.append(b"lands at E, reported failed").result(5)
            old.reset()  # seals past E, marks the anchor past that seal, deletes E

    taker = _wal(_BeforeSeal(mem, old_writer_goes_on), epoch=2, settings=settings, retry=False)
    got = {r.position: r.data for r in taker.recover()}
    assert all(got[p] == d for p, d in acked.items() if p > old._trim)
    with pytest.raises(FencedError):
        old.append(b"after the take-over").result(5)
    mine = {taker.append(b"taker %d" % i).result(5): b"taker %d" % i for i in range(3)}
    old._abandon()
    taker._abandon()  # both crash
    nxt, records = _ready(mem, epoch=3, settings=settings)
    recovered = {r.position: r.data for r in records}
    assert all(recovered.get(p) == d for p, d in mine.items()), "the taker's appends were lost"
    assert not any(d.startswith(b"after") for d in recovered.values())
    nxt.close()


def test_node_epochs_past_twelve_digits_keep_their_trim_markers() -> None:
    store = MemoryObjectStore()
    epoch = 10**12
    wal, _ = _ready(store, epoch=epoch)
    positions = [wal.append(b"rec %d" % i).result(5) for i in range(6)]
    wal.trim(positions[2])
    wal._abandon()  # a crash: the marker alone says where the chain starts
    nxt, records = _ready(store, epoch=epoch + 1)
    assert [r.data for r in records] == [b"rec 3", b"rec 4", b"rec 5"]
    nxt.close()
    # ... and a marker of a newer such epoch still fences an older writer.
    with pytest.raises(FencedError):
        list(_wal(store, epoch=epoch).recover())


def test_close_during_recovery_stops_it_before_it_writes() -> None:
    """A recovery still running when close() returns (an open that gave up, say) must not
    seal the WAL or become ready afterwards."""
    gated = GatedStore(MemoryObjectStore())
    first, _ = _ready(gated)
    first.append(b"x").result(5)
    first._abandon()
    entered, release = threading.Event(), threading.Event()

    class SlowList(ForwardingObjectStore):
        def list(self, prefix: str) -> Iterator[ObjectInfo]:
            entered.set()
            assert release.wait(10)
            return self.inner.list(prefix)

    wal = _wal(SlowList(gated), epoch=2, retry=False)
    outcome: list[object] = []

    def recover() -> None:
        try:
            outcome.append(list(wal.recover()))
        except Exception as exc:
            outcome.append(exc)

    t = threading.Thread(target=recover)
    t.start()
    assert entered.wait(5)
    before = len(gated.created)
    wal.close()
    release.set()
    t.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], s3stream.StreamClosedError), outcome
    assert len(gated.created) == before, "the recovery wrote after close()"


@pytest.mark.parametrize(
    "prefix",
    # The last two were taken, and the recovery then failed at its first request (an
    # HTTP 400 for the NUL, a PUT refused as if the store were down for the long one).
    ["//a//b//", "a/./b", "a/../b", "a\x00b", "y" * 2000],
)
def test_a_wal_prefix_that_makes_bad_keys_is_refused_at_once(prefix: str) -> None:
    with pytest.raises(InvalidArgumentError, match="WAL prefix"):
        ObjectWal(MemoryObjectStore(), node_id="n1", node_epoch=1, prefix=prefix)


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


# -- hedged PUTs ---------------------------------------------------------------------------------


class AttemptGate(ForwardingObjectStore):
    """Holds chosen attempts (0 = the first, 1 = the first hedge, ...) to create the next WAL
    data object once `armed`, each on its own event: before the create reaches the store, or
    with `after` once it took effect (a reply that is late). Attempts in `fail` then raise
    `UnavailableError` without reaching the store. Records what each attempt returned (None:
    it failed)."""

    def __init__(
        self,
        inner: ObjectStore,
        hold: frozenset[int],
        *,
        after: bool = False,
        fail: frozenset[int] = frozenset(),
        armed: bool = True,
    ) -> None:
        super().__init__(inner)
        self.hold = hold
        self.after = after
        self.fail = fail
        self.armed = armed
        self.lock = threading.Lock()
        self.target: str | None = None
        self.calls = 0
        self.events = {i: threading.Event() for i in hold}
        self.returned: list[tuple[int, bool | None]] = []

    def put_if_absent(self, key: str, data: bytes) -> bool:
        with self.lock:
            if self.target is None and self.armed and len(data) > HEADER.size:
                self.target = key
            index = self.calls if key == self.target else -1
            self.calls += key == self.target
        gate = self.events.get(index)
        if gate is not None and not self.after:
            assert gate.wait(10), "gate never opened"
        if index in self.fail:
            with self.lock:
                self.returned.append((index, None))
            raise UnavailableError(f"injected failure of attempt {index}")
        created = self.inner.put_if_absent(key, data)
        if gate is not None and self.after:
            assert gate.wait(10), "gate never opened"
        if index >= 0:
            with self.lock:
                self.returned.append((index, created))
        return created

    def wait_for(self, predicate: Any, what: str) -> None:
        deadline = time.monotonic() + 5
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.005)


HEDGE_FAST = ObjectWalSettings(
    wal_batch_interval_ms=1, wal_batch_max_bytes=64 << 10, hedge_after_ms=20
)


def test_a_slow_put_is_hedged_and_acked_while_the_first_attempt_still_hangs() -> None:
    gate = AttemptGate(MemoryObjectStore(), frozenset({0}))
    wal, _ = _ready(gate, settings=HEDGE_FAST, retry=False)
    t0 = time.monotonic()
    pos = wal.append(b"slow first PUT").result(5)
    assert time.monotonic() - t0 < 2, "the hedge did not rescue the held PUT"
    assert not gate.events[0].is_set() and gate.returned == [(1, True)]
    assert (wal.hedged_puts, wal.hedges_won) == (1, 1)
    gate.events[0].set()  # the first attempt lands late and finds the hedge's object
    gate.wait_for(lambda: len(gate.returned) == 2, "the first attempt")
    assert gate.returned[1] == (0, False)
    later = wal.append(b"after").result(5)  # the WAL goes on normally
    wal.close()
    assert [i.key for i in _data_objects(gate.inner)] == [
        wal.object_key(pos),
        wal.object_key(later),
    ]
    again, got = _ready(gate.inner, epoch=2)
    assert got == [WalRecord(pos, b"slow first PUT"), WalRecord(later, b"after")]
    again.close()


def test_both_attempts_landing_is_one_object_acked_once() -> None:
    # The first attempt creates the object but its reply is late: the hedge is told "exists",
    # reads the object back, finds its own bytes and acknowledges.
    gate = AttemptGate(MetricsObjectStore(MemoryObjectStore()), frozenset({0}), after=True)
    wal, _ = _ready(gate, settings=HEDGE_FAST, retry=False)
    gets_at_open = gate.inner.metrics.gets  # type: ignore[attr-defined]
    fired: list[int] = []
    fut = wal.append(b"landed twice")
    fut.add_done_callback(lambda f: fired.append(f.result()))
    pos = fut.result(5)
    assert gate.returned == [(1, False)] and not gate.events[0].is_set()
    assert (wal.hedged_puts, wal.hedges_won) == (1, 1)
    assert gate.inner.metrics.gets == gets_at_open + 1  # type: ignore[attr-defined]
    gate.events[0].set()
    wal.close()  # waits for the late attempt: nothing runs after close()
    assert gate.returned == [(1, False), (0, True)] and fired == [pos]
    assert len(_data_objects(gate.inner)) == 1
    again, got = _ready(gate.inner, epoch=2)
    assert got == [WalRecord(pos, b"landed twice")]
    again.close()


def test_a_hedge_that_finds_a_takers_seal_is_fenced() -> None:
    gate = AttemptGate(MemoryObjectStore(), frozenset({0, 1}), armed=False)
    zombie, _ = _ready(gate, settings=HEDGE_FAST, retry=False)
    before = zombie.append(b"acked before").result(5)
    gate.armed = True  # hold the attempts of the next object
    held = zombie.append(b"in flight at the take-over")
    gate.wait_for(lambda: gate.calls == 2, "the first attempt and its hedge")
    taker, got = _ready(gate.inner, epoch=2)  # seals the position the held object claims
    assert got == [WalRecord(before, b"acked before")]
    gate.events[1].set()
    with pytest.raises(FencedError):
        held.result(5)
    assert not gate.events[0].is_set(), "fenced by the hedge alone"
    gate.events[0].set()
    zombie.close()
    assert gate.returned == [(1, False), (0, False)]
    taker.append(b"taker").result(5)
    taker.close()
    last, records = _ready(gate.inner, epoch=3)
    assert [r.data for r in records] == [b"acked before", b"taker"]
    last.close()


def test_without_hedging_a_slow_put_holds_the_ack_as_before() -> None:
    gate = AttemptGate(MetricsObjectStore(MemoryObjectStore()), frozenset({0}))
    settings = replace(HEDGE_FAST, max_hedged_puts=0)
    wal, _ = _ready(gate, settings=settings, retry=False)
    fut = wal.append(b"waits")
    time.sleep(0.2)  # ten hedge delays
    assert not fut.done() and gate.calls == 1 and wal.hedged_puts == 0
    gate.events[0].set()
    fut.result(5)
    # A taker's seal fences at once: one attempt only, so "exists" needs no read-back.
    taker, _ = _ready(gate.inner, epoch=2)
    gets = gate.inner.metrics.gets  # type: ignore[attr-defined]
    with pytest.raises(FencedError):
        wal.append(b"fenced").result(5)
    assert gate.inner.metrics.gets == gets  # type: ignore[attr-defined]
    wal.close()
    taker.close()


def test_a_straggler_landing_after_the_trim_is_stale_and_deleted() -> None:
    gate = AttemptGate(MemoryObjectStore(), frozenset({0}))
    wal, _ = _ready(gate, settings=HEDGE_FAST, retry=False)
    pos = wal.append(b"trimmed soon").result(5)  # acked by the hedge
    key = wal.object_key(pos)
    wal.trim(pos)
    assert gate.inner.head(key) is None, "the trim deletes the acknowledged object"
    gate.events[0].set()  # the straggler creates it again, below the anchor
    gate.wait_for(lambda: len(gate.returned) == 2, "the straggler")
    assert gate.returned == [(1, True), (0, True)] and gate.inner.head(key) is not None
    nxt = wal.append(b"next").result(5)
    wal._abandon()  # crash before any trim could delete the straggler
    again, got = _ready(gate.inner, epoch=2)
    assert got == [WalRecord(nxt, b"next")], "recovery must not read the straggler"
    again.reset()
    assert gate.inner.head(key) is None and _data_objects(gate.inner) == []
    again.close()

    # In the same session, the next trim deletes the straggler.
    gate = AttemptGate(MemoryObjectStore(), frozenset({0}))
    wal, _ = _ready(gate, settings=HEDGE_FAST, retry=False)
    pos = wal.append(b"trimmed soon").result(5)
    wal.trim(pos)
    gate.events[0].set()
    key = wal.object_key(pos)
    gate.wait_for(lambda: any(k == key for _, k in wal._stale), "the straggler to be noted")
    wal.trim(wal.append(b"next").result(5))
    assert _data_objects(gate.inner) == []
    wal.close()


def test_close_waits_for_hedges_and_attempts_in_flight() -> None:
    threads_before = set(threading.enumerate())
    gate = AttemptGate(MemoryObjectStore(), frozenset({0, 1}))
    wal, _ = _ready(gate, settings=HEDGE_FAST, retry=False)
    fut = wal.append(b"closing")
    gate.wait_for(lambda: gate.calls == 2, "the hedge")
    closer = threading.Thread(target=wal.close)
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive() and not fut.done(), "close() must wait for the unresolved PUT"
    gate.events[1].set()
    assert fut.result(5) > 0
    time.sleep(0.05)
    assert closer.is_alive(), "close() must wait for the attempt still running"
    gate.events[0].set()
    closer.join(5)
    assert not closer.is_alive()
    left = set(threading.enumerate()) - threads_before
    assert not any(t.name.startswith("s3stream-wal-") for t in left), left


def test_one_failed_attempt_waits_for_the_other_and_all_failed_fails() -> None:
    gate = AttemptGate(MemoryObjectStore(), frozenset({0}), fail=frozenset({0}))
    wal, _ = _ready(gate, settings=HEDGE_FAST, retry=False)
    pos = wal.append(b"saved by the hedge").result(5)
    gate.events[0].set()
    gate.wait_for(lambda: len(gate.returned) == 2, "the first attempt")
    assert gate.returned == [(1, True), (0, None)]
    assert wal.append(b"the WAL still works").result(5) > pos
    wal.close()

    gate = AttemptGate(MemoryObjectStore(), frozenset({0}), fail=frozenset({0, 1}))
    wal, _ = _ready(gate, settings=HEDGE_FAST, retry=False)
    fut = wal.append(b"doomed")
    gate.wait_for(lambda: gate.returned == [(1, None)], "the hedge to fail")
    time.sleep(0.05)
    assert not fut.done(), "one attempt failed; the other may still succeed"
    gate.events[0].set()
    with pytest.raises(UnavailableError):
        fut.result(5)
    wal.close()


def test_adaptive_hedge_delay_follows_put_latency_per_size_class() -> None:
    wal, _ = _ready(MemoryObjectStore())  # hedge_after_ms=0: adaptive
    assert wal.hedge_delay_ms() == pytest.approx(1000)  # before enough PUTs were measured
    for i in range(20):
        wal.append(b"%d" % i).result(5)
    assert wal.hedge_delay_ms() == pytest.approx(10)  # microsecond PUTs: the floor (hedge_min_ms)
    # Large objects take longer: small ones say nothing about them.
    assert wal.hedge_delay_ms(8 << 20) == pytest.approx(1000)
    wal.close()
    slow = FaultyObjectStore(
        MemoryObjectStore(),
        rng=random.Random(5),
        clock=SystemClock(),
        rules=[FaultRule(latency_s=(0.03, 0.03), operations=frozenset({"put_if_absent"}))],
    )
    wal, _ = _ready(slow)
    for i in range(20):
        wal.append(b"%d" % i).result(5)
    assert 60 <= wal.hedge_delay_ms() < 300  # twice the p90 of ~30 ms PUTs
    wal.close()
    fixed, _ = _ready(slow, epoch=2, settings=HEDGE_FAST)
    fixed.append(b"x").result(5)
    assert fixed.hedge_delay_ms() == fixed.hedge_delay_ms(8 << 20) == pytest.approx(20)
    fixed.close()


def test_heavy_hedging_under_faults_loses_and_duplicates_nothing() -> None:
    """Every slow PUT is hedged (2 ms), up to two hedges each, while PUTs are slow, fail or
    lose their replies and trims run: recovery returns exactly the acknowledged records."""
    faulty = FaultyObjectStore(
        MemoryObjectStore(),
        rng=random.Random(11),
        clock=SystemClock(),
        error_rate=0.03,
        ambiguous_rate=0.03,
        latency_s=(0.0, 0.006),
    )
    settings = ObjectWalSettings(
        wal_batch_interval_ms=2,
        wal_batch_max_bytes=4 << 10,
        hedge_after_ms=2,
        max_hedged_puts=2,
    )
    wal = _wal(faulty, settings=settings, rng=random.Random(2))
    assert list(wal.recover()) == []
    acked: list[WalRecord] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        for window in range(60):
            data = [b"t%d-%d-%d" % (t, window, i) for i in range(3)]
            for fut, d in zip([wal.append(d) for d in data], data, strict=True):
                pos = fut.result(30)
                with lock:
                    acked.append(WalRecord(pos, d))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        with lock:
            target = sorted(acked)[len(acked) // 2].position if len(acked) > 10 else None
        if target is not None:
            wal.trim(target)
        time.sleep(0.005)
    for th in threads:
        th.join()
    trim_point = wal._trim
    assert wal.hedged_puts >= 20 and wal.hedges_won >= 5, (wal.hedged_puts, wal.hedges_won)
    wal.close()
    with faulty.healthy():
        again, got = _ready(faulty, epoch=2)
    assert got == sorted(r for r in acked if r.position > trim_point)
    again.close()


@pytest.mark.s3
def test_s3_hedge_resolves_a_late_first_attempt_by_reading_back(seaweedfs: Any) -> None:
    s3 = S3ObjectStore(seaweedfs.bucket, f"hedge-{uuid.uuid4().hex}", **seaweedfs.storage_options())
    gate = AttemptGate(s3, frozenset({0}), after=True)
    wal, _ = _ready(gate, settings=HEDGE_FAST)
    pos = wal.append(b"on SeaweedFS").result(10)
    assert gate.returned == [(1, False)], "the server says 'exists', the read-back 'ours'"
    assert wal.hedges_won == 1
    gate.events[0].set()
    wal.close()
    again, got = _ready(s3, epoch=2)
    assert got == [WalRecord(pos, b"on SeaweedFS")]
    again.close()
    s3.close()


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
    with pytest.raises(InvalidArgumentError, match="unknown object WAL setting"):
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


# -- identity: one WAL, one store -----------------------------------------------------------------


def _everything(store: ObjectStore) -> dict[str, bytes]:
    return {info.key: store.get(info.key) for info in store.list("")}


def _append_crash_recover(wal: ObjectWal, store: ObjectStore, payload: bytes, epoch: int) -> None:
    """`wal` acknowledges `payload` and dies; its next open (at `epoch`, expecting its
    identity) recovers it."""
    pos = wal.append(payload).result(5)
    uid = wal.identity
    wal._abandon()
    again, got = _ready(store, epoch=epoch, expect_uid=uid)
    assert got == [WalRecord(pos, payload)]
    again.close()


def test_the_first_open_gives_the_prefix_an_identity_that_later_opens_keep(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryObjectStore()
    wal = _wal(store, expect_uid=-1)
    assert wal.identity is None  # not known before recovery
    list(wal.recover())
    uid = wal.identity
    assert uid is not None and uid >= 0
    assert store.head("wal/n1/identity") is not None
    wal.append(b"x").result(5)
    wal.close()
    again, got = _ready(store, epoch=2, expect_uid=uid)
    assert again.identity == uid and [r.data for r in got] == [b"x"]
    again.close()
    with caplog.at_level(logging.WARNING, logger="s3stream"):
        unchecked, got = _ready(store, epoch=3)  # expect_uid None: no check
    assert unchecked.identity == uid and [r.data for r in got] == [b"x"]
    unchecked.close()
    assert "unexpected key" not in caplog.text


@pytest.mark.parametrize("expect", [-1, 12345])
def test_another_stores_prefix_holding_records_is_refused_before_any_write(expect: int) -> None:
    """Its node is at a higher epoch than ours (epochs are each store's own): the refusal
    names the WAL as another store's, not this writer as fenced; neither a recovery nor a
    reset (which would drop the other store's records) writes anything."""
    store = MemoryObjectStore()
    theirs, _ = _ready(store, epoch=7, expect_uid=-1)
    acked = [WalRecord(theirs.append(b"t%d" % i).result(5), b"t%d" % i) for i in range(3)]
    uid = theirs.identity
    theirs._abandon()  # their writer dies with the records not uploaded
    before = _everything(store)
    mine = _wal(store, epoch=2, expect_uid=expect)
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        list(mine.recover())
    mine.close()
    mine = _wal(store, epoch=2, expect_uid=expect)
    with pytest.raises(InvalidArgumentError, match="holds records that are not uploaded"):
        mine.reset()
    mine.close()
    assert _everything(store) == before
    again, got = _ready(store, epoch=8, expect_uid=uid)
    assert got == acked and again.identity == uid
    again.close()


def test_another_stores_empty_prefix_is_taken_with_an_identity_of_its_own() -> None:
    """Their trim marker and seals carry their store's higher epoch: taken anyway, and this
    store's next open is not fenced by them (their markers are gone before the new identity
    is written; the taking seal and marker are of epoch 0). Their writer, if alive, is
    fenced by the seal."""
    store = MemoryObjectStore()
    first, _ = _ready(store, epoch=1, expect_uid=-1)  # their node's first open
    uid = first.identity
    first.close()
    theirs, _ = _ready(store, epoch=9, expect_uid=uid)
    theirs.trim(theirs.append(b"uploaded").result(5))  # trimmed: nothing left to lose
    mine, got = _ready(store, epoch=2, expect_uid=-1)
    assert got == [] and mine.identity not in (None, uid)
    assert [i.key[-13:] for i in store.list("wal/n1/trim/")] == [".000000000000"]
    with pytest.raises(FencedError):
        theirs.append(b"late").result(5)
    theirs.close()
    _append_crash_recover(mine, store, b"mine", epoch=3)
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        _ready(store, epoch=10, expect_uid=uid)


class _Before(ForwardingObjectStore):
    """Runs `hook` once, just before the first write (`operation`) of the identity object."""

    def __init__(self, inner: ObjectStore, operation: str, hook: Any) -> None:
        super().__init__(inner)
        self.operation, self.hook = operation, hook

    def _maybe(self, operation: str, key: str) -> None:
        if operation == self.operation and key.endswith("/identity") and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()

    def put(self, key: str, data: bytes) -> None:
        self._maybe("put", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._maybe("put_if_absent", key)
        return self.inner.put_if_absent(key, data)


def test_two_openers_of_a_new_prefix_do_not_share_an_identity() -> None:
    """Two stores open one new prefix at once; the other's identity lands first. This open
    took it as its own (and recorded it), so the other's records were replayed into this
    store as its own. It fails now, and its next open judges the other's identity."""
    inner = MemoryObjectStore()
    other: list[ObjectWal] = []

    def other_opens() -> None:
        wal, _ = _ready(inner, epoch=5, expect_uid=-1)
        other.append(wal)

    mine = _wal(_Before(inner, "put_if_absent", other_opens), epoch=3, expect_uid=-1)
    with pytest.raises(UnavailableError, match="another writer gave this WAL an identity"):
        list(mine.recover())
    mine.close()
    acked = [WalRecord(other[0].append(b"o%d" % i).result(5), b"o%d" % i) for i in range(2)]
    uid = other[0].identity
    other[0]._abandon()
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        _ready(inner, epoch=4, expect_uid=-1)
    again, got = _ready(inner, epoch=6, expect_uid=uid)
    assert got == acked
    again.close()


def test_a_take_racing_the_owners_open_gives_the_wal_back() -> None:
    """Store B takes store A's empty prefix; before B's identity lands, A opens its WAL as
    its own (the identity read is still A's), seals past B's seal and acknowledges appends.
    B's identity written over A's made A's next open refuse A's records and B's replay them
    as B's. B now sees A's seal past its own, puts A's identity back and fails."""
    inner = MemoryObjectStore()
    a, _ = _ready(inner, epoch=2, expect_uid=-1)
    a_uid = a.identity
    a.close()
    acked: list[WalRecord] = []

    def a_opens_and_appends() -> None:
        wal, _ = _ready(inner, epoch=3, expect_uid=a_uid)
        acked.extend(WalRecord(wal.append(b"a%d" % i).result(5), b"a%d" % i) for i in range(3))
        wal._abandon()

    b = _wal(_Before(inner, "put", a_opens_and_appends), epoch=7, expect_uid=-1)
    with pytest.raises(UnavailableError, match="opened it while this open took it"):
        list(b.recover())
    b._abandon()
    assert _wal(inner)._read_identity().uid == a_uid  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        _ready(inner, epoch=8, expect_uid=-1)
    again, got = _ready(inner, epoch=4, expect_uid=a_uid)
    assert got == acked and len(acked) == 3
    again.close()


def test_an_owner_whose_wal_is_taken_while_it_opens_fails_its_open() -> None:
    """Store A read its own identity, then store B took the (empty) prefix before A's seal:
    A's open fails instead of appending to a WAL B now holds."""
    inner = MemoryObjectStore()
    a, _ = _ready(inner, epoch=2, expect_uid=-1)
    a_uid = a.identity
    a.close()
    took: list[ObjectWal] = []

    class TakenBeforeSeal(ForwardingObjectStore):
        def put_if_absent(self, key: str, data: bytes) -> bool:
            if not took and not key.endswith("/identity"):
                took.append(_ready(inner, epoch=9, expect_uid=-1)[0])
            return self.inner.put_if_absent(key, data)

    mine = _wal(TakenBeforeSeal(inner), epoch=3, expect_uid=a_uid)
    with pytest.raises(UnavailableError, match="another store took this WAL"):
        list(mine.recover())
    mine._abandon()
    assert took[0].identity not in (None, a_uid)
    took[0].close()


def test_a_take_that_dies_half_way_leaves_the_wal_to_its_owner() -> None:
    """Store B (its node at epoch 6) died taking store A's empty prefix: its seal and trim
    marker written, its identity not. The prefix is still A's; the seal and the marker
    carried B's epoch, and every open of A (at epoch 2, 3, ...) was fenced by them. They
    are of epoch 0 now: A opens and appends as before, and B can take it later."""
    inner = MemoryObjectStore()
    a, _ = _ready(inner, epoch=1, expect_uid=-1)
    a_uid = a.identity
    a.close()
    faulty = FaultyObjectStore(
        inner,
        rules=[FaultRule(error_rate=1.0, operations=frozenset({"put"}), key_prefix="wal/n1/id")],
        rng=random.Random(0),
    )
    b = _wal(faulty, epoch=6, expect_uid=-1, retry=False)
    with pytest.raises(UnavailableError):
        list(b.recover())
    b._abandon()
    assert _wal(inner)._read_identity().uid == a_uid  # type: ignore[union-attr]
    again, got = _ready(inner, epoch=2, expect_uid=a_uid)
    assert got == [] and again.identity == a_uid
    pos = again.append(b"after").result(5)
    again.close()
    last, got = _ready(inner, epoch=3, expect_uid=a_uid)
    assert got == [WalRecord(pos, b"after")]
    last.trim(pos)
    last.close()
    b, _ = _ready(inner, epoch=7, expect_uid=-1)
    assert b.identity not in (None, a_uid)
    b.close()


class _FailNextData(ForwardingObjectStore):
    """Fails the next conditional create of a data object (a WAL PUT) with UnavailableError."""

    armed = False

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.armed and len(data) > HEADER.size:
            self.armed = False
            raise UnavailableError("injected: the WAL PUT failed")
        return self.inner.put_if_absent(key, data)


@pytest.mark.parametrize("take", ["whole", "half"])
def test_a_resume_after_a_failure_does_not_run_over_another_stores_take(take: str) -> None:
    """Store A's WAL failed a PUT; before A's reset (the uploader's repair) ran, store B took
    the empty WAL. A's reset walked past B's seal (of epoch 0), sealed and trimmed: B's
    acknowledged appends were deleted, and A's next one went into a WAL that was B's. A is
    fenced now. A take that died before its identity was written leaves the WAL A's."""
    inner = MemoryObjectStore()
    a_store = _FailNextData(inner)
    a, _ = _ready(a_store, epoch=2, expect_uid=-1, retry=False)
    a.trim(a.append(b"uploaded").result(5))
    a_store.armed = True
    with pytest.raises(UnavailableError):
        a.append(b"failed").result(5)
    acked: list[WalRecord] = []
    if take == "whole":
        b, _ = _ready(inner, epoch=3, expect_uid=-1)
        acked = [WalRecord(b.append(b"b%d" % i).result(5), b"b%d" % i) for i in range(3)]
        b_uid = b.identity
        b._abandon()
    else:
        faulty = FaultyObjectStore(
            inner,
            rules=[
                FaultRule(error_rate=1.0, operations=frozenset({"put"}), key_prefix="wal/n1/id")
            ],
            rng=random.Random(0),
        )
        b = _wal(faulty, epoch=3, expect_uid=-1, retry=False)
        with pytest.raises(UnavailableError):
            list(b.recover())
        b._abandon()
    if take == "half":
        # B's take never finished: the WAL is still A's, which goes on with it.
        a.reset()
        _append_crash_recover(a, inner, b"after", epoch=4)
        return
    with pytest.raises(FencedError, match="another store took this WAL"):
        a.reset()
    a._abandon()
    again, got = _ready(inner, epoch=4, expect_uid=b_uid)
    assert got == acked
    again.close()


def test_a_stale_opener_of_this_stores_node_does_not_take_its_wal() -> None:
    """Two processes of one store open node n1 at once, the node having recorded no WAL: the
    first registered (epoch 1) but opens its WAL after the second (epoch 2) did. Expecting
    none, it took the WAL as another store's (epoch checks skipped), fenced the newer
    opener, and the identity it wrote was not the one the store recorded last: the node's
    WAL was refused for good. The stale opener is fenced now, writing nothing."""
    store = MemoryObjectStore()
    newer, _ = _ready(store, epoch=2, expect_uid=-1)
    before = _everything(store)
    stale = _wal(store, epoch=1, expect_uid=-1)
    with pytest.raises(FencedError, match="newer than this writer's 1"):
        list(stale.recover())
    stale.close()
    assert _everything(store) == before
    _append_crash_recover(newer, store, b"kept", epoch=3)


def test_a_stale_opener_that_read_an_older_identity_does_not_take_the_wal() -> None:
    """As above, the node having run before (its identity of epoch 1 in place): the stale
    opener (epoch 2) read that identity, then the newer one (epoch 3) opened and wrote its
    own. Judged on what it had read, the stale one took the WAL, fenced the newer one and
    left the node's WAL refused. It looks again before its seal now, and fails."""
    inner = MemoryObjectStore()
    first, _ = _ready(inner, epoch=1, expect_uid=-1)
    first.close()
    newer: list[ObjectWal] = []

    class NewerOpensAfterTheRead(ForwardingObjectStore):
        def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
            if not newer:
                newer.append(_ready(inner, epoch=3, expect_uid=-1)[0])
            return self.inner.list(prefix)

    stale = _wal(NewerOpensAfterTheRead(inner), epoch=2, expect_uid=-1)
    with pytest.raises(UnavailableError, match="while this open read it"):
        list(stale.recover())
    stale.close()
    _append_crash_recover(newer[0], inner, b"kept", epoch=4)
    retried = _wal(inner, epoch=2, expect_uid=-1)  # refused: the newer one's records
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        list(retried.recover())
    retried.close()


def test_the_check_reports_the_identity_and_its_damage() -> None:
    store = MemoryObjectStore()
    wal, _ = _ready(store, expect_uid=-1)
    uid = wal.identity
    wal.append(b"x").result(5)
    wal._abandon()
    check = check_object_wal(store, "n1", prefix="wal")
    assert check.ok and check.identity == uid and check.records == 1
    blob = bytearray(store.get("wal/n1/identity"))
    blob[8] ^= 1
    store.put("wal/n1/identity", bytes(blob))
    check = check_object_wal(store, "n1", prefix="wal")
    assert not check.ok and "identity" in (check.damage or "") and check.records == 1


def test_the_check_beside_a_writer_that_trims_reports_no_damage() -> None:
    """`s3stream verify` of an S3 store beside its live writer: the writer trimmed (marker,
    then deletes) between the check's LIST and its GET of an object, and the check called
    the WAL damaged ("vanished while it was read"; 3 of 20 runs on SeaweedFS). A vanished
    object with the trim marker moved past makes the check walk the chain again."""
    store = MemoryObjectStore()
    writer, _ = _ready(store, expect_uid=-1)
    acked = [writer.append(b"r%d" % i).result(5) for i in range(6)]
    trimmed: list[str] = []

    class TrimsDuringTheRead(ForwardingObjectStore):
        def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
            if not trimmed and key in {i.key for i in _data_objects(store)}:
                trimmed.append(key)
                writer.trim(acked[3])
                deadline = time.monotonic() + 10
                while key in {i.key for i in _data_objects(store)}:
                    assert time.monotonic() < deadline, "the trim deleted nothing"
                    time.sleep(0.01)
            return self.inner.get(key, start, end)

    check = check_object_wal(TrimsDuringTheRead(store), "n1", prefix="wal")
    assert trimmed, "the check read no data object"
    assert check.ok, check
    assert check.records == 2  # the records past the trim
    # A deleted object with no trim behind it is still damage.
    store.delete_many([_data_objects(store)[0].key])
    writer._abandon()
    damaged = check_object_wal(store, "n1", prefix="wal")
    assert not damaged.ok, damaged


def test_a_damaged_identity_is_damage() -> None:
    store = MemoryObjectStore()
    wal, _ = _ready(store, expect_uid=-1)
    wal.close()
    blob = bytearray(store.get("wal/n1/identity"))
    blob[8] ^= 1
    store.put("wal/n1/identity", bytes(blob))
    with pytest.raises(CorruptionError, match="identity"):
        _ready(store, epoch=2)


@pytest.mark.s3
def test_two_stores_given_one_s3_wal(seaweedfs: Any) -> None:
    """Two stores on SeaweedFS named one object WAL: store A's writer died with acknowledged
    appends in it; store B is refused it, writing nothing, and A recovers every append."""
    run = uuid.uuid4().hex
    opts = seaweedfs.storage_options()
    shared = f"s3://{seaweedfs.bucket}/shared-{run}/wal"
    a_url, b_url = (f"s3://{seaweedfs.bucket}/{name}-{run}" for name in ("a", "b"))
    with s3stream.open(b_url, node_id="n1", storage_options=opts) as b:
        b.create_stream().append(RecordBatch(b"B's own"))
    a = s3stream.open(a_url, node_id="n1", wal=shared, storage_options=opts)
    stream = a.create_stream()
    for i in range(3):
        stream.append(RecordBatch(b"A-%d" % i))
    a._storage.abandon()  # crash before any upload
    a._wal._abandon()  # type: ignore[attr-defined]
    # A's node in B's store (registered, no stream opened) is taken over with the WAL.
    with (
        s3stream.open(b_url, node_id="n2", storage_options=opts) as taker,
        pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"),
    ):
        taker.take_over("n1", wal=shared, storage_options=opts)
    raw = S3ObjectStore.from_url(f"s3://{seaweedfs.bucket}", **opts)
    try:
        before = _everything_under(raw, f"shared-{run}/")
        with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
            s3stream.open(b_url, node_id="n1", wal=shared, storage_options=opts)
        assert _everything_under(raw, f"shared-{run}/") == before
    finally:
        raw.close()
    with s3stream.open(a_url, node_id="n1", wal=shared, storage_options=opts) as again:
        assert _read_all(again, stream.stream_id) == [b"A-0", b"A-1", b"A-2"]


def _everything_under(store: ObjectStore, prefix: str) -> dict[str, bytes]:
    return {info.key: store.get(info.key) for info in store.list(prefix)}


# -- a crash's torn tail or damage ----------------------------------------------------------------

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    """A local directory store, and a fresh prefix on the session's SeaweedFS server."""
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "store", fsync=False)
        return
    server = request.getfixturevalue("seaweedfs")
    store = S3ObjectStore(server.bucket, f"damage-{uuid.uuid4().hex}", **server.storage_options())
    try:
        yield store
    finally:
        store.close()


def _one_per_object(wal: ObjectWal, n: int, tag: bytes) -> list[WalRecord]:
    """`n` acknowledged records, one WAL object each (every append waits for its ack)."""
    out = []
    for i in range(n):
        data = b"%s %d" % (tag, i)
        out.append(WalRecord(wal.append(data).result(10), data))
    return out


def _recovery_error(store: ObjectStore, epoch: int) -> CorruptionError:
    wal = _wal(store, epoch)
    try:
        with pytest.raises(CorruptionError) as err:
            list(wal.recover())
    finally:
        wal.close()
    assert "accept_wal_loss" in str(err.value) and not err.value.retryable
    return err.value


def test_a_deleted_object_inside_the_acknowledged_chain_is_damage(
    any_store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    wal, _ = _ready(any_store)
    acked = _one_per_object(wal, 10, b"acked")
    wal.close()
    missing, proof = (wal.object_key(r.position) for r in acked[3:5])
    any_store.delete_many([missing])

    err = _recovery_error(any_store, epoch=2)
    assert err.location == missing
    assert missing in str(err) and proof in str(err), "names the hole and what proves it"
    assert any_store.head(missing) is None, "a refused recovery seals nothing over the hole"

    # Accepting the loss recovers what lies before the hole and seals it there, once.
    with caplog.at_level(logging.WARNING, logger="s3stream.wal"):
        again, got = _ready(any_store, epoch=3, accept_loss=True)
    assert got == acked[:3]
    assert missing in caplog.text and "accept_wal_loss=True" in caplog.text
    after = WalRecord(again.append(b"after").result(10), b"after")
    again.close()
    last, got = _ready(any_store, epoch=4)
    assert got == [*acked[:3], after]
    last.close()


def test_a_crash_with_puts_in_flight_leaves_a_torn_tail_not_damage(
    any_store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Objects past a gap whose headers say the gap had not landed: the last, never
    acknowledged objects of a crash, skipped (logged at INFO), the prefix recovered."""
    gate = AttemptGate(any_store, frozenset({0}), fail=frozenset({0}), armed=False)
    wal, _ = _ready(gate, settings=HELD_PUT_SETTINGS, retry=False)
    acked = _one_per_object(wal, 3, b"acked")
    gate.armed = True
    doomed = [wal.append(b"its PUT never lands")]
    gate.wait_for(lambda: gate.calls == 1, "the held PUT")
    for i in range(2):  # later objects land while the first is still in flight
        doomed.append(wal.append(b"lands, never acknowledged %d" % i))
        gate.wait_for(lambda n=4 + i: len(_data_objects(any_store)) == n, "a later object")
    gate.events[0].set()  # the held PUT fails: it never reaches the store, as after a crash
    for fut in doomed:
        with pytest.raises(UnavailableError):
            fut.result(10)
    wal._abandon()
    assert gate.target is not None
    gap = int(gate.target.rsplit("/", 1)[1])
    past = [i for i in _data_objects(any_store) if int(i.key.rsplit("/", 1)[1]) > gap]
    assert len(past) == 2 and any_store.head(gate.target) is None
    for info in past:
        header = decode_object_header(any_store.get(info.key), node_id="n1", key=info.key)
        assert header.acked_through == gap, "its writer knew the gap had not landed"

    with caplog.at_level(logging.INFO, logger="s3stream.wal"):
        again, got = _ready(any_store, epoch=2)
    assert got == acked
    assert "torn tail" in caplog.text and all(i.key in caplog.text for i in past)
    again.close()


def test_a_seal_past_a_missing_object_is_damage(any_store: ObjectStore) -> None:
    first, _ = _ready(any_store, epoch=1)
    session1 = _one_per_object(first, 3, b"session 1")
    first.close()
    second, got = _ready(any_store, epoch=2)  # walks past session 1's objects, seals after
    assert got == session1
    session2 = _one_per_object(second, 2, b"session 2")
    second._abandon()
    # Session 1's last object: only session 2's seal and objects lie past it.
    missing = first.object_key(session1[-1].position)
    seal = next(
        i.key for i in _chain_objects(any_store) if i.size == HEADER.size and i.key > missing
    )
    any_store.delete_many([missing])

    err = _recovery_error(any_store, epoch=3)
    assert err.location == missing and seal in str(err) and "seal of epoch 2" in str(err)

    # With the loss accepted, recovery goes on at that seal: later sessions are kept.
    again, got = _ready(any_store, epoch=4, accept_loss=True)
    assert got == [*session1[:2], *session2]
    again.reset()  # what a client does once it uploaded the records: the anchor passes the hole
    again.close()
    last, got = _ready(any_store, epoch=5)
    assert got == []
    last.close()


def test_a_listing_that_missed_a_landed_object_is_not_taken_for_damage() -> None:
    """A paginated LIST may read the page of an object before it landed and a later page
    after the next object landed: the proof is checked on a new LIST before it counts."""

    class FirstListingMisses(ForwardingObjectStore):
        def __init__(self, inner: ObjectStore, key: str) -> None:
            super().__init__(inner)
            self.key = key
            self.lists = 0

        def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
            self.lists += 1
            found = self.inner.list(prefix)
            return found if self.lists > 1 else (i for i in found if i.key != self.key)

    store = MemoryObjectStore()
    wal, _ = _ready(store)
    acked = _one_per_object(wal, 5, b"acked")
    wal.close()
    racy = FirstListingMisses(store, wal.object_key(acked[2].position))
    again, got = _ready(racy, epoch=2)
    # The first LIST, the one confirming the proof, and the one after the seal.
    assert got == acked and racy.lists == 3
    again.close()


def test_a_fenced_writers_late_objects_are_never_taken_for_damage() -> None:
    """The objects an older writer lands after a taker's seal lie past the chain end at the
    take-over (their headers say the sealed position had not landed), and below the seal's
    jump for every later owner."""
    gated = GatedStore(MemoryObjectStore())
    zombie, _ = _ready(gated, epoch=1, settings=HELD_PUT_SETTINGS, retry=False)
    acked = _one_per_object(zombie, 3, b"acked")
    gated.hold_next_data = 1
    late = [zombie.append(b"in flight at the take-over")]
    deadline = time.monotonic() + 5
    while not gated.gates and time.monotonic() < deadline:
        time.sleep(0.005)
    (held_key,) = gated.gates
    for i in range(2):
        late.append(zombie.append(b"lands after %d" % i))
        deadline = time.monotonic() + 5
        while len(_data_objects(gated.inner)) < 4 + i and time.monotonic() < deadline:
            time.sleep(0.005)
    assert len(_data_objects(gated.inner)) == 5

    taker, got = _ready(gated.inner, epoch=2)  # seals at the held object's position
    assert got == acked
    gated.release_all()
    for fut in late:
        with pytest.raises(FencedError):
            fut.result(5)
    seal_at = int(held_key.rsplit("/", 1)[1])
    for info in _data_objects(gated.inner)[3:]:
        header = decode_object_header(gated.inner.get(info.key), node_id="n1", key=info.key)
        assert header.epoch == 1 and header.acked_through == seal_at
    taker._abandon()  # the taker crashes before writing anything: its chain ends at its jump
    third, got = _ready(gated.inner, epoch=3)
    assert got == acked
    third.close()
    zombie.close()


@pytest.mark.parametrize("markers", ["kept", "deleted"])
def test_a_wal_prefix_without_objects_is_damage_when_streams_are_open(
    any_store: ObjectStore, markers: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every open leaves a seal that is never deleted: a prefix without WAL objects was wiped.
    That loses acknowledged appends when the node still has streams open (`must_exist`)."""
    wal, _ = _ready(any_store)
    acked = _one_per_object(wal, 3, b"acked")
    wal.trim(acked[0].position)
    wal._abandon()
    doomed = [i.key for i in any_store.list("wal/n1/")]
    if markers == "kept":
        doomed = [k for k in doomed if "/trim/" not in k]
    any_store.delete_many(doomed)
    assert [i.key for i in any_store.list("wal/n1/") if "/trim/" not in i.key] == []

    wiped = _wal(any_store, epoch=2, must_exist=True)
    with pytest.raises(CorruptionError, match="holds no WAL object") as err:
        list(wiped.recover())
    wiped.close()
    assert err.value.location == "wal/n1/" and "accept_wal_loss" in str(err.value)
    with caplog.at_level(logging.WARNING, logger="s3stream.wal"):
        accepted, got = _ready(any_store, epoch=3, must_exist=True, accept_loss=True)
    assert got == [] and "wal/n1/" in caplog.text
    accepted.close()
    # Without open streams nothing acknowledged can be missing: no check.
    any_store.delete_many([i.key for i in any_store.list("wal/n1/") if "/trim/" not in i.key])
    plain, got = _ready(any_store, epoch=4)
    assert got == []
    plain.close()


def test_headers_of_version_2_say_what_had_landed() -> None:
    store = MemoryObjectStore()
    wal, _ = _ready(store)
    acked = _one_per_object(wal, 3, b"acked")
    wal.close()
    for info in _data_objects(store):
        head = store.get(info.key, 0, HEADER.size)
        header = decode_object_header(head, node_id="n1", key=info.key, size=info.size)
        assert HEADER.unpack(head)[1] == 2 and header.kind == KIND_DATA
        assert header.next == header.first + info.size - HEADER.size  # from the size alone
        assert header.acked_through == header.first  # every earlier object had landed
    assert [int(i.key[-20:]) for i in _data_objects(store)] == [r.position for r in acked]
    seal = _chain_objects(store)[0]
    header = decode_object_header(store.get(seal.key), node_id="n1", key=seal.key)
    assert (header.first, header.next, header.acked_through) == (0, SESSION_GAP, 0)

    # An object cannot have landed before it was cut: a header saying so is damaged.
    key = _data_objects(store)[0].key
    raw = store.get(key)
    header = decode_object_header(raw, node_id="n1", key=key)
    claims_itself = header._replace(acked_through=header.first + 64)
    raw = object_wal._encode_header(claims_itself, object_wal._node_seed("n1")) + raw[HEADER.size :]
    with pytest.raises(CorruptionError, match="acked_through"):
        decode_object_header(raw, node_id="n1", key=key)


def _load_golden(version: int, store: ObjectStore) -> tuple[list[str], list[WalRecord]]:
    """Put the golden history written by a header-`version` writer into `store`: its keys
    (seal, three objects, seal, three objects, marker) and the records it must recover to."""
    meta = json.loads((GOLDEN / f"object_wal_v{version}.json").read_text())
    assert meta["version"] == version
    for obj in meta["objects"]:
        store.put(obj["key"], bytes.fromhex(obj["hex"]))
    chain = [o["key"] for o in meta["objects"] if "/trim/" not in o["key"]]
    for key in chain:
        assert HEADER.unpack(store.get(key, 0, HEADER.size))[1] == version
    records = [WalRecord(r["position"], bytes.fromhex(r["data_hex"])) for r in meta["recovered"]]
    return chain, records


@pytest.mark.parametrize("version", [1, 2])
def test_golden_wal_objects_of_every_version_recover(any_store: ObjectStore, version: int) -> None:
    _, expected = _load_golden(version, any_store)
    wal, got = _ready(any_store, epoch=3)
    assert got == expected
    wal.append(b"on top").result(10)
    wal.close()
    again, got = _ready(any_store, epoch=4)
    assert got[: len(expected)] == expected and got[-1].data == b"on top"
    again.close()


@pytest.mark.parametrize("version", [1, 2])
def test_golden_hole_before_a_later_session_is_damage_in_every_version(
    any_store: ObjectStore, version: int
) -> None:
    chain, _ = _load_golden(version, any_store)
    any_store.delete_many([chain[2]])  # session 1's middle object
    err = _recovery_error(any_store, epoch=3)
    # Version 2: the next object's acked_through proves it; version 1: only the next seal.
    proof = chain[3] if version == 2 else chain[4]
    assert err.location == chain[2] and proof in str(err)


@pytest.mark.parametrize("version", [1, 2])
def test_golden_hole_in_the_last_session(any_store: ObjectStore, version: int) -> None:
    """Version 2 proves the hole; a version-1 object past it says nothing, so it reads as a
    torn tail (the limit of old objects, in docs/s3-wal.md)."""
    chain, expected = _load_golden(version, any_store)
    any_store.delete_many([chain[6]])  # session 2's middle object
    if version == 2:
        err = _recovery_error(any_store, epoch=3)
        assert err.location == chain[6] and chain[7] in str(err)
        return
    wal, got = _ready(any_store, epoch=3)
    assert got == expected[:-2]
    wal.close()


@pytest.mark.s3
@pytest.mark.parametrize("loss", ["wiped", "hole"])
def test_client_on_s3_refuses_a_lost_object_wal_unless_the_loss_is_accepted(
    seaweedfs: Any, loss: str
) -> None:
    """A node that crashed with open streams: its WAL prefix wiped, or one acknowledged
    object deleted. Opening the node and taking it over raise `CorruptionError` naming it;
    `accept_wal_loss=True` goes on with what is left."""
    prefix = f"lost-{uuid.uuid4().hex}"
    url = f"s3://{seaweedfs.bucket}/{prefix}"
    opts = seaweedfs.storage_options()
    wal_settings = ObjectWalSettings(wal_batch_interval_ms=1)
    client = s3stream.open(
        url, node_id="n1", storage_options=opts, object_wal_settings=wal_settings
    )
    stream = client.create_stream()
    payloads = [b"payload %d" % i for i in range(6)]
    for p in payloads:
        stream.append(RecordBatch(p, count=1))  # acknowledged: one WAL object each
    client._storage.abandon()  # crash before any upload
    client._wal._abandon()  # type: ignore[attr-defined]
    raw = S3ObjectStore(seaweedfs.bucket, prefix, **opts)
    data = sorted(i.key for i in raw.list("wal/n1/") if "/trim/" not in i.key and i.size > 40)
    assert len(data) == len(payloads)
    keys = sorted((i.key, i.size) for i in raw.list(""))
    healthy = check_object_wal(raw, "n1", prefix="wal")  # what `s3stream verify` runs
    assert healthy.ok and healthy.records == len(payloads), healthy
    if loss == "wiped":
        raw.delete_many([i.key for i in raw.list("wal/n1/")])
        where, left = "wal/n1/", []
    else:
        raw.delete_many([data[2]])
        where, left = data[2], payloads[:2]
        damaged = check_object_wal(raw, "n1", prefix="wal")
        assert not damaged.ok and data[2] in str(damaged.damage), damaged
        keys = [k for k in keys if k[0] != data[2]]
        assert sorted((i.key, i.size) for i in raw.list("")) == keys, "the check wrote"
    raw.close()
    with pytest.raises(CorruptionError, match=where) as err:
        s3stream.open(url, node_id="n1", storage_options=opts)
    assert err.value.location == where and "accept_wal_loss" in str(err.value)
    with (
        s3stream.open(url, node_id="other", storage_options=opts) as other,
        pytest.raises(CorruptionError, match=where),
    ):
        other.take_over("n1")
    with s3stream.open(url, node_id="n1", storage_options=opts, accept_wal_loss=True) as again:
        assert _read_all(again, stream.stream_id) == left


@pytest.mark.s3
def test_a_wiped_object_wal_of_a_cleanly_closed_node_is_no_damage(seaweedfs: Any) -> None:
    prefix = f"closed-{uuid.uuid4().hex}"
    url = f"s3://{seaweedfs.bucket}/{prefix}"
    opts = seaweedfs.storage_options()
    with s3stream.open(url, node_id="n1", storage_options=opts) as client:
        stream = client.create_stream()
        stream.append(RecordBatch(b"uploaded at close", count=1))
    raw = S3ObjectStore(seaweedfs.bucket, prefix, **opts)
    raw.delete_many([i.key for i in raw.list("wal/n1/")])
    raw.close()
    with s3stream.open(url, node_id="n1", storage_options=opts) as again:
        assert _read_all(again, stream.stream_id) == [b"uploaded at close"]
