"""Throw-away object-store servers on loopback, one interface for every backend the suite runs on.

`LoopbackStoreServer` is what a backend-independent test sees of a server: the URL of a fresh
prefix (`url`), the ``storage_options`` that reach it, `open_store` (the two through
`open_object_store`, as a user would), whether its conditional create has exactly one winner
(`atomic_conditional_create`), `start` and `stop` (a ``with`` block does both: `ServerLifecycle`).
Implementations: the S3 servers
(`s3_servers.LoopbackS3Server`: SeaweedFS, moto), fake-gcs-server (`gcs_server`) and Azurite
(`azurite`). Every server listens on 127.0.0.1 and every client it configures carries explicit
test credentials (or anonymous access), so no SDK looks for instance metadata.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from ._server_process import ServerLifecycle

if TYPE_CHECKING:
    from ..objectstore.base import ObjectStore

__all__ = ["LoopbackStoreServer"]


class LoopbackStoreServer(ServerLifecycle):
    """A running object-store server for tests (subclasses set the attributes)."""

    #: Which server this is: "seaweedfs", "moto", "fake-gcs", "azurite".
    kind: str = ""
    #: The URL scheme its stores open with ("s3", "gs", "az").
    scheme: str = ""
    #: Whether concurrent conditional creates of one key have exactly one winner here.
    atomic_conditional_create: bool = True
    _bucket: str
    #: The port it serves on, once started.
    _port: int | None = None

    @property
    def bucket(self) -> str:
        """The bucket (or container) created at start (at least 3 characters)."""
        return self._bucket

    @bucket.setter
    def bucket(self, name: str) -> None:
        if len(name) < 3:
            raise ValueError(f"bucket names need at least 3 characters, got {name!r}")
        self._bucket = name

    @property
    def port(self) -> int:
        """The port it serves on."""
        if self._port is None:
            raise RuntimeError("the server has not been started")
        return self._port

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self) -> dict[str, Any]:
        """The ``storage_options`` that make a URL of `url` reach this server."""
        raise NotImplementedError

    def url(self, prefix: str | None = None) -> str:
        """``scheme://bucket/prefix``; a fresh unique prefix when `prefix` is None."""
        if prefix is None:
            prefix = f"test-{uuid.uuid4().hex}"
        return (
            f"{self.scheme}://{self.bucket}/{prefix}"
            if prefix
            else f"{self.scheme}://{self.bucket}"
        )

    def open_store(self, prefix: str | None = None) -> ObjectStore:
        """A store on this server under `prefix` (fresh when None), opened by URL."""
        from ..objectstore.registry import open_object_store

        return open_object_store(self.url(prefix), self.storage_options())

    def raw_get(self, key: str) -> bytes | None:
        """The bytes of `key` (bucket-relative: the prefix included) read with the service's
        own client, not through s3stream's store; None if there is no such object."""
        raise NotImplementedError

    def raw_put(self, key: str, data: bytes) -> None:
        """Write `key` (bucket-relative) with the service's own client."""
        raise NotImplementedError
