"""Fixtures shared by the test suite, in sections by area."""

from __future__ import annotations

import socket
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from s3stream.testing.seaweedfs import SeaweedS3Server, SeaweedUnavailable

# ==============================================================================================
# S3 server: SeaweedFS (``weed mini``) for the whole session; moto's server only as a fallback
# when the weed binary cannot run here.
# ==============================================================================================


class MotoS3Server:
    """moto's S3 server on a free loopback port, with the interface of `SeaweedS3Server`."""

    kind = "moto"

    def __init__(self, bucket: str = "s3stream-test") -> None:
        from moto.server import ThreadedMotoServer

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.bucket = bucket
        self.access_key = "testing"
        self.secret_key = "testing"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    def start(self) -> MotoS3Server:
        self._server.start()
        self.make_bucket(self.bucket)
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint_url,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": "us-east-1",
        }

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client("s3", **self.storage_options())

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running S3 server (`SeaweedS3Server`, or `MotoS3Server` if weed cannot run)."""
    server: Any = SeaweedS3Server(tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
    except SeaweedUnavailable as exc:
        warnings.warn(
            f"SeaweedFS unavailable, falling back to moto's S3 server: {exc}", stacklevel=1
        )
        print(f"WARNING: SeaweedFS unavailable, using moto's S3 server instead: {exc}")
        server = MotoS3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_store(seaweedfs: Any) -> Iterator[Any]:
    """An `S3ObjectStore` on the session's server, under a fresh prefix of its own."""
    from s3stream.objectstore.s3 import S3ObjectStore

    store = S3ObjectStore(
        seaweedfs.bucket, f"test-{uuid.uuid4().hex}", **seaweedfs.storage_options()
    )
    try:
        yield store
    finally:
        store.close()
