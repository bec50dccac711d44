"""`ObstoreS3ObjectStore` (S3 through obstore): the object-store conformance kit and the object
WAL's kit on SeaweedFS and moto, AWS semantics (missing bucket, denied credentials, 412 and 409
on a conditional create), its storage options, and the S3 WAL's choice of client."""

from __future__ import annotations

import pickle
import uuid
from typing import Any

import pytest

from s3stream.clock import SystemClock
from s3stream.errors import ContendedError, InvalidArgumentError, S3StreamError, UnavailableError
from s3stream.objectstore.base import ObjectStore
from s3stream.objectstore.s3 import S3ObjectStore
from s3stream.testing.s3_servers import LoopbackS3Server

pytest.importorskip("obstore", reason="the obstore S3 store needs obstore (s3stream[s3])")

# Modules, not classes: a class imported by name would be collected (and run) here again.
import test_conformance_object_wal as object_wal_matrix
import test_conformance_objectstore as store_matrix

from s3stream.objectstore.s3_obstore import ObstoreS3ObjectStore

pytestmark = pytest.mark.s3

#: The S3 servers of the matrix (tests/conftest.py `STORE_SERVERS`) this store runs on.
S3_SERVERS = ["seaweedfs", "moto"]


@pytest.fixture(params=[pytest.param(k, marks=pytest.mark.s3) for k in S3_SERVERS])
def s3_server(request: pytest.FixtureRequest, store_server_of: Any) -> LoopbackS3Server:
    """SeaweedFS, then moto (checking SigV4 signatures and IAM)."""
    server: LoopbackS3Server = store_server_of(request.param)
    return server


@pytest.fixture
def store_server(s3_server: LoopbackS3Server) -> LoopbackS3Server:
    """The matrix's servers, for the matrix classes below: the S3 ones only."""
    return s3_server


def _open(server: LoopbackS3Server, prefix: str | None, **options: Any) -> ObstoreS3ObjectStore:
    return ObstoreS3ObjectStore.from_url(
        server.url(prefix), **{**server.storage_options(), **options}
    )


class TestObstoreS3ObjectStore(store_matrix.TestObjectStoreOnServers):
    """The conformance kit on each S3 server, a fresh prefix per store."""

    def open_at(self, prefix: str) -> ObjectStore:
        return _open(self.server, prefix)


class TestObjectWalOnObstoreS3(object_wal_matrix.TestObjectWalOnServers):
    """The object WAL's conformance kit with this store as its medium."""

    def open_at(self, prefix: str | None = None) -> ObjectStore:
        return _open(self.server, prefix)


# -- AWS semantics ---------------------------------------------------------------------------------


def _puts_fail(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception], status: str, code: str
) -> None:
    """Make every ``obstore.put`` raise `error` as obstore reports an S3 answer of HTTP
    `status` with error `code` (answers the test servers cannot be made to give)."""
    import obstore

    def put(*args: Any, **kwargs: Any) -> None:
        raise error(
            "Error performing PUT http://x/b/t/k.0 - Server returned non-2xx status code: "
            f'{status}: <?xml version="1.0"?><Error><Code>{code}</Code></Error>'
        )

    monkeypatch.setattr(obstore, "put", put)


def test_conditional_create_412_is_false_and_data_kept(s3_server: LoopbackS3Server) -> None:
    store = _open(s3_server, f"t/{uuid.uuid4().hex}")
    assert store.put_if_absent("k.0", b"first") is True
    assert store.put_if_absent("k.0", b"second") is False
    assert store.get("k.0") == b"first"


def test_conditional_create_409_conflict_is_retryable(
    seaweedfs: LoopbackS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3's 409 ConditionalRequestConflict (a concurrent conditional write in flight, this one
    not applied) arrives from obstore as "already exists", like a 412: it must not read as a
    lost race, or no creator might win."""
    from obstore.exceptions import AlreadyExistsError

    store = _open(seaweedfs, f"t/{uuid.uuid4().hex}")
    _puts_fail(monkeypatch, AlreadyExistsError, "409 Conflict", "ConditionalRequestConflict")
    with pytest.raises(ContendedError, match="ConditionalRequestConflict"):
        store.put_if_absent("k.0", b"x")


def test_the_endpoint_comes_from_aws_endpoint_url_as_for_boto3(
    seaweedfs: LoopbackS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `endpoint_url`, botocore's AWS_ENDPOINT_URL (an http:// one included) names the
    service, so the WAL's obstore store reaches the same server as the data store's boto3."""
    options = {k: v for k, v in seaweedfs.storage_options().items() if k != "endpoint_url"}
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweedfs.endpoint_url)
    store = ObstoreS3ObjectStore.from_url(seaweedfs.url(), **options)
    assert store.endpoint_url == seaweedfs.endpoint_url
    store.put("k.0", b"x")
    assert store.get("k.0") == b"x"


def test_missing_bucket_is_named_not_a_missing_object(s3_server: LoopbackS3Server) -> None:
    options = s3_server.storage_options()
    store = ObstoreS3ObjectStore.from_url(
        f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p", **options
    )
    for call in (
        lambda: store.put("k.0", b"x"),
        lambda: store.put_if_absent("k.0", b"x"),
        lambda: store.get("k.0"),
        lambda: store.head("k.0"),
        lambda: list(store.list("")),
    ):
        with pytest.raises(S3StreamError, match="NoSuchBucket") as info:
            call()
        assert "no-such-bucket" in str(info.value)
        assert not isinstance(info.value, UnavailableError)


def test_wrong_credentials_are_refused_by_name(s3_server: LoopbackS3Server) -> None:
    if not s3_server.checks_credentials:
        pytest.skip(f"{s3_server.kind} accepts any signature")
    store = _open(
        s3_server,
        f"t/{uuid.uuid4().hex}",
        aws_access_key_id="AKIAWRONGWRONGWRONG1",
        aws_secret_access_key="wrong",
    )
    with pytest.raises(S3StreamError, match="credentials") as info:
        store.put("k.0", b"x")
    assert not isinstance(info.value, UnavailableError)


def test_denied_by_policy_names_the_permission(
    seaweedfs: LoopbackS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from obstore.exceptions import PermissionDeniedError

    store = _open(seaweedfs, f"t/{uuid.uuid4().hex}")
    _puts_fail(monkeypatch, PermissionDeniedError, "403 Forbidden", "AccessDenied")
    with pytest.raises(S3StreamError, match="s3:PutObject"):
        store.put("k.0", b"x")


def test_unreachable_endpoint_is_unavailable() -> None:
    store = ObstoreS3ObjectStore(
        "b",
        endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="a",
        aws_secret_access_key="b",
        connect_timeout_s=1,
        read_timeout_s=2,
    )
    with pytest.raises(UnavailableError):
        store.put("k.0", b"x")


def test_list_is_in_key_order_across_directories(s3_server: LoopbackS3Server) -> None:
    store = _open(s3_server, f"t/{uuid.uuid4().hex}")
    keys = ["a/b.0", "a-c.0", "a.0", "b/z.0", "a/a/x.0"]
    for key in keys:
        store.put(key, b"x")
    assert [i.key for i in store.list("")] == sorted(keys)
    assert [i.key for i in store.list("a")] == sorted(k for k in keys if k.startswith("a"))
    assert [i.key for i in store.list("a/")] == ["a/a/x.0", "a/b.0"]


def test_suffix_and_ranges(s3_server: LoopbackS3Server) -> None:
    store = _open(s3_server, f"t/{uuid.uuid4().hex}")
    store.put("k.0", b"0123456789")
    assert store.get_suffix("k.0", 3) == b"789"
    assert store.get_suffix("k.0", 30) == b"0123456789"
    assert store.get("k.0", 2, 5) == b"234"
    assert store.get("k.0", 8) == b"89"
    assert store.get("k.0", 10) == b""


# -- options -----------------------------------------------------------------------------------


def test_storage_options_of_s3objectstore_and_s3fs_names_are_taken() -> None:
    store = ObstoreS3ObjectStore.from_url(
        "s3a://bucket/some/prefix/",
        key="k",
        secret="s",
        token="t",
        client_kwargs={"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"},
        max_attempts=2,
        connect_timeout_s=1,
        read_timeout_s=3,
        addressing_style="path",
    )
    assert store.bucket == "bucket"
    assert store.prefix == "some/prefix/"
    assert store.region_name == "eu-west-1"
    assert store.attempt_timeout_s == 6
    assert "(obstore)" in store.describe()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"profile_name": "dev"}, "profiles"),
        ({"max_pool_connections": 4}, "pools connections"),
        ({"frobnicate": 1}, "unknown storage_options.*frobnicate"),
        ({"endpoint_url": "ftp://x"}, "endpoint_url"),
        ({"read_timeout_s": 0}, "read_timeout_s|timeout_s"),
        ({"addressing_style": "sideways"}, "addressing_style"),
    ],
)
def test_bad_or_unsupported_options_are_refused_clearly(
    options: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        ObstoreS3ObjectStore.from_url("s3://bucket/p", **options)


def test_pickles_without_its_client(seaweedfs: LoopbackS3Server) -> None:
    store = _open(seaweedfs, f"t/{uuid.uuid4().hex}")
    store.put("k.0", b"x")
    again = pickle.loads(pickle.dumps(store))
    assert again.get("k.0") == b"x"


# -- the S3 WAL's client -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "kind"), [("obstore", ObstoreS3ObjectStore), ("boto3", S3ObjectStore)]
)
def test_s3_wal_url_chooses_its_client(
    seaweedfs: LoopbackS3Server, client: str, kind: type
) -> None:
    from s3stream.wal.object import ObjectWal
    from s3stream.wal.registry import open_wal

    url = f"{seaweedfs.url(f'wal-{uuid.uuid4().hex}')}?client={client}"
    wal = open_wal(
        url,
        node_id="n1",
        clock=SystemClock(),
        storage_options=seaweedfs.storage_options(),
    )
    try:
        assert isinstance(wal, ObjectWal)
        assert isinstance(wal.store, kind)
    finally:
        wal.close()


def test_s3_wal_url_refuses_an_unknown_client(seaweedfs: LoopbackS3Server) -> None:
    from s3stream.wal.registry import open_wal

    with pytest.raises(InvalidArgumentError, match="client"):
        open_wal(
            f"{seaweedfs.url()}?client=curl",
            node_id="n1",
            clock=SystemClock(),
            storage_options=seaweedfs.storage_options(),
        )


def _inner_store(store: ObjectStore) -> ObjectStore:
    """The raw store under a client's stack of wrappers."""
    while hasattr(store, "inner"):
        store = store.inner
    return store


@pytest.mark.parametrize(
    ("wal_client", "kind"), [(None, ObstoreS3ObjectStore), ("boto3", S3ObjectStore)]
)
def test_default_wal_of_an_s3_store_uses_the_chosen_client_and_recovers(
    seaweedfs: LoopbackS3Server, wal_client: str | None, kind: type
) -> None:
    """The default WAL of an ``s3://`` store goes through obstore unless boto3 is chosen; either
    way under ``wal/`` of the store, counted in the client's metrics, and recovered."""
    import s3stream
    from s3stream.records import RecordBatch
    from s3stream.settings import ObjectWalSettings

    url = seaweedfs.url(f"client-{uuid.uuid4().hex}")
    opts = seaweedfs.storage_options()
    settings = ObjectWalSettings(wal_batch_interval_ms=5)
    client = s3stream.open(
        url, node_id="n1", storage_options=opts, object_wal_settings=settings, wal_client=wal_client
    )
    assert isinstance(_inner_store(client.wal.store), kind)  # type: ignore[attr-defined]
    before = client.metrics.object_store.conditional_puts
    stream = client.create_stream()
    payloads = [b"payload %d" % i for i in range(20)]
    for f in [stream.append_async(RecordBatch(p, count=1)) for p in payloads]:
        f.result(30)
    assert client.metrics.object_store.conditional_puts > before  # the WAL PUTs count
    client._storage.abandon()  # crash before any upload
    client._wal._abandon()  # type: ignore[attr-defined]
    with s3stream.open(url, node_id="n1", storage_options=opts) as again:
        assert again.recovery.uploaded_batches == 20
    assert any(
        i.key.startswith("wal/") for i in seaweedfs.open_store(url.split("/", 3)[3]).list("")
    )


def test_default_wal_falls_back_to_boto3_for_options_only_boto3_takes(
    seaweedfs: LoopbackS3Server,
) -> None:
    import s3stream

    url = seaweedfs.url(f"client-{uuid.uuid4().hex}")
    opts = {**seaweedfs.storage_options(), "max_pool_connections": 4}
    with s3stream.open(url, node_id="n1", storage_options=opts) as client:
        assert isinstance(_inner_store(client.wal.store), S3ObjectStore)  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgumentError, match="max_pool_connections"):
        s3stream.open(url, node_id="n1", storage_options=opts, wal_client="obstore")
    with pytest.raises(InvalidArgumentError, match="wal_client"):
        s3stream.open(url, node_id="n1", storage_options=opts, wal_client="curl")
