"""`PostgresMetadataLog`: the metadata log as rows of PostgreSQL tables.

The same entries, checkpoints and pointer as the object-store log (`MetadataLog`), in the same
bytes (payloads are the codec's frames), under the same invariants, replayed by the same
`MetadataManager`; only where the bytes live differs. Tables and their version:
``postgres_schema.py``; connections, deadlines and errors: ``postgres_session.py``; the URL:
``postgres_url.py``.

Fencing is one statement, a transaction of its own::

    INSERT INTO log_entries (namespace, seq, payload) VALUES (...) ON CONFLICT DO NOTHING

on the primary key ``(namespace, seq)``: of concurrent inserts of one seq, in any sessions,
exactly one inserts a row and the others insert nothing (they wait for the winner's commit,
then see its row), which is all the manager's optimistic protocol needs.

Committers are serialized by default (`commit_serialized`), so that they queue instead of
racing: one transaction takes the namespace's row lock (``SELECT ... FOR UPDATE`` on its
``namespaces`` row; PostgreSQL grants a row lock to waiters in arrival order), reads the
entries the committer has not seen, lets it build its entry on them, inserts it with the same
``INSERT ... ON CONFLICT DO NOTHING`` and commits, which releases the lock. The insert still
fences writers on its own (a writer that does not take the lock just loses the race), so the
lock is for fairness and throughput only: no attempt is wasted. ``serialize_commits=False``
keeps the optimistic protocol. No lock is taken in this process.

The log's serial rate is 1 / (time the lock is held), so a serialized commit is two round
trips, each one simple-query message of several statements (parameters bound on the client):
``BEGIN; SELECT ... FOR UPDATE; SELECT`` the missed entries, then, after the build,
``INSERT ...; COMMIT``. The lock is held for the build, one round trip and the commit's WAL
flush (``synchronous_commit`` is the server's, except that a server set to ``off`` is
overridden with ``on`` for s3stream's sessions: a commit acknowledged survives a crash of
PostgreSQL). `commit_times` says where the time went, as the client saw it.

Writes use a checkpoint write's own connection, so a large checkpoint never holds up commits.
psycopg (3.3 or later) is imported here only: ``pip install 's3stream[postgres]'``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql
except ImportError as exc:  # pragma: no cover - only without the postgres extra
    raise ImportError(
        "the PostgreSQL metadata store needs psycopg: pip install 's3stream[postgres]'"
    ) from exc

from ..clock import Clock, SystemClock
from ..errors import (
    ContendedError,
    CorruptionError,
    InvalidArgumentError,
    ObjectNotFoundError,
    UnavailableError,
)
from ..settings import ClientSettings
from .base import Compose, ExternalMetadataLog
from .codec import decode_checkpoint, decode_entry, encode_checkpoint
from .model import Checkpoint, LogEntry
from .postgres_schema import check_version, create_tables, table
from .postgres_session import Connection, PostgresSession
from .postgres_url import PostgresTarget, parse_postgres_url

__all__ = ["CommitTimes", "PostgresMetadataLog", "from_url"]

if tuple(int(p) for p in psycopg.__version__.split(".")[:2]) < (3, 3):  # pragma: no cover
    raise ImportError(
        f"the PostgreSQL metadata store needs psycopg >= 3.3 (per-call deadlines), found "
        f"{psycopg.__version__}: pip install 's3stream[postgres]'"
    )

#: Entries read per query when catching up.
_READ_BATCH = 256
_MISSING_TABLES = (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName)


@dataclasses.dataclass
class CommitTimes:
    """Where this log's serialized commits spent their time, seen from the client: totals
    since it was opened (`PostgresMetadataLog.commit_times`; bench/metadata_bench.py prints
    them per commit). The lock is held from its grant on the server until the COMMIT there:
    `compose_s` and `write_s`, plus the trip of the lock's answer to the client."""

    #: Serialized commits finished (won, lost or with nothing to write).
    commits: int = 0
    #: BEGIN, the lock and the read of the missed entries: the wait in the lock's queue too.
    lock_s: float = 0.0
    #: The caller's build on the missed entries (`compose`), the lock held.
    compose_s: float = 0.0
    #: The INSERT and the COMMIT, one round trip (the server's WAL flush included).
    write_s: float = 0.0
    #: Missed entries handed to `compose`.
    entries: int = 0

    def add(self, started: float, granted: float, built: float, done: float, n: int) -> None:
        self.commits += 1
        self.lock_s += granted - started
        self.compose_s += built - granted
        self.write_s += done - built
        self.entries += n


class PostgresMetadataLog(ExternalMetadataLog):
    """The log of one namespace in a PostgreSQL database (see the module docstring).

    `url` is libpq's with s3stream's parameters (``namespace``, ``schema``,
    ``statement_timeout``: ``postgres_url.py``); `namespace` and `timeout_ms` are the defaults
    the URL may override, and `namespace` is also the `prefix` of the data in the object store
    (the client's metadata prefix, whatever the URL names the log). Nothing is connected or
    created until first used; tables are created by the first write (`check_writable`), never
    by a reader, which sees a database without them as an empty log. `clock` times the steps
    of serialized commits (`commit_times`).
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "meta",
        timeout_ms: int = 30_000,
        serialize_commits: bool = True,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(serialize_commits, bool):
            raise InvalidArgumentError(
                f"serialize_commits must be a bool, got {serialize_commits!r}"
            )
        self._serialize = serialize_commits
        #: Set once the namespace's row (which commits lock) is known to exist.
        self._ns_row = False
        self._target = parse_postgres_url(url, namespace=namespace, timeout_ms=timeout_ms)
        self._prefix = namespace
        self._main = PostgresSession(self._target)
        self._side = PostgresSession(self._target)
        self._writable = False
        self._version_checked = False
        self._times = CommitTimes()
        #: Times the steps of serialized commits (`commit_times`).
        self._clock = clock if clock is not None else SystemClock()
        s = self._target.schema
        entries, checkpoints = table(s, "log_entries"), table(s, "checkpoints")
        pointers, namespaces = table(s, "checkpoint_pointers"), table(s, "namespaces")
        q = sql.SQL
        self._q_entry = q("SELECT payload FROM {} WHERE namespace = %s AND seq = %s").format(
            entries
        )
        self._q_entries = q(
            "SELECT seq, payload FROM {} WHERE namespace = %s AND seq >= %s ORDER BY seq LIMIT %s"
        ).format(entries)
        self._q_create = q(
            "INSERT INTO {} (namespace, seq, payload) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
        ).format(entries)
        self._q_has = q("SELECT 1 FROM {} WHERE namespace = %s AND seq = %s").format(entries)
        self._q_has_past = q("SELECT 1 FROM {} WHERE namespace = %s AND seq > %s LIMIT 1").format(
            entries
        )
        # A serialized commit's two messages, parameters bound on the client (psycopg's
        # ClientCursor) so that each goes as one simple query of several statements. The lock
        # and the read are two statements, not one: under READ COMMITTED a statement reads the
        # snapshot taken when it began, i.e. before its wait for the lock, which would miss
        # the entry the previous holder committed; the read after the lock takes a snapshot
        # that has it.
        # (Rendered once: names are quoted the same on any connection.)
        # (After "BEGIN; SET LOCAL lock_timeout = <ms>; ", the wait for the lock bounded by
        # what is left of the commit's deadline.)
        self._q_lock_and_read = (
            q(
                "SELECT 1 FROM {} WHERE namespace = %s FOR UPDATE; "
                "SELECT seq, payload FROM {} WHERE namespace = %s AND seq >= %s ORDER BY seq"
            )
            .format(namespaces, entries)
            .as_string()
        )
        self._q_create_and_commit = (
            q(
                "INSERT INTO {} (namespace, seq, payload) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING; COMMIT"
            )
            .format(entries)
            .as_string()
        )
        self._q_seqs = q("SELECT seq FROM {} WHERE namespace = %s")
        self._t_entries, self._t_checkpoints = entries, checkpoints
        self._q_pointer = q("SELECT seq FROM {} WHERE namespace = %s").format(pointers)
        self._q_checkpoint = q("SELECT payload FROM {} WHERE namespace = %s AND seq = %s").format(
            checkpoints
        )
        self._q_put_checkpoint = q(
            "INSERT INTO {} (namespace, seq, payload) VALUES (%s, %s, %s) "
            "ON CONFLICT (namespace, seq) DO UPDATE SET payload = EXCLUDED.payload"
        ).format(checkpoints)
        # The pointer only moves forward: a slow writer's late checkpoint cannot move it back.
        self._q_put_pointer = q(
            "INSERT INTO {0} (namespace, seq) VALUES (%s, %s) ON CONFLICT (namespace) "
            "DO UPDATE SET seq = GREATEST({0}.seq, EXCLUDED.seq)"
        ).format(pointers)
        self._q_ns_create = q(
            "INSERT INTO {} (namespace, namespace_id) VALUES (%s, %s) ON CONFLICT DO NOTHING"
        ).format(namespaces)
        self._q_ns = q(
            "SELECT namespace_id, store_id, object_store FROM {} WHERE namespace = %s"
        ).format(namespaces)
        self._q_bind = q(
            "UPDATE {} SET store_id = %s, object_store = %s "
            "WHERE namespace = %s AND store_id IS NULL"
        ).format(namespaces)

    # -- names -------------------------------------------------------------------------------

    @property
    def target(self) -> PostgresTarget:
        """Where the log connects, and its deadlines."""
        return self._target

    @property
    def namespace(self) -> str:
        return self._target.namespace

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding the tables."""
        return self._target.schema

    def describe(self) -> str:
        t = self._target
        return f"{t.display} (schema {t.schema}, namespace {t.namespace!r})"

    def entry_key(self, seq: int) -> str:
        return f"{self._target.schema}.log_entries/{self._target.namespace}/{seq:020d}"

    def checkpoint_key(self, seq: int) -> str:
        return f"{self._target.schema}.checkpoints/{self._target.namespace}/{seq:020d}"

    @property
    def pointer_key(self) -> str:
        return f"{self._target.schema}.checkpoint_pointers/{self._target.namespace}"

    # -- entries -----------------------------------------------------------------------------

    def read_entry(self, seq: int) -> tuple[LogEntry, bytes]:
        rows = self._read(self._q_entry, (self.namespace, seq))
        if not rows:
            raise ObjectNotFoundError(f"no metadata log entry {self.entry_key(seq)!r}")
        return self._decode_entry(seq, bytes(rows[0][0]))

    def read_entries(self, first: int) -> Iterator[tuple[LogEntry, bytes]]:
        """A run of entries per query (`_READ_BATCH`), up to the first one missing."""
        seq = first
        while True:
            rows = self._read(self._q_entries, (self.namespace, seq, _READ_BATCH))
            for row_seq, payload in rows:
                if row_seq != seq:
                    raise self._hole(seq, row_seq)
                yield self._decode_entry(seq, bytes(payload))
                seq += 1
            if len(rows) < _READ_BATCH:
                return

    def create_entry(self, seq: int, payload: bytes) -> bool:
        self.check_writable()

        tries = 0

        def insert(conn: Connection) -> bool:
            nonlocal tries
            tries += 1
            if conn.execute(self._q_create, (self.namespace, seq, payload)).rowcount == 1:
                return True
            if tries == 1:
                return False
            # The first try died with a connection the server had ended while idle, and may
            # have landed: the entry is ours if it holds our bytes (a writer's entries carry
            # its identity and epoch, so a competitor's never do), as for an object store's
            # ambiguous create.
            row = conn.execute(self._q_entry, (self.namespace, seq)).fetchone()
            return row is not None and bytes(row[0]) == payload

        # Rerun on a new connection once (not an error while the server answers), as reads and
        # serialized commits are.
        return self._main.run(insert, idempotent=True)

    @property
    def serializes_commits(self) -> bool:
        return self._serialize

    @property
    def commit_times(self) -> CommitTimes:
        """Totals of where serialized commits spent their time (a copy)."""
        return dataclasses.replace(self._times)

    def commit_serialized(
        self, after: int, compose: Compose, *, timeout_s: float | None = None
    ) -> bool:
        if not self._serialize:
            raise NotImplementedError("this log was opened with serialize_commits=False")
        self.check_writable()
        if not self._ns_row:
            # The row every committer locks: the namespace's, made at its first write.
            self.namespace_id(create=True)
            self._ns_row = True

        # The session's lock_timeout, or less: what is left of the commit's deadline.
        lock_ms = self._target.lock_timeout_ms
        if timeout_s is not None and timeout_s * 1000 < lock_ms:  # (False for NaN)
            lock_ms = max(1, int(timeout_s * 1000))
        begin = f"BEGIN; SET LOCAL lock_timeout = {lock_ms}; "
        # Until round trip 2 is sent, the commit has written nothing: a connection found dead
        # (the server restarted, or dropped it while idle) is replaced and the commit rerun.
        writing = False

        def commit(conn: Connection) -> bool:
            nonlocal writing
            ns, first = self.namespace, max(after, 1)
            cur = psycopg.ClientCursor(conn)
            started = self._clock.monotonic()
            # Round trip 1: BEGIN, the lock, and the entries missed, in one simple-query
            # message (the server runs its statements in turn, each on a snapshot of its own,
            # so the read sees everything committed before the lock was granted).
            cur.execute(begin + self._q_lock_and_read, (ns, ns, first))
            cur.nextset()
            cur.nextset()
            if not cur.fetchall():
                raise InvalidArgumentError(  # pragma: no cover - rows are never deleted
                    f"namespace {ns!r} has no row to lock"
                )
            cur.nextset()
            entries: list[tuple[LogEntry, bytes]] = []
            for row_seq, payload in cur.fetchall():
                if row_seq != first + len(entries):
                    raise self._hole(first + len(entries), row_seq)
                entries.append(self._decode_entry(row_seq, bytes(payload)))
            granted = self._clock.monotonic()
            made = compose(entries)
            built = self._clock.monotonic()
            # Round trip 2: the INSERT and the COMMIT (which releases the lock), one message.
            writing = True
            created = False
            if made is None:
                cur.execute("COMMIT")
            else:
                cur.execute(self._q_create_and_commit, (ns, made[0], made[1]))
                created = cur.rowcount == 1
                cur.nextset()
            if cur.statusmessage != "COMMIT":  # pragma: no cover - an error raised before
                raise UnavailableError(f"the commit ended with {cur.statusmessage!r}")
            self._times.add(started, granted, built, self._clock.monotonic(), len(entries))
            return created

        try:
            return self._main.run(commit, idempotent=lambda: not writing)
        except ContendedError as exc:
            if lock_ms == self._target.lock_timeout_ms:
                raise
            # The wait was this commit's own (what was left of its deadline), not the
            # session's lock_timeout the mapped message names.
            raise ContendedError(
                f"{self.describe()}: another writer held the metadata log's commit lock for "
                f"longer than this commit could wait ({lock_ms} ms, what was left of its "
                "deadline)"
            ) from exc

    def has_entry(self, seq: int) -> bool:
        return bool(self._read(self._q_has, (self.namespace, seq)))

    def has_entry_past(self, seq: int) -> bool:
        return bool(self._read(self._q_has_past, (self.namespace, seq + 1)))

    def listed_seqs(self, *, checkpoints: bool = False) -> set[int]:
        where = self._t_checkpoints if checkpoints else self._t_entries
        return {int(r[0]) for r in self._read(self._q_seqs.format(where), (self.namespace,))}

    # -- checkpoints -------------------------------------------------------------------------

    def read_pointer(self) -> int | None:
        rows = self._read(self._q_pointer, (self.namespace,))
        return int(rows[0][0]) if rows else None

    def read_checkpoint(self, seq: int) -> Checkpoint:
        key = self.checkpoint_key(seq)
        rows = self._read(self._q_checkpoint, (self.namespace, seq))
        if not rows:
            raise CorruptionError(
                f"the checkpoint pointer names {key!r}, which does not exist", location=key
            )
        checkpoint = decode_checkpoint(bytes(rows[0][0]), key)
        if checkpoint.seq != seq:
            raise CorruptionError(
                f"metadata record {key!r} holds the checkpoint of entry {checkpoint.seq}, "
                f"not {seq}",
                location=key,
            )
        return checkpoint

    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        """The checkpoint and the pointer in one transaction (on a connection of its own)."""
        self.check_writable()
        payload = encode_checkpoint(checkpoint)

        def write(conn: Connection) -> None:
            with conn.transaction():
                conn.execute(self._q_put_checkpoint, (self.namespace, checkpoint.seq, payload))
                conn.execute(self._q_put_pointer, (self.namespace, checkpoint.seq))

        self._side.run(write, idempotent=True)  # an upsert, and a pointer that only rises

    # -- writing and binding -----------------------------------------------------------------

    def check_writable(self) -> None:
        """Create the tables if missing (and refuse a newer layout), once per instance."""
        if self._writable:
            return
        self._main.run(lambda conn: create_tables(conn, self.schema), idempotent=True)
        self._writable = self._version_checked = True

    def namespace_id(self, *, create: bool) -> str | None:
        if create:
            self.check_writable()
            fresh = uuid.uuid4().hex
            self._main.run(
                lambda conn: conn.execute(self._q_ns_create, (self.namespace, fresh)),
                idempotent=True,  # ON CONFLICT DO NOTHING
            )
        rows = self._read(self._q_ns, (self.namespace,))
        return str(rows[0][0]) if rows else None

    def bound_store(self) -> tuple[str, str] | None:
        rows = self._read(self._q_ns, (self.namespace,))
        if not rows or rows[0][1] is None:
            return None
        return str(rows[0][1]), str(rows[0][2] or "")

    def bind_store(self, store_id: str, description: str) -> tuple[str, str]:
        if self.namespace_id(create=True) is None:  # pragma: no cover - just created
            raise InvalidArgumentError(f"namespace {self.namespace!r} vanished")
        self._main.run(
            lambda conn: conn.execute(self._q_bind, (store_id, description, self.namespace)),
            idempotent=True,  # binds an unbound namespace only; the binding is read back
        )
        bound = self.bound_store()
        if bound is None:  # pragma: no cover - a row is never unbound
            raise InvalidArgumentError(f"namespace {self.namespace!r} lost its binding")
        return bound

    def close(self) -> None:
        self._main.close()
        self._side.close()

    # -- internals ---------------------------------------------------------------------------

    def _read(self, query: sql.Composed, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Rows of a read; none while the tables do not exist (nothing was written yet)."""

        def select(conn: Connection) -> list[tuple[Any, ...]]:
            try:
                if not self._version_checked:
                    check_version(conn, self.schema)
                    self._version_checked = True
                return conn.execute(query, params).fetchall()
            except _MISSING_TABLES:
                return []

        return self._main.run(select, idempotent=True)

    def _hole(self, missing: int, found: int) -> CorruptionError:
        """Entry `missing` is absent while `found` after it exists. Never a race: an entry is
        built on the one before it, committed first, so any snapshot holding an entry holds
        every one before it. Filling the hole would put a different history under its seq."""
        key = self.entry_key(missing)
        return CorruptionError(
            f"metadata log entry {key!r} is missing, but entry {found} after it exists: the "
            "log was damaged (entries are never deleted); restore it, or run `s3stream verify`",
            location=key,
        )

    def _decode_entry(self, seq: int, data: bytes) -> tuple[LogEntry, bytes]:
        key = self.entry_key(seq)
        entry = decode_entry(data, key)
        if entry.seq != seq:
            raise CorruptionError(
                f"metadata record {key!r} holds entry {entry.seq}, not {seq}", location=key
            )
        return entry, data


def from_url(
    url: str, *, namespace: str = "meta", settings: ClientSettings | None = None
) -> PostgresMetadataLog:
    """The registry's factory: the log `url` names, its deadlines from `settings`
    (``store_timeout_ms``) unless the URL gives them."""
    timeout_ms = (settings if settings is not None else ClientSettings()).store_timeout_ms
    return PostgresMetadataLog(url, namespace=namespace, timeout_ms=timeout_ms)
