"""Reading a ``postgresql://`` metadata URL into what the PostgreSQL log connects with.

The URL is libpq's (``postgresql://user:password@host:port/dbname?sslmode=require``, every
libpq parameter allowed in the query), plus parameters of s3stream's own, removed before the
rest goes to libpq:

- ``namespace``: the log's name in the database (default: the client's metadata prefix,
  ``meta``); several stores share one database under different namespaces;
- ``schema``: the PostgreSQL schema holding the tables (default ``s3stream``);
- ``statement_timeout``: the deadline of every SQL call, a duration (``30s``, ``500ms``;
  default: ``ClientSettings.store_timeout_ms``).

libpq's own ``connect_timeout`` (whole seconds) defaults to the statement timeout, at most
10 s and at least 2 s (libpq's minimum). Pure parsing: nothing here connects, and psycopg is
imported only by `check_postgres_url`, to let libpq judge the parameter names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import (
    SplitResult,
    parse_qsl,
    quote,
    unquote,
    urlencode,
    urlsplit,
)

from ..errors import InvalidArgumentError
from ..settings_parse import parse_duration_ms, parse_int
from ..validation import check_text

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMES",
    "PostgresTarget",
    "check_postgres_url",
    "parse_postgres_url",
]

#: URL schemes of the PostgreSQL log (libpq accepts both).
SCHEMES = ("postgresql", "postgres")
#: Where the tables are unless the URL says ``schema=``.
DEFAULT_SCHEMA = "s3stream"
#: A schema name used unquoted in messages and quoted in SQL: plain, lower case, <= 63 bytes.
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: libpq refuses a connect_timeout below 2 s (it raises it to 2).
_MIN_CONNECT_S = 2
_MAX_DEFAULT_CONNECT_S = 10


@dataclass(frozen=True, slots=True)
class PostgresTarget:
    """Where and how the PostgreSQL log connects (see the module docstring)."""

    #: The URL libpq gets: the given one without s3stream's parameters, with timeouts (its
    #: password too: never in a repr).
    conninfo: str = field(repr=False)
    #: ``postgresql://user@host:port/dbname``: no password, for messages.
    display: str
    #: The host part (``host:port``, several for a multi-host URL), for messages.
    host: str
    schema: str
    namespace: str
    statement_timeout_ms: int
    connect_timeout_s: int

    def scrub(self, text: str) -> str:
        """`text` (a libpq message) without the URL's password, as given or decoded: libpq
        quotes a token it cannot parse (``invalid percent-encoded token: "SECRET%pw"``)."""
        parts = urlsplit(self.conninfo)
        secrets = {parts.password or ""}
        secrets |= {v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "password"}
        secrets |= {unquote(s) for s in secrets}
        for secret in sorted((s for s in secrets if s), key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    @property
    def call_deadline_s(self) -> float:
        """How long the client waits for one SQL call before giving up on the connection: the
        server's statement timeout plus a margin, so that the server normally ends a slow call
        first (cleanly) and this only catches a server or network that stopped answering."""
        return self.statement_timeout_ms / 1000 + max(1.0, self.statement_timeout_ms / 10_000)

    @property
    def lock_timeout_ms(self) -> int:
        """The session's lock_timeout: a lock wait ends a little before the statement would be
        cancelled, so that it is told apart (LockNotAvailable: contention, retried until the
        commit's deadline) from a statement that is slow (QueryCanceled: the server or the
        network). A commit may set less for itself (what is left of its deadline)."""
        return max(1, self.statement_timeout_ms * 9 // 10)


def parse_postgres_url(url: str, *, namespace: str, timeout_ms: int) -> PostgresTarget:
    """Read `url`; `namespace` and `timeout_ms` are the defaults the URL may override."""
    check_text("metadata URL", url, allow_empty=False)
    parts = _split(url)
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidArgumentError(f"not a PostgreSQL URL (postgresql://...): {_safe(url)!r}")
    if "@" in parts.path + parts.query + parts.fragment:
        # A user name or password holding '/', '?' or '#' unencoded ends the host part
        # early: the rest of the password would show as a database name or a fragment.
        raise InvalidArgumentError(
            "not a usable PostgreSQL URL: it has an '@' past its host part; percent-encode "
            "'/', '?', '#', '@' and ':' in the user name and password (%2F, %3F, %23, %40, %3A)"
        )
    if parts.fragment:
        raise InvalidArgumentError(f"a PostgreSQL URL has no #fragment: {_safe(url)!r}")
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in ("namespace", "schema", "statement_timeout"):
            if key in ours:
                raise InvalidArgumentError(f"the metadata URL gives {key} twice")
            ours[key] = value
        else:
            rest.append((key, value))
    ns = ours.get("namespace", namespace)
    check_text("namespace", ns, allow_empty=False, max_bytes=200)
    if "\x00" in ns:
        raise InvalidArgumentError(f"namespace cannot hold a NUL character, got {ns!r}")
    schema = ours.get("schema", DEFAULT_SCHEMA)
    if _SCHEMA.fullmatch(schema) is None:
        raise InvalidArgumentError(
            f"schema must be a plain lower-case PostgreSQL name (letters, digits, _; at most "
            f"63), got {schema!r}"
        )
    if schema.startswith("pg_") or schema == "information_schema":
        raise InvalidArgumentError(f"schema {schema!r} is PostgreSQL's own: name another")
    statement_ms = (
        parse_duration_ms(ours["statement_timeout"], name="statement_timeout")
        if "statement_timeout" in ours
        else timeout_ms
    )
    if not 1 <= statement_ms <= _MAX_TIMEOUT_MS:
        raise InvalidArgumentError(
            f"statement_timeout must be > 0 and at most {_MAX_TIMEOUT_MS} ms (PostgreSQL's "
            f"limit), got {statement_ms} ms"
        )
    given = dict(rest).get("connect_timeout")
    if given is not None:
        connect_s = parse_int(given, name="connect_timeout (whole seconds)")
        if connect_s < 1:
            raise InvalidArgumentError(
                f"connect_timeout must be >= 1 s (0 would wait forever), got {given!r}"
            )
    else:
        connect_s = min(_MAX_DEFAULT_CONNECT_S, math.ceil(statement_ms / 1000))
        rest.append(("connect_timeout", str(connect_s)))
    connect_s = max(_MIN_CONNECT_S, connect_s)
    # Joined by hand: urlunsplit drops the "//" of an empty host (the local socket's URL,
    # ``postgresql:///dbname``), which libpq then cannot read.
    # quote, not urlencode's default quote_plus: libpq reads no '+' as a space
    # (``options=-c search_path=x`` would reach the server as "+search_path").
    query = urlencode(rest, quote_via=quote)
    conninfo = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")
    host = parts.netloc.rpartition("@")[2] or "localhost (the local socket)"
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    display = f"postgresql://{user + '@' if user else ''}{parts.netloc.rpartition('@')[2]}"
    # The path is percent-encoded already: quoted again, "%20" would show as "%2520".
    display += quote(unquote(parts.path), safe="/") if parts.path else ""
    return PostgresTarget(
        conninfo=conninfo,
        display=display,
        host=host,
        schema=schema,
        namespace=ns,
        statement_timeout_ms=statement_ms,
        connect_timeout_s=connect_s,
    )


#: The largest timeout PostgreSQL takes (its settings are int milliseconds).
_MAX_TIMEOUT_MS = 2**31 - 1


def _split(url: str) -> SplitResult:
    """`urlsplit`, its `ValueError` (an unclosed IPv6 bracket, a bad port) as
    `InvalidArgumentError`."""
    try:
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2]
        # A multi-host URL (libpq: ``host1:5432,host2:5433``) has a port per host.
        for host in hosts.split(","):
            urlsplit(f"//{host}").port  # noqa: B018 - parsed on access: a bad port raises
    except ValueError:
        # Not the parser's message: it quotes the value it took for a port, which is the
        # password when the password holds an unencoded '/', '?' or '#'.
        raise InvalidArgumentError(
            "not a usable PostgreSQL URL: a port that is not a number, or an unclosed '[' "
            "(percent-encode '/', '?', '#', '@' and ':' in the user name and password)"
        ) from None
    return parts


def _safe(url: str) -> str:
    """`url` without a password, for messages: all between ``://`` and the last ``@`` but
    the user name (a password holding an unencoded '/', '?' or '#' reaches past the host
    part a URL parser would see), and any ``password=`` parameter."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<not a URL>"
    userinfo, at, after = rest.rpartition("@")
    if at:
        user = re.split(r"[:/?#]", userinfo, maxsplit=1)[0]
        rest = f"{user}@{after}"
    return f"{scheme}://" + re.sub(r"(?i)(password=)[^&#]*", r"\1***", rest)


def check_postgres_url(url: str) -> None:
    """Refuse a URL the PostgreSQL log would refuse only when it connects: s3stream's own
    parameters (`parse_postgres_url`) and, when psycopg is installed, libpq's parameter names
    (libpq parses the URL without connecting). An open checks this before it writes
    anything: a typo in the query was found after the store's directories and the WAL's
    lock file were made."""
    target = parse_postgres_url(url, namespace="meta", timeout_ms=1000)
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return  # the factory says what is missing
    try:
        conninfo_to_dict(target.conninfo)
    except psycopg.Error as exc:
        raise InvalidArgumentError(
            f"not a usable PostgreSQL URL ({target.display}): {target.scrub(str(exc).strip())}"
        ) from None
