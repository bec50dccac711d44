"""One PostgreSQL connection of the metadata log: opened lazily, one call at a time, every call
under a deadline, every failure an s3stream error naming the server.

Deadlines, so that no call can hang:

- connecting: libpq's ``connect_timeout`` (in the URL `PostgresTarget` built);
- each statement: the server's ``statement_timeout`` (also ``lock_timeout`` and
  ``idle_in_transaction_session_timeout``), set once per connection, so the server ends a slow
  call cleanly with an error;
- and a deadline of the client's own on every wait for the server (`call_deadline_s`: the
  statement timeout plus a margin), for a server or network that stopped answering altogether,
  which no server-side timeout can end. The connection is then closed: its state is unknown.
- A public call with a deadline of its own (`_call_deadline.caller_deadline`: a close's)
  waits no longer than that for the session's lock, a connection and the server.

Failures map to `UnavailableError` (retryable: connection refused, lost, timed out, the server
shutting down or read-only), whose message names the host; a write may or may not have landed
then, which the manager settles by reading back. A connection that failed is dropped, and the
next call opens a new one. A child process (``fork``) never uses its parent's connection: it
opens its own, and leaves the parent's socket alone.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq

from .._bounded import within_deadline
from .._call_deadline import the_deadline, time_left
from ..errors import (
    ContendedError,
    InvalidArgumentError,
    S3StreamError,
    StreamClosedError,
    UnavailableError,
)
from .postgres_url import PostgresTarget

__all__ = ["PostgresSession", "map_error"]

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]


class _DeadlineConnection(psycopg.Connection[tuple[Any, ...]]):
    """A connection that waits at most `deadline_s` for the server in any one call."""

    deadline_s: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is None:
            timeout = self.deadline_s
        return super().wait(gen, interval=interval, timeout=timeout)


class PostgresSession:
    """A lazily opened connection to `target` (see the module docstring). Thread-safe: calls
    are serialized."""

    def __init__(self, target: PostgresTarget) -> None:
        self._target = target
        self._lock = threading.Lock()
        self._conn: _DeadlineConnection | None = None
        self._pid = 0
        #: Connections inherited through fork: kept referenced, never closed or finalized (that
        #: would end the parent's session on the shared socket).
        self._inherited: list[_DeadlineConnection] = []
        self._closed = False

    def run(
        self, call: Callable[[Connection], T], *, idempotent: bool | Callable[[], bool] = False
    ) -> T:
        """`call(connection)`, with its psycopg errors mapped (see `map_error`). An
        `idempotent` call (a read) that fails because the connection it found open had been
        closed by the server meanwhile (a restart, a failover, an idle timeout of a proxy)
        runs once more on a new connection. `idempotent` may instead be a function saying,
        after the failure, whether the call had sent nothing that writes yet (a commit whose
        first message, which only locks and reads, failed)."""
        try:
            return self._run_locked(call, idempotent)
        finally:
            if self._closed and self._conn is not None and self._lock.acquire(blocking=False):
                # `close` came while this call held the lock: the connection goes now.
                try:
                    self._drop()
                finally:
                    self._lock.release()

    def _run_locked(
        self, call: Callable[[Connection], T], idempotent: bool | Callable[[], bool]
    ) -> T:
        # The public call this one serves may have a deadline of its own (a close's):
        # waits for the lock, a connection and the server end by it too.
        left = time_left()
        if left is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=max(0.0, left)):
            raise UnavailableError(
                f"the PostgreSQL metadata store at {self._target.host} "
                f"({self._target.display}): another call of this client was still waiting "
                "for the server when this call's deadline passed"
            )
        try:
            if self._closed:
                raise StreamClosedError(f"the metadata log at {self._target.display} was closed")
            reused = self._conn is not None and not self._conn.closed
            for attempt in range(2):
                conn = self._connection()
                waited = self._bound(conn)
                try:
                    return call(conn)
                except psycopg.Error as exc:
                    # Ended by the server (its message, or a reset socket), not by a wait of
                    # ours running out: that is an outage to report, never to wait out twice.
                    ended = (conn.broken or conn.closed) and not _timed_out(exc)
                    self._end_transaction(conn)
                    if isinstance(exc, psycopg.OperationalError) or conn.broken or conn.closed:
                        self._drop()
                    if reused and ended and attempt == 0:
                        again = idempotent() if callable(idempotent) else idempotent
                        if again:
                            continue  # a connection that died while idle: once more, afresh
                    raise map_error(exc, self._target, waited_s=waited) from exc
                except BaseException:
                    self._end_transaction(conn)
                    raise
                finally:
                    conn.deadline_s = self._target.call_deadline_s
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._lock.release()

    def _bound(self, conn: _DeadlineConnection) -> float:
        """Make `conn` wait for the server no longer than this call may (the session's
        `call_deadline_s`, or less: what is left of the public call's deadline); returns
        that wait. The caller restores the session's."""
        limit = self._target.call_deadline_s
        left = time_left()
        if left is not None and left < limit:
            if left <= 0:
                raise self._not_asked()
            limit = left
        conn.deadline_s = limit
        return limit

    def close(self) -> None:
        """Close the connection, at once: a call under way (a thread waiting up to
        `call_deadline_s` for a server that stopped answering) is not waited for, and drops
        the connection when it ends. Idempotent."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._lock.release()

    def _connection(self) -> _DeadlineConnection:
        if self._conn is not None and self._pid != os.getpid():
            self._inherited.append(self._conn)
            self._conn = None
        if self._conn is None or self._conn.closed:
            self._conn = self._connect_in_time()
            self._pid = os.getpid()
        return self._conn

    def _connect_in_time(self) -> _DeadlineConnection:
        """`_connect`, within the public call's deadline if it has one shorter than the
        connect timeout (libpq's is whole seconds, 2 at least): then in a thread of its own
        (`within_deadline`), a connection made too late closed there."""
        bounded = the_deadline()
        if bounded is None:
            return self._connect()
        clock, deadline = bounded
        left = deadline - clock.monotonic()
        if left >= self._target.connect_timeout_s:
            return self._connect()
        if left <= 0:
            raise self._not_asked()
        return within_deadline(
            self._connect,
            clock=clock,
            deadline=deadline,
            name="s3stream-postgres-connect",
            timeout_error=lambda: UnavailableError(
                f"cannot connect to the PostgreSQL metadata store at {self._target.host} "
                f"({self._target.display}) within this call's deadline"
            ),
            abandoned=lambda conn: conn.close(),
        )

    def _not_asked(self) -> UnavailableError:
        return UnavailableError(
            f"the PostgreSQL metadata store at {self._target.host} ({self._target.display}) "
            "was not asked: this call's deadline passed"
        )

    def _connect(self) -> _DeadlineConnection:
        t = self._target
        options: dict[str, Any] = {}
        left = time_left()
        if left is not None and left < t.connect_timeout_s:
            # libpq's unit is whole seconds, and 2 at least (psycopg rounds a 1 up to it).
            options["connect_timeout"] = max(2, math.ceil(left))
        try:
            conn = _DeadlineConnection.connect(
                t.conninfo, autocommit=True, application_name="s3stream", **options
            )
        except psycopg.Error as exc:
            # Not chained: libpq's own message may quote the password (a traceback would
            # print it); `connect_error` keeps the message, scrubbed.
            raise connect_error(exc, t) from None
        conn.deadline_s = t.call_deadline_s
        ms = str(t.statement_timeout_ms)
        lock_ms = str(t.lock_timeout_ms)
        try:
            # synchronous_commit: a server tuned to 'off' acknowledges a commit before it is
            # flushed, and loses it in a crash, after the uploader trimmed the WAL that held
            # the data: acknowledged appends gone. Any stronger setting of the server's (on,
            # local, remote_write, remote_apply) is kept.
            conn.execute(
                "SELECT set_config('statement_timeout', %s, false), "
                "set_config('lock_timeout', %s, false), "
                "set_config('idle_in_transaction_session_timeout', %s, false), "
                "CASE WHEN current_setting('synchronous_commit') = 'off' "
                "THEN set_config('synchronous_commit', 'on', false) END",
                (ms, lock_ms, ms),
            )
        except psycopg.Error as exc:
            conn.close()
            raise map_error(exc, t) from exc
        return conn

    def _end_transaction(self, conn: _DeadlineConnection) -> None:
        """After a failed call: roll back the transaction it left open (a call may send BEGIN
        and COMMIT itself), or drop the connection if that fails; the lock a transaction
        holds is released either way."""
        if conn.closed or conn.info.transaction_status == pq.TransactionStatus.IDLE:
            return
        try:
            conn.rollback()
        except Exception:  # the connection is in no state to reuse: the next call reconnects
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._pid != os.getpid():
            self._inherited.append(conn)
            return
        # It failed already: closing is best effort.
        with contextlib.suppress(Exception):
            conn.close()


#: What a server says when the URL itself is wrong (SQLSTATE classes 28: invalid
#: authorization, 3D: invalid catalog name; 42: a role or option that does not exist):
#: retrying cannot help.
_PERMANENT_CONNECT_CLASSES = ("28", "3D", "42")
#: libpq's and the server's words for a URL that cannot work, whatever the retries (the
#: server's FATAL at connect time comes without a SQLSTATE in psycopg's error).
_PERMANENT_CONNECT = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|"
    r'(database|role) ".*" does not exist|invalid connection option|invalid sslmode value|'
    r"invalid percent-encoded token|invalid integer value|invalid port number|"
    r"invalid URI query parameter|unrecognized configuration parameter|"
    r"invalid value for parameter|server does not support SSL",
    re.IGNORECASE,
)


def connect_error(exc: psycopg.Error, target: PostgresTarget) -> S3StreamError:
    """The s3stream error for a failed connect: `InvalidArgumentError` when the URL is wrong
    (bad password, unknown database or role, a parameter libpq does not take), retryable
    `UnavailableError` when the server could not be reached or was not ready."""
    text = target.scrub(_first_line(exc))
    where = f"the PostgreSQL metadata store at {target.host} ({target.display})"
    state = getattr(exc, "sqlstate", None) or ""
    if state[:2] in _PERMANENT_CONNECT_CLASSES or _PERMANENT_CONNECT.search(str(exc)):
        return InvalidArgumentError(f"{where} refused the metadata URL: {text}")
    return UnavailableError(
        f"cannot connect to {where} within {target.connect_timeout_s} s: {text}"
    )


def _timed_out(exc: psycopg.Error) -> bool:
    """Whether `exc` is a wait of the client's that ran out (`call_deadline_s`)."""
    return isinstance(exc, psycopg.OperationalError) and "timeout" in _first_line(exc).lower()


def map_error(
    exc: psycopg.Error, target: PostgresTarget, *, waited_s: float | None = None
) -> S3StreamError:
    """The s3stream error for a psycopg error met talking to `target` (`waited_s`: how long
    the call waited for the server at most, if not `call_deadline_s`)."""
    where = f"the PostgreSQL metadata store at {target.host} ({target.display})"
    text = target.scrub(_first_line(exc))
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return InvalidArgumentError(
            f"{where} refused: {text} (the role needs CREATE on the database for the first "
            f"writer, then SELECT, INSERT and UPDATE on schema {target.schema!r}'s tables; "
            "readers need SELECT only)"
        )
    if isinstance(exc, pg_errors.LockNotAvailable):
        # Contention, not an outage: another writer held the log's commit lock that long.
        return ContendedError(
            f"{where}: another writer held the metadata log's commit lock for longer than "
            f"lock_timeout ({target.lock_timeout_ms} ms): {text}"
        )
    if isinstance(exc, pg_errors.QueryCanceled):
        return UnavailableError(
            f"{where} did not finish a call within its statement_timeout "
            f"({target.statement_timeout_ms} ms): {text}"
        )
    if _timed_out(exc):
        waited = target.call_deadline_s if waited_s is None else waited_s
        return UnavailableError(
            f"{where} did not answer within {waited:.3g} s (connection closed; "
            f"a write may or may not have landed): {text}"
        )
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return UnavailableError(f"{where} is read-only (a standby?): {text}")
    if isinstance(exc, psycopg.ProgrammingError | psycopg.DataError | psycopg.IntegrityError):
        # Not the network and not retryable: tables altered by hand, or a bug.
        return S3StreamError(f"{where} refused a statement of the metadata log: {text}")
    return UnavailableError(f"{where} failed: {text}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
