"""`MetadataLogStore`: where the metadata log's records live, as the manager needs them.

The log is the same everywhere (entries ``1, 2, ...`` in the codec's bytes, checkpoints, a
pointer to the latest checkpoint); only where those bytes are kept varies. `MetadataManager`
builds, validates and replays entries, and asks its store for exactly this:

- read entry ``seq`` (or learn it does not exist yet);
- create entry ``seq`` **if absent**, atomically: of any number of writers creating the same
  seq, in any processes on any machines, exactly one wins. This one primitive is the whole of
  the fencing (docs/metadata.md, "Concurrency protocol"), so an implementation must provide it
  from its backend (a conditional create, a primary key), never from a lock in this process;
- whether an entry it has applied still exists (the rollback check), and whether one exists
  past the tip it loaded (a hole: damage);
- read and write checkpoints and the pointer to the latest one;
- list the seqs present, for audits only.

Implementations: `MetadataLog` (``log.py``: keys in the object store, the default) and
`PostgresMetadataLog` (``postgres.py``: rows in PostgreSQL). ``registry.py`` picks one by URL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from ..errors import ObjectNotFoundError
from .model import Checkpoint, LogEntry

__all__ = ["Compose", "ExternalMetadataLog", "MetadataLogStore", "tip_probes"]

#: `MetadataLogStore.commit_serialized`'s callback: given the entries from seq `after` on (in
#: order; entry `after` itself first unless `after` is 0), the seq and payload of the entry to
#: create, or None to create nothing.
Compose = Callable[[list[tuple[LogEntry, bytes]]], tuple[int, bytes] | None]


def tip_probes(seq: int) -> list[int]:
    """The entries `MetadataLogStore.has_entry_past` asks for by default, the nearest first."""
    return [seq + 1 + (1 << j) for j in range(17)]


class MetadataLogStore(ABC):
    """The records of one metadata log (one namespace); see the module docstring.

    Records are named for messages and `CorruptionError.location` by `entry_key`,
    `checkpoint_key` and `pointer_key`. Not-yet-written records raise `ObjectNotFoundError`
    (the name is historical: the first store was an object store). Backend failures raise
    `UnavailableError` (retryable; a create may or may not have landed, which the manager
    settles by reading the entry back). Thread-safe.
    """

    @abstractmethod
    def describe(self) -> str:
        """Where the log lives, for messages (never a password)."""

    @property
    @abstractmethod
    def namespace(self) -> str:
        """The name of this log among the logs its backend holds (an object store's key
        prefix, a namespace column)."""

    @property
    def prefix(self) -> str:
        """The metadata prefix, in the object store, of the data this log describes: where the
        object-store log keeps its records, and where any log's companions in the store live
        (the orphan sweeper's record, the binding marker). The namespace by default."""
        return self.namespace

    @abstractmethod
    def entry_key(self, seq: int) -> str:
        """Name of log entry `seq` (a key, a table row), for messages."""

    @abstractmethod
    def checkpoint_key(self, seq: int) -> str:
        """Name of the checkpoint taken after entry `seq`, for messages."""

    @property
    @abstractmethod
    def pointer_key(self) -> str:
        """Name of the pointer to the latest checkpoint, for messages."""

    @abstractmethod
    def read_entry(self, seq: int) -> tuple[LogEntry, bytes]:
        """Entry `seq` and its raw bytes; `ObjectNotFoundError` if not written (yet);
        `CorruptionError` (naming `entry_key(seq)`) if its bytes are bad or hold another seq."""

    def read_entries(self, first: int) -> Iterator[tuple[LogEntry, bytes]]:
        """Entries `first`, `first` + 1, ... up to the first one missing, in order.

        Lazily: a consumer that stops early, or meets a `CorruptionError` at entry N, has
        entries before N. The default reads them one by one; a backend that can read a run of
        them in one request overrides this (replaying after a lost race then costs one round
        trip instead of one per entry).
        """
        seq = first
        while True:
            try:
                yield self.read_entry(seq)
            except ObjectNotFoundError:
                return
            seq += 1

    @abstractmethod
    def create_entry(self, seq: int, payload: bytes) -> bool:
        """Write entry `seq` unless it exists; True if this call created it. Atomic across
        processes and machines (see the module docstring). Calls `check_writable` first."""

    @property
    def serializes_commits(self) -> bool:
        """Whether `commit_serialized` is available: committers of this log then queue for a
        lock of the backend (fair, first come first served) instead of racing."""
        return False

    def commit_serialized(
        self, after: int, compose: Compose, *, timeout_s: float | None = None
    ) -> bool:
        """In one backend transaction holding the log's commit lock: read the entries from
        seq `after` on, call `compose` with them, and create the entry it returns if absent
        (the same conditional create as `create_entry`, which alone fences writers: the lock
        only orders committers, so none wastes an attempt); True if this call created it.
        `compose` must not call this log. Only where `serializes_commits`; backend failures
        raise `UnavailableError` (the entry may or may not have been created). The wait for
        the lock ends after `timeout_s` (the rest of the caller's deadline) with
        `ContendedError`, nothing written."""
        raise NotImplementedError(f"{type(self).__name__} does not serialize commits")

    @abstractmethod
    def has_entry(self, seq: int) -> bool:
        """Whether entry `seq` exists (entries are never deleted: the rollback check)."""

    def has_entry_past(self, seq: int) -> bool:
        """Whether an entry after ``seq + 1`` exists: the load's check that entry
        ``seq + 1``, found missing, is the log's tip and not a hole (damage, or a partial
        copy of the store), which a writer would fill with an entry of its own. This default
        asks `has_entry` at ``seq + 1 + 2**j`` for j = 0..16, the nearest first: a hole is
        found whenever the log goes on past it at least as far as the hole is long (a power
        of two then lies in that stretch). A backend that can see every later entry at once
        says so exactly."""
        return any(self.has_entry(p) for p in tip_probes(seq))

    @abstractmethod
    def check_writable(self) -> None:
        """Raise unless this log can be written with fencing intact (an `InvalidArgumentError`
        saying why); prepares what the first write needs (tables, say). A writing client's
        first commit, at open, calls this; readers never do."""

    @abstractmethod
    def read_pointer(self) -> int | None:
        """Seq of the latest checkpoint the pointer names, or None if there is no pointer."""

    @abstractmethod
    def read_checkpoint(self, seq: int) -> Checkpoint:
        """The checkpoint after entry `seq`; `CorruptionError` if it is missing or bad."""

    @abstractmethod
    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Store `checkpoint`, then point the pointer at it (never the pointer first, so it
        never names a checkpoint that is not there)."""

    @abstractmethod
    def listed_seqs(self, *, checkpoints: bool = False) -> set[int]:
        """Seqs of the entries (or checkpoints) present: for audits only (it lists)."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what the log holds (connections). Idempotent. The object-store log holds
        nothing: its store belongs to whoever opened it."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class ExternalMetadataLog(MetadataLogStore):
    """A log kept outside the object store that holds its data (a database), which must
    therefore be bound to exactly one store, and a store to exactly one such log: two logs
    over one store would restart node epochs and reuse each other's data keys.
    `s3stream.metadata.binding` does the binding with these records of the log's side."""

    @abstractmethod
    def namespace_id(self, *, create: bool) -> str | None:
        """A random id the log took when its namespace was first written (created now if
        `create`; None if it does not exist and not `create`)."""

    @abstractmethod
    def bound_store(self) -> tuple[str, str] | None:
        """``(store_id, description)`` of the object store the log is bound to, or None."""

    @abstractmethod
    def bind_store(self, store_id: str, description: str) -> tuple[str, str]:
        """Bind the log to the store `store_id` unless it is bound already (atomically: the
        first binder wins); the binding now in force, as `bound_store`."""
