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

__all__ = ["SCHEMA_VERSION", "check_version", "create_tables", "table"]

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


def table(schema: str, name: str) -> sql.Identifier:
    """``"schema"."name"``, quoted."""
    return sql.Identifier(schema, name)


def create_tables(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Create the schema's tables if missing (one transaction), then `check_version`."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
        for statement in _DDL:
            conn.execute(
                sql.SQL(statement).format(
                    schema=sql.Identifier(schema), version=sql.Literal(SCHEMA_VERSION)
                )
            )
    check_version(conn, schema)


def check_version(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Refuse a database laid out by a newer s3stream (`UndefinedTable` if there are no
    tables yet: the caller decides what that means)."""
    row = conn.execute(
        sql.SQL("SELECT max(version) FROM {}").format(table(schema, "schema_version"))
    ).fetchone()
    found = row[0] if row is not None else None
    if isinstance(found, int) and found > SCHEMA_VERSION:
        raise InvalidArgumentError(
            f"the metadata tables in schema {schema!r} have layout version {found}, newer than "
            f"this s3stream's {SCHEMA_VERSION}: upgrade s3stream to use them"
        )
