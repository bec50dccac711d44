"""The PostgreSQL metadata log beyond the conformance kit: its URL, deadlines and errors, the
tables' creation and version, privileges, the same bytes as the object-store log, the binding
of a store to one log, and the entry points that take ``metadata=`` (open, open_reader, the
CLI, the Spark options). Against the session's server (tests/conftest.py, ``postgres``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream.clock import ManualClock, SystemClock
from s3stream.errors import (
    CorruptionError,
    InvalidArgumentError,
    S3StreamError,
    StreamClosedError,
    UnavailableError,
)
from s3stream.metadata import MetadataManager, RegisterNode
from s3stream.metadata.codec import encode_checkpoint
from s3stream.metadata.log import MetadataLog
from s3stream.metadata.model import Checkpoint
from s3stream.metadata.postgres_url import parse_postgres_url
from s3stream.metadata.registry import check_metadata_url
from s3stream.metrics import catalog
from s3stream.metrics.components import MetadataInstruments
from s3stream.metrics.registry import MetricsRegistry
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.testing.metadata import race_creates
from s3stream.types import RecordBatch

psycopg = pytest.importorskip("psycopg", reason="needs psycopg (s3stream[postgres])")

from s3stream.metadata.postgres import PostgresMetadataLog  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _namespace() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def url(postgres: Any) -> str:
    """The session server's database, in a namespace of the test's own."""
    made: str = postgres.url(namespace=_namespace())
    return made


def _sql(postgres: Any, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres.url(), autocommit=True) as conn:
        cur = conn.execute(statement, params or None)
        return list(cur.fetchall()) if cur.description is not None else []


def _manager(log: Any, writer: str = "w") -> MetadataManager:
    m = MetadataManager(log, clock=ManualClock(), writer_id=writer)
    m.load()
    return m


# -- the URL ---------------------------------------------------------------------------------


def test_url_parameters_and_defaults() -> None:
    t = parse_postgres_url(
        "postgresql://u:secret@db.example:6543/meta", namespace="m", timeout_ms=30_000
    )
    assert (t.namespace, t.schema, t.statement_timeout_ms, t.connect_timeout_s) == (
        "m", "s3stream", 30_000, 10
    )  # fmt: skip
    assert t.host == "db.example:6543"
    assert "secret" not in t.display and t.display == "postgresql://u@db.example:6543/meta"
    assert "connect_timeout=10" in t.conninfo and "secret" in t.conninfo
    t = parse_postgres_url(
        "postgres://h/db?namespace=orders&schema=meta_v1&statement_timeout=5s&sslmode=disable"
        "&connect_timeout=3",
        namespace="meta",
        timeout_ms=30_000,
    )
    assert (t.namespace, t.schema, t.statement_timeout_ms, t.connect_timeout_s) == (
        "orders", "meta_v1", 5_000, 3
    )  # fmt: skip
    assert "namespace" not in t.conninfo and "sslmode=disable" in t.conninfo
    assert t.call_deadline_s == 6.0
    # A short deadline still gives libpq its 2 s minimum to connect.
    assert (
        parse_postgres_url("postgresql://h/db", namespace="m", timeout_ms=500).connect_timeout_s
        == 2
    )
    for bad, why in (
        ("postgresql://h/db?schema=Bad-Name", "schema"),
        ("postgresql://h/db?statement_timeout=1.5s", "statement_timeout"),
        ("postgresql://h/db?statement_timeout=0", "statement_timeout"),
        ("postgresql://h/db?connect_timeout=0", "connect_timeout"),
        ("postgresql://h/db?namespace=", "namespace"),
        ("postgresql://h/db?namespace=a&namespace=b", "twice"),
        ("postgresql://u:pw@h/db#x", "fragment"),
        ("mysql://h/db", "PostgreSQL URL"),
        ("postgresql://s3stream@[::1/x", "not a usable PostgreSQL URL"),
        ("postgresql://h:99999/db", "not a usable PostgreSQL URL"),
        ("postgresql://h/db?namespace=a%00b", "NUL"),
        ("postgresql://h/db?schema=information_schema", "PostgreSQL's own"),
        ("postgresql://h/db?schema=pg_catalog", "PostgreSQL's own"),
    ):
        with pytest.raises(InvalidArgumentError, match=why) as err:
            parse_postgres_url(bad, namespace="m", timeout_ms=1000)
        assert "pw" not in str(err.value)


def test_a_metadata_url_libpq_would_refuse_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """A typo in the URL's query (``?foo=bar``, ``?schema=Bad-Name``) was found when the log
    connected, after the store's directories and the WAL's lock file were made."""
    for url, why in (
        ("postgresql://u:secret@h/db?foo=bar", 'invalid URI query parameter: "foo"'),
        ("postgresql://h/db?schema=Bad-Name", "schema"),
        # libpq quotes the token it cannot parse: the password (review).
        ("postgresql://u:secret%pw@h/db", "invalid percent-encoded token"),
        ("postgresql://u:se cret@h/db", "unexpected spaces"),
    ):
        with pytest.raises(InvalidArgumentError, match=why) as err:
            s3stream.open(tmp_path / "s", metadata=url)
        assert "secret" not in str(err.value) and "cret" not in str(err.value)
        assert not (tmp_path / "s").exists()
        with pytest.raises(InvalidArgumentError, match=why):
            check_metadata_url(url)


def test_a_password_never_shows_in_an_error_or_a_repr(tmp_path: Path) -> None:
    """A password holding an unencoded '/', '?' or '#' cut the URL's host part short, and
    its rest showed in messages: as the "port" the URL parser quoted, as the URL a fragment
    error printed whole, as a database name; and the target's repr printed the conninfo."""
    from s3stream.metadata.postgres_url import parse_postgres_url

    secret = "Zq8Secret"
    for url in (
        f"postgresql://app:Tr0b{secret}&3/x@host/db",
        f"postgresql://app:2024#{secret}@host/db",
        f"postgresql://app:5432/{secret}@host/db",
    ):
        with pytest.raises(InvalidArgumentError) as err:
            s3stream.open(tmp_path / "s", wal="memory://", metadata=url)
        assert secret not in str(err.value), err.value
        assert "percent-encode" in str(err.value)
    target = parse_postgres_url(
        f"postgresql://app:{secret}@host/db", namespace="n", timeout_ms=1000
    )
    assert secret not in repr(target)


def test_the_url_factory_takes_no_option_it_would_ignore() -> None:
    """`from_url(url, timeout_ms=...)` was accepted and the timeout ignored (the factory took
    any keyword): the deadlines come from `settings` or the URL, and anything else is an
    error before anything is opened."""
    from s3stream.metadata import postgres

    with pytest.raises(TypeError, match="timeout_ms"):
        postgres.from_url("postgresql://h/db", timeout_ms=5)  # type: ignore[call-arg]


def test_libpq_url_forms_reach_libpq_intact() -> None:
    """A value with a space reaches libpq as %20 (urlencode's '+' reached the server as
    "+search_path"), a multi-host URL is taken (its netloc has a port per host), a
    database name with an escape is shown once decoded, and a timeout past PostgreSQL's
    int range is the URL's fault."""
    t = parse_postgres_url(
        "postgresql://u@h/db?options=-c%20search_path%3Dpublic", namespace="m", timeout_ms=3000
    )
    assert "options=-c%20search_path%3Dpublic" in t.conninfo and "+" not in t.conninfo
    multi = parse_postgres_url(
        "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
        namespace="m",
        timeout_ms=3000,
    )
    assert multi.conninfo.startswith("postgresql://u@h1:5432,h2:5433/db?")
    spaced = parse_postgres_url("postgresql://u@h/my%20db", namespace="m", timeout_ms=3000)
    assert spaced.display == "postgresql://u@h/my%20db"
    for bad in ("postgresql://u@h1:5432,h2:x/db", "postgresql://u@h/db?statement_timeout=9999999h"):
        with pytest.raises(InvalidArgumentError):
            parse_postgres_url(bad, namespace="m", timeout_ms=3000)


def test_a_local_socket_url_reaches_libpq_as_given() -> None:
    """``postgresql:///dbname`` (no host: the local socket) keeps its ``//`` for libpq."""
    t = parse_postgres_url("postgresql:///meta?host=/run/pg", namespace="m", timeout_ms=3000)
    assert t.conninfo.startswith("postgresql:///meta?") and "host=%2Frun%2Fpg" in t.conninfo
    assert parse_postgres_url("postgresql://", namespace="m", timeout_ms=3000).conninfo == (
        "postgresql://?connect_timeout=3"
    )


def test_a_wrong_url_is_not_retryable_and_an_unreachable_server_is(
    postgres: Any, tmp_path: Path
) -> None:
    """A database or role that does not exist, or a parameter libpq does not take, is the
    URL's fault (`InvalidArgumentError`: retrying cannot help); a server that cannot be
    reached is `UnavailableError` (retryable)."""
    from urllib.parse import urlsplit

    parts = urlsplit(postgres.url())
    where = f"{parts.hostname}:{parts.port}"
    for bad, why in (
        (f"postgresql://{parts.username}@{where}/no_such_db", "does not exist"),
        (f"postgresql://no_such_role@{where}{parts.path}", "does not exist"),
        (postgres.url(frobnicate="1"), "frobnicate"),
        (postgres.url(sslmode="maybe"), "sslmode"),
    ):
        with pytest.raises(InvalidArgumentError, match=why) as err:
            s3stream.open(tmp_path / "s", wal="memory://", metadata=bad)
        assert not err.value.retryable


def test_a_store_bound_to_another_namespace_makes_nothing_in_this_one(
    postgres: Any, url: str, tmp_path: Path
) -> None:
    """A writer opened on a store bound to another log (a mistyped namespace or schema) is
    refused before it creates anything: no schema, no tables, no namespace row (it made
    them all, then refused)."""
    with s3stream.open(tmp_path / "s", wal="memory://", metadata=url) as client:
        client.create_stream()
    schema = f"typo_{uuid.uuid4().hex[:8]}"
    namespace = _namespace()
    for wrong in (
        postgres.url(namespace=namespace, schema=schema),
        postgres.url(namespace=namespace),
    ):
        with pytest.raises(InvalidArgumentError, match="lives in"):
            s3stream.open(tmp_path / "s", wal="memory://", metadata=wrong)
    assert not _sql(
        postgres, "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", schema
    )
    assert not _sql(postgres, "SELECT 1 FROM s3stream.namespaces WHERE namespace = %s", namespace)
    # A store keeping its log in itself, given a metadata URL: nothing made either.
    with s3stream.open(tmp_path / "own", wal="memory://") as client:
        client.create_stream()
    with pytest.raises(InvalidArgumentError, match="keeps its metadata log in the store"):
        s3stream.open(tmp_path / "own", wal="memory://", metadata=postgres.url(schema=schema + "x"))
    assert not _sql(
        postgres, "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", schema + "x"
    )


def _open_together(targets: list[tuple[Path, str, str]]) -> list[BaseException]:
    """Open (and close) a writer for each ``(store, node id, metadata URL)`` in threads that
    start together; the errors they met."""
    import threading

    start = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def open_one(where: Path, node: str, metadata: str) -> None:
        start.wait()
        try:
            with s3stream.open(where, node_id=node, wal="memory://", metadata=metadata):
                pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=target) for target in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_writers_opening_a_new_store_at_once_all_bind_it(postgres: Any, tmp_path: Path) -> None:
    """Writers opening one new store at once, with one new namespace: one that saw no marker
    in the store and then found the namespace bound (by another opener, just now) was
    refused as "another object store"; and of two *different* new stores racing for one
    namespace, the loser kept the marker it had made, and was then refused by every
    namespace, its own included."""
    from s3stream.metadata.marker import marker_key

    for trial in range(4):
        url, root = postgres.url(namespace=_namespace()), tmp_path / f"same-{trial}"
        root.mkdir()
        assert _open_together([(root, f"n{i}", url) for i in range(4)]) == []
    for trial in range(4):
        url = postgres.url(namespace=_namespace())
        roots = [tmp_path / f"two-{trial}-{side}" for side in "ab"]
        for r in roots:
            r.mkdir()
        errors = _open_together([(r, "n", url) for r in roots])
        assert len(errors) <= 1, errors  # one store binds the namespace
        for r in roots:
            # The winner opens again on the namespace; the loser, whose marker is gone, on
            # one of its own (a marker left behind bound it to a namespace that refused it).
            marked = (r / marker_key("meta")).exists()
            again = url if marked else postgres.url(namespace=_namespace())
            with s3stream.open(r, wal="memory://", metadata=again):
                pass


def test_writers_need_no_create_privilege_on_tables_made_beforehand(
    postgres: Any, tmp_path: Path
) -> None:
    """docs/metadata.md: with the schema and tables made beforehand, writers need SELECT,
    INSERT and UPDATE on the tables. Every writer ran ``CREATE SCHEMA/TABLE IF NOT EXISTS``,
    which PostgreSQL refuses without CREATE even where the objects exist."""
    tag = uuid.uuid4().hex[:8]
    schema, role, namespace = f"pre_{tag}", f"w_{tag}", _namespace()
    made = postgres.url(namespace=namespace, schema=schema)
    with s3stream.open(tmp_path / "s", wal="memory://", metadata=made) as first:
        first.create_stream().append(RecordBatch(b"by the first writer"))
    _sql(postgres, f"CREATE ROLE {role} LOGIN")
    _sql(postgres, f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    _sql(postgres, f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role}")
    url = made.replace("//s3stream@", f"//{role}@")
    with s3stream.open(tmp_path / "s", node_id="w2", wal="memory://", metadata=url) as writer:
        stream = writer.create_stream()
        stream.append(RecordBatch(b"by a writer without CREATE"))
        writer.flush()
    with s3stream.open_reader(tmp_path / "s", metadata=url) as reader:
        assert len(reader.list_streams()) == 2


def test_tables_of_another_application_are_never_written(postgres: Any, tmp_path: Path) -> None:
    """A schema that holds another application's table of one of the log's names (here
    ``schema_version``) is refused, for writers and readers, before anything is written."""
    schema = f"app_{uuid.uuid4().hex[:8]}"
    _sql(postgres, f"CREATE SCHEMA {schema}")
    _sql(postgres, f"CREATE TABLE {schema}.schema_version (version int PRIMARY KEY, note text)")
    _sql(postgres, f"INSERT INTO {schema}.schema_version VALUES (7, 'the app''s own')")
    url = postgres.url(namespace=_namespace(), schema=schema)
    with pytest.raises(InvalidArgumentError, match="'schema_version' that is not s3stream's"):
        s3stream.open(tmp_path / "s", wal="memory://", metadata=url)
    with pytest.raises(InvalidArgumentError, match="not s3stream's"):
        s3stream.open_reader(tmp_path / "s", metadata=url)
    assert _sql(postgres, f"SELECT * FROM {schema}.schema_version") == [(7, "the app's own")]
    tables = _sql(
        postgres, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
        schema,
    )  # fmt: skip
    assert tables == [("schema_version",)]
    # The log's columns without its keys (the primary key is the fencing: two writers both
    # "created" entry 1000 there) are not the log's tables either.
    bare = f"bare_{uuid.uuid4().hex[:8]}"
    _sql(postgres, f"CREATE SCHEMA {bare}")
    _sql(
        postgres,
        f"CREATE TABLE {bare}.log_entries (namespace text NOT NULL, seq bigint NOT NULL, "
        "payload bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    )
    with pytest.raises(InvalidArgumentError, match="'log_entries' that is not s3stream's"):
        s3stream.open(
            tmp_path / "b", wal="memory://", metadata=postgres.url(namespace="b", schema=bare)
        )


def test_metadata_urls_are_checked_before_anything_is_opened(tmp_path: Path) -> None:
    assert check_metadata_url(None) is None
    assert check_metadata_url("postgres://h/db") == "postgres://h/db"
    with pytest.raises(InvalidArgumentError, match=r"known: postgres, postgresql"):
        check_metadata_url("mysql://h/db")
    with pytest.raises(InvalidArgumentError, match="must be a URL"):
        check_metadata_url("h/db")
    target = tmp_path / "never"
    with pytest.raises(InvalidArgumentError, match="mysql"):
        s3stream.open(target, metadata="mysql://h/db")
    with pytest.raises(InvalidArgumentError, match="mysql"):
        s3stream.open_reader(tmp_path, metadata="mysql://h/db")
    assert not target.exists()


# -- deadlines and errors --------------------------------------------------------------------


def test_an_unreachable_server_is_unavailable_naming_the_host() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = PostgresMetadataLog(f"postgresql://nobody@127.0.0.1:{port}/db", namespace="x")
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=f"127.0.0.1:{port}") as err:
        _manager(log)
    assert time.monotonic() - started < 15
    assert err.value.retryable
    log.close()


def test_a_server_that_stops_answering_hits_the_call_deadline(postgres: Any) -> None:
    log = PostgresMetadataLog(postgres.url(statement_timeout="1s"), namespace=_namespace())
    try:
        m = _manager(log)
        m.create_stream({})
        backend_pid = log._main.run(lambda c: c.execute("SELECT pg_backend_pid()").fetchone()[0])
        os.kill(backend_pid, signal.SIGSTOP)  # the server's process for this connection
        try:
            started = time.monotonic()
            with pytest.raises(UnavailableError, match="did not answer within 2 s"):
                m.create_stream({})
            assert time.monotonic() - started < 5
        finally:
            os.kill(backend_pid, signal.SIGCONT)
        # The outcome was unknown; the next call reconnects, and the manager sorts it out.
        m.refresh()
        assert m.create_stream({}).stream_id == m.seq - 1
    finally:
        log.close()


@pytest.mark.parametrize("meanwhile", ["nothing", "refreshes", "a trim", "a reconnect"])
def test_close_keeps_its_deadline_when_its_release_meets_a_frozen_server(
    postgres: Any, tmp_path: Path, meanwhile: str
) -> None:
    """Everything is uploaded, so the release commit of `close(timeout_s)` is the call that
    meets the frozen server (postmaster and backends). It waited the session's own deadline
    for the server (the statement timeout and its margin: 11 s for close(1) with 10 s);
    behind threads refreshing meanwhile, each waiting that long in turn; queued behind
    another commit of the client (a trim) leading its group on the frozen server (10.5 s);
    and, its connection dropped by an earlier call, 2 s for a connect (libpq's least
    connect_timeout) against close(0.5). Its deadline now bounds every one of those waits."""
    statement = "1s" if meanwhile == "a reconnect" else "10s"
    url = postgres.url(namespace=_namespace(), statement_timeout=statement)
    settings = {"upload_interval_ms": 50}
    c = s3stream.open(tmp_path / "s", wal="memory://", metadata=url, settings=settings)
    s = c.create_stream()
    s.append(RecordBatch(b"x"))
    s.append(RecordBatch(b"y"))
    c.flush()
    errors: list[BaseException] = []

    def swallow(call: Any) -> None:
        try:
            call()
        except S3StreamError as exc:
            errors.append(exc)

    calls = {"refreshes": [c.list_streams] * 3, "a trim": [lambda: s.trim(1)]}.get(meanwhile, [])
    threads = [threading.Thread(target=swallow, args=(call,)) for call in calls]
    limit = 0.5 if meanwhile == "a reconnect" else 1.0
    with postgres.frozen():
        if meanwhile == "a reconnect":
            swallow(c.list_streams)  # times out: its connection is dropped
            assert errors
        for t in threads:
            t.start()
        time.sleep(0.3)  # the others are waiting on the server now
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            c.close(timeout_s=limit)
        took = time.monotonic() - started
    for t in threads:
        t.join(30)
    assert took < limit + 0.7, f"close(timeout_s={limit}) took {took:.1f} s, {meanwhile} meanwhile"
    assert all(isinstance(e, UnavailableError | StreamClosedError) for e in errors), errors


def test_close_keeps_its_deadline_while_a_commit_waits_on_a_frozen_server(
    postgres: Any, tmp_path: Path
) -> None:
    """The uploader's commit is stuck on a server process that stopped answering (it waits
    up to the statement timeout and its margin): `close(timeout_s)` still returns or raises
    within its deadline, instead of waiting for that call to give the connection back."""
    url = postgres.url(namespace=_namespace(), statement_timeout="20s")
    settings = {"call_timeout_ms": 3000, "upload_interval_ms": 50}
    c = s3stream.open(tmp_path / "s", wal="memory://", metadata=url, settings=settings)
    s = c.create_stream()
    s.append(RecordBatch(b"x"))
    c.flush()
    log = c._meta.log  # the client's PostgreSQL log
    backends = [
        r[0]
        for r in _sql(
            postgres,
            "SELECT pid FROM pg_stat_activity WHERE application_name = 's3stream' "
            "AND pid <> pg_backend_pid()",
        )
    ]
    assert backends
    for pid in backends:
        os.kill(pid, signal.SIGSTOP)
    try:
        s.append(RecordBatch(b"y"))
        time.sleep(0.5)  # the uploader's commit is now waiting on a stopped process
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            c.close(timeout_s=2)
        assert time.monotonic() - started < 2.5
    finally:
        for pid in backends:
            os.kill(pid, signal.SIGCONT)
    log.close()


def test_a_slow_statement_ends_at_the_statement_timeout(postgres: Any) -> None:
    log = PostgresMetadataLog(postgres.url(statement_timeout="300ms"), namespace=_namespace())
    try:
        with pytest.raises(UnavailableError, match="statement_timeout"):
            log._main.run(lambda c: c.execute("SELECT pg_sleep(5)"))
        assert log.has_entry(1) is False  # the connection is still usable
    finally:
        log.close()


# -- tables ----------------------------------------------------------------------------------


def test_readers_create_nothing_and_the_first_writer_creates_the_tables(postgres: Any) -> None:
    schema = f"fresh_{uuid.uuid4().hex[:8]}"
    url = postgres.url(schema=schema, namespace="n")
    exists = "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s"
    reader = PostgresMetadataLog(url)
    m = _manager(reader)
    assert m.seq == 0 and reader.read_pointer() is None and reader.listed_seqs() == set()
    assert _sql(postgres, exists, schema) == [(0,)], "a reader created tables"
    writer = PostgresMetadataLog(url)
    _manager(writer).create_stream({})
    assert _sql(postgres, exists, schema) == [(5,)]
    assert _sql(postgres, f"SELECT version FROM {schema}.schema_version") == [(1,)]
    assert m.refresh() is True and m.seq == 1
    for log in (reader, writer):
        log.close()


def test_a_newer_schema_version_is_refused(postgres: Any) -> None:
    schema = f"newer_{uuid.uuid4().hex[:8]}"
    url = postgres.url(schema=schema, namespace="n")
    first = PostgresMetadataLog(url)
    first.check_writable()
    first.close()
    _sql(postgres, f"INSERT INTO {schema}.schema_version (version) VALUES (2)")
    for use in ("read", "write"):
        log = PostgresMetadataLog(url)
        with pytest.raises(InvalidArgumentError, match="layout version 2, newer"):
            log.read_pointer() if use == "read" else log.check_writable()
        log.close()


def test_a_read_only_role_reads_and_is_refused_writes(postgres: Any, url: str) -> None:
    writer = PostgresMetadataLog(url)
    _manager(writer).create_stream({"a": "b"})
    writer.close()
    role = f"ro_{uuid.uuid4().hex[:8]}"
    _sql(postgres, f"CREATE ROLE {role} LOGIN")
    _sql(postgres, f"GRANT USAGE ON SCHEMA s3stream TO {role}")
    _sql(postgres, f"GRANT SELECT ON ALL TABLES IN SCHEMA s3stream TO {role}")
    ro_url = url.replace("postgresql://s3stream@", f"postgresql://{role}@")
    log = PostgresMetadataLog(ro_url)
    m = _manager(log, "ro")
    assert [s.tags for s in m.list_streams()] == [{"a": "b"}]
    with pytest.raises(InvalidArgumentError, match=r"permission denied|refused"):
        m.create_stream({})
    log.close()


def test_the_pointer_only_moves_forward(url: str) -> None:
    log = PostgresMetadataLog(url)
    for seq in (8, 4):
        log.write_checkpoint(
            Checkpoint(seq=seq, next_stream_id=0, streams=(), objects=(), nodes=())
        )
    assert log.read_pointer() == 8 and log.listed_seqs(checkpoints=True) == {4, 8}
    log.close()


def test_entries_are_the_object_store_logs_bytes(url: str) -> None:
    """The same commits give byte-identical entries and checkpoints in both backends."""
    pg = PostgresMetadataLog(url)
    obj_log = MetadataLog(MemoryObjectStore())
    for log in (pg, obj_log):
        m = MetadataManager(
            log, clock=ManualClock(start_ms=7), writer_id="w", checkpoint_interval=3
        )
        m.load()
        sid = m.create_stream({"topic": "t"}).stream_id
        m.open_stream(sid, "n1")
        m.register_node("n1")
        m.close_stream(sid, 1)
    for seq in range(1, 5):
        assert pg.read_entry(seq)[1] == obj_log.read_entry(seq)[1]
    assert encode_checkpoint(pg.read_checkpoint(3)) == encode_checkpoint(obj_log.read_checkpoint(3))
    pg.close()


def test_a_forked_child_opens_its_own_connection(url: str) -> None:
    log = PostgresMetadataLog(url)
    m = _manager(log)
    m.create_stream({})
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if log.has_entry(1) and not log.has_entry(2) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    m.create_stream({})  # the parent's connection survived the child
    assert m.seq == 2
    log.close()


# -- clients, readers and the binding of a store to its log ----------------------------------


def test_a_client_and_a_reader_keep_the_log_in_postgres(tmp_path: Path, url: str) -> None:
    root = tmp_path / "store"
    with s3stream.open(root, node_id="n1", metadata=url) as client:
        stream = client.create_stream({"topic": "orders"})
        for i in range(20):
            stream.append(RecordBatch(b"r%d" % i, count=1))
        client.flush()
    assert not (root / "meta" / "log").exists(), "the log went to the object store"
    assert (root / "meta" / "metadata-store").is_file() and (root / "data").is_dir()
    with s3stream.open_reader(root, metadata=url) as reader:
        (info,) = reader.list_streams()
        assert (info.end_offset, info.tags) == (20, {"topic": "orders"})
        assert [b.payload for b in reader.read(info.stream_id, 0).batches][:2] == [b"r0", b"r1"]
    with s3stream.open(root, node_id="n2", metadata=url) as again:
        assert again.stream_info(info.stream_id).end_offset == 20


def test_a_store_and_a_log_are_bound_one_to_one(tmp_path: Path, url: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    s3stream.open(a, metadata=url).close()
    # Another store on the same namespace: refused, writer and reader, leaving no marker.
    with pytest.raises(InvalidArgumentError, match="another object store"):
        s3stream.open(b, metadata=url)
    assert not (b / "meta" / "metadata-store").exists()
    b.mkdir(exist_ok=True)
    with pytest.raises(InvalidArgumentError, match="another object store"):
        s3stream.open_reader(b, metadata=url)
    # ... which may have a namespace of its own.
    s3stream.open(b, metadata=url + "-b").close()
    # The store itself, without the metadata URL (or with another namespace): refused, saying
    # where its metadata is.
    with pytest.raises(InvalidArgumentError, match="lives in postgresql://"):
        s3stream.open(a)
    with pytest.raises(InvalidArgumentError, match="lives in postgresql://"):
        s3stream.open_reader(a)
    with pytest.raises(InvalidArgumentError, match="lives in postgresql://"):
        s3stream.open(a, metadata=url + "-c")
    # A store keeping its log in itself cannot be moved to PostgreSQL by accident.
    own = tmp_path / "own"
    s3stream.open(own).close()
    with pytest.raises(InvalidArgumentError, match="keeps its metadata log in the store"):
        s3stream.open(own, metadata=url + "-d")


def test_the_cli_takes_metadata(tmp_path: Path, url: str) -> None:
    root = tmp_path / "store"
    with s3stream.open(root, metadata=url) as client:
        client.create_stream({"k": "v"}).append(RecordBatch(b"x", count=1))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("S3STREAM_METADATA", None)

    def cli(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "s3stream", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, **extra_env},
            check=False,
        )

    done = cli("inspect", str(root), "--metadata", url, "--json")
    assert done.returncode == 0, done.stderr
    assert '"end": 1' in done.stdout
    done = cli("verify", str(root), S3STREAM_METADATA=url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify: OK" in done.stdout
    done = cli("inspect", str(root))
    assert done.returncode == 2 and "lives in postgresql://" in done.stderr
    done = cli("inspect", str(root), "--metadata", "mysql://h/db")
    assert done.returncode == 2 and "mysql" in done.stderr


def test_the_spark_option_metadata() -> None:
    pytest.importorskip("pyspark", reason="the Spark options module needs pyspark")
    from s3stream.spark.options import parse_options

    opts = parse_options({"path": "./x", "metadata": "postgresql://h/db"}, streaming=False)
    assert opts.metadata == "postgresql://h/db"
    assert parse_options({"path": "./x"}, streaming=False).metadata is None
    with pytest.raises(InvalidArgumentError, match="option metadata"):
        parse_options({"path": "./x", "METADATA": "mysql://h/db"}, streaming=False)


# -- serialized commits (the namespace's row lock) ----------------------------------------------


def test_serialized_commits_queue_instead_of_racing(url: str) -> None:
    """Writers in sessions of their own take the namespace's row lock in turn: none ever loses
    a race (no conflict counted, no entry attempted twice), every op lands once."""
    registries = [MetricsRegistry() for _ in range(4)]
    logs = [PostgresMetadataLog(url) for _ in range(4)]
    assert all(log.serializes_commits for log in logs)
    managers = [
        MetadataManager(
            log, clock=ManualClock(), writer_id=f"w{i}", instruments=MetadataInstruments(reg)
        )
        for i, (log, reg) in enumerate(zip(logs, registries, strict=True))
    ]
    for m in managers:
        m.load()
    race_creates(managers, 25)
    for reg in registries:
        family = reg.family(catalog.METADATA_CONFLICTS.name)
        assert family is None or family.total() == 0
    fresh = _manager(PostgresMetadataLog(url), "r")
    assert fresh.seq == 100 and len(fresh.list_streams()) == 100
    assert sorted(s.stream_id for s in fresh.list_streams()) == list(range(100))
    for m in managers:
        m.refresh()
        assert m.state.to_checkpoint() == fresh.state.to_checkpoint()
        m.log.close()


def test_a_writer_that_does_not_lock_is_still_fenced_by_the_insert(url: str) -> None:
    """The lock only orders committers: a writer on the optimistic protocol (an older client)
    beside locking ones loses races instead of overwriting, and everything lands once."""
    locking = _manager(PostgresMetadataLog(url), "locking")
    racing = _manager(PostgresMetadataLog(url, serialize_commits=False), "racing")
    assert not racing.log.serializes_commits
    with pytest.raises(NotImplementedError):
        racing.log.commit_serialized(0, lambda entries: None)
    with pytest.raises(InvalidArgumentError, match="serialize_commits"):
        PostgresMetadataLog(url, serialize_commits="yes")  # type: ignore[arg-type]
    race_creates([locking, racing], 30)
    # A locking commit whose view is stale is handed the missed entries in its transaction.
    racing.create_stream({})
    sid = locking.create_stream({}).stream_id
    assert sid == 61 and locking.seq == 62
    fresh = _manager(PostgresMetadataLog(url), "r")
    assert sorted(s.stream_id for s in fresh.list_streams()) == list(range(62))
    for m in (locking, racing, fresh):
        m.log.close()


def test_serialized_commit_refuses_a_rolled_back_log(postgres: Any, url: str) -> None:
    m = _manager(PostgresMetadataLog(url), "w")
    for _ in range(3):
        m.create_stream({})
    namespace = m.log.namespace
    _sql(postgres, "DELETE FROM s3stream.log_entries WHERE namespace = %s AND seq = 3", namespace)
    with pytest.raises(CorruptionError, match="rolled back"):
        m.create_stream({})
    with pytest.raises(CorruptionError, match="rolled back"):
        m.create_stream({})
    m.log.close()


def _writer_and_a_lock_holder(
    postgres: Any, url: str
) -> tuple[PostgresMetadataLog, MetadataManager, psycopg.Connection[Any]]:
    """A log at `url` with one entry, its manager (commits retried for 30 s), and another
    session holding the log's commit lock (the namespace's row) until it rolls back."""
    log = PostgresMetadataLog(url)
    m = MetadataManager(log, clock=SystemClock(), writer_id="a", commit_timeout_s=30)
    m.load()
    m.create_stream({})
    holder = psycopg.connect(postgres.url(), autocommit=False)
    holder.execute(
        "SELECT 1 FROM s3stream.namespaces WHERE namespace = %s FOR UPDATE", (log.namespace,)
    )
    return log, m, holder


def test_a_commit_waits_its_turn_past_lock_timeout_until_its_deadline(
    postgres: Any, url: str
) -> None:
    """Another writer holding the log's commit lock longer than lock_timeout is contention,
    not an outage: the serialized commit tries again until its own deadline, and lands when
    the lock is free (it failed at the lock timeout before)."""
    import threading

    log, m, holder = _writer_and_a_lock_holder(postgres, f"{url}&statement_timeout=1s")
    release = threading.Timer(2.5, holder.rollback)
    release.start()
    started = time.monotonic()
    try:
        assert m.create_stream({}).stream_id == 1
        assert time.monotonic() - started >= 2.0  # it waited for the lock, past lock_timeout
    finally:
        release.join()
        holder.close()
        log.close()


def test_a_commit_waiting_for_the_lock_keeps_its_own_deadline(postgres: Any, url: str) -> None:
    """The wait for the log's commit lock ends with the commit's deadline, not with the
    session's lock_timeout (0.9 x statement_timeout, here 5.4 s), and says what it waited
    for."""
    log, m, holder = _writer_and_a_lock_holder(postgres, f"{url}&statement_timeout=6s")
    started = time.monotonic()
    try:
        with pytest.raises(UnavailableError, match="commit lock"):
            m.commit(lambda s: [RegisterNode("late", 1)], timeout_s=1.0)
        assert time.monotonic() - started < 2.5
    finally:
        holder.rollback()
        holder.close()
    m.create_stream({})  # the lock free again: commits land
    log.close()


def _end_idle_connections(postgres: Any) -> None:
    """What a server restart, a failover or a proxy's idle timeout does to the log's idle
    connections: the server ends them."""
    with psycopg.connect(postgres.url(), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 's3stream' AND pid <> pg_backend_pid()"
        )
    time.sleep(0.2)


def test_a_read_on_a_connection_the_server_ended_while_idle_reconnects(
    postgres: Any, url: str
) -> None:
    """The server ended the log's idle connections (a restart, a failover, a proxy's idle
    timeout): the next read opens a new one instead of failing while the server answers."""
    log = PostgresMetadataLog(url)
    m = MetadataManager(log, clock=ManualClock(), writer_id="w")
    m.load()
    m.create_stream({})
    _end_idle_connections(postgres)
    assert m.refresh() is False
    m.create_stream({})
    assert m.seq == 2
    log.close()


def test_a_commit_on_a_connection_the_server_ended_while_idle_reconnects(
    postgres: Any, url: str, tmp_path: Path
) -> None:
    """A commit is the first call after the server ended the idle connections: its first
    message (lock and read, nothing written) fails on the dead connection, and it runs again
    on a new one, within its deadline. It failed at once ("terminating connection due to
    administrator command"), and a close then left the client's streams open."""

    client = s3stream.open(tmp_path / "s", wal="memory://", metadata=url)
    s = client.create_stream()
    s.append(RecordBatch(b"x"))
    client.flush()
    _end_idle_connections(postgres)
    other = client.create_stream()
    _end_idle_connections(postgres)
    client.close(timeout_s=10)
    with s3stream.open_reader(tmp_path / "s", metadata=url) as reader:
        assert [i.state.name for i in reader.list_streams()] == ["CLOSED", "CLOSED"]
        assert [i.stream_id for i in reader.list_streams()] == [s.stream_id, other.stream_id]


def test_an_optimistic_create_on_a_connection_the_server_ended_while_idle_reruns(
    postgres: Any, url: str
) -> None:
    """With ``serialize_commits=False`` a commit is one INSERT of the next entry: after the
    server ended the idle connections it failed at once while the server answered, where
    reads and serialized commits reconnect. It now runs again on a new connection, and a
    rerun that finds the entry takes it as its own only if it holds its bytes."""
    log = PostgresMetadataLog(url, serialize_commits=False)
    assert log.create_entry(1, b"first")

    _end_idle_connections(postgres)
    assert log.create_entry(2, b"second") is True
    _end_idle_connections(postgres)
    assert log.create_entry(2, b"not mine") is False  # taken: the rerun compares bytes
    assert log.has_entry(2) and not log.has_entry(3)
    log.close()


def test_acknowledged_appends_survive_a_crash_of_a_server_without_synchronous_commit(
    tmp_path: Path,
) -> None:
    """A server tuned with ``synchronous_commit = off`` (a common tuning, and the test
    server's) acknowledges a commit before it is flushed: a crash of PostgreSQL then lost
    commits whose data the uploader had already trimmed from the WAL, so acknowledged
    appends. s3stream's sessions commit with ``on``."""
    from s3stream.testing.postgres import PostgresServer

    server = PostgresServer().start()  # fsync and synchronous_commit off
    try:
        url = server.url(namespace=_namespace())
        client = s3stream.open(tmp_path / "s", node_id="n1", metadata=url)
        s = client.create_stream()
        acked = []
        for i in range(30):
            acked.append(s.append(RecordBatch(b"%d" % i)).base_offset)
            client.flush()  # a commit, then the WAL trimmed past it
        server.crash_restart()
        client.close(timeout_s=5)  # the commits it made are durable: it finds them
        with s3stream.open(tmp_path / "s", node_id="n1", metadata=url) as again:
            got = again.open_stream(s.stream_id).fetch(0, max_bytes=1 << 20).batches
            assert [b.payload for b in got] == [b"%d" % i for i in range(30)]
    finally:
        server.stop()


def test_the_read_after_the_lock_sees_the_previous_holders_entry(url: str) -> None:
    """The lock and the read of missed entries go in one message: the read must still see
    the entry the previous holder committed while this commit waited for the lock (it runs
    on a snapshot taken after the grant), so the commit builds on it and wins at once."""
    import threading

    from s3stream.metadata.codec import encode_entry
    from s3stream.metadata.model import LogEntry

    registry = MetricsRegistry()
    log = PostgresMetadataLog(url)
    m = MetadataManager(
        log, clock=ManualClock(), writer_id="w", instruments=MetadataInstruments(registry)
    )
    m.load()
    assert m.create_stream({}).stream_id == 0 and m.seq == 1
    holder = PostgresMetadataLog(url)
    granted = threading.Event()

    def slow(entries: list[Any]) -> tuple[int, bytes]:
        assert [e.seq for e, _ in entries] == [1]
        granted.set()
        time.sleep(1.0)  # the other commit queues for the lock meanwhile
        return 2, encode_entry(LogEntry(seq=2, ops=(), writer="holder", ts_ms=0))

    thread = threading.Thread(target=lambda: holder.commit_serialized(1, slow))
    thread.start()
    try:
        assert granted.wait(10)
        assert m.create_stream({}).stream_id == 1
    finally:
        thread.join()
    assert m.seq == 3
    family = registry.family(catalog.METADATA_CONFLICTS.name)
    assert family is None or family.total() == 0
    times = log.commit_times
    assert times.commits == 2 and times.lock_s >= 0.5  # it waited its turn
    for each in (log, holder):
        each.close()


def test_serialized_commits_carry_any_namespace_and_payload_bytes(postgres: Any) -> None:
    """A serialized commit writes its values into the text of simple queries: a namespace
    with quotes, backslashes, percent signs and non-ASCII letters, and payloads holding every
    byte value, arrive and read back exactly (through the commit's own read and through a
    reader's), whatever ``standard_conforming_strings`` says."""
    from s3stream.metadata.codec import encode_entry
    from s3stream.metadata.model import CreateStream, LogEntry

    namespace = f"o'b\\r%s%%z-{uuid.uuid4().hex[:6]}\u00e9\u4e2d"
    url = postgres.url(namespace=namespace)
    tags = {"k": "".join(map(chr, range(1, 256))), "q": "';\\x00 %s $$"}
    for conforming in ("on", "off"):
        log = PostgresMetadataLog(url)
        log._main.run(
            lambda conn, v=conforming: conn.execute(
                "SELECT set_config('standard_conforming_strings', %s, false)", (v,)
            )
        )
        assert log.namespace == namespace
        m = _manager(log, f"w-{conforming}")
        created = m.create_stream(tags)
        assert m.get_stream(created.stream_id).tags == tags
        # The next commit is handed the entry just written, read back by the commit itself.
        seen: list[bytes] = []

        def compose(
            entries: list[Any], after: int = m.seq, seen: list[bytes] = seen
        ) -> tuple[int, bytes]:
            seen.extend(data for _, data in entries)
            op = CreateStream(after, tags, 0)
            return after + 1, encode_entry(LogEntry(seq=after + 1, ops=(op,), writer="x", ts_ms=0))

        assert log.commit_serialized(m.seq, compose)
        assert seen == [log.read_entry(m.seq)[1]]
        reader = _manager(PostgresMetadataLog(url), "r")
        assert reader.state.streams[m.seq].tags == tags
        assert log.read_entry(m.seq + 1)[1] == compose([], m.seq)[1]
        for each in (log, reader.log):
            each.close()
    assert _manager(PostgresMetadataLog(url), "r2").log.namespace == namespace


def test_a_failed_commit_leaves_no_transaction_open(url: str) -> None:
    """A commit that fails with the lock held (its build raised, or its insert was refused)
    rolls back: the lock is released and the session's connection is usable at once."""
    log = PostgresMetadataLog(f"{url}&statement_timeout=2s")
    m = _manager(log, "w")
    m.create_stream({})

    def boom(entries: list[Any]) -> tuple[int, bytes]:
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        log.commit_serialized(1, boom)
    # seq 0 breaks the table's CHECK (seq > 0): the INSERT fails inside the transaction.
    with pytest.raises(S3StreamError, match="refused a statement"):
        log.commit_serialized(1, lambda entries: (0, b"x"))
    other = PostgresMetadataLog(f"{url}&statement_timeout=2s")
    started = time.monotonic()
    assert _manager(other, "o").create_stream({}).stream_id == 1  # the lock is free
    assert time.monotonic() - started < 1.5
    assert m.create_stream({}).stream_id == 2  # the same session goes on
    for each in (log, other):
        each.close()
