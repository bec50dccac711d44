"""`S3ObjectStore` against AWS's documented semantics, where SeaweedFS cannot show them.

* moto's S3 server (in-process, loopback) for answers SeaweedFS gives differently or not at all:
  a missing bucket on every call, and listings;
* a scripted loopback HTTP server for answers no test server gives: 403s (HEAD's has no body),
  pages out of key order;
* a stub client for the AWS endpoint path (listings streamed, checked for order);
* the moto fallback of the test suite's S3 fixture, forced, as it runs when ``weed`` cannot.

Every client gets explicit test credentials; conftest.py turns EC2 instance-metadata lookups off.
"""

from __future__ import annotations

import random
import threading
import time
import tomllib
import uuid
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from s3stream.clock import ManualClock, SystemClock
from s3stream.errors import (
    ContendedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    UnavailableError,
)
from s3stream.objectstore import RetryingObjectStore, S3ObjectStore
from s3stream.objectstore.s3 import DIRECTORY_BUCKET_SUFFIX
from s3stream.testing.s3_servers import LoopbackS3Server, MotoS3Server, start_s3_server
from s3stream.testing.seaweedfs import SeaweedUnavailable

# Keys whose key order differs from a directory-by-directory walk.
ORDERING_KEYS = ["a-b/x", "a.0", "a/x", "a/z/y", "ab/x", "b/a", "Z", "\u00fc/x"]


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3Server]:
    server = MotoS3Server(bucket=f"semantics-{uuid.uuid4().hex[:12]}").start()
    try:
        yield server
    finally:
        server.stop()


def _store(server: LoopbackS3Server, bucket: str | None = None, **options: Any) -> S3ObjectStore:
    return S3ObjectStore(
        bucket or server.bucket,
        f"p-{uuid.uuid4().hex}",
        **{**server.storage_options(), **options},
    )


# -- a missing bucket is never a missing object (moto) -------------------------------------------


def test_missing_bucket_is_named_on_every_call(moto: MotoS3Server) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    store = _store(moto, bucket)
    calls: dict[str, Callable[[], object]] = {
        "head": lambda: store.head("k"),
        "get": lambda: store.get("k"),
        "get range": lambda: store.get("k", 1, 5),
        "get_suffix": lambda: store.get_suffix("k", 4),
        "list": lambda: list(store.list()),
        "put": lambda: store.put("k", b"v"),
        "put_if_absent": lambda: store.put_if_absent("k", b"v"),
        "delete_many": lambda: store.delete_many(["k"]),
    }
    for name, call in calls.items():
        with pytest.raises(S3StreamError) as info:
            call()
        error = info.value
        assert not isinstance(error, ObjectNotFoundError), name
        assert not error.retryable, name
        assert bucket in str(error) and "NoSuchBucket" in str(error), (name, str(error))


def test_missing_key_in_a_bucket_is_a_missing_object(moto: MotoS3Server) -> None:
    store = _store(moto)
    assert store.head("nothing") is None
    with pytest.raises(ObjectNotFoundError):
        store.get("nothing")
    with pytest.raises(ObjectNotFoundError):
        store.get_suffix("nothing", 3)


def test_listing_is_in_key_order(moto: MotoS3Server) -> None:
    store = _store(moto)
    for i, key in enumerate(reversed(ORDERING_KEYS)):
        store.put(key, b"x" * i)
    assert [info.key for info in store.list()] == sorted(ORDERING_KEYS)
    assert [info.key for info in store.list("a")] == sorted(
        k for k in ORDERING_KEYS if k.startswith("a")
    )


def test_conditional_create_412_and_one_winner(moto: MotoS3Server) -> None:
    assert moto.atomic_conditional_create
    store = RetryingObjectStore(_store(moto), clock=SystemClock(), rng=random.Random(1))
    assert store.put_if_absent("c", b"first") is True
    assert store.put_if_absent("c", b"second") is False
    assert store.get("c") == b"first"

    def create(i: int, key: str, barrier: threading.Barrier, results: list[bool]) -> None:
        barrier.wait(timeout=30)
        results.append(store.put_if_absent(key, f"writer {i}".encode()))

    for round_ in range(5):
        barrier = threading.Barrier(8)
        results: list[bool] = []
        threads = [
            threading.Thread(target=create, args=(i, f"race/{round_}", barrier, results))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(results) == [False] * 7 + [True], round_


# -- 403s name the permission (scripted) ----------------------------------------------------------

Reply = tuple[int, dict[str, str], bytes]


def _error_xml(code: str) -> bytes:
    return f"<Error><Code>{code}</Code><Message>scripted</Message></Error>".encode()


class Scripted:
    """A loopback HTTP server answering every request with `respond(method, path)`."""

    def __init__(self, respond: Callable[[str, str], Reply]) -> None:
        self.requests: list[tuple[str, str]] = []
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                script.requests.append((self.command, self.path))
                status, headers, body = respond(self.command, self.path)
                self.send_response(status)
                self.send_header("x-amz-request-id", f"req{len(script.requests)}")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def store(self) -> S3ObjectStore:
        return S3ObjectStore(
            "bucket",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            clock=ManualClock(),
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def scripted() -> Iterator[Callable[[Callable[[str, str], Reply]], Scripted]]:
    servers: list[Scripted] = []

    def make(respond: Callable[[str, str], Reply]) -> Scripted:
        servers.append(Scripted(respond))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_403_names_the_missing_permission(
    scripted: Callable[[Callable[[str, str], Reply]], Scripted],
) -> None:
    # A HEAD answer has no body: botocore sees the bare status as the code.
    server = scripted(lambda method, path: (403, {}, _error_xml("AccessDenied")))
    store = server.store()
    cases: dict[str, tuple[Callable[[], object], list[str]]] = {
        "head": (lambda: store.head("k"), ["HeadObject", "s3:GetObject", "s3:ListBucket"]),
        "get": (lambda: store.get("k"), ["GetObject", "s3:GetObject", "s3:ListBucket"]),
        "put": (lambda: store.put("k", b"v"), ["s3:PutObject"]),
        "create": (lambda: store.put_if_absent("k", b"v"), ["s3:PutObject"]),
        "list": (lambda: list(store.list()), ["s3:ListBucket"]),
    }
    for name, (call, needed) in cases.items():
        before = len(server.requests)
        with pytest.raises(S3StreamError, match="access denied") as info:
            call()
        assert type(info.value) is S3StreamError and not info.value.retryable, name
        for part in needed:
            assert part in str(info.value), (name, part, str(info.value))
        assert len(server.requests) == before + 1, f"{name}: a 403 is not retried"


def test_403_for_bad_credentials_names_no_permission(
    scripted: Callable[[Callable[[str, str], Reply]], Scripted],
) -> None:
    server = scripted(lambda method, path: (403, {}, _error_xml("InvalidAccessKeyId")))
    with pytest.raises(S3StreamError, match="InvalidAccessKeyId") as info:
        server.store().get("k")
    assert "s3:GetObject" not in str(info.value)


def test_409_conditional_conflict_is_retryable_and_not_retried_in_the_store(
    scripted: Callable[[Callable[[str, str], Reply]], Scripted],
) -> None:
    server = scripted(lambda method, path: (409, {}, _error_xml("ConditionalRequestConflict")))
    with pytest.raises(ContendedError, match="ConditionalRequestConflict"):
        server.store().put_if_absent("k", b"v")
    assert server.requests == [("PUT", "/bucket/k")]


def _list_page(keys: list[str], token: str | None) -> bytes:
    contents = "".join(f"<Contents><Key>{k}</Key><Size>1</Size></Contents>" for k in keys)
    more = (
        f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>"
        if token
        else "<IsTruncated>false</IsTruncated>"
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>b</Name><Prefix></Prefix><KeyCount>{len(keys)}</KeyCount>{more}{contents}"
        "</ListBucketResult>"
    ).encode()


def test_pages_out_of_key_order_are_sorted(
    scripted: Callable[[Callable[[str, str], Reply]], Scripted],
) -> None:
    """S3-compatible services need not list in key order (SeaweedFS walks directories):
    two pages, each out of order and interleaved, come out sorted."""

    def respond(method: str, path: str) -> Reply:
        if "continuation-token" in path:
            return 200, {}, _list_page(["a-b/x", "Z", "a/z/y"], None)
        return 200, {}, _list_page(["b/a", "a/x", "\u00fc/x", "ab/x", "a.0"], "next")

    server = scripted(respond)
    assert [i.key for i in server.store().list()] == sorted(ORDERING_KEYS)
    assert [method for method, _ in server.requests] == ["GET", "GET"]


# -- the AWS endpoint path: streamed, and checked (stub client, no network) ----------------------


class _StubClient:
    """Enough of a boto3 S3 client for `list`: fixed pages, and an AWS endpoint."""

    def __init__(self, pages: list[list[str]], endpoint: str) -> None:
        self.meta = SimpleNamespace(endpoint_url=endpoint)
        self.pages = pages
        self.served = 0

    def get_paginator(self, name: str) -> Any:
        assert name == "list_objects_v2"
        client = self

        class Paginator:
            def paginate(self, **_: Any) -> Iterator[dict[str, Any]]:
                for page in client.pages:
                    client.served += 1
                    yield {"Contents": [{"Key": k, "Size": 1} for k in page]}

        return Paginator()

    def close(self) -> None:
        pass


AWS = "https://s3.eu-west-1.amazonaws.com"


def test_general_purpose_bucket_on_aws_streams_its_pages() -> None:
    client = _StubClient([["a", "b"], ["c", "d"]], AWS)
    store = S3ObjectStore("bucket", client=client)  # type: ignore[arg-type]
    listing = store.list()
    assert next(listing).key == "a"
    assert client.served == 1, "the first page is yielded before the next is fetched"
    assert [i.key for i in listing] == ["b", "c", "d"]


def test_aws_listing_out_of_order_is_an_error_not_a_silent_misorder() -> None:
    client = _StubClient([["a", "c"], ["b"]], AWS)
    store = S3ObjectStore("bucket", client=client)  # type: ignore[arg-type]
    with pytest.raises(S3StreamError, match="out of key order"):
        list(store.list())


def test_directory_bucket_on_aws_is_sorted() -> None:
    """AWS documents no key order for directory buckets (S3 Express One Zone)."""
    client = _StubClient([["c", "a"], ["b"]], AWS)
    store = S3ObjectStore(f"b--euw1-az1{DIRECTORY_BUCKET_SUFFIX}", client=client)  # type: ignore[arg-type]
    assert [i.key for i in store.list()] == ["a", "b", "c"]


# -- the declared floor: conditional create needs botocore >= 1.35.2 ------------------------------


def test_dependency_floor_has_if_none_match_on_put_object() -> None:
    import boto3

    client = boto3.session.Session().client(
        "s3", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )
    members = client.meta.service_model.operation_model("PutObject").input_shape.members
    assert "IfNoneMatch" in members
    pyproject = Path(__file__).parent.parent / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert "boto3>=1.35.2" in extras["s3"] and "botocore>=1.35.2" in extras["s3"]


# -- the test suite's moto fallback, forced --------------------------------------------------------


def test_fallback_to_moto_when_weed_cannot_start(tmp_path: Path) -> None:
    """What the session fixture does on a machine where ``weed`` exits at once: moto's server
    with the same interface, keyword arguments of `client` included."""
    weed = tmp_path / "weed"
    weed.write_text("#!/bin/sh\nexit 3\n")
    weed.chmod(0o755)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        server = start_s3_server(tmp_path / "data", weed=str(weed))
    try:
        assert server.kind == "moto"
        assert any("falling back to moto" in str(w.message) for w in caught)
        client = server.client(max_pool_connections=16, connect_timeout=1, max_attempts=1)
        client.put_object(Bucket=server.bucket, Key="raw", Body=b"raw")
        assert server.make_bucket(server.bucket) == server.bucket  # idempotent
        store = _store(server)
        store.put("k", b"v")
        assert store.get("k") == b"v"
    finally:
        server.stop()


def test_forced_seaweedfs_does_not_fall_back(tmp_path: Path) -> None:
    with pytest.raises(SeaweedUnavailable, match="cannot run"):
        start_s3_server(tmp_path, choice="seaweedfs", weed=str(tmp_path / "no-such-weed"))
    with pytest.raises(ValueError, match="choice"):
        start_s3_server(tmp_path, choice="minio")


# -- answers AWS documents that SeaweedFS and moto do not give (scripted) ------------------------


def test_501_not_implemented_is_permanent_and_not_retried(
    scripted: Callable[[Callable[[str, str], Reply]], Scripted],
) -> None:
    """AWS answers a request it does not implement (a conditional write on a service without
    them) with 501 NotImplemented: retrying it until the deadline only delayed the error."""
    server = scripted(lambda method, path: (501, {}, _error_xml("NotImplemented")))
    with pytest.raises(S3StreamError, match="conditional writes") as info:
        server.store().put_if_absent("k", b"v")
    assert not info.value.retryable
    assert server.requests == [("PUT", "/bucket/k")]


def test_a_range_the_server_ignores_is_cut_from_the_whole_object(
    scripted: Callable[[Callable[[str, str], Reply]], Scripted],
) -> None:
    """A proxy or service that ignores Range answers 200 with the whole object: a ranged read
    returned all of it (other bytes than asked for)."""
    whole = bytes(range(100))
    server = scripted(lambda method, path: (200, {"ETag": '"x"'}, whole))
    store = server.store()
    assert store.get("k", 10, 20) == whole[10:20]
    assert store.get("k", 95) == whole[95:]
    assert store.get_suffix("k", 5) == whole[-5:]


def test_a_body_that_trickles_in_ends_within_the_try(tmp_path: Path) -> None:
    """botocore's read timeout bounds each socket read, not the body: a GET whose body came
    at 20 kB/s returned after the whole body (a 30 s call with 2 s timeouts)."""

    class Slow(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(600_000))
            self.end_headers()
            try:
                for _ in range(300):
                    self.wfile.write(b"x" * 2000)
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    server.block_on_close = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = S3ObjectStore(
            "bucket",
            endpoint_url=f"http://127.0.0.1:{server.server_address[1]}",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            connect_timeout_s=1,
            read_timeout_s=1,
        )
        started = time.monotonic()
        with pytest.raises(UnavailableError, match="slow link"):
            store.get("k")
        assert time.monotonic() - started < 2 + 65_536 / 20_000 + 0.5
        store.close()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "url", ["s3://bucket/team?region=us-east-1", "s3://bucket/p#x", "s3a://bucket?x=1"]
)
def test_a_store_url_with_a_query_is_refused(url: str) -> None:
    """`s3://b/team?region=...` kept the query in the store's prefix while the default WAL's
    URL cut it off: data and WAL in two places, and a node's acknowledged appends lost when
    another store (`s3://b/team`) registered the same node. (Every remote store's URL goes
    through the same `split_url`.)"""
    with pytest.raises(InvalidArgumentError, match="query or fragment"):
        S3ObjectStore.from_url(url, endpoint_url="http://127.0.0.1:9")
