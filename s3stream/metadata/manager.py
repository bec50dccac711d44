"""`MetadataManager`: one process's handle on the shared metadata log.

It keeps the latest `MetadataState`, replays what other writers committed, and commits new
entries with optimistic concurrency: build ops against the latest state, validate them by
applying them to it, then create entry ``seq + 1`` if absent (`MetadataLogStore.create_entry`:
a conditional PUT in the object store, an ``INSERT ... ON CONFLICT DO NOTHING`` in PostgreSQL).
A writer that loses the race reads the entries it missed and builds again, so every entry was
validated against exactly the state it follows, and the log's backend is the only coordination
service.

Group commit: concurrent `commit` calls of one manager queue up; one caller (the leader) takes
every queued request, runs each one's build in turn on the state the ones before it staged, and
writes ONE entry with all their ops. A build that raises fails only its own caller; each op is
still checked by the invariants on exactly the state it follows, and replay applies the entry
op by op as well. Each caller's ops go through the codec (encoded and decoded) before they are
staged, so the state the leader publishes after a win is the staged one: what any replay of
the entry's bytes computes, without applying every op a second time.

Lost races are retried until the commit's deadline (never a count), with an age-ordered
jitter: the writer that has lost most retries first, and a writer that just won while others
were committing pauses briefly before its next try, so it does not starve the writers still
catching up (docs/metadata.md, "Concurrency protocol").
"""

from __future__ import annotations

import contextlib
import enum
import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .._bounded import within_deadline
from ..clock import Clock
from ..errors import (
    ContendedError,
    CorruptionError,
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    StreamOwnedError,
    UnavailableError,
)
from ..metrics.components import MetadataInstruments
from ..metrics.logs import ContextLogger
from ..metrics.registry import MetricsRegistry
from ..objectstore.base import ObjectStore
from ..validation import check_int, check_number, check_str_map, check_text
from .base import MetadataLogStore
from .codec import encode_entry, validate_entry
from .invariants import check_state
from .log import MetadataLog
from .model import (
    CloseStream,
    CreateStream,
    DeleteStream,
    LogEntry,
    ObjectMeta,
    Op,
    OpenStream,
    RegisterNode,
    StreamMeta,
    StreamState,
    TrimStream,
)
from .state import MetadataState

__all__ = ["MetadataManager"]

_logger = logging.getLogger(__name__)

#: Builds the ops of one entry from the latest state; may be called again after a lost race.
Build = Callable[[MetadataState], Sequence[Op]]

#: Most commit requests folded into one entry (bounds an entry's size; the rest go next).
_MAX_GROUP = 256
#: Most weight (ops a request says it will build, 1 unless it says) folded into one entry; a
#: request heavier than this alone still makes an entry of its own.
_MAX_GROUP_WEIGHT = 4096
#: Most streams `create_streams` puts into one entry (two ops each with `open_for`).
MAX_CREATES_PER_ENTRY = 1024
#: How long after a lost race, or after replaying another writer's entry, this writer assumes
#: others are committing too (and so pauses courteously after a win).
_CONTENTION_MEMORY_S = 1.0
#: Weight of the newest sample in the moving averages of request times.
_EWMA = 0.2


class _Stale(enum.Enum):
    """An attempt's outcome when a build failed on a stale view (build the group again)."""

    STALE = enum.auto()


_STALE = _Stale.STALE
#: An attempt's outcome: None (nothing to write), `_STALE`, or (won, entry, state after it).
_Outcome = tuple[bool, LogEntry, bytes, MetadataState] | _Stale | None
#: A group's entry, its bytes and the state after it.
_Group = tuple[LogEntry, bytes, MetadataState]


class _CheckpointLate(Exception):
    """A checkpoint write outlasted the commit call that started it (never leaves the
    module: the commit itself succeeded)."""

    def __init__(self, seq: int) -> None:
        super().__init__(seq)


@dataclass(eq=False, slots=True)
class _Request:
    """One `commit` call waiting for its group's entry."""

    build: Build
    #: On the manager's clock: past it, the request fails instead of being tried again.
    deadline: float
    result: tuple[LogEntry, MetadataState] | None = None
    error: BaseException | None = None
    done: bool = False
    #: Ops built on the latest attempt (empty: a no-op, or `error` is set).
    ops: tuple[Op, ...] = field(default=())
    #: How many ops the build will make, about (bounds a group's size; see _MAX_GROUP_WEIGHT).
    weight: int = 1


class MetadataManager:
    """Reads, replays and commits a metadata log: the one kept in the object store `store`
    under `prefix` (the default), or `store` itself when it is a `MetadataLogStore` (then
    `prefix` is its business and must be left alone).

    Call `load` once before anything else. Concurrent commits fold into one entry per group
    (group commit), and groups are serialized by a lock; `state` is an immutable snapshot
    swapped atomically, so readers never lock. `writer_id` names this writer in every entry
    (make it unique per process, e.g. the node id plus a nonce). A commit retries lost races
    until its deadline, `commit_timeout_s`; a positive `commit_attempts` also caps them.
    """

    def __init__(
        self,
        store: ObjectStore | MetadataLogStore,
        *,
        clock: Clock,
        writer_id: str,
        prefix: str = "meta",
        checkpoint_interval: int = 64,
        commit_attempts: int = 0,
        commit_timeout_s: float = 60.0,
        rng: random.Random | None = None,
        instruments: MetadataInstruments | None = None,
    ) -> None:
        if not isinstance(clock, Clock):
            raise InvalidArgumentError(f"clock must be a Clock, got {clock!r}")
        check_text("writer_id", writer_id, allow_empty=False)
        check_int("checkpoint_interval", checkpoint_interval, minimum=1)
        check_int("commit_attempts", commit_attempts, minimum=0)
        check_number("commit_timeout_s", commit_timeout_s)
        if commit_timeout_s <= 0:
            raise InvalidArgumentError(f"commit_timeout_s must be > 0, got {commit_timeout_s!r}")
        if isinstance(store, MetadataLogStore):
            if prefix != "meta":
                raise InvalidArgumentError(
                    f"prefix {prefix!r} is given twice: a MetadataLogStore has its namespace "
                    f"({store.namespace!r}) already"
                )
            self._log: MetadataLogStore = store
        else:
            self._log = MetadataLog(store, prefix)
        self._clock = clock
        self._writer_id = writer_id
        self._logger = ContextLogger(_logger, writer_id)
        self._checkpoint_interval = checkpoint_interval
        #: 0: lost races are retried until the deadline only (the default).
        self._commit_attempts = commit_attempts
        self._commit_timeout_s = float(commit_timeout_s)
        # Jitter of retries and courtesy pauses (see `_pause`). Seeded: no ambient randomness.
        self._rng = rng if rng is not None else random.Random(writer_id)
        # Serializes commit groups and replays; never held by readers.
        self._lock = threading.Lock()
        # Group commit: requests waiting, and whether a caller is leading (taking them).
        self._queue_cond = threading.Condition(threading.Lock())
        self._queue: deque[_Request] = deque()
        self._leading = False
        # Checkpoint writes a commit left to finish in the background (`_lead`), and whether
        # `stop_checkpoints` came: a closed client's store is written no more.
        self._checkpoint_cond = threading.Condition(threading.Lock())
        self._checkpoints_running = 0
        self._checkpoints_stopped = False
        # Shared refreshes (`refresh`, under `_lock`): how many started, and the last one
        # that ended: (its number, how many had ended with it, its outcome).
        self._refreshes_started = 0
        self._last_refresh: tuple[int, int, bool | UnavailableError] | None = None
        # Contention, as seen by this writer (under `_lock`): until when to assume others
        # commit too, and moving averages of a create's and of a catch-up's duration.
        self._contended_until = float("-inf")
        self._create_s = 0.0
        self._catch_up_s = 0.0
        #: Set once the log was found rolled back: this manager then neither reads on nor
        #: writes (a write would put a different history under the same numbers).
        self._rolled_back: CorruptionError | None = None
        self._state: MetadataState | None = None
        #: The bytes of the entry at `state.seq` as this manager applied (or wrote) it; None
        #: while unknown (loaded from a checkpoint, or nothing applied). A log rolled back and
        #: then written again has an entry of that seq with other bytes: the rollback check
        #: compares them (an entry's mere existence would not tell).
        self._applied: bytes | None = None
        self._ins = (
            instruments if instruments is not None else MetadataInstruments(MetricsRegistry())
        )

    @property
    def log(self) -> MetadataLogStore:
        """Where the log's records live (the object store's `MetadataLog` by default)."""
        return self._log

    @property
    def writer_id(self) -> str:
        """The name this manager writes into its entries."""
        return self._writer_id

    @property
    def state(self) -> MetadataState:
        """The latest snapshot (immutable: safe to keep and read without locks)."""
        state = self._state
        if state is None:
            raise S3StreamError("MetadataManager.load() has not been called")
        return state

    @property
    def seq(self) -> int:
        """The last log entry applied."""
        return self.state.seq

    def load(self) -> None:
        """Read the latest checkpoint (no LIST: through the pointer), then replay the entries
        after it. Call once."""
        with self._lock:
            if self._state is not None:
                raise S3StreamError("MetadataManager.load() was already called; use refresh()")
            pointer = self._log.read_pointer()
            if pointer is None:
                state = MetadataState.empty()
            else:
                state = MetadataState.from_checkpoint(self._log.read_checkpoint(pointer))
                problems = check_state(state)
                if problems:
                    key = self._log.checkpoint_key(pointer)
                    raise CorruptionError(
                        f"checkpoint {key!r} breaks invariants: {'; '.join(problems[:3])}",
                        location=key,
                    )
            self._state = state
            self._catch_up()
            self._check_tip()

    def _check_tip(self) -> None:
        """(At load.) The replay stopped at the first entry missing; if a later one exists,
        that entry is a hole (entries are never deleted: damage, or a partial copy of the
        store), and a history read up to it would be short without a word, and a writer
        would fill the hole with an entry of its own (`MetadataLogStore.has_entry_past`: one
        round of HEADs in the object store). Later catch-ups read runs of entries, which tell
        a hole from the tip themselves."""
        assert self._state is not None
        tip = self._state.seq
        if not self._log.has_entry_past(tip):
            return
        self._catch_up()  # or writers added both meanwhile
        if self._state.seq == tip:
            key = self._log.entry_key(tip + 1)
            raise CorruptionError(
                f"metadata log entry {key!r} is missing while later entries exist: the log is "
                "damaged (entries are never deleted); stop writers and restore it, or run "
                "`s3stream verify`",
                location=key,
            )

    def refresh(self) -> bool:
        """Apply entries written by other writers since the last look; True if there were any.

        Concurrent calls share refreshes: a call that finds, once it holds the lock, that a
        refresh which started after it was called has ended takes that one's outcome (it saw
        every entry written before the call); and if one that ended while it waited failed
        with `UnavailableError`, it fails with that too, without asking the store again
        (against a store that stopped answering, N callers waited N store timeouts in turn).
        The bookkeeping is under the lock, so a caller interrupted (Ctrl-C) leaves nothing
        the others wait on."""
        started, seen = self._refreshes_started, self._last_refresh
        finished = 0 if seen is None else seen[1]
        with self._lock:
            last = self._last_refresh
            if last is not None:
                number, ended, outcome = last
                shared = number > started or (
                    ended > finished and isinstance(outcome, UnavailableError)
                )
                if shared:
                    if isinstance(outcome, BaseException):
                        raise UnavailableError(
                            f"refreshing the metadata failed while this call waited: {outcome}"
                        ) from outcome
                    return outcome
            self._refreshes_started = number = self._refreshes_started + 1
            try:
                changed = self._catch_up()
            except UnavailableError as exc:
                self._end_refresh(number, exc)
                raise
            self._end_refresh(number, changed)
            return changed

    def _end_refresh(self, number: int, outcome: bool | UnavailableError) -> None:
        """Record how refresh `number` ended (the lock is held), for the callers waiting."""
        ended = 1 if self._last_refresh is None else self._last_refresh[1] + 1
        self._last_refresh = (number, ended, outcome)

    def commit(
        self, build: Build, *, timeout_s: float | None = None
    ) -> tuple[LogEntry, MetadataState]:
        """Commit the ops `build` makes from the latest state, as one entry; return the entry
        written and the state after it.

        Concurrent calls fold into one entry (group commit, see the module docstring): then
        `build` sees the state with the ops of the calls before it in the group staged, and
        every caller of the group gets the same entry and state back. `build` is called again
        on the newer state each time another writer got there first, so it must derive its ops
        from the state it is given. It may raise to abort: the error propagates to this caller
        only (an `S3StreamError` only once a refresh found nothing newer, so a stale view never
        aborts a commit). Making it idempotent (no ops if its effect is already in the state,
        e.g. its object key is in ``state.objects``) makes a retry after an `UnavailableError`
        safe. If `build` returns no ops nothing is written for it, and the returned entry has
        ``ops == ()`` and the seq of the state returned.

        Lost races are retried (after re-reading what the winners wrote) until `timeout_s`
        (default: the manager's `commit_timeout_s`) has passed; contention is never an error
        before that. Raises what the invariant checks raise (`FencedError`,
        `InvalidArgumentError`, ...) without writing anything of this call; `UnavailableError`
        if the deadline passed or the store is unreachable (then the entry may or may not have
        been written: `refresh` tells).
        """
        if timeout_s is not None:
            check_number("timeout_s", timeout_s)
        return self._commit(build, timeout_s)

    def _commit(
        self, build: Build, timeout_s: float | None = None, weight: int = 1
    ) -> tuple[LogEntry, MetadataState]:
        """`commit`, for a build that makes about `weight` ops (groups stay bounded)."""
        started = self._clock.monotonic()
        limit = self._commit_timeout_s if timeout_s is None else float(timeout_s)
        request = _Request(build, started + limit, weight=weight)
        with self._queue_cond:
            self._queue.append(request)
        try:
            while True:
                with self._queue_cond:
                    # The leader completes every request it takes and hands over when done;
                    # this caller waits no longer than its deadline, though (the leader may
                    # wait on a store that stopped answering, up to its own deadline).
                    while not request.done and self._leading:
                        left = request.deadline - self._clock.monotonic()
                        if left <= 0:
                            raise self._late(request, "another commit of this client was under way")
                        self._queue_cond.wait(left)
                    if request.done:
                        break
                    self._leading = True
                # A group takes at most _MAX_GROUP requests, in queue order: this one may be
                # left for the next group, which this caller then leads (or waits for).
                self._lead(request)
        except BaseException:
            # Interrupted (Ctrl-C) while queued: withdraw, so that no later group writes the
            # ops of a call its caller saw fail. Taken into a group already, it is decided
            # there, like any call interrupted while its request is on the wire.
            with self._queue_cond, contextlib.suppress(ValueError):
                self._queue.remove(request)
            raise
        if request.error is not None:
            self._ins.failed.observe(self._clock.monotonic() - started)
            raise request.error
        assert request.result is not None
        entry, state = request.result
        outcome = self._ins.written if entry.ops else self._ins.noop
        outcome.observe(self._clock.monotonic() - started)
        return entry, state

    def stop_checkpoints(self, deadline: float) -> bool:
        """Start no more checkpoint writes after commits, and wait until `deadline` (on the
        manager's clock) for those under way (left to the background by a commit past its
        deadline) to end: called before the store is closed, so that nothing is written for
        a closed client (a write cut short at the interpreter's exit could leave a torn
        pointer on a store whose puts are not atomic). Whether none is left."""
        with self._checkpoint_cond:
            self._checkpoints_stopped = True
            while self._checkpoints_running:
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    return False
                self._checkpoint_cond.wait(left)
        return True

    def write_checkpoint(self) -> int:
        """Write a checkpoint of the current state now (unless it is empty); its seq."""
        state = self.state
        if state.seq > 0:
            self._write_checkpoint(state)
        return state.seq

    # -- conveniences built on commit() ------------------------------------------------

    def create_stream(
        self,
        tags: Mapping[str, str],
        *,
        open_for: str | None = None,
        wal_uid: int | None = None,
    ) -> StreamMeta:
        """Create a stream (closed, epoch 0) with the next free id; with `open_for`, open it
        for that node (epoch 1) in the same entry: one commit instead of two, and concurrent
        calls fold into one entry (group commit). `wal_uid`: as for `open_stream`."""
        return self.create_streams([tags], open_for=open_for, wal_uid=wal_uid)[0]

    def create_streams(
        self,
        tags: Sequence[Mapping[str, str]],
        *,
        open_for: str | None = None,
        wal_uid: int | None = None,
    ) -> list[StreamMeta]:
        """Create one stream per item of `tags` (its tags), with consecutive ids in that
        order, in ONE entry: all or none; with `open_for`, each is also opened for that node
        (epoch 1) in the same entry. At most `MAX_CREATES_PER_ENTRY` streams. `wal_uid`: as
        for `open_stream`."""
        if isinstance(tags, str | bytes | Mapping) or not isinstance(tags, Sequence):
            raise InvalidArgumentError(
                f"tags must be a sequence of tag mappings, one per stream, not "
                f"{type(tags).__name__}"
            )
        check_int("number of streams", len(tags), minimum=1, maximum=MAX_CREATES_PER_ENTRY)
        tag_dicts = [check_str_map(f"tags[{i}]", t) for i, t in enumerate(tags)]
        if open_for is not None:
            check_text("open_for", open_for, allow_empty=False)
        if wal_uid is not None:
            check_int("wal_uid", wal_uid)
        created_ms = self._clock.now_ms()
        first: list[int] = []

        def build(state: MetadataState) -> list[Op]:
            sid = state.next_stream_id
            first[:] = [sid]
            ops: list[Op] = []
            for i, tag_dict in enumerate(tag_dicts):
                ops.append(CreateStream(sid + i, tag_dict, created_ms))
                if open_for is not None:
                    ops.append(OpenStream(sid + i, 1, open_for, wal_uid))
            return ops

        weight = len(tag_dicts) * (1 if open_for is None else 2)
        _, state = self._commit(build, weight=weight)
        streams = state.streams
        return [streams[first[0] + i] for i in range(len(tag_dicts))]

    def open_stream(
        self, stream_id: int, node_id: str, *, force: bool = False, wal_uid: int | None = None
    ) -> StreamMeta:
        """Open the stream for `node_id` with the next epoch, fencing every older owner.

        Raises `StreamOwnedError` if another node has the stream open (it may hold
        acknowledged appends it has not uploaded), unless `force`; judged on the state the
        entry is committed after, so two openers cannot both pass the check. `wal_uid`: the
        identity of the WAL the node appends through (`WriteAheadLog.identity`), recorded as
        the node's (`NodeMeta.wal_uid`).
        """
        check_text("node_id", node_id, allow_empty=False)
        if wal_uid is not None:
            check_int("wal_uid", wal_uid)

        def build(state: MetadataState) -> list[Op]:
            stream = state.get_stream(stream_id)
            owner = stream.owner
            if (
                not force
                and stream.state is StreamState.OPEN
                and owner is not None
                and owner != node_id
            ):
                raise StreamOwnedError(
                    f"stream {stream_id} is open on node {owner!r}, which may hold "
                    "acknowledged appends it has not uploaded yet: take that node over first "
                    f"(client.take_over({owner!r}), or `s3stream take-over URL {owner}`), "
                    f"which uploads them and releases its streams, or open with force=True "
                    "to discard them",
                    stream_id=stream_id,
                    owner=owner,
                )
            return [OpenStream(stream_id, stream.epoch + 1, node_id, wal_uid)]

        _, state = self.commit(build)
        return state.get_stream(stream_id)

    def close_stream(self, stream_id: int, epoch: int) -> StreamMeta:
        """Close the stream; `FencedError` unless `epoch` is current. Closing twice is a no-op."""
        check_int("epoch", epoch)

        def build(state: MetadataState) -> list[Op]:
            stream = state.get_stream(stream_id)
            if stream.epoch == epoch and stream.state is StreamState.CLOSED:
                return []
            return [CloseStream(stream_id, epoch)]

        _, state = self.commit(build)
        return state.get_stream(stream_id)

    def trim_stream(
        self, stream_id: int, epoch: int, start_offset: int, *, timeout_s: float | None = None
    ) -> StreamMeta:
        """Move the stream's start offset to `start_offset` (forward, at most to its end);
        `timeout_s`: as for `commit`."""
        check_int("epoch", epoch)
        check_int("start_offset", start_offset)

        def build(state: MetadataState) -> list[Op]:
            stream = state.get_stream(stream_id)
            if stream.epoch == epoch and stream.start_offset >= start_offset:
                # Done already, or further (retention in another process moved the start
                # after this writer last looked): a trim never moves it back.
                return []
            return [TrimStream(stream_id, epoch, start_offset)]

        _, state = self.commit(build, timeout_s=timeout_s)
        return state.get_stream(stream_id)

    def delete_stream(self, stream_id: int, epoch: int) -> None:
        """Delete the stream; its objects become garbage for compaction."""
        check_int("epoch", epoch)

        def build(state: MetadataState) -> list[Op]:
            state.get_stream(stream_id)
            return [DeleteStream(stream_id, epoch)]

        self.commit(build)

    def register_node(self, node_id: str) -> int:
        """Claim `node_id` with the next node epoch (1 for a new node); return it."""
        check_text("node_id", node_id, allow_empty=False)

        def build(state: MetadataState) -> list[Op]:
            node = state.nodes.get(node_id)
            return [RegisterNode(node_id, 1 if node is None else node.epoch + 1)]

        _, state = self.commit(build)
        return state.nodes[node_id].epoch

    # -- queries on the latest snapshot (no I/O) ------------------------------------------

    def get_stream(self, stream_id: int) -> StreamMeta:
        """The stream; `StreamNotFoundError` if it does not exist or was deleted."""
        return self.state.get_stream(stream_id)

    def list_streams(self, tags: Mapping[str, str] | None = None) -> list[StreamMeta]:
        """Streams not deleted whose tags include all of `tags`, sorted by id."""
        return self.state.list_streams(tags)

    def objects_for(
        self, stream_id: int, start_offset: int, end_offset: int | None = None
    ) -> list[ObjectMeta]:
        """Live objects holding data of the stream overlapping ``[start, end)``, by offset."""
        return self.state.objects_for(stream_id, start_offset, end_offset)

    # -- internals -----------------------------------------------------------------------

    def _lead(self, request: _Request) -> None:
        """Commit the queued requests as one group (the leading caller's `request` among
        them), complete them, then hand the lead over (to a waiter whose request is still
        queued). The leader's deadline bounds its wait for the lock, and a checkpoint written
        after the group does not overrun it."""
        deadline = request.deadline
        batch: list[_Request] = []
        written: MetadataState | None = None
        try:
            # A refresh or a take-over may hold the lock, waiting on a store that stopped
            # answering: past its deadline, the leader's request fails alone (the others
            # stay queued, for their own leaders).
            if not self._lock.acquire(timeout=max(0.0, deadline - self._clock.monotonic())):
                with self._queue_cond:
                    request.error = self._late(
                        request,
                        "another call of this client (a refresh, or a take-over) was "
                        "reading the metadata log",
                    )
                    request.done = True
                return
            try:
                written = self._commit_group_locked(batch)
            finally:
                self._lock.release()
        except BaseException as exc:
            # The store failed (or the log was found rolled back): every request of the
            # group gets the error, its entry may or may not have been written.
            for r in batch:
                if r.result is None:
                    r.error = exc
        finally:
            with self._queue_cond:
                for r in batch:
                    r.done = True
                self._leading = False
                self._queue_cond.notify_all()
        # After handing over: the next group need not wait for the checkpoint. Nor need this
        # caller past its deadline (a slow store): the write then goes on in its thread.
        if written is not None and written.seq % self._checkpoint_interval == 0:
            state = written
            with self._checkpoint_cond:
                if self._checkpoints_stopped:
                    return
                self._checkpoints_running += 1

            def write() -> None:
                try:
                    self._write_checkpoint(state)
                finally:
                    with self._checkpoint_cond:
                        self._checkpoints_running -= 1
                        self._checkpoint_cond.notify_all()

            try:
                within_deadline(
                    write,
                    clock=self._clock,
                    deadline=deadline,
                    name=f"s3stream-checkpoint-{state.seq}",
                    timeout_error=lambda: _CheckpointLate(state.seq),
                )
            except _CheckpointLate:
                self._logger.info(
                    "metadata checkpoint %d still being written at the commit's deadline; "
                    "left to finish in the background",
                    state.seq,
                )

    def _commit_group_locked(self, batch: list[_Request]) -> MetadataState | None:
        """Take queued requests into `batch` and write one entry with the ops of every one
        that builds them, retrying lost races until each request's deadline (requests queued
        meanwhile join the group); set each request's result or error. The state written, or
        None if nothing was."""
        live: list[_Request] = []
        losses = 0
        weight = 0
        while True:
            self._pause(losses)
            with self._queue_cond:
                while self._queue and len(batch) < _MAX_GROUP:
                    heavier = weight + self._queue[0].weight
                    if batch and heavier > _MAX_GROUP_WEIGHT:
                        break  # the rest go in the next group
                    weight = heavier
                    batch.append(self._queue.popleft())
                    live.append(batch[-1])
            if self._rolled_back is not None:
                raise self._rolled_back
            now = self._clock.monotonic()
            gave_up = self._commit_attempts and losses >= self._commit_attempts
            for r in live:
                if gave_up or now >= r.deadline:
                    r.error = self._overloaded(losses)
            live = [r for r in live if r.error is None]
            if not live:
                return None
            if self._log.serializes_commits:
                outcome = self._attempt_serialized(live)
            else:
                outcome = self._attempt_optimistic(live)
            if outcome is _STALE:
                # A build failed on a stale view: all build again on what others wrote (and
                # errors judged on that view are void).
                for r in live:
                    r.error = None
                continue
            if outcome is None:
                return None  # nothing to write: each request has its no-op or its error
            won, entry, payload, state = outcome
            if won:
                self._state = state
                self._applied = payload
                for r in live:
                    if r.error is None:
                        mine = entry if r.ops else _noop(entry)
                        r.result = (mine, state)
                if losses:
                    self._contended_until = self._clock.monotonic() + _CONTENTION_MEMORY_S
                return state
            # Lost: errors of builds judged on the staged state are void (those ops are not
            # in the log); everyone builds again on the entries the winner wrote.
            for r in live:
                r.error = None
            losses += 1
            self._ins.conflicts.add()
            self._contended_until = self._clock.monotonic() + _CONTENTION_MEMORY_S
            caught_at = self._clock.monotonic()
            self._catch_up()
            self._catch_up_s += _EWMA * (self._clock.monotonic() - caught_at - self._catch_up_s)

    def _attempt_optimistic(self, live: list[_Request]) -> _Outcome:
        """Build the group's entry on the latest state known and create it if absent."""
        made = self._group_entry(live, self.state, fresh=False)
        if made is None or made is _STALE:
            return made
        entry, payload, state = made
        created_at = self._clock.monotonic()
        won = self._create_entry(entry.seq, payload)
        self._create_s += _EWMA * (self._clock.monotonic() - created_at - self._create_s)
        return won, entry, payload, state

    def _attempt_serialized(self, live: list[_Request]) -> _Outcome:
        """Build the group's entry inside the log's commit transaction, which holds the log's
        commit lock and hands over the entries this writer has not seen: the view is the
        latest, so the create wins unless a writer that does not lock got there first."""
        made: list[_Group | None] = []

        def compose(entries: list[tuple[LogEntry, bytes]]) -> tuple[int, bytes] | None:
            made.clear()
            self._apply_entries(entries)
            group = self._group_entry(live, self.state, fresh=True)
            assert group is not _STALE  # a fresh view is never stale
            made.append(group)
            return None if made[0] is None else (made[0][0].seq, made[0][1])

        left = min(r.deadline for r in live) - self._clock.monotonic()
        try:
            won = self._log.commit_serialized(self.state.seq, compose, timeout_s=max(left, 0.001))
        except ContendedError:
            if made:
                raise
            # The lock wait ran out (another writer held the lock beyond lock_timeout):
            # nothing was written; try again, on the latest state, until the deadline.
            return _STALE
        except UnavailableError as exc:
            if not made or made[0] is None:
                raise
            # The commit may have landed although the call failed: look before reporting.
            entry, payload, _ = made[0]
            try:
                _, data = self._log.read_entry(entry.seq)
            except ObjectNotFoundError:
                raise exc from None
            won = data == payload
        if not made or made[0] is None:
            return None
        entry, payload, state = made[0]
        return won, entry, payload, state

    def _group_entry(
        self, live: list[_Request], base: MetadataState, *, fresh: bool
    ) -> _Group | _Stale | None:
        """The group's entry after `base`, its bytes and the state after it; None if no
        request has ops (each then has its no-op result or its error); `_STALE` if a build
        failed on a view a catch-up found stale (only unless `fresh`)."""
        # One timestamp for the staging and the entry: an op that reads it (compaction's
        # deletion mark) stages exactly what replaying the entry computes.
        ts_ms = self._clock.now_ms()
        staged = self._build_group(live, base, ts_ms, fresh=fresh)
        if staged is None:
            return _STALE
        ops = tuple(op for r in live for op in r.ops)
        if not ops:
            noop = LogEntry(seq=base.seq, ops=(), writer=self._writer_id, ts_ms=ts_ms)
            for r in live:
                if r.error is None:
                    r.result = (noop, base)
            return None
        entry = LogEntry(seq=base.seq + 1, ops=ops, writer=self._writer_id, ts_ms=ts_ms)
        payload = encode_entry(entry)
        # The state after the entry is the staged one at the entry's seq, not `base` with the
        # entry's bytes decoded and applied again: every op staged is what decoded from its
        # request's own encoding (`_build_group`), the ops in the entry's order, each checked
        # on the state staged before it, at the entry's timestamp; so this is exactly what
        # `apply` computes from the bytes, which every replay does. (Applying an entry of no
        # ops only moves the seq on.)
        after = staged.apply(
            LogEntry(seq=base.seq + 1, ops=(), writer=self._writer_id, ts_ms=ts_ms)
        )
        return entry, payload, after

    def _build_group(
        self, live: list[_Request], base: MetadataState, ts_ms: int, *, fresh: bool
    ) -> MetadataState | None:
        """Run each request's build on `base` with the ops of those before it staged at
        `ts_ms`, setting its ops (or its error: that request alone drops out). None if a build
        failed on a view that a catch-up then found stale (the caller builds the group again);
        with `fresh` (the view is known to be the latest) a failure is final at once."""
        staged = base
        for r in live:
            r.ops, r.error = (), None
            try:
                ops = tuple(r.build(staged))
                if ops:
                    # Through the codec first, as the entry will be: a malformed op fails
                    # its own request only, and what is staged is what replay will apply.
                    own = LogEntry(seq=base.seq + 1, ops=ops, writer=self._writer_id, ts_ms=ts_ms)
                    ops = validate_entry(encode_entry(own)).ops
                    staged = staged.stage(ops, ts_ms)
            except S3StreamError as exc:
                # Judged against a stale view? Then build all again on what others committed.
                if not fresh and self._catch_up():
                    return None
                r.error = exc
                continue
            except Exception as exc:  # a bug in one caller's build fails that caller only
                r.error = exc
                continue
            r.ops = ops
        return staged

    def _pause(self, losses: int) -> None:
        """Wait before an attempt while others are committing, jittered so writers take turns.

        The wait is age-ordered: none when no contention was seen lately; before a first
        attempt (a writer that may just have won, whose view is fresh) up to twice the time a
        loser needs to catch up and try again; after `losses` lost races, that divided by
        `losses`, so the writer that has lost most tries first. Requests queued meanwhile
        fold into this group.
        """
        if self._log.serializes_commits or self._clock.monotonic() >= self._contended_until:
            return  # a serializing log queues committers fairly itself
        # A loser's handicap: reading what it missed, then its next create starts. Floor of
        # a tenth of a create: the create's own latency spreads the arrivals of the others.
        turn = max(self._catch_up_s, self._create_s / 10)
        bound = 2 * turn if losses == 0 else turn / losses
        if bound > 0:
            self._clock.sleep(self._rng.uniform(0, bound))

    def _late(self, request: _Request, why: str) -> UnavailableError:
        """The error of `request`, whose deadline passed while `why` (the queue lock is
        held): still queued, it is withdrawn (nothing of it is written); taken into another
        caller's group, it may yet be."""
        if request in self._queue:
            self._queue.remove(request)
            fate = "it was withdrawn, nothing written"
        else:
            fate = "it was in a group still being written, and may or may not land"
        return UnavailableError(
            f"metadata commit by {self._writer_id!r} did not land within its deadline: {why} "
            f"all that time (is the metadata store answering?); {fate}"
        )

    def _overloaded(self, losses: int) -> UnavailableError:
        if self._commit_attempts and losses >= self._commit_attempts:
            why = f"lost the race for the next log entry {losses} times in a row"
        elif not losses and self._log.serializes_commits:
            why = (
                f"did not land within its deadline ({self._commit_timeout_s:g} s unless the "
                "call gave one): waiting for the log's commit lock (other writers held it) or "
                "for the metadata store took all that time"
            )
        else:
            why = (
                f"did not land within its deadline ({self._commit_timeout_s:g} s unless the "
                f"call gave one): lost the race for the next log entry {losses} times to "
                "other writers"
            )
        return UnavailableError(
            f"metadata commit by {self._writer_id!r} {why}; the log is overloaded (commit "
            "less often: larger uploads, or a namespace per group of writers; or keep the log "
            "in PostgreSQL, docs/scaling.md); retry later"
        )

    def _create_entry(self, seq: int, payload: bytes) -> bool:
        try:
            return self._log.create_entry(seq, payload)
        except UnavailableError as exc:
            # The create may have landed although the call failed: look before reporting.
            try:
                _, data = self._log.read_entry(seq)
            except ObjectNotFoundError:
                raise exc from None
            return data == payload

    def _catch_up(self) -> bool:
        """Apply entries after the current state until one is missing; True if any were."""
        if self._rolled_back is not None:
            raise self._rolled_back
        state = start = self.state
        applied = self._applied
        try:
            # The entry applied last must still be there, with the same bytes (the rollback
            # check); then the entries after it. (Read apart: the log reads its first entries
            # one by one before it reads ahead, a budget the known entry must not take.)
            if state.seq > 0:
                try:
                    found: tuple[LogEntry, bytes] | None = self._log.read_entry(state.seq)
                except ObjectNotFoundError:
                    found = None
                self._check_same_entry(state.seq, found)
                applied = self._applied
            for entry, raw in self._log.read_entries(state.seq + 1):
                state = self._apply_replayed(state, entry)
                applied = raw
        finally:
            # Keep the progress made even if a later entry could not be read.
            self._state = state
            self._applied = applied
            if state is not start:
                self._ins.replayed.add(state.seq - start.seq)
        return state is not start

    def _apply_entries(self, entries: list[tuple[LogEntry, bytes]]) -> None:
        """Apply `entries`, which a serializing log read from this state's seq on (that entry
        first, unless the state is empty), skipping those already applied."""
        start = self.state
        if start.seq > 0:
            self._check_same_entry(start.seq, entries[0] if entries else None)
        fresh = [entry for entry, _ in entries if entry.seq > start.seq]
        if not fresh:
            return
        applied = entries[-1][1]
        raws = {entry.seq: raw for entry, raw in entries}
        try:
            # All in one go: with many writers a commit catches up on an entry of each other
            # writer, and the states between them would be built for nothing.
            state = start.apply_run(fresh)
        except Exception:
            # One breaks an invariant (or trips a bug): apply them one by one, to name it in
            # the error and keep the state after the entries before it, as a catch-up does.
            state = start
            try:
                for entry in fresh:
                    state = self._apply_replayed(state, entry)
            except BaseException:
                self._state = state
                if state is not start:
                    self._applied = raws[state.seq]
                    self._ins.replayed.add(state.seq - start.seq)
                raise
        if any(entry.writer != self._writer_id for entry in fresh):
            # Another writer commits: pause courteously after wins for a while.
            self._contended_until = self._clock.monotonic() + _CONTENTION_MEMORY_S
        self._state = state
        self._applied = applied
        self._ins.replayed.add(state.seq - start.seq)

    def _apply_replayed(self, state: MetadataState, entry: LogEntry) -> MetadataState:
        """`state` after `entry`, which another writer (or an earlier run) committed."""
        try:
            after = state.apply(entry)
        except S3StreamError as exc:
            key = self._log.entry_key(entry.seq)
            raise CorruptionError(
                f"metadata log entry {key!r} breaks an invariant: {exc}", location=key
            ) from exc
        if entry.writer != self._writer_id:
            # Another writer commits: pause courteously after wins for a while.
            self._contended_until = self._clock.monotonic() + _CONTENTION_MEMORY_S
        return after

    def _check_same_entry(self, seen: int, found: tuple[LogEntry, bytes] | None) -> None:
        """Entries are never deleted nor rewritten, so the newest one this client has applied
        (`seen`) must still be there, with the bytes it applied: if it is gone, someone
        deleted the log's newest entries (a rollback); if its bytes differ, the log was rolled
        back and written again since. Going on would mix two histories under one set of
        numbers. `found` is what the log holds at `seen` now (None: nothing)."""
        if found is None or found[0].seq != seen:
            why = "is gone"
        elif self._applied is not None and found[1] != self._applied:
            why = "holds other bytes than this client applied"
        else:
            if self._applied is None:
                self._applied = found[1]
            return
        self._rolled_back = self._rollback_error(seen, why)
        raise self._rolled_back

    def _rollback_error(self, seen: int, why: str = "is gone") -> CorruptionError:
        key = self._log.entry_key(seen)
        return CorruptionError(
            f"metadata log entry {key!r}, which this client has applied, {why}: the log "
            "was rolled back or damaged (entries are never deleted nor rewritten); stop "
            "writers and restore the log, or run `s3stream verify`",
            location=key,
        )

    def _write_checkpoint(self, state: MetadataState) -> None:
        try:
            self._log.write_checkpoint(state.to_checkpoint())
            self._ins.checkpoint_written.add()
        except S3StreamError as exc:
            self._ins.checkpoint_failed.add()
            # Harmless: the next checkpoint (or a longer replay) covers for it.
            self._logger.warning("could not write metadata checkpoint %d: %s", state.seq, exc)


def _noop(entry: LogEntry) -> LogEntry:
    """What a request that built no ops gets back from a group that wrote `entry`."""
    return LogEntry(seq=entry.seq, ops=(), writer=entry.writer, ts_ms=entry.ts_ms)
