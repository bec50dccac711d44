"""Throw-away S3 servers on loopback for tests: one interface, SeaweedFS first, moto as fallback.

`LoopbackS3Server` is what a test sees of a server: the bucket, the credentials, `endpoint_url`,
`storage_options()` for `S3ObjectStore`, `client(**config)` for raw boto3 calls and
`make_bucket`. `SeaweedS3Server` (``seaweedfs``) and `MotoS3Server` (here) implement it once,
so the fallback cannot drift from the server it stands in for.

`start_s3_server` starts SeaweedFS, or moto's server when ``weed`` cannot run (or when asked
to). moto is a model of S3's API, not a storage server: it runs in the test process, sharing
moto's one in-process backend with every other moto server there (use distinct bucket names),
and its conditional PUT checks, then writes, without a lock, so two racing creators could both
win. `MotoS3Server` serializes conditional writes in front of it to give them S3's documented
semantics (exactly one winner), which s3stream's tests depend on; `atomic_conditional_create`
says whether that worked.

Every client built here gets explicit test credentials and a region, so that no SDK looks for
credentials elsewhere (instance metadata included); the servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from ._server_process import stop_process
from .store_servers import LoopbackStoreServer

__all__ = [
    "SERVER_CHOICES",
    "LoopbackS3Server",
    "MotoProcessS3Server",
    "MotoS3Server",
    "start_s3_server",
]

#: What `start_s3_server` may be asked for: SeaweedFS, falling back to moto ("auto"), or one.
SERVER_CHOICES = ("auto", "seaweedfs", "moto")


class LoopbackS3Server(LoopbackStoreServer):
    """The interface tests use, whichever S3 server runs (subclasses set the attributes)."""

    #: Which server this is ("seaweedfs", "moto").
    kind: str = ""
    scheme = "s3"
    #: Whether concurrent conditional creates of one key have exactly one winner here.
    atomic_conditional_create: bool = True
    #: Whether requests signed with wrong credentials are refused (403), as S3 does.
    checks_credentials: bool = True
    #: The credentials the server accepts.
    access_key: str
    secret_key: str

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for `S3ObjectStore` / ``storage_options`` of an ``s3://`` URL."""
        return {
            "endpoint_url": self.endpoint_url,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": "us-east-1",
        }

    def client(self, **config: Any) -> Any:
        """A fresh boto3 S3 client for this server (botocore ``Config`` keyword arguments;
        ``max_attempts`` sets the retry budget, 3 by default)."""
        import boto3
        from botocore.config import Config

        max_attempts = config.pop("max_attempts", 3)
        cfg = Config(
            s3={"addressing_style": "path"},
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            **config,
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=cfg,
        )

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` (no error if it exists); returns the name."""
        client = self.client()
        with contextlib.suppress(
            client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
        ):
            client.create_bucket(Bucket=name)
        return name

    def raw_get(self, key: str) -> bytes | None:
        client = self.client()
        try:
            reply = client.get_object(Bucket=self.bucket, Key=key)
        except client.exceptions.NoSuchKey:
            return None
        return bytes(reply["Body"].read())

    def raw_put(self, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)


class MotoS3Server(LoopbackS3Server):
    """moto's S3 server (``moto[server]``) in a thread of this process, on a free loopback
    port. See the module docstring for how it differs from a storage server."""

    kind = "moto"
    atomic_conditional_create = False
    checks_credentials = False  # moto accepts any signature unless told to model IAM

    def __init__(
        self,
        *,
        bucket: str = "s3stream-test",
        access_key: str = "s3stream-access",
        secret_key: str = "s3stream-secret-key",
    ) -> None:
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self._server: Any = None

    def start(self) -> MotoS3Server:
        if self._server is not None:
            return self
        from moto.server import ThreadedMotoServer

        # Port 0: the OS picks a free port as it binds, so no other process can take it first.
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        self._server = server
        self._port = int(server.get_host_and_port()[1])
        # The WSGI server moto built (werkzeug serves every request with its `app`).
        wsgi: Any = getattr(server, "_server", None)
        self.atomic_conditional_create = hasattr(wsgi, "app")
        if self.atomic_conditional_create:
            wsgi.app = _ConditionalWritesInTurn(wsgi.app)
        try:
            self.make_bucket(self.bucket)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()


class MotoProcessS3Server(LoopbackS3Server):
    """moto's S3 server in a child process (`moto_process`) that checks SigV4 signatures and
    IAM permissions, as S3 does: requests signed with wrong credentials get 403. The
    credentials are the IAM user's key the child created (known after `start`). Stopped by
    closing its standard input, then by signal, so it never outlives the test process."""

    kind = "moto"
    checks_credentials = True

    def __init__(self, *, bucket: str = "s3stream-test", start_timeout_s: float = 60.0) -> None:
        self.bucket = bucket
        self.access_key = ""
        self.secret_key = ""
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> MotoProcessS3Server:
        if self._process is not None:
            return self
        process = subprocess.Popen(
            [sys.executable, "-m", "s3stream.testing.moto_process", self.bucket],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"},
        )
        self._process = process
        assert process.stdout is not None
        ready: dict[str, Any] = {}
        reader = threading.Thread(
            target=lambda: ready.update(json.loads(process.stdout.readline() or "{}")),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(self._start_timeout_s)
        if "port" not in ready:
            self.stop()
            raise RuntimeError(f"moto's S3 server did not start within {self._start_timeout_s:g} s")
        self._port = int(ready["port"])
        self.access_key = str(ready["access_key"])
        self.secret_key = str(ready["secret_key"])
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)  # it exits when its standard input closes
        stop_process(process, 10)
        if process.stdout is not None:
            process.stdout.close()

    @property
    def pid(self) -> int | None:
        """The server process's PID while it runs."""
        return self._process.pid if self._process is not None else None


_WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _ConditionalWritesInTurn:
    """WSGI middleware: one conditional write (a PUT with ``If-None-Match`` or ``If-Match``)
    at a time, so that moto's check-then-write decides each like S3 does; other requests
    run concurrently as before."""

    def __init__(self, app: _WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        conditional = environ.get("REQUEST_METHOD") == "PUT" and (
            "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ
        )
        if not conditional:
            return self._app(environ, start_response)
        with self._lock:
            # moto answers with a finished body: materialize it under the lock.
            return list(self._app(environ, start_response))


def start_s3_server(
    data_dir: str | os.PathLike[str],
    *,
    choice: str = "auto",
    weed: str | None = None,
) -> LoopbackS3Server:
    """A started S3 server: SeaweedFS in `data_dir` (``weed`` found with
    `seaweedfs.find_weed` when None), or moto's server when `choice` says so, or when
    `choice` is ``"auto"`` and SeaweedFS cannot start (with a warning saying why)."""
    if choice not in SERVER_CHOICES:
        raise ValueError(f"choice must be one of {', '.join(SERVER_CHOICES)}, got {choice!r}")
    if choice == "moto":
        return MotoS3Server().start()
    from .seaweedfs import SeaweedS3Server, SeaweedUnavailable

    try:
        return SeaweedS3Server(data_dir, weed=weed).start()
    except SeaweedUnavailable as exc:
        if choice == "seaweedfs":
            raise
        warnings.warn(
            f"SeaweedFS unavailable, falling back to moto's S3 server: {exc}", stacklevel=2
        )
        return MotoS3Server().start()
