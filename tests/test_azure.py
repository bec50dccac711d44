"""Azure Blob Storage (`AzureObjectStore`, ``az://``) against a real Azurite on loopback.

The store passes the object-store conformance kit; a client opened by URL writes, compacts and
reads back; Spark reads it; two processes racing for 1,000 metadata entries each get exactly
one winner per entry (Azure's ``If-None-Match: *`` decides); and failures (no container, a
missing key, a stopped or frozen server, a bad option, a wrong key) raise the project's errors,
within their deadlines. Tests skip, saying why, where Azurite cannot run.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import pickle
import random
import signal
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

import s3stream
from s3stream.clock import SystemClock
from s3stream.errors import (
    InvalidArgumentError,
    ObjectNotFoundError,
    S3StreamError,
    UnavailableError,
)
from s3stream.objectstore.base import ObjectInfo, ObjectStore
from s3stream.objectstore.registry import open_object_store
from s3stream.objectstore.stack import store_stack
from s3stream.records import RecordBatch

pytest.importorskip("obstore", reason="the Azure store needs obstore (s3stream[azure])")

from s3stream.objectstore.azure import (
    EMULATOR_ACCOUNT,
    ROLE_HINT,
    AzureObjectStore,
)
from s3stream.testing.azurite import AzuriteServer, AzuriteUnavailable

pytestmark = pytest.mark.s3

KiB = 1024


# The server: the session's `azurite` fixture (tests/conftest.py), an `AzuriteServer`.

# The dataset helpers live with the Spark tests (the session is conftest's ``spark``); without
# pyspark that module skips at import, and so does only the Spark test here.
try:
    from test_spark import _check_batch_reads, write_dataset
except pytest.skip.Exception:
    _check_batch_reads = write_dataset = None


def _store(server: AzuriteServer, prefix: str | None = None, **options: Any) -> ObjectStore:
    return open_object_store(server.url(prefix), {**server.storage_options(), **options})


# -- (a) the conformance kits: tests/test_conformance_objectstore.py and
# tests/test_conformance_metadata.py run them on every server of the matrix, Azurite included.


# -- (b) a client by URL: round trip, close, reopen ------------------------------------------------


def test_open_round_trip_close_and_reopen(azurite: AzuriteServer) -> None:
    url = azurite.url()
    options = azurite.storage_options()
    records = [s3stream.Record(value=b"v%d" % i, key=b"k%d" % (i % 3)) for i in range(50)]
    with s3stream.open(url, storage_options=options) as client:
        assert client.object_store.capabilities.scheme == "az"
        stream = client.create_stream(tags={"topic": "t"})
        sid = stream.stream_id
        for i in range(0, 50, 10):
            stream.append_records(records[i : i + 10])
        client.flush()
    with s3stream.open(url, storage_options=options) as client:
        stream = client.open_stream(sid)
        got = [rec for _, rec in stream.read_records(0)]
        assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in records]
        stream.append_records([s3stream.Record(value=b"after reopen")])
        client.flush()
    with s3stream.open(url, storage_options=options) as client:
        stream = client.open_stream(sid)
        assert stream.next_offset == 51
        assert [r.value for _, r in stream.read_records(50)] == [b"after reopen"]


# -- (c) compaction on az:// ----------------------------------------------------------------------


def test_compaction_on_azure_reads_back(azurite: AzuriteServer) -> None:
    settings = {
        "upload_threshold_bytes": "1MiB",
        "stream_split_bytes": "1MiB",
        "block_target_bytes": "2KiB",
        "upload_interval_ms": 0,
        "log_cache_bytes": 0,
        "compaction.deletion_delay_ms": 0,
        "compaction.stream_set_split_bytes": "16KiB",
        "compaction.stream_object_target_bytes": "64KiB",
        "compaction.orphan_sweep_interval_ms": 0,
    }
    url = azurite.url()
    with s3stream.open(
        url, wal="memory://", storage_options=azurite.storage_options(), settings=settings
    ) as client:
        streams = [client.create_stream() for _ in range(4)]
        model: dict[int, list[tuple[int, bytes]]] = {}
        for round_ in range(6):
            for i, s in enumerate(streams):
                data = b"%d:%d:" % (s.stream_id, round_) * (100 if i == 0 else 20)
                offset = s.append(RecordBatch(data, count=2)).base_offset
                model.setdefault(s.stream_id, []).append((offset, data))
            client.flush()
        report = client.compact()
        assert report.objects_before == 6
        assert report.objects_after < report.objects_before
        for sid, expected in model.items():
            got = []
            offset = 0
            while offset < client.stream_info(sid).end_offset:
                result = client.read(sid, offset, max_bytes=8 * KiB)
                got.extend((b.base_offset, bytes(b.payload)) for b in result.batches)
                offset = result.next_offset
            assert got == expected, f"stream {sid}"


# -- (d) Spark reads az:// ------------------------------------------------------------------------


@pytest.mark.spark
def test_spark_batch_read(azurite: AzuriteServer, spark: Any) -> None:
    ds = write_dataset(azurite.url(f"spark-{uuid.uuid4().hex[:8]}"), azurite.storage_options())
    try:
        _check_batch_reads(spark, ds)
        df = spark.read.format("s3stream").option(
            "storageOptions", json.dumps(azurite.storage_options())
        )
        assert df.load(ds.url).count() == sum(len(ds.expected(sid)) for sid in ds.streams)
    finally:
        ds.client.close()


# -- (e) two processes racing 1,000 rounds of metadata commits: tests/test_metadata_races.py


# -- (f) errors -----------------------------------------------------------------------------------


def test_missing_container_is_named(azurite: AzuriteServer) -> None:
    store = open_object_store("az://no-such-container/p", azurite.storage_options())
    calls = {
        "head": lambda: store.head("k"),
        "get": lambda: store.get("k"),
        "get range": lambda: store.get("k", 1, 5),
        "put": lambda: store.put("k", b"x"),
        "put_if_absent": lambda: store.put_if_absent("k", b"x"),
        "list": lambda: list(store.list()),
        "delete_many": lambda: store.delete_many(["k"]),
    }
    for name, call in calls.items():
        with pytest.raises(S3StreamError, match="container 'no-such-container' does not exist"):
            call()
        try:
            call()
        except ObjectNotFoundError:
            pytest.fail(f"{name} reported a missing container as a missing object")
        except S3StreamError as exc:
            assert not exc.retryable, name


def test_missing_key_raises_object_not_found(azurite: AzuriteServer) -> None:
    store = _store(azurite)
    store.put("there.0", b"x")
    assert store.head("missing.0") is None
    for call in (
        lambda: store.get("missing.0"),
        lambda: store.get("missing.0", 3, 9),
        lambda: store.get_suffix("missing.0", 4),
    ):
        with pytest.raises(ObjectNotFoundError, match=r"missing\.0"):
            call()
    store.delete_many(["missing.0", "there.0", "missing.1"])  # missing keys are fine
    assert list(store.list()) == []


def test_delete_many_over_several_batches_with_missing_keys(azurite: AzuriteServer) -> None:
    store = _store(azurite)
    keys = [f"d/{i:04d}.0" for i in range(600)]
    for key in keys[::2]:
        store.put(key, b"x")
    # Half the keys were never written, in every Blob Batch request (256 deletes each).
    store.delete_many(keys)
    assert list(store.list()) == []


def test_list_prefix_is_a_string_prefix_not_a_directory(azurite: AzuriteServer) -> None:
    store = _store(azurite)
    for key in ("a-b/x.0", "a.0", "a/x.0", "ab/y.0", "b.0"):
        store.put(key, b"12")
    assert [i.key for i in store.list("a")] == ["a-b/x.0", "a.0", "a/x.0", "ab/y.0"]
    assert [i.key for i in store.list("a/")] == ["a/x.0"]
    assert list(store.list("a/x")) == [ObjectInfo("a/x.0", 2)]


def _account_sas(server: AzuriteServer) -> str:
    """An account SAS for blobs (read, write, delete, list, add, create), valid for an hour."""
    expiry = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    version = "2021-08-06"
    fields = [server.account_name, "rwdlac", "b", "sco", "", expiry, "", "", version, "", ""]
    digest = hmac.new(
        base64.b64decode(server.account_key), "\n".join(fields).encode(), hashlib.sha256
    ).digest()
    signature = base64.b64encode(digest).decode()
    query = {"sv": version, "ss": "b", "srt": "sco", "sp": "rwdlac", "se": expiry}
    return urllib.parse.urlencode({**query, "sig": signature})


def test_sas_token_writes_reads_and_lists(azurite: AzuriteServer) -> None:
    """With a SAS instead of the account key; a wrong one is access denied."""
    options = {"account_name": azurite.account_name, "endpoint": azurite.endpoint}
    sas = _account_sas(azurite)
    store = _store(azurite, **options, account_key=None, sas_token="?" + sas)
    store.put("a/b.0", b"x")
    assert store.put_if_absent("a/c.0", b"yy") is True
    assert store.get("a/c.0") == b"yy"
    assert list(store.list()) == [ObjectInfo("a/b.0", 1), ObjectInfo("a/c.0", 2)]
    assert list(store.list("a/c")) == [ObjectInfo("a/c.0", 2)]
    wrong = _store(azurite, **options, account_key=None, sas_token=sas.replace("sig=", "sig=A"))
    with pytest.raises(S3StreamError, match="access denied") as info:
        list(wrong.list())
    assert not info.value.retryable


class _ScriptedAzure:
    """A loopback server answering every Put Blob with one status and error code, as Azure
    does: for the answers Azurite never gives (409 ContainerBeingDeleted, ...)."""

    def __init__(self) -> None:
        import http.server

        self.status = 409
        self.code = "ContainerBeingDeleted"
        scripted = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = (
                    f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{scripted.code}'
                    "</Code><Message>scripted</Message></Error>"
                ).encode()
                self.send_response(scripted.status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("x-ms-error-code", scripted.code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}/{EMULATOR_ACCOUNT}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def test_put_if_absent_is_false_only_for_an_existing_blob() -> None:
    """obstore reports every 409 and 412 of a Put Blob as "already exists"; Azure answers 409
    with other codes where nothing was created: those raise instead of returning False."""
    server = _ScriptedAzure()
    try:
        store = AzureObjectStore("c", "p", use_emulator=True, endpoint=server.endpoint)
        for status, code in ((409, "BlobAlreadyExists"), (412, "ConditionNotMet")):
            server.status, server.code = status, code
            assert store.put_if_absent("log/1", b"entry") is False, code
        for status, code in (
            (409, "ContainerBeingDeleted"),
            (409, "ContainerDisabled"),
            (409, "BlobArchived"),
            (412, "LeaseIdMissing"),
        ):
            server.status, server.code = status, code
            with pytest.raises(S3StreamError, match=code) as info:
                store.put_if_absent("log/1", b"entry")
            assert not info.value.retryable, code
    finally:
        server.stop()


def test_wrong_key_is_access_denied_naming_the_role(azurite: AzuriteServer) -> None:
    options = {**azurite.storage_options(), "account_key": "d3Jvbmcga2V5IGZvciB0aGUgdGVzdA=="}
    store = _store(azurite, **options)
    for call in (lambda: store.head("k"), lambda: store.put("k", b"x")):
        with pytest.raises(S3StreamError, match="access denied") as info:
            call()
        assert ROLE_HINT in str(info.value) and not info.value.retryable


def test_stopped_server_is_unavailable_within_the_deadline(tmp_path: Path) -> None:
    server = AzuriteServer(tmp_path / "az")
    try:
        server.start()
    except AzuriteUnavailable as exc:
        pytest.skip(f"Azurite cannot run here: {exc}")
    try:
        raw = _store(server, "gone", timeout_s=2.0, connect_timeout_s=1.0)
        raw.put("k.0", b"x")
        stacked = store_stack(
            _store(server, "gone"), clock=SystemClock(), rng=random.Random(0), timeout_s=3.0
        )
        # Frozen: the socket accepts, nothing answers (the worst case for a client).
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            _assert_unavailable_within(lambda: raw.get("k.0"), 2.0 + 2.0)
            _assert_unavailable_within(lambda: stacked.head("k.0"), 3.0 + 3.0)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        server.stop()
        for call in (
            lambda: raw.get("k.0"),
            lambda: raw.put_if_absent("k.1", b"x"),
            lambda: raw.head("k.0"),
            lambda: list(raw.list()),
            lambda: raw.delete_many(["k.0"]),
        ):
            _assert_unavailable_within(call, 2.0)
        _assert_unavailable_within(lambda: stacked.put("k.2", b"x"), 3.0 + 3.0)
    finally:
        server.stop()


def _assert_unavailable_within(call: Any, seconds: float) -> None:
    started = time.monotonic()
    with pytest.raises(UnavailableError):
        call()
    elapsed = time.monotonic() - started
    assert elapsed < seconds, f"the call took {elapsed:.1f}s, more than {seconds}s"


def test_bad_storage_options_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"acount_name.*known: account_key"):
        open_object_store("az://c/p", {"acount_name": "x"})
    bad_values: list[dict[str, Any]] = [
        {"account_name": ""},
        {"account_name": "a", "endpoint": "ftp://x"},
        {"account_name": "a", "timeout_s": 0},
        {"account_name": "a", "connect_timeout_s": float("nan")},
        {"account_name": "a", "max_attempts": 0},
        {"account_name": "a", "use_emulator": "yes"},
    ]
    for options in bad_values:
        with pytest.raises(InvalidArgumentError):
            open_object_store("az://c/p", options)
    for url in ("az://", "az:///p", "abfs://c@nodots/p", "abfs://c@acct.web.core.windows.net/p"):
        with pytest.raises(InvalidArgumentError):
            open_object_store(url, {"account_name": "a"})


def test_no_account_anywhere_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AZURE_"):
            monkeypatch.delenv(name)
    with pytest.raises(S3StreamError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        open_object_store("az://c/p")


def test_url_forms_name_container_account_and_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "fromenv")
    cases = {
        # The account from the environment: obstore reads it, and does not report it back.
        "az://c/p/q": ("c", "p/q/", None, None),
        "azure://c": ("c", "", None, None),
        "abfs://c/p": ("c", "p/", None, None),
        "abfss://c@acct.dfs.core.windows.net/p": ("c", "p/", "acct", None),
        "abfs://c@acct.blob.core.windows.net": ("c", "", "acct", None),
        "abfss://c@acct.dfs.core.chinacloudapi.cn/p": (
            "c",
            "p/",
            "acct",
            "https://acct.blob.core.chinacloudapi.cn",
        ),
    }
    for url, (container, prefix, account, endpoint) in cases.items():
        store = open_object_store(url)
        assert isinstance(store, AzureObjectStore), url
        assert (store.container, store.prefix, store.account_name, store.endpoint) == (
            container,
            prefix,
            account,
            endpoint,
        ), url
        assert store.capabilities.atomic_create and store.capabilities.scheme == "az"
        assert repr(store).startswith(f"<AzureObjectStore az://{container}/{prefix}")
    with pytest.raises(InvalidArgumentError, match="names account"):
        open_object_store("abfss://c@acct.dfs.core.windows.net/p", {"account_name": "other"})


def test_account_from_the_environment(
    azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", azurite.account_name)
    options = azurite.storage_options()
    del options["account_name"]
    store = open_object_store(azurite.url(), options)
    store.put("env.0", b"account from the environment")
    assert store.get("env.0") == b"account from the environment"


def test_pickled_store_works_and_timeouts_bound_tries(azurite: AzuriteServer) -> None:
    store = _store(azurite)
    store.put("p.0", b"pickled")
    again = pickle.loads(pickle.dumps(store))
    assert again.get("p.0") == b"pickled"
    assert store.attempt_timeout_s == 30.0
    store.bound_attempts(3.0)
    assert store.attempt_timeout_s == 3.0
    assert store.get("p.0") == b"pickled"  # rebuilt with the new timeouts
