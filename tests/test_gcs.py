"""Google Cloud Storage: `GcsObjectStore` against a real fake-gcs-server process on loopback.

The object-store conformance kit and the metadata-log kit on ``gs://``; two processes racing
1,000 rounds of metadata commits on one log; a client opened by URL, closed and reopened;
compaction; a Spark batch read; and the errors a user meets: a missing bucket, a missing key,
denied or throttled calls, a server that is down or frozen, bad storage options. Every server
and client stays on 127.0.0.1 with anonymous credentials.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import s3stream
from s3stream import ClientSettings, CompactionSettings, ObjectNotFoundError, Record, RecordBatch
from s3stream.clock import SystemClock
from s3stream.errors import InvalidArgumentError, S3StreamError, UnavailableError
from s3stream.metadata import ObjectKind, check_state
from s3stream.objectstore.base import ObjectStore
from s3stream.objectstore.gcs import GcsObjectStore
from s3stream.objectstore.registry import open_object_store
from s3stream.objectstore.requests import RequestMeter
from s3stream.objectstore.stack import store_stack
from s3stream.testing.gcs_server import FakeGcsServer, FakeGcsUnavailable

KiB = 1024


# -- fixtures (the session's server, `fake_gcs`, and the loopback environment: conftest.py) ------


def _start_server() -> FakeGcsServer:
    try:
        return FakeGcsServer().start()
    except FakeGcsUnavailable as exc:
        pytest.skip(f"fake-gcs-server cannot run here: {exc}")


@pytest.fixture
def gcs_store(fake_gcs: FakeGcsServer) -> Iterator[ObjectStore]:
    store = fake_gcs.open_store()
    try:
        yield store
    finally:
        store.close()


def _open_gcs(url: str, options: dict[str, Any]) -> ObjectStore:
    """Opens a store in another process (a picklable opener with `functools.partial`)."""
    return open_object_store(url, options)


# -- (a) the conformance kits run on every server of the matrix, fake-gcs-server included
# (tests/test_conformance_objectstore.py, tests/test_conformance_metadata.py); here what is
# particular to GCS.


def test_conditional_create_above_8_mib_is_still_refused(gcs_store: ObjectStore) -> None:
    """google-cloud-storage uploads bodies above 8 MiB as resumable uploads, on which this
    emulator ignores ifGenerationMatch; the store sends every write as one multipart upload,
    so a large conditional create of an existing key still loses."""
    big = os.urandom((8 << 20) + 1)
    assert gcs_store.put_if_absent("big.0", big) is True
    assert gcs_store.put_if_absent("big.0", big[::-1]) is False
    assert gcs_store.get("big.0") == big
    gcs_store.put("small.0", b"x")
    assert gcs_store.put_if_absent("small.0", big) is False
    assert gcs_store.get("small.0") == b"x"


def test_capabilities_and_names(fake_gcs: FakeGcsServer) -> None:
    for scheme in ("gs", "gcs"):
        store = open_object_store(f"{scheme}://{fake_gcs.bucket}/a/b", fake_gcs.storage_options())
        assert isinstance(store, GcsObjectStore)
        assert (store.bucket, store.prefix) == (fake_gcs.bucket, "a/b/")
        caps = store.capabilities
        assert caps.scheme == "gs" and caps.atomic_create and caps.fences_writers
        assert caps.ranged_reads and caps.ordered_listing and not caps.conditional_replace
        assert repr(store) == (
            f"<GcsObjectStore gs://{fake_gcs.bucket}/a/b/ at {fake_gcs.endpoint_url}>"
        )


def test_pickled_store_works_without_its_client(gcs_store: ObjectStore) -> None:
    gcs_store.put("p.0", b"before pickling")
    again = pickle.loads(pickle.dumps(gcs_store))
    assert again.get("p.0") == b"before pickling"
    again.put("q.0", b"after")
    assert gcs_store.get("q.0") == b"after"


class _Meter(RequestMeter):
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def request(self, name: str, count: int = 1) -> None:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + count


def test_requests_are_metered(gcs_store: ObjectStore) -> None:
    meter = _Meter()
    assert gcs_store.meter_requests(meter) is True
    gcs_store.put("m/a.0", b"a")
    gcs_store.put_if_absent("m/a.0", b"b")
    gcs_store.get("m/a.0", 0, 1)
    gcs_store.get_suffix("m/a.0", 1)
    gcs_store.head("m/a.0")
    list(gcs_store.list("m/"))
    gcs_store.delete_many(["m/a.0", "m/b.0"])
    assert meter.counts == {
        "PutObject": 2,
        "GetObject": 2,
        "HeadObject": 1,
        # The listing, and the one check that the bucket exists after the first 404 (the
        # delete of the missing m/b.0).
        "ListObjectsV2": 2,
        "DeleteObjects": 2,
    }


# -- (b) a client on gs://, closed and reopened --------------------------------------------------


def test_open_round_trip_close_and_reopen(fake_gcs: FakeGcsServer) -> None:
    url = fake_gcs.url()
    options = fake_gcs.storage_options()
    records = [
        Record(b"value %d" % i, key=b"k%d" % (i % 7), timestamp=1000 + i) for i in range(300)
    ]
    # The default WAL of a remote store: the object WAL inside it, on gs:// as well.
    with s3stream.open(url, storage_options=options) as client:
        stream = client.create_stream(tags={"topic": "orders"})
        for i in range(0, len(records), 50):
            stream.append_records(records[i : i + 50])
        client.flush()
        stream_id = stream.stream_id
    with s3stream.open(url, storage_options=options) as again:
        assert [info.stream_id for info in again.list_streams({"topic": "orders"})] == [stream_id]
        reopened = again.open_stream(stream_id)
        got = list(reopened.read_records(0))
        assert [offset for offset, _ in got] == list(range(len(records)))
        assert [r for _, r in got] == records
        # Still writable after the reopen.
        reopened.append_records([Record(b"after reopen")])
        again.flush()
        assert [r.value for _, r in reopened.read_records(len(records))] == [b"after reopen"]


# -- (c) compaction on gs:// ---------------------------------------------------------------------


def test_compaction_on_gcs_merges_objects_and_data_reads_back(fake_gcs: FakeGcsServer) -> None:
    url = fake_gcs.url()
    settings = ClientSettings(
        upload_threshold_bytes=1 << 20,
        stream_split_bytes=1 << 20,  # uploads make stream-set objects only ...
        block_target_bytes=2 * KiB,
        max_pending_bytes=4 << 20,
        upload_interval_ms=0,
        log_cache_bytes=0,  # ... and reads go to the objects
        compaction=CompactionSettings(
            deletion_delay_ms=0,
            stream_set_split_bytes=16 * KiB,
            stream_object_target_bytes=64 * KiB,
            orphan_sweep_interval_ms=0,
        ),
    )
    expected: dict[int, list[tuple[int, bytes]]] = {}
    with s3stream.open(
        url, wal="memory://", storage_options=fake_gcs.storage_options(), settings=settings
    ) as client:
        streams = [client.create_stream() for _ in range(4)]
        for round_ in range(10):
            for i, stream in enumerate(streams):
                data = f"{stream.stream_id}:{round_}:".encode() * (300 if i == 0 else 20)
                offset = stream.append(RecordBatch(data, count=2)).base_offset
                expected.setdefault(stream.stream_id, []).append((offset, data))
            client.flush()
        client.metadata.refresh()
        before = [o for o in client.metadata.state.objects.values() if o.live]
        assert len(before) == 10 and all(o.kind is ObjectKind.STREAM_SET for o in before)
        report = client.compact()
        assert report.tasks.get("stream_set") == 1
        client.metadata.refresh()
        after = [o for o in client.metadata.state.objects.values() if o.live]
        assert report.objects_before == 10 and report.objects_after == len(after) < 10
        assert check_state(client.metadata.state) == []
        # The replaced objects are gone from the bucket (deletion delay 0).
        store = open_object_store(url, fake_gcs.storage_options())
        assert {i.key for i in store.list("data/")} == {o.key for o in after}
    with s3stream.open(
        url, wal="memory://", storage_options=fake_gcs.storage_options(), settings=settings
    ) as again:
        for stream_id, batches in expected.items():
            got: list[tuple[int, bytes]] = []
            offset = 0
            end = again.stream_info(stream_id).end_offset
            while offset < end:
                result = again.read(stream_id, offset, max_bytes=8 * KiB)
                assert result.batches, f"no progress at offset {offset} of stream {stream_id}"
                got.extend((b.base_offset, bytes(b.payload)) for b in result.batches)
                offset = result.next_offset
            assert got == batches, f"stream {stream_id}"


# -- (d) Spark reads gs:// -----------------------------------------------------------------------


@pytest.mark.spark
def test_spark_batch_read_of_gcs(spark: Any, fake_gcs: FakeGcsServer) -> None:
    """test_spark's batch-read checks on gs://: the driver and the Python workers open the
    store from the URL and the storageOptions option."""
    spark_tests = pytest.importorskip("test_spark", reason="the Spark tests need pyspark")
    ds = spark_tests.write_dataset(
        f"gs://{fake_gcs.bucket}/spark-{uuid.uuid4().hex[:8]}", fake_gcs.storage_options()
    )
    try:
        spark_tests._check_batch_reads(spark, ds)
    finally:
        ds.client.close()


# -- (e) two processes racing 1,000 rounds of metadata commits: tests/test_metadata_races.py


# -- (f) errors ----------------------------------------------------------------------------------


def test_missing_bucket_is_named_on_every_call(fake_gcs: FakeGcsServer) -> None:
    store = open_object_store("gs://no-such-bucket-here/prefix", fake_gcs.storage_options())
    calls = {
        "get": lambda: store.get("k.0"),
        "get range": lambda: store.get("k.0", 1, 5),
        "get_suffix": lambda: store.get_suffix("k.0", 3),
        "head": lambda: store.head("k.0"),
        "put": lambda: store.put("k.0", b"x"),
        "put_if_absent": lambda: store.put_if_absent("k.0", b"x"),
        "delete_many": lambda: store.delete_many(["k.0"]),
        "list": lambda: list(store.list()),
    }
    for name, call in calls.items():
        with pytest.raises(S3StreamError, match="bucket 'no-such-bucket-here' does not exist") as e:
            call()
        assert not isinstance(e.value, ObjectNotFoundError | UnavailableError), name


def test_missing_key_is_object_not_found(gcs_store: ObjectStore) -> None:
    gcs_store.put("present.0", b"here")
    for call in (
        lambda: gcs_store.get("absent.0"),
        lambda: gcs_store.get("absent.0", 2, 4),
        lambda: gcs_store.get("absent.0", 3, 3),
        lambda: gcs_store.get_suffix("absent.0", 2),
    ):
        with pytest.raises(ObjectNotFoundError, match=r"absent\.0"):
            call()
    assert gcs_store.head("absent.0") is None
    gcs_store.delete_many(["absent.0"])  # missing keys are fine
    assert [i.key for i in gcs_store.list()] == ["present.0"]


def test_a_stopped_server_is_unavailable_at_once() -> None:
    server = _start_server()
    store = server.open_store("down")
    store.put("k.0", b"x")
    server.stop()
    calls = {
        "get": lambda: store.get("k.0"),
        "head": lambda: store.head("k.0"),
        "put": lambda: store.put("k.1", b"x"),
        "put_if_absent": lambda: store.put_if_absent("k.2", b"x"),
        "delete_many": lambda: store.delete_many(["k.0", "k.1"]),
        "list": lambda: list(store.list()),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(UnavailableError) as e:
            call()
        assert e.value.retryable, name
        assert time.monotonic() - started < 5, f"{name} took {time.monotonic() - started:.1f}s"


def test_every_call_ends_within_its_deadline_on_a_frozen_server() -> None:
    """A server that accepts connections but never answers: each call through the client's
    stack (retries within one deadline, tries bounded to a third of it) ends by the deadline,
    with `UnavailableError`, instead of hanging."""
    deadline_s = 3.0
    server = _start_server()
    try:
        raw = server.open_store("frozen")
        raw.put("k.0", b"x")
        store = store_stack(raw, clock=SystemClock(), rng=random.Random(7), timeout_s=deadline_s)
        assert raw.attempt_timeout_s is not None and raw.attempt_timeout_s <= deadline_s / 3 + 1e-9
        calls = {
            "get": lambda: store.get("k.0"),
            "head": lambda: store.head("k.0"),
            "put_if_absent": lambda: store.put_if_absent("k.1", b"x"),
            "list": lambda: list(store.list()),
            # One request per key, 8 at a time: no delete is started after the first timeout
            # (it took a try's timeout per 8 keys, 13 s here).
            "delete_many(100 keys)": lambda: store.delete_many(f"d/{i:03d}" for i in range(100)),
        }
        with server.frozen():
            for name, call in calls.items():
                started = time.monotonic()
                with pytest.raises(UnavailableError):
                    call()
                took = time.monotonic() - started
                assert took < deadline_s + 2, f"{name} took {took:.1f}s"
        assert raw.get("k.0") == b"x"  # and it works again once the server answers
    finally:
        server.stop()


class _ScriptedGcs:
    """A loopback HTTP server answering every request with one status and a JSON-API error
    body, as Cloud Storage does: for the answers fake-gcs-server never gives (403, 401, 429,
    503)."""

    def __init__(self) -> None:
        import http.server

        self.status = 500
        self.message = "scripted"
        self.requests: list[str] = []
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                scripted.requests.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                body = json.dumps(
                    {"error": {"code": scripted.status, "message": scripted.message}}
                ).encode()
                self.send_response(scripted.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


@pytest.fixture
def scripted_gcs() -> Iterator[_ScriptedGcs]:
    server = _ScriptedGcs()
    try:
        yield server
    finally:
        server.stop()


def test_service_answers_map_to_errors_naming_the_cause(scripted_gcs: _ScriptedGcs) -> None:
    store = GcsObjectStore(
        "bkt", "p", endpoint_url=scripted_gcs.endpoint_url, token="anon", project="x"
    )
    scripted_gcs.status = 403
    scripted_gcs.message = "anonymous caller does not have storage.objects.get access"
    denied = {
        "storage.objects.get": [lambda: store.get("k.0"), lambda: store.head("k.0")],
        "storage.objects.create": [
            lambda: store.put("k.0", b"x"),
            lambda: store.put_if_absent("k.0", b"x"),
        ],
        "storage.objects.delete": [lambda: store.delete_many(["k.0"])],
        "storage.objects.list": [lambda: list(store.list())],
    }
    for permission, calls in denied.items():
        for call in calls:
            with pytest.raises(S3StreamError, match=rf"access denied.*{permission}") as e:
                call()
            assert not e.value.retryable and not isinstance(e.value, ObjectNotFoundError)
    scripted_gcs.status = 401
    with pytest.raises(S3StreamError, match="credentials were refused"):
        store.get("k.0")
    for transient in (429, 503, 500, 408):
        scripted_gcs.status = transient
        for call in (lambda: store.get("k.0"), lambda: store.put_if_absent("k.0", b"x")):
            with pytest.raises(UnavailableError, match=f"HTTP {transient}"):
                call()
    # A 404 that says the bucket is missing is reported as such at once.
    scripted_gcs.status = 404
    scripted_gcs.message = "The specified bucket does not exist."
    scripted_gcs.requests.clear()
    with pytest.raises(S3StreamError, match="bucket 'bkt' does not exist"):
        store.head("k.0")
    assert len(scripted_gcs.requests) == 1


def test_bad_storage_options_are_refused(fake_gcs: FakeGcsServer) -> None:
    url = f"gs://{fake_gcs.bucket}/x"
    with pytest.raises(
        InvalidArgumentError, match=r"unknown storage_options.*bogus.*known:.*token"
    ):
        open_object_store(url, {"bogus": 1})
    bad = [
        ({"token": 42}, "token must be"),
        ({"token": "/no/such/credentials.json"}, "no file"),
        ({"endpoint_url": "127.0.0.1:80"}, "endpoint_url must be"),
        ({"read_timeout_s": 0}, "read_timeout_s"),
        ({"timeout_s": -1}, "timeout_s"),
        ({"max_pool_connections": 0}, "max_pool_connections"),
        ({"project": ""}, "project"),
    ]
    for options, match in bad:
        with pytest.raises(InvalidArgumentError, match=match):
            open_object_store(url, options)
    for wrong in ("gs://", "gs:///prefix"):
        with pytest.raises(InvalidArgumentError, match="names no bucket"):
            open_object_store(wrong, fake_gcs.storage_options())


@pytest.mark.filterwarnings("ignore:The load_credentials_from_file method:DeprecationWarning")
def test_a_credentials_file_of_another_shape_is_an_invalid_argument(tmp_path: Any) -> None:
    """google-auth raised AttributeError on a credentials file holding a JSON list."""
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    store = GcsObjectStore("bkt", "p", endpoint_url="http://127.0.0.1:9", token=str(path))
    with pytest.raises(InvalidArgumentError, match=r"credentials .*list\.json.*AttributeError"):
        store.head("k.0")


def test_timeout_s_bounds_one_try(fake_gcs: FakeGcsServer) -> None:
    store = GcsObjectStore(fake_gcs.bucket, "t", **{**fake_gcs.storage_options(), "timeout_s": 4})
    assert store.attempt_timeout_s == pytest.approx(4.0)
