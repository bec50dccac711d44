"""`MetadataStoreTests`: the `MetadataLogStore` contract as a pytest base class.

A metadata log store keeps the records of the metadata log (entries, checkpoints, a pointer)
and offers one coordination primitive, create-entry-if-absent, whose single winner is all that
fences writers (docs/metadata.md). A third party proves a store with a subclass that makes a
`MetadataBackend`: a fresh, empty log, on which the kit opens as many handles as it needs (each
as a separate process would hold it) and, through the backend's backdoor, damages records::

    class TestMyLogStore(MetadataStoreTests):
        def make_backend(self, tmp_path):
            return MyBackend(tmp_path)

Tests are grouped by the prefix of their name (``test_entry_*``, ``test_checkpoint_*``,
``test_concurrency_*``, ``test_manager_*``, ``test_fencing_*``, ``test_rollback_*``,
``test_lifecycle_*``), so ``-k`` selects a concern. A test that needs a part of the backend it
does not offer (the backdoor; `MetadataBackend.recipe`, for other processes) skips and says why.

Shipped backends: `ObjectStoreBackend` (the object-store log, `MetadataLog`, on any object
store) and `PostgresBackend` (`PostgresMetadataLog`, on a server's URL: see
`s3stream.testing.postgres` for a throw-away server). The suite's own metadata tests use them
too (tests/test_metadata.py), so every test of the manager runs on each backend.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from ..clock import ManualClock, SystemClock
from ..errors import CorruptionError, FencedError, ObjectNotFoundError
from ..metadata.base import MetadataLogStore
from ..metadata.codec import encode_checkpoint, encode_entry
from ..metadata.log import MetadataLog
from ..metadata.manager import MetadataManager
from ..metadata.model import (
    Checkpoint,
    CommitObjects,
    LogEntry,
    ObjectKind,
    ObjectMeta,
    Op,
    RegisterNode,
    StreamRange,
)
from ..metadata.state import MetadataState
from ..objectstore.base import ObjectStore
from . import MISSING_DEPENDENCIES_MESSAGE

try:
    import pytest
except ImportError as exc:  # pragma: no cover - only without the testing extras
    raise ImportError(MISSING_DEPENDENCIES_MESSAGE) from exc

__all__ = [
    "MetadataBackend",
    "MetadataStoreTests",
    "ObjectStoreBackend",
    "PostgresBackend",
    "entry_bytes",
]

#: Opens a handle on a log in another process: picklable (a module-level function, or a
#: `functools.partial` of one, with picklable arguments).
Recipe = Callable[[], MetadataLogStore]


def entry_bytes(seq: int, writer: str) -> bytes:
    """A well-formed entry `seq` written by `writer` (its op names the writer, so that two
    writers' entries of one seq differ)."""
    return encode_entry(
        LogEntry(seq=seq, ops=(RegisterNode(f"node-{writer}", seq),), writer=writer, ts_ms=seq)
    )


# -- backends ----------------------------------------------------------------------------------


class MetadataBackend(ABC):
    """One empty log as a test sees it: new handles on it, and a backdoor to its records.

    Handles opened through `open_log` are closed by `close`.
    """

    def __init__(self) -> None:
        self._handles: list[MetadataLogStore] = []

    def open_log(self) -> MetadataLogStore:
        """A new handle on the log (as another process would open it)."""
        log = self._open()
        assert isinstance(log, MetadataLogStore), f"the backend opened {log!r}"
        self._handles.append(log)
        return log

    @abstractmethod
    def _open(self) -> MetadataLogStore:
        """A new handle (see `open_log`)."""

    def recipe(self) -> Recipe | None:
        """Optional: a picklable opener of the log for other processes; None if the log
        lives in this process only."""
        return None

    def close(self) -> None:
        """Close every handle opened."""
        for log in self._handles:
            log.close()
        self._handles.clear()

    # -- the backdoor: records read and written without the store under test ------------------

    has_backdoor: ClassVar[bool] = True

    @abstractmethod
    def put_entry(self, seq: int, data: bytes) -> None:
        """Store `data` as entry `seq`, overwriting."""

    @abstractmethod
    def get_entry(self, seq: int) -> bytes | None:
        """The stored bytes of entry `seq`, or None."""

    @abstractmethod
    def delete_entries(self, seqs: list[int]) -> None:
        """Remove entries (a rollback, as an operator restoring an old backup would cause)."""

    @abstractmethod
    def entry_seqs(self) -> list[int]:
        """The seqs of the entries stored, sorted."""

    @abstractmethod
    def put_checkpoint(self, seq: int, data: bytes) -> None:
        """Store `data` as the checkpoint after entry `seq`, overwriting."""

    @abstractmethod
    def get_checkpoint(self, seq: int) -> bytes | None:
        """The stored bytes of the checkpoint after entry `seq`, or None."""

    @abstractmethod
    def delete_checkpoint(self, seq: int) -> None:
        """Remove the checkpoint after entry `seq`."""

    @abstractmethod
    def set_pointer(self, seq: int) -> None:
        """Make the pointer name checkpoint `seq`, whatever it named."""


class ObjectStoreBackend(MetadataBackend):
    """The object-store log (`MetadataLog`) under `prefix` of `store`. `reopen`, a picklable
    opener of the same store, lets other processes race on it."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str = "meta",
        *,
        reopen: Callable[[], ObjectStore] | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.prefix = prefix
        self._reopen = reopen
        self._layout = MetadataLog(store, prefix)

    def _open(self) -> MetadataLogStore:
        return MetadataLog(self.store, self.prefix)

    def recipe(self) -> Recipe | None:
        if self._reopen is None:
            return None
        return functools.partial(_object_log, self._reopen, self.prefix)

    def put_entry(self, seq: int, data: bytes) -> None:
        self.store.put(self._layout.entry_key(seq), data)

    def get_entry(self, seq: int) -> bytes | None:
        return self._get(self._layout.entry_key(seq))

    def delete_entries(self, seqs: list[int]) -> None:
        self.store.delete_many([self._layout.entry_key(s) for s in seqs])

    def entry_seqs(self) -> list[int]:
        return sorted(self._layout.listed_seqs())

    def put_checkpoint(self, seq: int, data: bytes) -> None:
        self.store.put(self._layout.checkpoint_key(seq), data)

    def get_checkpoint(self, seq: int) -> bytes | None:
        return self._get(self._layout.checkpoint_key(seq))

    def delete_checkpoint(self, seq: int) -> None:
        self.store.delete_many([self._layout.checkpoint_key(seq)])

    def set_pointer(self, seq: int) -> None:
        from ..metadata.codec import encode_pointer

        self.store.put(self._layout.pointer_key, encode_pointer(seq))

    def _get(self, key: str) -> bytes | None:
        try:
            return self.store.get(key)
        except ObjectNotFoundError:
            return None


def _object_log(reopen: Callable[[], ObjectStore], prefix: str) -> MetadataLogStore:
    return MetadataLog(reopen(), prefix)


class PostgresBackend(MetadataBackend):
    """`PostgresMetadataLog` on the database `url` names, in a namespace of its own (a fresh
    one unless given), so that many backends share one database. The backdoor is SQL."""

    def __init__(self, url: str, namespace: str | None = None, **log_options: Any) -> None:
        super().__init__()
        self.url = url
        self.namespace = namespace if namespace is not None else f"kit-{uuid.uuid4().hex[:12]}"
        self._options = log_options
        self._probe: Any = None
        from ..metadata.postgres_url import parse_postgres_url

        self._target = parse_postgres_url(url, namespace=self.namespace, timeout_ms=30_000)

    def _open(self) -> MetadataLogStore:
        from ..metadata.postgres import PostgresMetadataLog

        return PostgresMetadataLog(self.url, namespace=self.namespace, **self._options)

    def recipe(self) -> Recipe | None:
        from ..metadata.postgres import PostgresMetadataLog

        return functools.partial(
            PostgresMetadataLog, self.url, namespace=self.namespace, **self._options
        )

    def close(self) -> None:
        super().close()
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def _sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        """Run `statement` (``{s}`` standing for the schema) on the backdoor's connection."""
        import psycopg
        from psycopg import sql

        if self._probe is None:
            self._probe = psycopg.connect(self._target.conninfo, autocommit=True)
        cur = self._probe.execute(
            sql.SQL(statement).format(s=sql.Identifier(self._target.schema)),
            (self._target.namespace, *params),
        )
        return list(cur.fetchall()) if cur.description is not None else []

    def put_entry(self, seq: int, data: bytes) -> None:
        self.open_log().check_writable()
        self._sql(
            "INSERT INTO {s}.log_entries (namespace, seq, payload) VALUES (%s, %s, %s) "
            "ON CONFLICT (namespace, seq) DO UPDATE SET payload = EXCLUDED.payload",
            seq,
            data,
        )

    def get_entry(self, seq: int) -> bytes | None:
        rows = self._sql(
            "SELECT payload FROM {s}.log_entries WHERE namespace = %s AND seq = %s", seq
        )
        return bytes(rows[0][0]) if rows else None

    def delete_entries(self, seqs: list[int]) -> None:
        self._sql("DELETE FROM {s}.log_entries WHERE namespace = %s AND seq = ANY(%s)", list(seqs))

    def entry_seqs(self) -> list[int]:
        rows = self._sql("SELECT seq FROM {s}.log_entries WHERE namespace = %s ORDER BY seq")
        return [int(r[0]) for r in rows]

    def put_checkpoint(self, seq: int, data: bytes) -> None:
        self.open_log().check_writable()
        self._sql(
            "INSERT INTO {s}.checkpoints (namespace, seq, payload) VALUES (%s, %s, %s) "
            "ON CONFLICT (namespace, seq) DO UPDATE SET payload = EXCLUDED.payload",
            seq,
            data,
        )

    def get_checkpoint(self, seq: int) -> bytes | None:
        rows = self._sql(
            "SELECT payload FROM {s}.checkpoints WHERE namespace = %s AND seq = %s", seq
        )
        return bytes(rows[0][0]) if rows else None

    def delete_checkpoint(self, seq: int) -> None:
        self._sql("DELETE FROM {s}.checkpoints WHERE namespace = %s AND seq = %s", seq)

    def set_pointer(self, seq: int) -> None:
        self.open_log().check_writable()
        self._sql(
            "INSERT INTO {s}.checkpoint_pointers (namespace, seq) VALUES (%s, %s) "
            "ON CONFLICT (namespace) DO UPDATE SET seq = EXCLUDED.seq",
            seq,
        )


# -- helpers -----------------------------------------------------------------------------------


def _create_many(log: MetadataLogStore, writer: str, seqs: range, start: Any) -> list[int]:
    """Try to create each of `seqs` as `writer`, each begun together with the other writers
    (`start`, a barrier, before every seq: without it one writer can run ahead and win every
    entry without ever colliding); the seqs won."""
    won = []
    for seq in seqs:
        start.wait(60)
        if log.create_entry(seq, entry_bytes(seq, writer)):
            won.append(seq)
    return won


def _race_in_child(recipe: Recipe, writer: str, seqs: range, start: Any, out: Any) -> None:
    """A child process's side of the cross-process race: report the seqs it won."""
    log = recipe()
    try:
        log.check_writable()
        out.put((writer, _create_many(log, writer, seqs, start)))
    except BaseException as exc:
        out.put((writer, f"{type(exc).__name__}: {exc}"))
    finally:
        log.close()


def race_in_processes(
    target: Callable[..., None], args: list[tuple[Any, ...]], timeout_s: float
) -> dict[Any, Any]:
    """Run ``target(*a, start, out)`` for each ``a`` of `args`, each in a process of its own
    (spawned), `start` a barrier they share, `out` a queue on which each puts one
    ``(key, result)`` pair; the pairs, once every process gave one (within `timeout_s`)."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(len(args)), ctx.Queue()
    children = [ctx.Process(target=target, args=(*a, start, out)) for a in args]
    for child in children:
        child.start()
    try:
        return dict(out.get(timeout=timeout_s) for _ in children)
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():  # pragma: no cover - a hung child
                child.kill()


def race_creates(managers: list[MetadataManager], commits: int, timeout_s: float = 120.0) -> None:
    """Each manager, in a thread of its own, creates `commits` streams tagged with its writer
    id and the round, all begun together; raises the first error a thread met (a race must
    never be one)."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(managers))

    def run(m: MetadataManager) -> None:
        try:
            start.wait(30)
            for i in range(commits):
                m.create_stream({"writer": m.writer_id, "i": str(i)})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(m,)) for m in managers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if errors:
        raise errors[0]
    stuck = [m.writer_id for m, t in zip(managers, threads, strict=True) if t.is_alive()]
    assert not stuck, f"writers still committing after {timeout_s:g} s: {stuck}"


def _checkpoint(seq: int, next_stream_id: int = 0) -> Checkpoint:
    return Checkpoint(seq=seq, next_stream_id=next_stream_id, streams=(), objects=(), nodes=())


def _manager(log: MetadataLogStore, writer: str, **kwargs: Any) -> MetadataManager:
    kwargs.setdefault("clock", ManualClock())
    m = MetadataManager(log, writer_id=writer, **kwargs)
    m.load()
    return m


def _same(a: MetadataState, b: MetadataState) -> bool:
    return a.to_checkpoint() == b.to_checkpoint()


def _upload(m: MetadataManager, key: str, stream_id: int, node: str, node_epoch: int) -> None:
    """Commit one object of `node` at the stream's end, as an uploader fenced by node epoch."""

    def build(state: MetadataState) -> list[Op]:
        s = state.streams[stream_id]
        obj = ObjectMeta(
            key=key,
            kind=ObjectKind.STREAM,
            size=10,
            ranges=(StreamRange(stream_id, s.end_offset, s.end_offset + 1),),
            committed_ms=1,
            node_id=node,
        )
        return [CommitObjects((obj,), {stream_id: s.epoch}, node_epoch=node_epoch)]

    m.commit(build)


# -- the kit -----------------------------------------------------------------------------------


class MetadataStoreTests:
    """Every test of the `MetadataLogStore` contract; subclass it as ``TestSomething``.

    Required hook: `make_backend`.
    """

    #: Threads racing for the same seqs, and how many seqs each tries.
    race_threads: ClassVar[int] = 8
    race_seqs: ClassVar[int] = 40
    #: Commits each of two managers makes in the manager race.
    manager_commits: ClassVar[int] = 60

    # -- hooks ------------------------------------------------------------------------------

    def make_backend(self, tmp_path: Path) -> MetadataBackend:
        """A new, empty log (each call: its own directory, namespace, ...)."""
        raise NotImplementedError("MetadataStoreTests subclasses must implement make_backend()")

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[MetadataBackend]:
        """The test's backend, closed after it."""
        made = self.make_backend(tmp_path)
        assert isinstance(made, MetadataBackend), f"make_backend() returned {made!r}"
        try:
            yield made
        finally:
            made.close()

    # -- entries ----------------------------------------------------------------------------

    def test_entry_empty_log(self, backend: MetadataBackend) -> None:
        log = backend.open_log()
        with pytest.raises(ObjectNotFoundError):
            log.read_entry(1)
        assert list(log.read_entries(1)) == []
        assert log.has_entry(1) is False
        assert log.read_pointer() is None
        assert log.listed_seqs() == set() and log.listed_seqs(checkpoints=True) == set()

    def test_entry_create_and_read_back(self, backend: MetadataBackend) -> None:
        writer, reader = backend.open_log(), backend.open_log()
        for seq in (1, 2, 3):
            assert writer.create_entry(seq, entry_bytes(seq, "w")) is True
        for seq in (1, 2, 3):
            entry, data = reader.read_entry(seq)
            assert data == entry_bytes(seq, "w"), "read_entry returned other bytes"
            assert entry.seq == seq and entry.writer == "w"
            assert reader.has_entry(seq)
        assert [e.seq for e, _ in reader.read_entries(1)] == [1, 2, 3]
        assert [e.seq for e, _ in reader.read_entries(3)] == [3]
        assert reader.listed_seqs() == {1, 2, 3}

    def test_entry_create_if_absent_keeps_the_first(self, backend: MetadataBackend) -> None:
        a, b = backend.open_log(), backend.open_log()
        assert a.create_entry(1, entry_bytes(1, "a")) is True
        assert b.create_entry(1, entry_bytes(1, "b")) is False
        assert a.create_entry(1, entry_bytes(1, "a")) is False, "a second create must lose"
        assert b.read_entry(1)[1] == entry_bytes(1, "a")

    def test_entry_read_entries_stops_at_a_hole(self, backend: MetadataBackend) -> None:
        # The entries before the hole come back; then the entries end, or CorruptionError
        # where the backend sees that a later one exists (a hole only damage makes).
        log = backend.open_log()
        for seq in (1, 2, 3, 5, 6):
            log.create_entry(seq, entry_bytes(seq, "w"))

        def read(first: int) -> list[int]:
            got: list[int] = []
            with contextlib.suppress(CorruptionError):
                for entry, _ in log.read_entries(first):
                    got.append(entry.seq)
            return got

        assert read(1) == [1, 2, 3]
        assert [e.seq for e, _ in log.read_entries(5)] == [5, 6]
        assert read(4) == []

    def test_entry_has_entry_past_finds_a_hole_at_the_tip(self, backend: MetadataBackend) -> None:
        # Entries 1..40 with `hole` of them missing after entry 5: the log goes on past the
        # hole at least as far as the hole is long, so `has_entry_past(5)` must see it (a
        # loading writer would otherwise take entry 5 for the tip and fill the hole).
        log = backend.open_log()
        for seq in range(1, 41):
            log.create_entry(seq, entry_bytes(seq, "w"))
        assert log.has_entry_past(5) and log.has_entry_past(38)
        assert not log.has_entry_past(39) and not log.has_entry_past(40)
        for hole in (1, 2, 3, 7, 16):
            backend.delete_entries(list(range(6, 6 + hole)))
            assert log.has_entry_past(5), f"a hole of {hole} after entry 5 went unseen"
            for seq in range(6, 6 + hole):
                backend.put_entry(seq, entry_bytes(seq, "w"))
        backend.delete_entries(list(range(6, 41)))
        assert not log.has_entry_past(5), "no entry after 6 exists"

    def test_entry_read_entries_stop_at_any_hole_or_damage(self, backend: MetadataBackend) -> None:
        # A backend may read ahead (in runs, in parallel): wherever the first missing or
        # damaged entry falls in a run, exactly the entries before it come back, in order (a
        # damaged one then raises CorruptionError; a missing one ends the entries, or raises
        # CorruptionError where the backend saw a later entry: a hole, which only damage
        # makes, since entries are never deleted).
        log = backend.open_log()
        for seq in range(1, 25):
            log.create_entry(seq, entry_bytes(seq, "w"))
        for at in (2, 3, 4, 5, 6, 9, 12, 13, 20):
            for damaged in (False, True):
                if damaged:
                    backend.put_entry(at, b"not an entry")
                else:
                    backend.delete_entries([at])
                got: list[int] = []
                with (
                    pytest.raises(CorruptionError)
                    if damaged
                    else contextlib.suppress(CorruptionError)
                ):
                    for entry, _ in backend.open_log().read_entries(1):
                        got.append(entry.seq)
                assert got == list(range(1, at)), f"{damaged=} at {at}: read {got}"
                backend.put_entry(at, entry_bytes(at, "w"))

    def test_entry_read_entries_many(self, backend: MetadataBackend) -> None:
        log = backend.open_log()
        for seq in range(1, 601):
            log.create_entry(seq, entry_bytes(seq, "w"))
        got = [e.seq for e, _ in backend.open_log().read_entries(1)]
        assert got == list(range(1, 601))

    def test_entry_damage_is_corruption_naming_the_record(self, backend: MetadataBackend) -> None:
        log = backend.open_log()
        for seq in (1, 2, 3):
            log.create_entry(seq, entry_bytes(seq, "w"))
        good = entry_bytes(2, "w")
        for bad in (good[:-1] + bytes([good[-1] ^ 1]), good[:5], b"", entry_bytes(3, "w")):
            backend.put_entry(2, bad)
            with pytest.raises(CorruptionError) as err:
                log.read_entry(2)
            assert err.value.location == log.entry_key(2)
            seen = []
            with pytest.raises(CorruptionError):
                for entry, _ in log.read_entries(1):
                    seen.append(entry.seq)
            assert seen == [1], "entries before a damaged one must be delivered first"
        backend.put_entry(2, good)
        assert log.read_entry(2)[1] == good

    def test_entry_names_are_distinct(self, backend: MetadataBackend) -> None:
        log = backend.open_log()
        names = {log.entry_key(1), log.entry_key(2), log.checkpoint_key(1), log.pointer_key}
        assert len(names) == 4
        assert log.describe() and "password" not in log.describe().lower()

    # -- checkpoints ------------------------------------------------------------------------

    def test_checkpoint_written_and_read_back(self, backend: MetadataBackend) -> None:
        log, other = backend.open_log(), backend.open_log()
        log.write_checkpoint(_checkpoint(4, 2))
        assert other.read_pointer() == 4
        assert other.read_checkpoint(4) == _checkpoint(4, 2)
        log.write_checkpoint(_checkpoint(8, 3))
        assert other.read_pointer() == 8
        assert other.listed_seqs(checkpoints=True) == {4, 8}
        assert backend.get_checkpoint(8) == encode_checkpoint(_checkpoint(8, 3))

    def test_checkpoint_missing_or_damaged_is_corruption(self, backend: MetadataBackend) -> None:
        log = backend.open_log()
        with pytest.raises(CorruptionError) as err:
            log.read_checkpoint(5)
        assert err.value.location == log.checkpoint_key(5)
        log.write_checkpoint(_checkpoint(5))
        backend.put_checkpoint(5, encode_checkpoint(_checkpoint(6)))
        with pytest.raises(CorruptionError, match="6"):
            log.read_checkpoint(5)
        backend.put_checkpoint(5, b"S3MC junk")
        with pytest.raises(CorruptionError):
            log.read_checkpoint(5)

    # -- concurrency ------------------------------------------------------------------------

    def test_concurrency_threads_one_winner_per_seq(self, backend: MetadataBackend) -> None:
        n, seqs = self.race_threads, range(1, self.race_seqs + 1)
        logs = [backend.open_log() for _ in range(n)]
        for log in logs:
            log.check_writable()
        start = threading.Barrier(n)
        with ThreadPoolExecutor(n) as pool:
            futures = [
                pool.submit(_create_many, log, f"t{i}", seqs, start) for i, log in enumerate(logs)
            ]
            won = {f"t{i}": f.result(timeout=120) for i, f in enumerate(futures)}
        self._check_one_winner(backend, won, seqs)

    def test_concurrency_processes_one_winner_per_seq(self, backend: MetadataBackend) -> None:
        recipe = backend.recipe()
        if recipe is None:
            pytest.skip(f"{type(backend).__name__} offers no recipe for other processes")
        backend.open_log().check_writable()
        seqs = range(1, self.race_seqs + 1)
        results = race_in_processes(
            _race_in_child, [(recipe, f"p{i}", seqs) for i in range(2)], timeout_s=120
        )
        for writer, won in results.items():
            assert isinstance(won, list), f"process {writer} failed: {won}"
        self._check_one_winner(backend, results, seqs)

    def _check_one_winner(self, backend: MetadataBackend, won: dict[str, Any], seqs: range) -> None:
        winners: dict[int, list[str]] = {}
        for writer, mine in won.items():
            for seq in mine:
                winners.setdefault(seq, []).append(writer)
        doubled = {s: w for s, w in winners.items() if len(w) > 1}
        assert not doubled, f"entries created by more than one writer: {doubled}"
        assert sorted(winners) == list(seqs), f"no winner for {set(seqs) - set(winners)}"
        reader = backend.open_log()
        for seq in seqs:
            assert reader.read_entry(seq)[1] == entry_bytes(seq, winners[seq][0]), (
                f"entry {seq} holds another writer's bytes than the one told it won"
            )

    # -- a manager on top -------------------------------------------------------------------

    def test_manager_commits_and_replays(self, backend: MetadataBackend) -> None:
        a = _manager(backend.open_log(), "A", checkpoint_interval=4)
        b = _manager(backend.open_log(), "B", checkpoint_interval=4)
        for i in range(10):
            (a if i % 2 else b).create_stream({"i": str(i)})
        sid = a.create_stream({}).stream_id
        assert b.open_stream(sid, "nb").epoch == 1  # B's view was stale: it re-read first
        a.refresh()
        fresh = _manager(backend.open_log(), "C")
        assert fresh.seq == a.seq == b.seq == 12
        assert _same(fresh.state, a.state) and _same(a.state, b.state)
        assert backend.open_log().read_pointer() == 12

    def test_manager_race_two_writers(self, backend: MetadataBackend) -> None:
        managers = [
            _manager(backend.open_log(), w, checkpoint_interval=16, clock=SystemClock())
            for w in "AB"
        ]
        race_creates(managers, self.manager_commits)
        total = 2 * self.manager_commits
        assert backend.entry_seqs() == list(range(1, total + 1))
        fresh = _manager(backend.open_log(), "C")
        assert fresh.seq == total
        assert sorted(s.stream_id for s in fresh.list_streams()) == list(range(total))
        for w in "AB":
            assert len(fresh.list_streams({"writer": w})) == self.manager_commits

    # -- fencing ----------------------------------------------------------------------------

    def test_fencing_a_node_taken_over_cannot_commit(self, backend: MetadataBackend) -> None:
        old = _manager(backend.open_log(), "old")
        epoch = old.register_node("n1")
        sid = old.create_stream({}).stream_id
        old.open_stream(sid, "n1")
        _upload(old, "n1/1", sid, "n1", epoch)
        # Another process takes node n1 over: a new node epoch, the stream force-opened.
        new = _manager(backend.open_log(), "new")
        assert new.register_node("n1") == epoch + 1
        new.open_stream(sid, "n2", force=True)
        with pytest.raises(FencedError):
            _upload(old, "n1/2", sid, "n1", epoch)
        with pytest.raises(FencedError):
            old.close_stream(sid, 1)
        assert [o.key for o in _manager(backend.open_log(), "r").objects_for(sid, 0)] == ["n1/1"]

    def test_fencing_the_loser_of_a_seq_writes_nothing(self, backend: MetadataBackend) -> None:
        a, b = _manager(backend.open_log(), "A"), _manager(backend.open_log(), "B")
        a.register_node("n1")
        # B's view is at 0; its entry 1 loses, it re-reads, and commits as entry 2.
        assert b.register_node("n1") == 2
        assert backend.entry_seqs() == [1, 2]
        assert b.log.read_entry(1)[0].writer == "A"

    # -- rollback ---------------------------------------------------------------------------

    def test_rollback_is_detected_by_a_client_that_saw_more(self, backend: MetadataBackend) -> None:
        m = _manager(backend.open_log(), "w")
        for _ in range(5):
            m.create_stream({})
        seen = m.seq
        assert m.refresh() is False
        backend.delete_entries([seen - 1, seen])
        with pytest.raises(CorruptionError, match="gone") as err:
            m.refresh()
        assert err.value.location == m.log.entry_key(seen)
        with pytest.raises(CorruptionError):
            m.create_stream({})

    # -- lifecycle --------------------------------------------------------------------------

    def test_lifecycle_close_is_idempotent(self, backend: MetadataBackend) -> None:
        log = backend.open_log()
        log.create_entry(1, entry_bytes(1, "w"))
        log.close()
        log.close()
        assert backend.open_log().has_entry(1)
