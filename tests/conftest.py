"""Fixtures shared by the test suite, in sections by area."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from s3stream.testing.s3_servers import SERVER_CHOICES, LoopbackS3Server, start_s3_server

# ==============================================================================================
# S3 server: SeaweedFS (``weed mini``) for the whole session; moto's server only as a fallback
# when the weed binary cannot run here, or when S3STREAM_TEST_S3_SERVER=moto asks for it.
# ==============================================================================================

#: ``auto`` (default: SeaweedFS, else moto with a warning), ``seaweedfs`` (fail without it) or
#: ``moto`` (the fallback, on purpose).
S3_SERVER_ENV = "S3STREAM_TEST_S3_SERVER"


@pytest.fixture(scope="session", autouse=True)
def _aws_sdks_stay_on_loopback() -> Iterator[None]:
    """No AWS SDK in the test process (or its children) probes EC2 instance metadata for
    credentials or a region: every client gets explicit test credentials, and this makes a
    forgotten one fail fast instead of waiting on 169.254.169.254."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackS3Server]:
    """A running S3 server: `SeaweedS3Server`, or `MotoS3Server` if weed cannot run here (see
    `S3_SERVER_ENV`). Tests that need what moto does not model check the server's flags
    (``checks_credentials``, ``atomic_conditional_create``)."""
    choice = os.environ.get(S3_SERVER_ENV, "auto")
    if choice not in SERVER_CHOICES:
        raise pytest.UsageError(
            f"{S3_SERVER_ENV} must be one of {', '.join(SERVER_CHOICES)}, got {choice!r}"
        )
    server = start_s3_server(tmp_path_factory.mktemp("seaweedfs"), choice=choice)
    if server.kind != "seaweedfs":
        print(f"WARNING: the S3 tests run against {server.kind}'s server, not SeaweedFS")
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


# ==============================================================================================
# PostgreSQL: one throw-away server from the machine's binaries for the whole session (the
# metadata log's PostgreSQL backend); tests that need it skip, saying why, where it cannot run.
# ==============================================================================================


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A running `PostgresServer` on loopback (`server.url()` names its database; each test
    takes a namespace of its own). Skips when PostgreSQL or psycopg is not installed."""
    pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg (s3stream[postgres])")
    from s3stream.testing.postgres import PostgresServer, PostgresUnavailable

    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server here: {exc}")
    try:
        yield server
    finally:
        server.stop()
