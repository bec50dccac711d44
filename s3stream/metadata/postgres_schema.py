"""The PostgreSQL log's tables: their definition, creation and version.

Schema version 1 (docs/metadata.md, "The PostgreSQL backend", shows the same)::

    {schema}.schema_version       (version PK, installed_at)
    {schema}.namespaces           (namespace PK, namespace_id UNIQUE, store_id, object_store,
                                   created_at): one row per log; store_id binds it to one
                                   object store (binding.py)
    {schema}.log_entries          (namespace, seq) PK, payload bytea, created_at
    {schema}.checkpoints          (namespace, seq) PK, payload bytea, created_at
    {schema}.checkpoint_pointers  namespace PK, seq

Payloads are the codec's bytes, exactly those the object-store log keeps in its objects, so a
log can be copied from one backend to the other byte for byte and every reader checks the same
frames and checksums. Fencing is the primary key of ``log_entries``: ``INSERT ... ON CONFLICT
DO NOTHING`` lets exactly one transaction create a given (namespace, seq).

Tables are created if missing, by the first writer, in one transaction that holds a
transaction-scoped advisory lock: concurrent ``CREATE TABLE IF NOT EXISTS`` can otherwise fail
on the catalog's unique index. The lock serializes table creation only, never a commit. A later
layout gets a new version number and a migration here; a database whose version is newer than
this code's is refused (reading or writing), never misread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg import sql

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    import psycopg

__all__ = ["SCHEMA_VERSION", "check_layout", "check_version", "create_tables", "table"]

#: The layout this code reads and writes.
SCHEMA_VERSION = 1

#: Key of the advisory lock serializing table creation (any constant; "s3st" in ASCII).
_DDL_LOCK = 0x73337374

_DDL = (
    "CREATE SCHEMA IF NOT EXISTS {schema}",
    """CREATE TABLE IF NOT EXISTS {schema}.schema_version (
        version integer PRIMARY KEY,
        installed_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS {schema}.namespaces (
        namespace text PRIMARY KEY,
        namespace_id text NOT NULL UNIQUE,
        store_id text,
        object_store text,
        created_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS {schema}.log_entries (
        namespace text NOT NULL,
        seq bigint NOT NULL CHECK (seq > 0),
        payload bytea NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (namespace, seq))""",
    """CREATE TABLE IF NOT EXISTS {schema}.checkpoints (
        namespace text NOT NULL,
        seq bigint NOT NULL CHECK (seq > 0),
        payload bytea NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (namespace, seq))""",
    """CREATE TABLE IF NOT EXISTS {schema}.checkpoint_pointers (
        namespace text PRIMARY KEY,
        seq bigint NOT NULL CHECK (seq > 0))""",
    "INSERT INTO {schema}.schema_version (version) VALUES ({version}) ON CONFLICT DO NOTHING",
)


#: Each table's columns as PostgreSQL names their types (``format_type``), in order: a table
#: of one of these names that differs is another application's, never written to.
_LAYOUT: dict[str, tuple[tuple[str, str], ...]] = {
    "schema_version": (("version", "integer"), ("installed_at", "timestamp with time zone")),
    "namespaces": (
        ("namespace", "text"),
        ("namespace_id", "text"),
        ("store_id", "text"),
        ("object_store", "text"),
        ("created_at", "timestamp with time zone"),
    ),
    "log_entries": (
        ("namespace", "text"),
        ("seq", "bigint"),
        ("payload", "bytea"),
        ("created_at", "timestamp with time zone"),
    ),
    "checkpoints": (
        ("namespace", "text"),
        ("seq", "bigint"),
        ("payload", "bytea"),
        ("created_at", "timestamp with time zone"),
    ),
    "checkpoint_pointers": (("namespace", "text"), ("seq", "bigint")),
}

#: The unique keys each table must have: the primary keys are the fencing (one transaction
#: creates a given entry), so a table of the right columns without them is not the log's.
_KEYS: dict[str, frozenset[tuple[str, ...]]] = {
    "schema_version": frozenset({("version",)}),
    "namespaces": frozenset({("namespace",), ("namespace_id",)}),
    "log_entries": frozenset({("namespace", "seq")}),
    "checkpoints": frozenset({("namespace", "seq")}),
    "checkpoint_pointers": frozenset({("namespace",)}),
}

_UNIQUE_KEYS = """SELECT c.relname, array_agg(a.attname::text ORDER BY k.ord)
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
    WHERE n.nspname = %s AND c.relname = ANY(%s) AND i.indisunique AND i.indpred IS NULL
    GROUP BY c.relname, i.indexrelid"""

_COLUMNS = """SELECT c.relname, c.relkind, a.attname, format_type(a.atttypid, a.atttypmod)
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE n.nspname = %s AND c.relname = ANY(%s)
    ORDER BY c.relname, a.attnum"""


def check_layout(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Refuse, before anything is read or written, a schema where a relation of one of the
    log's table names is not the log's table (another application's ``schema_version``, say):
    `InvalidArgumentError` naming it. Missing tables are fine (created by the first writer)."""
    found: dict[str, list[tuple[str, str]]] = {}
    kinds: dict[str, str] = {}
    for name, kind, column, type_name in conn.execute(_COLUMNS, (schema, list(_LAYOUT))):
        kinds[str(name)] = str(kind)
        if column is not None:
            found.setdefault(str(name), []).append((str(column), str(type_name)))
    keys: dict[str, set[tuple[str, ...]]] = {}
    for name, columns in conn.execute(_UNIQUE_KEYS, (schema, list(_LAYOUT))):
        assert isinstance(columns, list)  # (a text[] reads as a list)
        keys.setdefault(str(name), set()).add(tuple(str(c) for c in columns))
    for name, kind in sorted(kinds.items()):
        if (
            kind in ("r", "p")
            and tuple(found.get(name, ())) == _LAYOUT[name]
            and _KEYS[name] <= keys.get(name, set())
        ):
            continue
        raise InvalidArgumentError(
            f"schema {schema!r} holds a {'table' if kind in ('r', 'p') else 'relation'} "
            f"named {name!r} that is not s3stream's layout {SCHEMA_VERSION} (another "
            f"application's, or a newer s3stream's: columns "
            f"{', '.join(f'{c} {t}' for c, t in found.get(name, [])) or 'none'}; unique "
            f"keys {sorted(keys.get(name, set())) or 'none'}): "
            "give the metadata URL a schema of its own (?schema=...)"
        )


def table(schema: str, name: str) -> sql.Identifier:
    """``"schema"."name"``, quoted."""
    return sql.Identifier(schema, name)


_TABLES = """SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = ANY(%s) AND c.relkind IN ('r', 'p')"""


def create_tables(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Create the schema's tables if missing (one transaction), then `check_version`. Where
    they all exist (made by an earlier writer, or by a DBA) no DDL runs: PostgreSQL checks
    the CREATE privilege even for ``CREATE ... IF NOT EXISTS`` of what exists, and writers
    need only SELECT, INSERT and UPDATE on the tables (and USAGE on the schema)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
        check_layout(conn, schema)
        row = conn.execute(_TABLES, (schema, list(_LAYOUT))).fetchone()
        statements = _DDL[-1:] if row is not None and row[0] == len(_LAYOUT) else _DDL
        for statement in statements:
            conn.execute(
                sql.SQL(statement).format(
                    schema=sql.Identifier(schema), version=sql.Literal(SCHEMA_VERSION)
                )
            )
    check_version(conn, schema)


def check_version(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Refuse a database laid out by a newer s3stream, or tables of the log's names that
    are not the log's (`check_layout`); `UndefinedTable` if there are no tables yet: the
    caller decides what that means."""
    check_layout(conn, schema)
    row = conn.execute(
        sql.SQL("SELECT max(version) FROM {}").format(table(schema, "schema_version"))
    ).fetchone()
    found = row[0] if row is not None else None
    if isinstance(found, int) and found > SCHEMA_VERSION:
        raise InvalidArgumentError(
            f"the metadata tables in schema {schema!r} have layout version {found}, newer than "
            f"this s3stream's {SCHEMA_VERSION}: upgrade s3stream to use them"
        )
