"""Run a throw-away Azurite (the Azure Blob Storage emulator) on loopback, for tests and demos.

`AzuriteServer` starts ``azurite-blob`` on a free 127.0.0.1 port with its data in a temporary
directory, telemetry off, creates a container, and gives the ``storage_options`` that reach it
with the emulator's well-known account (``devstoreaccount1``) and key::

    with AzuriteServer() as server:
        store = open_object_store(server.url(), server.storage_options())

``azurite-blob`` comes from npm (``make install`` puts it in ``.venv/azurite``); it is looked
for there (beside the running Python's environment), then on ``PATH``. Where it cannot run,
`start` raises `AzuriteUnavailable` saying why, so fixtures can skip.

obstore cannot create containers, so `make_bucket` sends a SharedKey-signed Create Container
request itself (``urllib`` and ``hmac``: no Azure SDK needed).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import os
import shutil
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..objectstore.azure import EMULATOR_ACCOUNT, EMULATOR_KEY
from ._server_process import ServerProcess, free_ports
from .store_servers import LoopbackStoreServer

__all__ = ["AzuriteServer", "AzuriteUnavailable", "find_azurite"]

#: The Blob service REST version the container requests speak.
_API_VERSION = "2021-08-06"


class AzuriteUnavailable(RuntimeError):
    """``azurite-blob`` is missing (or Node.js), or the server did not come up."""


def find_azurite() -> str | None:
    """Path of ``azurite-blob``: in the environment's ``azurite/node_modules/.bin`` (where
    ``make install`` puts it), then on ``PATH``."""
    beside = Path(sys.prefix) / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("azurite-blob")


class AzuriteServer(ServerProcess, LoopbackStoreServer):
    """An Azurite Blob service on ``http://127.0.0.1:<port>/devstoreaccount1``.

    Args:
        data_dir: Where Azurite keeps its data; a temporary directory (removed on `stop`)
            when None.
        container: Container created at start (3-63 lowercase letters, digits and dashes).
        start_timeout_s: How long `start` waits for the service to answer.
        stop_timeout_s: How long `stop` waits after SIGTERM before it kills the process.
        azurite: Path of ``azurite-blob``; found with `find_azurite` when None.
    """

    kind = "azurite"
    scheme = "az"
    atomic_conditional_create = True
    program = "azurite-blob"
    unavailable = AzuriteUnavailable
    missing = (
        "'azurite-blob' was not found (make install puts it in .venv/azurite; it needs "
        "Node.js and npm: npm install azurite)"
    )
    dir_prefix = "s3stream-azurite-"
    log_name = "azurite.log"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        container: str = "s3stream-test",
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        azurite: str | None = None,
    ) -> None:
        super().__init__(
            data_dir,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
            executable=azurite,
        )
        self.bucket = container
        self.account_name = EMULATOR_ACCOUNT
        self.account_key = EMULATOR_KEY

    @property
    def container(self) -> str:
        """The container created at start (`bucket`, in the shared interface's words)."""
        return self.bucket

    # -- how it runs ----------------------------------------------------------------------------

    def _locate(self) -> str | None:
        return find_azurite()

    def _pick_ports(self) -> None:
        self._port = free_ports(1)[0]

    def _command(self, executable: str) -> list[str]:
        return [
            executable,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.port),
            "--location",
            str(self._data_dir),
            "--skipApiVersionCheck",
            "--silent",
            # Azurite otherwise sends usage data to Application Insights (a public endpoint).
            "--disableTelemetry",
            # The account from the path only (http://127.0.0.1:P/devstoreaccount1/...).
            "--disableProductStyleUrl",
        ]

    def _readiness_probe(self) -> Callable[[], object]:
        def answers() -> None:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                pass
            # Listening is not serving yet: ask for the account's containers.
            self._request("GET", "", {"comp": "list"})

        return answers

    def _started(self) -> None:
        self.make_bucket(self.bucket)

    # -- what tests need ------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The account's Blob endpoint, ``http://127.0.0.1:<port>/devstoreaccount1``."""
        return f"{self.endpoint_url}/{self.account_name}"

    def storage_options(self) -> dict[str, Any]:
        """Options of an ``az://`` URL that reach this server with the emulator's key."""
        return {
            "account_name": self.account_name,
            "account_key": self.account_key,
            "endpoint": self.endpoint,
        }

    def raw_get(self, key: str) -> bytes | None:
        import obstore

        try:
            return bytes(obstore.get(self._raw_store(), key).bytes())
        except FileNotFoundError:
            return None

    def raw_put(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self._raw_store(), key, data)

    def _raw_store(self) -> Any:
        """obstore's own client on the container (the only Azure client installed here)."""
        from obstore.store import AzureStore

        return AzureStore(
            self.bucket,
            account_name=self.account_name,
            account_key=self.account_key,
            endpoint=self.endpoint,
            client_options={"allow_http": True},
        )

    def make_bucket(self, name: str) -> None:
        """Create container `name` (an existing one is fine)."""
        try:
            self._request("PUT", name, {"restype": "container"})
        except _HttpError as exc:
            if exc.status != 409:  # ContainerAlreadyExists
                raise

    # -- SharedKey-signed requests --------------------------------------------------------------

    def _request(self, method: str, path: str, query: dict[str, str]) -> bytes:
        """One request on the account (`path`: a container or ``""``), signed with SharedKey
        as the Blob service documents it for the emulator's path-style URLs."""
        # Explicit, and signed as sent: urllib would add a form Content-Type to a PUT body.
        content_type = "application/octet-stream"
        headers = {
            "x-ms-date": email.utils.formatdate(usegmt=True),
            "x-ms-version": _API_VERSION,
        }
        canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        resource = f"/{self.account_name}/{self.account_name}" + (f"/{path}" if path else "/")
        resource += "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
        # VERB, then Content-Encoding, -Language, -Length, -MD5, -Type, Date, If-Modified-Since,
        # If-Match, If-None-Match, If-Unmodified-Since, Range (empty but Content-Type).
        fields = [method, "", "", "", "", content_type, "", "", "", "", "", ""]
        to_sign = "\n".join(fields) + "\n" + canonical_headers + resource
        digest = hmac.new(base64.b64decode(self.account_key), to_sign.encode(), hashlib.sha256)
        signature = base64.b64encode(digest.digest()).decode()
        headers["Authorization"] = f"SharedKey {self.account_name}:{signature}"
        headers["Content-Type"] = content_type
        url = f"{self.endpoint}/{path}?" + "&".join(f"{k}={v}" for k, v in query.items())
        request = urllib.request.Request(
            url, data=b"" if method == "PUT" else None, method=method, headers=headers
        )
        try:
            # No proxy from the environment: the server is on loopback.
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(request, timeout=5) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            raise _HttpError(exc.code, f"{method} {url}: HTTP {exc.code}: {exc.read()!r}") from exc
        except OSError as exc:
            raise AzuriteUnavailable(f"{method} {url}: {exc}") from exc


class _HttpError(AzuriteUnavailable):
    """Azurite answered a container request with an HTTP error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
