"""`MetadataManager`: one process's handle on the shared metadata log.

It keeps the latest `MetadataState`, replays what other writers committed, and commits new
entries with optimistic concurrency: build ops against the latest state, validate them by
applying them to it, then create entry ``seq + 1`` if absent (`MetadataLogStore.create_entry`:
a conditional PUT in the object store, an ``INSERT ... ON CONFLICT DO NOTHING`` in PostgreSQL).
A writer that loses the race reads the entries it missed and builds again, so every entry was
validated against exactly the state it follows, and the log's backend is the only coordination
service.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence

from ..clock import Clock
from ..errors import (
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
from ..validation import check_int, check_str_map, check_text
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


class MetadataManager:
    """Reads, replays and commits a metadata log: the one kept in the object store `store`
    under `prefix` (the default), or `store` itself when it is a `MetadataLogStore` (then
    `prefix` is its business and must be left alone).

    Call `load` once before anything else. Commits are serialized by a lock; `state` is an
    immutable snapshot swapped atomically, so readers never lock. `writer_id` names this
    writer in every entry (make it unique per process, e.g. the node id plus a nonce).
    """

    def __init__(
        self,
        store: ObjectStore | MetadataLogStore,
        *,
        clock: Clock,
        writer_id: str,
        prefix: str = "meta",
        checkpoint_interval: int = 64,
        commit_attempts: int = 32,
        rng: random.Random | None = None,
        instruments: MetadataInstruments | None = None,
    ) -> None:
        if not isinstance(clock, Clock):
            raise InvalidArgumentError(f"clock must be a Clock, got {clock!r}")
        check_text("writer_id", writer_id, allow_empty=False)
        check_int("checkpoint_interval", checkpoint_interval, minimum=1)
        check_int("commit_attempts", commit_attempts, minimum=1)
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
        self._commit_attempts = commit_attempts
        # Jitter after repeated lost races, so a writer whose view is always one entry stale
        # does not starve behind one committing back to back. Seeded: no ambient randomness.
        self._rng = rng if rng is not None else random.Random(writer_id)
        # Serializes commits and replays; never held by readers.
        self._lock = threading.Lock()
        #: Set once the log was found rolled back: this manager then neither reads on nor
        #: writes (a write would put a different history under the same numbers).
        self._rolled_back: CorruptionError | None = None
        self._state: MetadataState | None = None
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

    def refresh(self) -> bool:
        """Apply entries written by other writers since the last look; True if there were any."""
        with self._lock:
            return self._catch_up()

    def commit(self, build: Build) -> tuple[LogEntry, MetadataState]:
        """Commit the ops `build` makes from the latest state, as one entry; return the entry
        written and the state after it.

        `build` is called again on the newer state each time another writer got there first,
        so it must derive its ops from the state it is given. It may raise to abort: the
        error propagates (an `S3StreamError` only once a refresh found nothing newer, so a
        stale view never aborts a commit). Making it idempotent (no ops if its effect is
        already in the state, e.g. its object key is in ``state.objects``) makes a retry
        after an `UnavailableError` safe. If `build` returns no ops nothing is written, and
        the returned entry has ``ops == ()`` and the seq of the current state.

        Raises what the invariant checks raise (`FencedError`, `InvalidArgumentError`, ...)
        without writing anything; `UnavailableError` if the race was lost `commit_attempts`
        times in a row or the store is unreachable (then the entry may or may not have been
        written: `refresh` tells).
        """
        started = self._clock.monotonic()
        try:
            with self._lock:
                entry, state = self._commit_locked(build)
        except BaseException:
            self._ins.failed.observe(self._clock.monotonic() - started)
            raise
        outcome = self._ins.written if entry.ops else self._ins.noop
        outcome.observe(self._clock.monotonic() - started)
        if entry.ops and entry.seq % self._checkpoint_interval == 0:
            self._write_checkpoint(state)
        return entry, state

    def write_checkpoint(self) -> int:
        """Write a checkpoint of the current state now (unless it is empty); its seq."""
        state = self.state
        if state.seq > 0:
            self._write_checkpoint(state)
        return state.seq

    # -- conveniences built on commit() ------------------------------------------------

    def create_stream(self, tags: Mapping[str, str]) -> StreamMeta:
        """Create a stream (closed, epoch 0) with the next free id."""
        tag_dict = check_str_map("tags", tags)
        created_ms = self._clock.now_ms()
        chosen: list[int] = []

        def build(state: MetadataState) -> list[Op]:
            chosen[:] = [state.next_stream_id]
            return [CreateStream(state.next_stream_id, tag_dict, created_ms)]

        _, state = self.commit(build)
        return state.get_stream(chosen[0])

    def open_stream(self, stream_id: int, node_id: str, *, force: bool = False) -> StreamMeta:
        """Open the stream for `node_id` with the next epoch, fencing every older owner.

        Raises `StreamOwnedError` if another node has the stream open (it may hold
        acknowledged appends it has not uploaded), unless `force`; judged on the state the
        entry is committed after, so two openers cannot both pass the check.
        """
        check_text("node_id", node_id, allow_empty=False)

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
            return [OpenStream(stream_id, stream.epoch + 1, node_id)]

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

    def trim_stream(self, stream_id: int, epoch: int, start_offset: int) -> StreamMeta:
        """Move the stream's start offset to `start_offset` (forward, at most to its end)."""
        check_int("epoch", epoch)
        check_int("start_offset", start_offset)

        def build(state: MetadataState) -> list[Op]:
            stream = state.get_stream(stream_id)
            if stream.epoch == epoch and stream.start_offset == start_offset:
                return []
            return [TrimStream(stream_id, epoch, start_offset)]

        _, state = self.commit(build)
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

    def _commit_locked(self, build: Build) -> tuple[LogEntry, MetadataState]:
        if self._rolled_back is not None:
            raise self._rolled_back
        for attempt in range(self._commit_attempts):
            if attempt >= 4:
                self._clock.sleep(self._rng.uniform(0, min(0.05, 0.0005 * 2 ** (attempt - 4))))
            base = self.state
            try:
                ops = tuple(build(base))
                ts_ms = self._clock.now_ms()
                if not ops:
                    noop = LogEntry(seq=base.seq, ops=(), writer=self._writer_id, ts_ms=ts_ms)
                    return noop, base
                payload = encode_entry(
                    LogEntry(seq=base.seq + 1, ops=ops, writer=self._writer_id, ts_ms=ts_ms)
                )
                # Apply what decodes from the bytes, not the ops as built: the state then is
                # exactly what any replay of this entry will compute.
                entry = validate_entry(payload)
                state = base.apply(entry)
            except S3StreamError:
                # Judged against a stale view? Then build again on what others committed.
                if self._catch_up():
                    continue
                raise
            if self._create_entry(entry.seq, payload):
                self._state = state
                return entry, state
            self._ins.conflicts.add()
            self._catch_up()
        raise UnavailableError(
            f"metadata commit by {self._writer_id!r} lost the race for the next log entry "
            f"{self._commit_attempts} times in a row; retry later"
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
        try:
            for entry, _ in self._log.read_entries(state.seq + 1):
                try:
                    state = state.apply(entry)
                except S3StreamError as exc:
                    key = self._log.entry_key(entry.seq)
                    raise CorruptionError(
                        f"metadata log entry {key!r} breaks an invariant: {exc}", location=key
                    ) from exc
            if state is start:
                self._check_not_rolled_back(state.seq)
        finally:
            # Keep the progress made even if a later entry could not be read.
            self._state = state
            if state is not start:
                self._ins.replayed.add(state.seq - start.seq)
        return state is not start

    def _check_not_rolled_back(self, seen: int) -> None:
        """Entries are never deleted, so the newest one this client has applied must still be
        there: if it is gone, someone deleted the log's newest entries (a rollback), and going
        on would write a different history under their numbers."""
        if seen == 0:
            return
        key = self._log.entry_key(seen)
        if not self._log.has_entry(seen):
            self._rolled_back = CorruptionError(
                f"metadata log entry {key!r}, which this client has applied, is gone: the log "
                "was rolled back or damaged (entries are never deleted); stop writers and "
                "restore the log, or run `s3stream verify`",
                location=key,
            )
            raise self._rolled_back

    def _write_checkpoint(self, state: MetadataState) -> None:
        try:
            self._log.write_checkpoint(state.to_checkpoint())
            self._ins.checkpoint_written.add()
        except S3StreamError as exc:
            self._ins.checkpoint_failed.add()
            # Harmless: the next checkpoint (or a longer replay) covers for it.
            self._logger.warning("could not write metadata checkpoint %d: %s", state.seq, exc)
