"""What the kit's throw-away server launchers share (Azurite, fake-gcs-server, SeaweedFS,
PostgreSQL, moto): one way to pick loopback ports, wait for a server, stop a process and run
a server as a child process.

- `ServerLifecycle`: `start` and `stop`; a ``with`` block starts the server and stops it (the
  `Closeable` protocol, `close` being `stop`).
- `free_ports`: loopback ports free right now.
- `wait_until`: call a probe until it succeeds, or raise the launcher's ``...Unavailable``
  error after a deadline (with the server's log tail).
- `stop_process`: by PID: SIGTERM, SIGKILL if it lingers (SIGCONT too: a frozen process acts
  on no other signal).
- `ServerProcess`: a server that is one child process on 127.0.0.1, its output in a log file
  in its data directory (a temporary one, removed on `stop`, unless given), started again
  with fresh ports when it exits at once (a port picked as free was taken before it bound
  it); with `kill`, `frozen` (SIGSTOP/SIGCONT) and `log_tail` for tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Self

from .._closeable import Closeable

__all__ = [
    "ServerLifecycle",
    "ServerProcess",
    "StopWaiting",
    "free_ports",
    "log_tail",
    "stop_process",
    "wait_until",
]

#: Starts tried with fresh ports when the server exits at once.
START_TRIES = 3


class ServerLifecycle(Closeable):
    """A server that `start` starts and `stop` stops; a ``with`` block does both."""

    @abstractmethod
    def start(self) -> Self:
        """Start the server (nothing if it runs) and wait until it answers."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the server (idempotent)."""

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> Self:
        return self.start()


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 right now (held open together while picking)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


class StopWaiting(Exception):
    """Raised by a probe of `wait_until` when waiting longer is pointless (the server exited)."""


def wait_until(
    probe: Callable[[], object],
    timeout_s: float,
    *,
    what: str,
    error: type[Exception],
    detail: Callable[[], str] | None = None,
    interval_s: float = 0.05,
) -> None:
    """Call `probe` until it returns without raising. After `timeout_s`, raise `error` saying
    `what` did not happen, with the probe's last error and `detail` (a log tail); at once, with
    its reason, when the probe raises `StopWaiting`."""
    deadline = time.monotonic() + timeout_s

    def tail() -> str:
        return f"\n{detail()}" if detail is not None else ""

    while True:
        try:
            probe()
            return
        except StopWaiting as exc:
            raise error(f"{exc}{tail()}") from None
        except Exception as exc:
            last: Exception = exc
        if time.monotonic() >= deadline:
            raise error(f"{what} within {timeout_s:.0f}s (last error: {last}){tail()}")
        time.sleep(interval_s)


def stop_process(process: subprocess.Popen[Any] | int, timeout_s: float) -> None:
    """Stop a process (a child, or any PID): SIGTERM, then SIGKILL when it has not exited
    within `timeout_s`, each followed by SIGCONT (a frozen process would not act on SIGTERM);
    returns once it is gone (a child reaped, a zombie counted as gone)."""
    if isinstance(process, int):
        pid = process

        def gone() -> bool:
            return not _alive(pid)
    else:
        pid = process.pid

        def gone() -> bool:
            return process.poll() is not None

    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        if gone():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if gone():
                return
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie left unreaped by a container's init does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def log_tail(path: Path | None, lines: int = 40) -> str:
    """The last `lines` lines of the log at `path`."""
    if path is None or not path.exists():
        return "(no log)"
    with open(path, errors="replace") as f:
        return "".join(deque(f, maxlen=lines))


class ServerProcess(ServerLifecycle):
    """A server that is one child process (see the module docstring). Subclasses say how to
    find (`_locate`) and run (`_pick_ports`, `_command`, `_environment`) it, when it answers
    (`_readiness_probe`), and what to do once it does (`_started`) or has exited (`_exited`).

    Args:
        data_dir: Where the server keeps its data and log; a temporary directory (removed on
            `stop`) when None.
        start_timeout_s: How long `start` waits for the server to answer.
        stop_timeout_s: How long `stop` waits after SIGTERM before it kills the process.
        executable: Path of the server's program; `_locate` finds it when None.
    """

    #: The program's name, in messages.
    program: ClassVar[str] = "server"
    #: The error saying why the server cannot run here (the launcher's ``...Unavailable``).
    unavailable: ClassVar[type[RuntimeError]] = RuntimeError
    #: What `start` says when `_locate` finds no program.
    missing: ClassVar[str] = ""
    #: Prefix of the temporary data directory's name.
    dir_prefix: ClassVar[str] = "s3stream-server-"
    #: The log file's name in the data directory.
    log_name: ClassVar[str] = "server.log"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        start_timeout_s: float,
        stop_timeout_s: float,
        executable: str | None = None,
    ) -> None:
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._owned_dir: str | None = None
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._executable = executable
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    # -- what subclasses say --------------------------------------------------------------------

    @abstractmethod
    def _locate(self) -> str | None:
        """Path of the program, None if there is none."""

    def _pick_ports(self) -> None:
        """Choose the ports of the next start (`free_ports`)."""

    @abstractmethod
    def _command(self, executable: str) -> list[str]:
        """The command line that runs the server on the picked ports."""

    def _environment(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    @abstractmethod
    def _readiness_probe(self) -> Callable[[], object]:
        """A call that raises until the server answers."""

    def _started(self) -> None:
        """What `start` does once the server answers (create a bucket)."""

    def _exited(self) -> None:
        """What is left to clean up once the process is gone."""

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server, wait until it answers, then `_started`."""
        if self._process is not None:
            return self
        self._executable = self._executable or self._locate()
        if self._executable is None:
            raise self.unavailable(self.missing)
        if self._data_dir is None:
            self._owned_dir = tempfile.mkdtemp(prefix=self.dir_prefix)
            self._data_dir = Path(self._owned_dir)
        self._data_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = self._data_dir / self.log_name
        try:
            for attempt in range(START_TRIES):
                self._pick_ports()
                self._spawn()
                try:
                    self._wait_ready()
                    break
                except self.unavailable:
                    if self.running or attempt + 1 == START_TRIES:
                        raise
                    # Most likely a port picked as free was taken before the server bound it.
                    self._terminate()
            self._started()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server by its PID (`stop_process`) and remove an owned data dir
        (idempotent)."""
        self._terminate()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None
            self._data_dir = None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (its data dir stays)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=self._stop_timeout_s)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Stop the server with SIGSTOP while inside (its sockets still accept connections,
        nothing answers: the worst case for a client), SIGCONT on leaving (`frozen_tree`)."""
        pid = self.pid
        if pid is None:
            raise self.unavailable("frozen() needs a started server")
        with frozen_tree(pid):
            yield

    def _spawn(self) -> None:
        """Run the program on the picked ports, its output appended to the log."""
        assert self._executable is not None and self._log_path is not None
        with open(self._log_path, "ab") as log:
            try:
                self._process = subprocess.Popen(
                    self._command(self._executable),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._environment(),
                    cwd=self._data_dir,
                )
            except OSError as exc:  # not there, not executable, not for this machine
                raise self.unavailable(f"cannot run {self._executable!r}: {exc}") from exc

    def _wait_ready(self) -> None:
        probe = self._readiness_probe()

        def answers() -> None:
            process = self._process
            assert process is not None
            if process.poll() is not None:
                raise StopWaiting(
                    f"{self.program} exited with code {process.returncode} during start"
                )
            probe()

        wait_until(
            answers,
            self._start_timeout_s,
            what=f"{self.program} did not answer",
            error=self.unavailable,
            detail=self.log_tail,
        )

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, self._stop_timeout_s)
            self._exited()

    # -- what tests need ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the server, while started."""
        return self._process.pid if self._process is not None else None

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's output."""
        return log_tail(self._log_path, lines)


@contextlib.contextmanager
def frozen_tree(pid: int) -> Iterator[None]:
    """Stop process `pid` with SIGSTOP while inside, and then its descendants (PostgreSQL's
    backends answer the connections they hold while the postmaster is stopped), once it can
    fork no more; SIGCONT to each on leaving."""
    stopped = [pid]
    os.kill(pid, signal.SIGSTOP)
    try:
        _wait_stopped(pid)
        for child in _descendants(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGSTOP)
                stopped.append(child)
                _wait_stopped(child)
        yield
    finally:
        for p in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (children first), from /proc (none where there is none)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # The parent's pid is the second field after the parenthesised command name.
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _wait_stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Return once every thread of `pid` is stopped (SIGSTOP takes effect asynchronously: on
    a busy machine a server thread mid-request answered it after `kill` had returned), or
    after `timeout_s` where /proc does not tell."""
    deadline = time.monotonic() + timeout_s
    task_dir = f"/proc/{pid}/task"
    while time.monotonic() < deadline:
        try:
            states = []
            for tid in os.listdir(task_dir):
                with open(f"{task_dir}/{tid}/stat", "rb") as f:
                    # The state follows the parenthesised command name, which may hold spaces.
                    states.append(f.read().rsplit(b")", 1)[1].split()[0])
        except OSError:
            return  # no /proc here, or the process is gone
        if all(state in (b"T", b"t") for state in states):
            return
        time.sleep(0.01)
