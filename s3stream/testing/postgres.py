"""Run a throw-away PostgreSQL server on loopback, for tests, the conformance kit and benches.

`PostgresServer` runs the machine's own binaries (``initdb``, ``pg_ctl``; found with
`find_postgres_bin`): a fresh cluster in a temporary directory, listening on 127.0.0.1 only, on
a free port, with no Unix socket, trust authentication for its superuser ``s3stream`` (test
connections come from loopback only) and a database ``s3stream``. PostgreSQL refuses to run as
root, so when this process is root the server runs as the unprivileged user ``nobody``
(through ``runuser``), in a directory that user owns. `stop` stops it by its postmaster's PID
(``pg_ctl stop -m fast``, then SIGTERM, then SIGKILL) and removes the directory::

    with PostgresServer() as server:
        url = server.url()           # postgresql://s3stream@127.0.0.1:PORT/s3stream
        s3stream.open("./data", metadata=url)

`PostgresUnavailable` says why a server cannot run here (no binaries, no ``runuser``); a test
fixture turns it into a skip. Nothing here imports psycopg, except `create_database`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ._server_process import ServerLifecycle, free_ports, frozen_tree, stop_process, wait_until

__all__ = ["PostgresServer", "PostgresUnavailable", "find_postgres_bin"]

#: Where Debian and Ubuntu install the server binaries, one directory per major version.
_DEBIAN_GLOB = "/usr/lib/postgresql/*/bin"
#: Environment variable naming the directory of ``initdb`` and ``pg_ctl``, if set.
BIN_ENV = "S3STREAM_POSTGRES_BIN"
_SUPERUSER = "s3stream"
_DATABASE = "s3stream"
_START_TRIES = 3


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can run here (missing binaries or user), or it did not start."""


def find_postgres_bin(preferred_major: int = 15) -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: $S3STREAM_POSTGRES_BIN, else
    /usr/lib/postgresql/<`preferred_major`>/bin, else the newest such directory, else the
    directory of ``initdb`` on PATH; None if there is none."""
    candidates: list[Path] = []
    if os.environ.get(BIN_ENV):
        candidates.append(Path(os.environ[BIN_ENV]))
    candidates.append(Path(f"/usr/lib/postgresql/{preferred_major}/bin"))

    def major(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else 0

    candidates += [Path(p) for p in sorted(glob.glob(_DEBIAN_GLOB), key=major, reverse=True)]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for directory in candidates:
        if all(os.access(directory / tool, os.X_OK) for tool in ("initdb", "pg_ctl")):
            return directory
    return None


class PostgresServer(ServerLifecycle):
    """A PostgreSQL server on ``127.0.0.1:<port>`` (see the module docstring).

    Args:
        fsync: Keep PostgreSQL's durability (fsync, synchronous commit). Off by default for
            tests, where only crash-consistency of the client matters and speed does; a bench
            comparing durable stores turns it on.
        max_connections: The server's connection limit (each log holds up to two).
        start_timeout_s: How long `start` waits for the server to accept connections.
        bin_dir: Directory of ``initdb`` and ``pg_ctl``; `find_postgres_bin` when None.
        run_as: The user running the server when this process is root (default ``nobody``).
    """

    def __init__(
        self,
        *,
        fsync: bool = False,
        max_connections: int = 200,
        start_timeout_s: float = 60.0,
        bin_dir: str | os.PathLike[str] | None = None,
        run_as: str = "nobody",
    ) -> None:
        self._fsync = fsync
        self._max_connections = max_connections
        self._start_timeout_s = start_timeout_s
        self._bin = Path(bin_dir) if bin_dir is not None else None
        self._run_as = run_as
        self._dir: Path | None = None
        self._pid: int | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        """Create the cluster and start the server; wait until it accepts connections."""
        if self._pid is not None:
            return self
        bin_dir = self._bin or find_postgres_bin()
        if bin_dir is None:
            raise PostgresUnavailable(
                "no PostgreSQL server binaries (initdb, pg_ctl) found: install postgresql "
                f"(e.g. apt-get install postgresql-15) or set {BIN_ENV}"
            )
        self._bin = bin_dir
        prefix = self._prefix()
        self._dir = Path(tempfile.mkdtemp(prefix="s3stream-pg-"))
        try:
            if prefix:
                user = pwd.getpwnam(self._run_as)
                os.chown(self._dir, user.pw_uid, user.pw_gid)
            self._run(
                [
                    str(bin_dir / "initdb"),
                    "-D", str(self.data_dir), "-U", _SUPERUSER, "-A", "trust",
                    "-E", "UTF8", "--locale=C", "--no-sync",
                ],
                "initdb",
            )  # fmt: skip
            for attempt in range(_START_TRIES):
                self.port = free_ports(1)[0]
                try:
                    self._pg_ctl_start()
                    break
                except PostgresUnavailable:
                    # Most likely the port picked as free was taken before the server bound it.
                    if attempt + 1 == _START_TRIES:
                        raise
            self._pid = self._read_pid()
            self._create_default_database()
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server (fast shutdown, by its PID if pg_ctl fails) and remove its
        directory. Idempotent."""
        directory, pid = self._dir, self._pid
        self._pid = None
        if directory is not None and pid is None and (directory / "data").is_dir():
            with contextlib.suppress(PostgresUnavailable, ValueError, OSError):
                pid = self._read_pid()
        if pid is not None:
            assert self._bin is not None
            with contextlib.suppress(PostgresUnavailable, subprocess.TimeoutExpired):
                self._run(
                    [str(self._bin / "pg_ctl"), "stop", "-D", str(self.data_dir),
                     "-m", "fast", "-w", "-t", "30"],
                    "pg_ctl stop",
                )  # fmt: skip
            stop_process(pid, 30)  # if pg_ctl left it running
        self._dir = None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def crash_restart(self) -> None:
        """Crash the server (``pg_ctl stop -m immediate``: every process ends at once, what
        it had not written is lost, as in a crash of PostgreSQL, not of the machine) and
        start it again on the same data and port."""
        assert self._bin is not None and self._pid is not None, "the server is not running"
        self._run(
            [str(self._bin / "pg_ctl"), "stop", "-D", str(self.data_dir),
             "-m", "immediate", "-w", "-t", "30"],
            "pg_ctl stop -m immediate",
        )  # fmt: skip
        self._pg_ctl_start()
        self._pid = self._read_pid()

    # -- what tests use --------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """The cluster's directory."""
        if self._dir is None:
            raise PostgresUnavailable("the server is not started")
        return self._dir / "data"

    @property
    def pid(self) -> int | None:
        """The postmaster's PID while running."""
        return self._pid

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The postmaster and every server process stopped with SIGSTOP while inside: open
        connections and new ones alike get no answer (the kernel still accepts them);
        SIGCONT on leaving."""
        if self._pid is None:
            raise PostgresUnavailable("frozen() needs a started server")
        with frozen_tree(self._pid):
            yield

    def url(self, database: str = _DATABASE, **params: str) -> str:
        """``postgresql://s3stream@127.0.0.1:PORT/<database>`` with `params` as its query."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{_SUPERUSER}@127.0.0.1:{self.port}/{database}" + (
            f"?{query}" if query else ""
        )

    def create_database(self, name: str) -> str:
        """Create database `name` (if missing) and return its URL. Needs psycopg."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    # -- internals ------------------------------------------------------------------------------

    def _prefix(self) -> list[str]:
        """The command prefix that runs a tool as the unprivileged user when we are root."""
        if os.geteuid() != 0:
            return []
        runuser = shutil.which("runuser")
        if runuser is None:
            raise PostgresUnavailable(
                "running as root, and PostgreSQL refuses root: 'runuser' (util-linux) is "
                f"needed to run it as {self._run_as!r}"
            )
        try:
            pwd.getpwnam(self._run_as)
        except KeyError:
            raise PostgresUnavailable(f"no user {self._run_as!r} to run PostgreSQL as") from None
        return [runuser, "-u", self._run_as, "--"]

    def _run(self, argv: list[str], what: str, timeout_s: float = 120) -> None:
        done = subprocess.run(
            [*self._prefix(), *argv],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd="/",
            check=False,
        )
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}"
            )

    def _pg_ctl_start(self) -> None:
        assert self._bin is not None and self._dir is not None
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-c port={self.port}",
            "-c unix_socket_directories=''",
            f"-c max_connections={self._max_connections}",
            "-c shared_buffers=32MB",
        ]
        if not self._fsync:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._run(
            [str(self._bin / "pg_ctl"), "start", "-D", str(self.data_dir), "-w",
             "-t", str(int(self._start_timeout_s)), "-l", str(self._dir / "server.log"),
             "-o", " ".join(options)],
            "pg_ctl start",
            timeout_s=self._start_timeout_s + 30,
        )  # fmt: skip
        wait_until(
            lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close(),
            self._start_timeout_s,
            what=f"the server did not listen on port {self.port}",
            error=PostgresUnavailable,
        )

    def _read_pid(self) -> int:
        text = (self.data_dir / "postmaster.pid").read_text()
        return int(text.split("\n", 1)[0])

    def _create_default_database(self) -> None:
        assert self._bin is not None
        createdb = self._bin / "createdb"
        if os.access(createdb, os.X_OK):
            self._run(
                [str(createdb), "-h", "127.0.0.1", "-p", str(self.port), "-U", _SUPERUSER,
                 _DATABASE],
                "createdb",
            )  # fmt: skip
        else:  # pragma: no cover - createdb ships with initdb everywhere we know
            self.create_database(_DATABASE)
