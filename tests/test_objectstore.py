"""Object stores: one contract over every implementation, then each one's own behaviour."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import random
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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
from s3stream.objectstore import (
    LocalObjectStore,
    MemoryObjectStore,
    MetricsObjectStore,
    ObjectInfo,
    ObjectStore,
    ObjectStoreMetrics,
    RetryingObjectStore,
    open_object_store,
    register_object_store,
)
from s3stream.objectstore.fsspec_store import FsspecObjectStore
from s3stream.objectstore.local import TEMP_PREFIX
from s3stream.objectstore.s3 import S3ObjectStore

BAD_KEYS = ["", "/a", "a/", "a//b", "a/./b", "../x", "a/..", None, 7]


# ==============================================================================================
# The contract, over every store
# ==============================================================================================


@pytest.fixture(params=["memory", "local", "fsspec", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "memory":
        yield MemoryObjectStore()
    elif request.param == "local":
        with LocalObjectStore(tmp_path / "objects") as local:
            yield local
    elif request.param == "fsspec":
        # fsspec's memory filesystem is process-global: a fresh root per test.
        root = f"s3stream-test-{uuid.uuid4().hex}"
        fsspec_store = FsspecObjectStore(f"memory://{root}")
        yield fsspec_store
        if fsspec_store.fs.exists(f"/{root}"):
            fsspec_store.fs.rm(f"/{root}", recursive=True)
    else:
        yield request.getfixturevalue("s3_store")


def test_put_get_roundtrip_and_overwrite(store: ObjectStore) -> None:
    store.put("a/b/c.bin", b"hello world")
    assert store.get("a/b/c.bin") == b"hello world"
    store.put("a/b/c.bin", b"second")
    assert store.get("a/b/c.bin") == b"second"
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.head("empty") == ObjectInfo("empty", 0)


def test_accepts_bytes_like_and_rejects_str(store: ObjectStore) -> None:
    store.put("ba", bytearray(b"xyz"))
    store.put("mv", memoryview(b"0123456789")[2:5])
    assert store.get("ba") == b"xyz"
    assert store.get("mv") == b"234"
    with pytest.raises(InvalidArgumentError):
        store.put("s", "text")  # type: ignore[arg-type]


def test_large_object_roundtrip(store: ObjectStore) -> None:
    data = random.Random(1).randbytes(3 * 1024 * 1024 + 17)
    store.put("big", data)
    assert store.get("big") == data
    assert store.get("big", 1_000_000, 2_000_001) == data[1_000_000:2_000_001]
    assert store.get_suffix("big", 4097) == data[-4097:]


def test_ranges_are_half_open_and_short_at_end(store: ObjectStore) -> None:
    store.put("k", b"0123456789")
    assert store.get("k", 0, 3) == b"012"
    assert store.get("k", 3) == b"3456789"
    assert store.get("k", 3, 4) == b"3"
    assert store.get("k", 5, 100) == b"56789"
    assert store.get("k", 2, 2) == b""
    assert store.get("k", 10) == b""
    assert store.get("k", 15) == b""
    assert store.get("k", 15, 20) == b""
    assert store.get("k", 0, 10) == b"0123456789"


def test_suffix(store: ObjectStore) -> None:
    store.put("k", b"0123456789")
    assert store.get_suffix("k", 3) == b"789"
    assert store.get_suffix("k", 10) == b"0123456789"
    assert store.get_suffix("k", 1000) == b"0123456789"
    store.put("empty", b"")
    assert store.get_suffix("empty", 5) == b""


def test_head(store: ObjectStore) -> None:
    store.put("dir/k", b"12345")
    assert store.head("dir/k") == ObjectInfo("dir/k", 5)
    assert store.head("dir/missing") is None
    assert store.head("dir") is None  # a prefix of keys is not an object
    assert store.head("nothing/here") is None


def test_list_is_in_key_order_and_filters_by_prefix(store: ObjectStore) -> None:
    # '-' < '.' < '/' < '0' < 'b': directory-wise listings get this wrong.
    sizes = {"a-c": 1, "a.b": 2, "a/b": 3, "a/c/d": 4, "a/c/e": 5, "a0": 6, "b": 7, "ab/x": 8}
    for key, size in reversed(list(sizes.items())):
        store.put(key, b"x" * size)
    everything = list(store.list())
    assert [i.key for i in everything] == sorted(sizes)
    assert all(i.size == sizes[i.key] for i in everything)
    assert [i.key for i in store.list("a/")] == ["a/b", "a/c/d", "a/c/e"]
    assert [i.key for i in store.list("a/c")] == ["a/c/d", "a/c/e"]
    assert [i.key for i in store.list("a/c/")] == ["a/c/d", "a/c/e"]
    assert [i.key for i in store.list("a")] == ["a-c", "a.b", "a/b", "a/c/d", "a/c/e", "a0", "ab/x"]
    assert [i.key for i in store.list("ab")] == ["ab/x"]
    assert list(store.list("zz")) == []
    assert list(store.list("zz/")) == []
    assert list(store.list("a//")) == []
    assert list(store.list("../")) == []
    with pytest.raises(InvalidArgumentError):
        store.list(5)  # type: ignore[arg-type]


def test_delete_many(store: ObjectStore) -> None:
    for key in ("x/1", "x/2", "x/3", "y"):
        store.put(key, b"v")
    store.delete_many(["x/1", "x/3", "missing", "x/1"])
    assert [i.key for i in store.list()] == ["x/2", "y"]
    store.delete_many(iter(["x/2"]))
    store.delete_many([])
    assert [i.key for i in store.list()] == ["y"]
    with pytest.raises(ObjectNotFoundError):
        store.get("x/1")


def test_delete_many_validates_every_key_before_deleting(store: ObjectStore) -> None:
    store.put("keep", b"v")
    with pytest.raises(InvalidArgumentError):
        store.delete_many(["keep", "bad//key"])
    assert store.get("keep") == b"v"


def test_put_if_absent(store: ObjectStore) -> None:
    assert store.put_if_absent("log/0001", b"first") is True
    assert store.put_if_absent("log/0001", b"second") is False
    assert store.get("log/0001") == b"first"
    assert store.put_if_absent("log/0002", b"") is True
    assert store.head("log/0002") == ObjectInfo("log/0002", 0)


def test_put_if_absent_race_has_exactly_one_winner(store: ObjectStore) -> None:
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    results: dict[int, bool] = {}
    errors: list[BaseException] = []

    def contend(i: int) -> None:
        try:
            barrier.wait()
            results[i] = store.put_if_absent("log/0042", f"writer-{i}".encode() * 100)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    winners = [i for i, won in results.items() if won]
    assert len(results) == threads_n
    assert len(winners) == 1
    assert store.get("log/0042") == f"writer-{winners[0]}".encode() * 100


def test_missing_keys(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        store.get("nope")
    with pytest.raises(ObjectNotFoundError):
        store.get("nope", 5, 10)
    with pytest.raises(ObjectNotFoundError):
        store.get("nope", 3, 3)
    with pytest.raises(ObjectNotFoundError):
        store.get_suffix("nope", 8)
    with pytest.raises(LookupError):  # ObjectNotFoundError is a LookupError too
        store.get("deep/nope")
    assert store.head("nope") is None


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_rejected(store: ObjectStore, key: Any) -> None:
    for call in (
        lambda: store.put(key, b"v"),
        lambda: store.put_if_absent(key, b"v"),
        lambda: store.get(key),
        lambda: store.get_suffix(key, 1),
        lambda: store.head(key),
        lambda: store.delete_many([key]),
    ):
        with pytest.raises(InvalidArgumentError):
            call()


def test_bad_ranges_are_rejected(store: ObjectStore) -> None:
    store.put("k", b"0123")
    for start, end in ((-1, None), (3, 2), (1.0, None), (0, 2.5), ("0", None)):
        with pytest.raises(InvalidArgumentError):
            store.get("k", start, end)  # type: ignore[arg-type]
    for length in (0, -1, 1.5):
        with pytest.raises(InvalidArgumentError):
            store.get_suffix("k", length)  # type: ignore[arg-type]


def test_describe_and_context_manager(store: ObjectStore) -> None:
    assert isinstance(store.describe(), str) and store.describe()
    with store as same:
        assert same is store


# ==============================================================================================
# LocalObjectStore
# ==============================================================================================


def test_local_files_are_where_keys_say(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "r" / "nested")
    store.put("a/b/c", b"data")
    assert (tmp_path / "r" / "nested" / "a" / "b" / "c").read_bytes() == b"data"
    assert store.root == tmp_path / "r" / "nested"
    assert store.describe() == f"file://{tmp_path / 'r' / 'nested'}"


def test_local_temp_files_are_never_listed(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put("d/real", b"1")
    # Leftovers of a writer that crashed between creating and renaming its temporary file.
    (tmp_path / f"{TEMP_PREFIX}999-0").write_bytes(b"partial")
    (tmp_path / "d" / f"{TEMP_PREFIX}999-1").write_bytes(b"partial")
    (tmp_path / f"{TEMP_PREFIX}dir").mkdir()
    (tmp_path / f"{TEMP_PREFIX}dir" / "x").write_bytes(b"partial")
    assert [i.key for i in store.list()] == ["d/real"]
    for key in (f"{TEMP_PREFIX}999-0", f"d/{TEMP_PREFIX}x", f"{TEMP_PREFIX}dir/x"):
        with pytest.raises(InvalidArgumentError, match="reserved"):
            store.put(key, b"v")
        with pytest.raises(InvalidArgumentError):
            store.get(key)
    assert list(store.list(f"{TEMP_PREFIX}dir/")) == []
    # Our own writes leave no temporary files behind.
    for i in range(20):
        store.put(f"d/k{i}", b"v")
        store.put_if_absent(f"d/c{i % 5}", b"v")
    assert [p.name for p in (tmp_path / "d").iterdir() if p.name.startswith(TEMP_PREFIX)] == [
        f"{TEMP_PREFIX}999-1"
    ]


@pytest.mark.parametrize("method", ["put", "put_if_absent"])
def test_a_local_store_closed_under_a_write_removes_its_temporary_file(
    tmp_path: Path, method: str
) -> None:
    """A process leaving after a Ctrl-C (`take-over`, `demo`) closed its store while upload
    threads were writing, and exited: their temporary files, tens of MB each, stayed until
    the orphan sweep, unseen by `inspect --cost`. A close removes them; the write fails."""
    store = LocalObjectStore(tmp_path, fsync=False)
    outcome: list[object] = []

    def write() -> None:
        try:
            outcome.append(getattr(store, method)("d/big", b"x" * (512 << 20)))
        except S3StreamError as exc:
            outcome.append(exc)

    def temps() -> list[str]:
        folder = tmp_path / "d"
        return [p.name for p in folder.iterdir()] if folder.is_dir() else []

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 10
    while not temps() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert temps(), "the write made no temporary file"
    store.close()
    assert temps() == []
    writer.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], S3StreamError), outcome
    assert temps() == [] and [i.key for i in store.list("d/")] == []
    store.put("d/after", b"1")  # a close ends no later write
    assert store.get("d/after") == b"1"


@pytest.mark.parametrize("fsync", [True, False])
def test_local_readers_never_see_partial_objects(tmp_path: Path, fsync: bool) -> None:
    store = LocalObjectStore(tmp_path, fsync=fsync)
    size = 4 * 1024 * 1024
    versions = [bytes([v]) * size for v in range(4)]
    store.put("obj", versions[0])
    stop = threading.Event()
    seen: set[bytes] = set()
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            data = store.get("obj")
            if data not in versions:
                bad.append(f"partial read of {len(data)} bytes")
                return
            seen.add(data[:1])
            created = store.get("fresh") if store.head("fresh") else None
            if created is not None and created != versions[3]:
                bad.append(f"partial conditional create of {len(created)} bytes")
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for round_ in range(12):
            store.put("obj", versions[round_ % 3])
        assert store.put_if_absent("fresh", versions[3]) is True
        for round_ in range(6):
            store.put("obj", versions[round_ % 3])
    finally:
        stop.set()
        reader.join()
    assert bad == []
    assert len(seen) >= 2  # the reader really overlapped with the writes


def test_local_root_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        LocalObjectStore(tmp_path / "file")
    with pytest.raises(InvalidArgumentError):
        LocalObjectStore(tmp_path / "file" / "below")
    with pytest.raises(InvalidArgumentError):
        LocalObjectStore("")


def test_local_key_conflicts_between_object_and_prefix(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put("a", b"object a")
    with pytest.raises(InvalidArgumentError, match="conflicts"):
        store.put("a/b", b"v")
    with pytest.raises(InvalidArgumentError, match="conflicts"):
        store.put_if_absent("a/b", b"v")
    store.put("x/y", b"v")
    with pytest.raises(InvalidArgumentError, match="conflicts"):
        store.put("x", b"v")
    with pytest.raises(InvalidArgumentError, match="conflicts"):
        store.put_if_absent("x", b"v")
    with pytest.raises(ObjectNotFoundError):
        store.get("x")
    with pytest.raises(ObjectNotFoundError):
        store.get_suffix("x", 1)
    with pytest.raises(ObjectNotFoundError):
        store.get("a/b")
    store.delete_many(["x", "a/b"])  # neither is an object: nothing happens
    assert [i.key for i in store.list()] == ["a", "x/y"]


def test_local_delete_prunes_empty_directories(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "root")
    store.put("p/q/r/s", b"v")
    store.put("p/keep", b"v")
    store.delete_many(["p/q/r/s"])
    assert sorted(p.name for p in (tmp_path / "root" / "p").iterdir()) == ["keep"]
    store.delete_many(["p/keep"])
    assert list((tmp_path / "root").iterdir()) == []
    assert (tmp_path / "root").is_dir()  # the root itself stays
    store.put("p/q/again", b"v")  # and directories come back on demand
    assert store.get("p/q/again") == b"v"


def test_local_writes_race_with_directory_pruning(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path, fsync=False)
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                store.put("d/e/tmp", b"v")
                store.delete_many(["d/e/tmp"])
        except BaseException as exc:
            errors.append(exc)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for i in range(300):
            store.put(f"d/e/k{i}", b"v")
            store.delete_many([f"d/e/k{i}"])
    finally:
        stop.set()
        churner.join()
    assert errors == []


def test_local_from_url_and_options(tmp_path: Path) -> None:
    a = LocalObjectStore.from_url(f"file://{tmp_path}/a", fsync=False)
    b = LocalObjectStore.from_url(str(tmp_path / "b"))
    a.put("k", b"1")
    b.put("k", b"2")
    assert (tmp_path / "a" / "k").read_bytes() == b"1"
    assert (tmp_path / "b" / "k").read_bytes() == b"2"
    with pytest.raises(InvalidArgumentError, match="unknown storage_options"):
        LocalObjectStore.from_url(str(tmp_path), fsnyc=False)
    with pytest.raises(InvalidArgumentError):
        LocalObjectStore.from_url(str(tmp_path), fsync="no")
    with pytest.raises(InvalidArgumentError):
        LocalObjectStore.from_url("s3://bucket")


def test_local_store_pickles(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("k") == b"v"


def _run_as_nobody(fn: Callable[[], None]) -> str:
    """Run `fn` in a forked child with the uid of nobody; returns what it reports."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
            report = "no error"
        except S3StreamError as exc:
            report = f"{type(exc).__name__} retryable={exc.retryable}: {exc}"
        except BaseException as exc:
            report = f"unexpected {type(exc).__name__}: {exc}"
        os.write(write_end, report.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read().decode()
    os.waitpid(pid, 0)
    return report


def test_local_permission_denied_is_not_retryable(tmp_path: Path) -> None:
    import tempfile

    # Below /tmp so that an unprivileged user can reach it; mode 0755: readable, not writable.
    root = Path(tempfile.mkdtemp(prefix="s3stream-perm-"))
    try:
        root.chmod(0o755)
        store = LocalObjectStore(root, fsync=False)
        store.put("secret", b"v")
        (root / "secret").chmod(0o600)
        if os.geteuid() == 0:
            put_report = _run_as_nobody(lambda: store.put("new", b"v"))
            get_report = _run_as_nobody(lambda: print(store.get("secret")))
        else:  # pragma: no cover - when the suite runs unprivileged
            root.chmod(0o555)
            reports = []
            for call in (lambda: store.put("new", b"v"), lambda: store.get("secret")):
                try:
                    call()
                    reports.append("no error")
                except S3StreamError as exc:
                    reports.append(f"{type(exc).__name__} retryable={exc.retryable}: {exc}")
            put_report, get_report = reports
        for report in (put_report, get_report):
            assert report.startswith("S3StreamError retryable=False"), report
            assert "Permission denied" in report and "retrying will not help" in report
    finally:
        root.chmod(0o755)
        for path in root.iterdir():
            path.unlink()
        root.rmdir()


def test_local_errno_translation(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    cases = {
        errno.ENOSPC: UnavailableError,
        errno.EIO: UnavailableError,
        errno.EACCES: S3StreamError,
        errno.EROFS: S3StreamError,
        errno.ENAMETOOLONG: InvalidArgumentError,
        errno.ELOOP: S3StreamError,
    }
    for code, kind in cases.items():
        error = store._translate(OSError(code, os.strerror(code)), "write", "k")
        assert type(error) is kind, (code, error)
    assert store._translate(OSError(errno.ENOSPC, "x"), "write", "k").retryable
    assert isinstance(
        store._translate(OSError(errno.ENOENT, "x"), "read", "k"), ObjectNotFoundError
    )
    with pytest.raises(InvalidArgumentError, match="too long"):
        store.put("x" * 300, b"v")


# ==============================================================================================
# S3ObjectStore against SeaweedFS
# ==============================================================================================


@pytest.mark.s3
def test_s3_conditional_create_race_sees_real_412s(seaweedfs: Any) -> None:
    client = seaweedfs.client(max_pool_connections=16)
    statuses: list[int] = []
    lock = threading.Lock()

    def record(http_response: Any, **_: Any) -> None:
        with lock:
            statuses.append(http_response.status_code)

    client.meta.events.register("after-call.s3.PutObject", record)
    # Through the retry layer, as a client calls it: a 409 (a conditional write of the key in
    # flight) is retried there, not in the store.
    store = RetryingObjectStore(
        S3ObjectStore(seaweedfs.bucket, f"race-{uuid.uuid4().hex}", client=client),
        clock=SystemClock(),
        rng=random.Random(5),
        max_attempts=20,
    )
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def contend(i: int) -> None:
        barrier.wait()
        won = store.put_if_absent("meta/00000001", f"writer {i}".encode())
        with lock:
            results.append(won)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [False] * 7 + [True]
    assert statuses.count(200) == 1
    assert statuses.count(412) >= 1
    assert set(statuses) <= {200, 409, 412}


@pytest.mark.s3
def test_s3_prefix_isolates_stores(seaweedfs: Any) -> None:
    options = seaweedfs.storage_options()
    base = f"iso-{uuid.uuid4().hex}"
    a = S3ObjectStore(seaweedfs.bucket, f"{base}/a/", **options)
    b = S3ObjectStore(seaweedfs.bucket, f"/{base}/b", **options)
    a.put("k", b"from a")
    b.put("k", b"from b")
    assert a.get("k") == b"from a"
    assert [i.key for i in b.list()] == ["k"]
    assert a.prefix == f"{base}/a/"
    whole = S3ObjectStore(seaweedfs.bucket, base, **options)
    assert [i.key for i in whole.list()] == ["a/k", "b/k"]


@pytest.mark.s3
def test_s3_store_pickles_without_its_client(s3_store: S3ObjectStore) -> None:
    s3_store.put("k", b"payload")
    assert s3_store._client is not None
    clone = pickle.loads(pickle.dumps(s3_store))
    assert clone._client is None
    assert clone.get("k") == b"payload"
    assert clone.describe() == s3_store.describe()
    clone.put("k2", b"from the clone")
    assert s3_store.get("k2") == b"from the clone"
    clone.close()


@pytest.mark.s3
def test_s3_from_url_and_registry(seaweedfs: Any) -> None:
    prefix = f"url-{uuid.uuid4().hex}"
    options = seaweedfs.storage_options()
    a = S3ObjectStore.from_url(f"s3://{seaweedfs.bucket}/{prefix}", **options)
    a.put("x/y", b"1")
    s3fs_style = {
        "key": options["aws_access_key_id"],
        "secret": options["aws_secret_access_key"],
        "client_kwargs": {"endpoint_url": options["endpoint_url"]},
    }
    b = open_object_store(f"s3a://{seaweedfs.bucket}/{prefix}/x", s3fs_style)
    assert isinstance(b, S3ObjectStore)
    assert b.get("y") == b"1"
    with pytest.raises(InvalidArgumentError, match="unknown storage_options"):
        S3ObjectStore.from_url(f"s3://{seaweedfs.bucket}", endpoint=options["endpoint_url"], x=1)
    with pytest.raises(InvalidArgumentError, match="names no bucket"):
        S3ObjectStore.from_url("s3:///prefix")


@pytest.mark.s3
def test_s3_wrong_bucket_and_credentials_are_not_retryable(seaweedfs: Any) -> None:
    options = seaweedfs.storage_options()
    wrong = S3ObjectStore("no-such-bucket-s3stream", **options)
    for call in (lambda: wrong.get("k"), lambda: wrong.put("k", b"v"), lambda: list(wrong.list())):
        with pytest.raises(S3StreamError, match="does not exist") as info:
            call()
        assert type(info.value) is S3StreamError and not info.value.retryable
    if not seaweedfs.checks_credentials:
        pytest.skip(f"{seaweedfs.kind}'s S3 server accepts any credentials")
    denied = S3ObjectStore(
        seaweedfs.bucket, **{**options, "aws_secret_access_key": "not-the-secret"}
    )
    with pytest.raises(S3StreamError, match="access denied") as info:
        denied.put("k", b"v")
    assert type(info.value) is S3StreamError


@pytest.mark.s3
def test_s3_make_bucket(seaweedfs: Any) -> None:
    name = seaweedfs.make_bucket(f"extra-{uuid.uuid4().hex[:12]}")
    store = S3ObjectStore(name, **seaweedfs.storage_options())
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert seaweedfs.make_bucket(name) == name  # idempotent


def _s3_on_loopback_port(port: int, *, max_attempts: int) -> S3ObjectStore:
    """An S3 store whose endpoint is a loopback port of the test's (test credentials)."""
    return S3ObjectStore(
        "bucket",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        max_attempts=max_attempts,
        connect_timeout_s=1,
        read_timeout_s=1,
    )


def test_s3_unreachable_endpoint_is_unavailable_within_bounded_time() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The port is closed now: every connection is refused.
    store = _s3_on_loopback_port(port, max_attempts=2)
    started = time.monotonic()
    for call in (
        lambda: store.put("k", b"v"),
        lambda: store.get("k"),
        lambda: store.head("k"),
        lambda: list(store.list()),
        lambda: store.put_if_absent("k", b"v"),
    ):
        with pytest.raises(UnavailableError) as info:
            call()
        assert info.value.retryable
        assert f"127.0.0.1:{port}" in str(info.value)
    assert time.monotonic() - started < 20


def test_s3_argument_checks() -> None:
    for bad in ("", "a/b", None):
        with pytest.raises(InvalidArgumentError):
            S3ObjectStore(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="prefix"):
        S3ObjectStore("bucket", "a//b")
    for name, value in (
        ("max_attempts", 0),
        ("max_pool_connections", -1),
        ("connect_timeout_s", 0),
        ("read_timeout_s", "1"),
        ("addressing_style", "sideways"),
    ):
        with pytest.raises(InvalidArgumentError, match=name):
            S3ObjectStore("bucket", **{name: value})
    assert S3ObjectStore("bucket", "/p/q/").prefix == "p/q/"
    assert S3ObjectStore("bucket").prefix == ""


# ==============================================================================================
# S3ObjectStore against a scripted loopback HTTP server (failures SeaweedFS cannot produce)
# ==============================================================================================

Reply = tuple[int, dict[str, str], bytes]


def _error_xml(code: str, message: str = "scripted") -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()


class ScriptedS3:
    """A loopback HTTP server that answers each request from a script, and records them."""

    def __init__(
        self,
        respond: Callable[[str, str, dict[str, str], bytes], Reply | None],
        s3_headers: bool = True,
    ):
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                script.requests.append((self.command, self.path, headers, body))
                reply = respond(self.command, self.path, headers, body)
                if reply is None:  # cut the body short: promise 100 bytes, send 10
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                status, extra, payload = reply
                self.send_response(status)
                if s3_headers:  # every S3 answer has one, errors included
                    self.send_header("x-amz-request-id", f"req{len(script.requests)}")
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def store(self, **kwargs: Any) -> S3ObjectStore:
        options: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "aws_access_key_id": "a",
            "aws_secret_access_key": "b",
            "max_attempts": 2,
            "clock": ManualClock(),
            "rng": random.Random(3),
        }
        options.update(kwargs)
        return S3ObjectStore("bucket", **options)

    def methods(self) -> list[str]:
        return [method for method, *_ in self.requests]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., ScriptedS3]]:
    servers: list[ScriptedS3] = []

    def make(
        respond: Callable[[str, str, dict[str, str], bytes], Reply | None],
        s3_headers: bool = True,
    ) -> ScriptedS3:
        server = ScriptedS3(respond, s3_headers)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def _sequence(replies: Iterable[Reply | None]) -> Callable[..., Reply | None]:
    queue = list(replies)

    def respond(*_: Any) -> Reply | None:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return respond


OK: Reply = (200, {"ETag": '"abc"'}, b"")
SLOW_DOWN: Reply = (503, {}, _error_xml("SlowDown", "Please reduce your request rate."))


def test_s3_slowdown_is_retried_then_unavailable(scripted: Callable[..., ScriptedS3]) -> None:
    server = scripted(_sequence([SLOW_DOWN]))
    store = server.store(max_attempts=2)
    with pytest.raises(UnavailableError, match="SlowDown") as info:
        store.put("k", b"v")
    assert info.value.retryable
    assert server.methods() == ["PUT", "PUT"]  # botocore's bounded retries, then us


def test_s3_slowdown_then_success(scripted: Callable[..., ScriptedS3]) -> None:
    server = scripted(_sequence([SLOW_DOWN, OK]))
    server.store(max_attempts=2).put("k", b"v")
    assert server.methods() == ["PUT", "PUT"]
    assert server.requests[-1][3] == b"v"


def test_s3_access_denied_is_not_retried(scripted: Callable[..., ScriptedS3]) -> None:
    server = scripted(_sequence([(403, {}, _error_xml("AccessDenied"))]))
    with pytest.raises(S3StreamError, match="access denied") as info:
        server.store(max_attempts=3).get("k")
    assert type(info.value) is S3StreamError
    assert server.methods() == ["GET"]


def test_s3_range_headers(scripted: Callable[..., ScriptedS3]) -> None:
    server = scripted(_sequence([(206, {}, b"abc")]))
    store = server.store()
    store.get("k", 10, 13)
    store.get("k", 10)
    store.get_suffix("k", 3)
    store.get("k")
    ranges = [headers.get("range") for _, _, headers, _ in server.requests]
    assert ranges == ["bytes=10-12", "bytes=10-", "bytes=-3", None]
    assert [path for _, path, _, _ in server.requests] == ["/bucket/k"] * 4


def test_s3_truncated_body_is_retried(scripted: Callable[..., ScriptedS3]) -> None:
    server = scripted(_sequence([None, (200, {}, b"0123456789")]))
    clock = ManualClock()
    store = server.store(clock=clock, max_attempts=3)
    assert store.get("k") == b"0123456789"
    assert server.methods() == ["GET", "GET"]
    broken = scripted(_sequence([None]))
    with pytest.raises(UnavailableError):
        broken.store(max_attempts=3).get("k")
    assert broken.methods() == ["GET"] * 3


def test_s3_conditional_create_conflict_409_is_retried(
    scripted: Callable[..., ScriptedS3],
) -> None:
    """A 409 is retryable, and retried in the one retry layer: the store itself sends one
    PUT (botocore does not retry a 409 either), `RetryingObjectStore` tries again."""
    conflict: Reply = (409, {}, _error_xml("ConditionalRequestConflict"))
    alone = scripted(_sequence([conflict]))
    with pytest.raises(UnavailableError, match="ConditionalRequestConflict") as info:
        alone.store().put_if_absent("k", b"v")
    assert info.value.retryable
    assert alone.methods() == ["PUT"]

    server = scripted(_sequence([conflict, conflict, OK]))
    clock = ManualClock()
    start = clock.monotonic()
    retrying = RetryingObjectStore(
        server.store(max_attempts=1), clock=clock, rng=random.Random(1), max_attempts=5
    )
    assert retrying.put_if_absent("k", b"v") is True
    assert server.methods() == ["PUT"] * 3
    assert all(h.get("if-none-match") == "*" for _, _, h, _ in server.requests)
    assert clock.monotonic() > start  # backed off on the injected clock, not in real time

    def conflict_then_exists(method: str, *_: Any) -> Reply:
        puts = sum(1 for m, *_ in exists.requests if m == "PUT")
        if method == "PUT":
            return conflict if puts == 1 else (412, {}, _error_xml("PreconditionFailed"))
        return (200, {}, b"someone else's")

    exists = scripted(conflict_then_exists)
    retrying = RetryingObjectStore(
        exists.store(max_attempts=1), clock=ManualClock(), rng=random.Random(1)
    )
    assert retrying.put_if_absent("k", b"v") is False
    # After a failed try the retry layer reads the object back: it is not ours.
    assert exists.methods() == ["PUT", "PUT", "GET"]


def test_s3_ambiguous_conditional_create_is_resolved_by_reading_back(
    scripted: Callable[..., ScriptedS3],
) -> None:
    # First try: the server applied the write but answered 500; botocore retried and got 412.
    def make(stored: bytes) -> Callable[..., Reply]:
        puts = 0

        def respond(method: str, *_: Any) -> Reply:
            nonlocal puts
            if method == "PUT":
                puts += 1
                if puts == 1:
                    return (500, {}, _error_xml("InternalError"))
                return (412, {}, _error_xml("PreconditionFailed"))
            return (200, {}, stored)

        return respond

    ours = scripted(make(b"mine"))
    assert ours.store(max_attempts=3).put_if_absent("k", b"mine") is True
    assert ours.methods() == ["PUT", "PUT", "GET"]
    theirs = scripted(make(b"someone else's"))
    assert theirs.store(max_attempts=3).put_if_absent("k", b"mine") is False
    # Without a retry a 412 is final: no read-back.
    plain = scripted(_sequence([(412, {}, _error_xml("PreconditionFailed"))]))
    assert plain.store().put_if_absent("k", b"mine") is False
    assert plain.methods() == ["PUT"]


def test_s3_delete_many_batches_and_reports_errors(scripted: Callable[..., ScriptedS3]) -> None:
    empty_result = b'<?xml version="1.0" encoding="UTF-8"?><DeleteResult></DeleteResult>'
    server = scripted(_sequence([(200, {}, empty_result)]))
    keys = [f"k{i:05d}" for i in range(2500)]
    server.store().delete_many(keys + keys[:10])
    assert server.methods() == ["POST"] * 3
    counts = [body.count(b"<Key>") for _, _, _, body in server.requests]
    assert counts == [1000, 1000, 500]
    assert all("delete" in path for _, path, _, _ in server.requests)

    def failing(code: str) -> bytes:
        return (
            '<?xml version="1.0" encoding="UTF-8"?><DeleteResult>'
            f"<Error><Key>k00001</Key><Code>{code}</Code><Message>m</Message></Error>"
            "</DeleteResult>"
        ).encode()

    denied = scripted(_sequence([(200, {}, failing("AccessDenied"))]))
    with pytest.raises(S3StreamError, match="k00001") as info:
        denied.store().delete_many(["k00001", "k00002"])
    assert not info.value.retryable
    busy = scripted(_sequence([(200, {}, failing("InternalError"))]))
    with pytest.raises(UnavailableError, match="k00001"):
        busy.store().delete_many(["k00001"])


def test_s3_empty_object_and_past_end_ranges(scripted: Callable[..., ScriptedS3]) -> None:
    server = scripted(_sequence([(416, {}, _error_xml("InvalidRange"))]))
    store = server.store()
    assert store.get("k", 5) == b""
    assert store.get_suffix("k", 5) == b""


# ==============================================================================================
# FsspecObjectStore specifics
# ==============================================================================================


def test_fsspec_store_on_a_local_directory(tmp_path: Path) -> None:
    store = FsspecObjectStore(f"file://{tmp_path}", auto_mkdir=True)
    store.put("a/b", b"12345")
    assert (tmp_path / "a" / "b").read_bytes() == b"12345"
    assert store.get("a/b", 1, 3) == b"23"
    assert store.get_suffix("a/b", 2) == b"45"
    assert store.put_if_absent("a/b", b"x") is False
    assert store.put_if_absent("a/c", b"x") is True
    assert [i.key for i in store.list()] == ["a/b", "a/c"]
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("a/c") == b"x"


def test_a_stuck_fsspec_backend_keeps_the_deadline(tmp_path: Path) -> None:
    """A try that blocks in the kernel for good (here: opening a FIFO nobody writes, as a
    hung network filesystem would block) does not hold the call past its deadline once the
    store's tries are bounded, as every client's store stack bounds them."""
    import random

    from s3stream.clock import SystemClock
    from s3stream.objectstore.stack import store_stack

    (tmp_path / "data").mkdir()
    fifo = tmp_path / "data" / "stuck"
    os.mkfifo(fifo)
    raw = FsspecObjectStore(f"file://{tmp_path}", auto_mkdir=True)
    store = store_stack(raw, clock=SystemClock(), rng=random.Random(1), timeout_s=1.5)
    assert raw.attempt_timeout_s == pytest.approx(0.5)
    try:
        started = time.monotonic()
        with pytest.raises(UnavailableError, match=r"no answer within 0\.5 s"):
            store.get("data/stuck")
        assert time.monotonic() - started < 2.5
        store.put("data/fine", b"ok")  # other keys still work meanwhile
        assert store.get("data/fine") == b"ok"
        # Writes are not left behind: on a backend that writes in place, a try left writing
        # after its retry succeeded cut the committed file short. A slow write is waited for.
        pipe_file = raw.fs.pipe_file

        def slow_pipe_file(path: str, value: bytes, **kwargs: Any) -> None:
            time.sleep(0.8)
            pipe_file(path, value, **kwargs)

        raw.fs.pipe_file = slow_pipe_file
        try:
            store.put("data/slow", b"x" * 100_000)
        finally:
            raw.fs.pipe_file = pipe_file
        time.sleep(1.0)  # a write left behind would land now
        assert store.get("data/slow") == b"x" * 100_000
        assert [t.name for t in threading.enumerate() if "fsspec-write" in t.name] == []
    finally:
        # Release the tries left blocked in open(): a writer's open wakes every reader.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_at_a_keys_path_in_a_local_store_is_no_object(tmp_path: Path) -> None:
    """Somebody's FIFO where a key's file would be: a read opened it and blocked until a
    writer came, for ever (a reader's fetch, `open_reader` on a FIFO in the metadata log,
    `s3stream inspect`). It is no object now, at once; the FIFO is left as it was."""
    store = LocalObjectStore(tmp_path / "objects")
    store.put("a/regular", b"x")
    fifo = tmp_path / "objects" / "a" / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    for call in (
        lambda: store.get("a/fifo"),
        lambda: store.get("a/fifo", 1, 2),
        lambda: store.get_suffix("a/fifo", 4),
    ):
        with pytest.raises(ObjectNotFoundError):
            call()
    assert time.monotonic() - started < 5  # an open blocking on the FIFO waits for ever
    assert fifo.is_fifo() and store.get("a/regular") == b"x"


def test_fsspec_bad_url() -> None:
    with pytest.raises(InvalidArgumentError):
        FsspecObjectStore("nosuchproto-xyz://a")
    with pytest.raises(InvalidArgumentError):
        FsspecObjectStore("")


# ==============================================================================================
# Registry
# ==============================================================================================


def test_object_options_given_as_text_are_refused(tmp_path: Path) -> None:
    """``-o client=obstore`` (the WAL URL's ``?client=`` given to the store) or ``-o
    clock=x`` failed on first use with an AttributeError; ``rng=5`` was taken."""
    opts = {"endpoint_url": "http://127.0.0.1:1"}
    for name, value in (("client", "obstore"), ("client", 5), ("clock", "x"), ("rng", 5)):
        with pytest.raises(InvalidArgumentError, match=f"{name} must be a"):
            open_object_store("s3://bucket/p", {**opts, name: value})
    with pytest.raises(InvalidArgumentError, match="clock must be a Clock"):
        open_object_store(f"fsspec+file://{tmp_path}", {"clock": "x"})


def test_a_client_given_to_the_s3_store_is_used_as_it_is() -> None:
    """A boto3 client given as ``client=`` was closed and replaced by one built from the other
    options when the client bounded its tries (every `s3stream.open`): with no endpoint
    among them, one that talked to AWS instead of the user's server."""
    import boto3

    given = boto3.session.Session().client(
        "s3",
        endpoint_url="http://127.0.0.1:1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )
    store = open_object_store("s3://bucket/p", {"client": given})
    store.bound_attempts(1.0)
    assert store._connected() is given  # type: ignore[attr-defined]
    store.close()
    assert given.meta.endpoint_url == "http://127.0.0.1:1"
    unpickled = pickle.loads(pickle.dumps(store))
    assert not unpickled._client_given  # type: ignore[attr-defined]


def test_registry_builtin_schemes(tmp_path: Path) -> None:
    local = open_object_store(str(tmp_path / "plain"))
    assert isinstance(local, LocalObjectStore)
    assert local.root == tmp_path / "plain"
    by_url = open_object_store(f"file://{tmp_path}/url", {"fsync": False})
    assert isinstance(by_url, LocalObjectStore) and by_url.root == tmp_path / "url"
    first, second = open_object_store("memory://"), open_object_store("memory://name")
    assert isinstance(first, MemoryObjectStore) and isinstance(second, MemoryObjectStore)
    first.put("k", b"v")
    assert second.head("k") is None  # memory:// never shares state
    for options in ("memory://?fsync=false", "memory://x?bogus=1", "memory://x#f"):
        with pytest.raises(InvalidArgumentError, match="no query or fragment"):
            open_object_store(options)  # were ignored
    s3 = open_object_store("s3://bucket/some/prefix", {"endpoint_url": "http://127.0.0.1:1"})
    assert isinstance(s3, S3ObjectStore) and s3.prefix == "some/prefix/"
    fs = open_object_store(f"fsspec+memory://s3stream-reg-{uuid.uuid4().hex}")
    assert isinstance(fs, FsspecObjectStore)
    fs.put("k", b"v")
    assert fs.get("k") == b"v"


def test_registry_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="no object store for URL scheme"):
        open_object_store("nosuchscheme-xyz://a/b")
    with pytest.raises(InvalidArgumentError, match="storage_options"):
        open_object_store("memory://", {"x": 1})
    with pytest.raises(InvalidArgumentError):
        open_object_store("memory://", ["x"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        open_object_store("")
    with pytest.raises(InvalidArgumentError, match="scheme"):
        register_object_store("Bad Scheme", MemoryObjectStore.from_url)
    with pytest.raises(InvalidArgumentError, match="target"):
        register_object_store("okscheme", "no-colon")


def test_register_object_store_at_run_time() -> None:
    scheme = f"test-{uuid.uuid4().hex[:8]}"
    opened: list[tuple[str, dict[str, Any]]] = []
    shared = MemoryObjectStore()

    def factory(url: str, **options: Any) -> ObjectStore:
        opened.append((url, options))
        return shared

    register_object_store(scheme, factory)
    assert open_object_store(f"{scheme}://x", {"a": 1}) is shared
    assert opened == [(f"{scheme}://x", {"a": 1})]
    with pytest.raises(InvalidArgumentError, match="already registered"):
        register_object_store(scheme, factory)
    register_object_store(scheme, lambda url, **_: "not a store", clobber=True)
    with pytest.raises(InvalidArgumentError, match="not an ObjectStore"):
        open_object_store(f"{scheme}://x")


def test_entry_point_plugin_is_found(tmp_path: Path) -> None:
    (tmp_path / "plugin_store.py").write_text(
        textwrap.dedent(
            """
            from s3stream.objectstore import MemoryObjectStore

            class PluginStore(MemoryObjectStore):
                def __init__(self, url):
                    super().__init__()
                    self.url = url

            def open_store(url, **options):
                return PluginStore(url)
            """
        )
    )
    dist = tmp_path / "plugin_store-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-store\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[s3stream.object_stores]\nplugged = plugin_store:open_store\n"
    )
    code = (
        "from s3stream.objectstore import open_object_store\n"
        "store = open_object_store('plugged://somewhere')\n"
        "print(type(store).__name__, store.url)\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "PluginStore plugged://somewhere"


# ==============================================================================================
# RetryingObjectStore
# ==============================================================================================


class FlakyStore(MemoryObjectStore):
    """A memory store whose next `failures` calls raise UnavailableError (a test double)."""

    def __init__(
        self,
        failures: int = 0,
        *,
        lose_reply: bool = False,
        error: type[UnavailableError] = UnavailableError,
    ) -> None:
        super().__init__()
        self.failures = failures
        self.lose_reply = lose_reply  # apply the write, then fail (an ambiguous error)
        self.error = error
        self.calls: list[str] = []

    def _maybe_fail(self, op: str) -> None:
        self.calls.append(op)
        if self.failures > 0:
            self.failures -= 1
            raise self.error(f"injected failure of {op}")

    def put(self, key: str, data: bytes) -> None:
        self._maybe_fail("put")
        super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.lose_reply and self.failures > 0:
            super().put_if_absent(key, data)
        self._maybe_fail("put_if_absent")
        return super().put_if_absent(key, data)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self._maybe_fail("get")
        return super().get(key, start, end)

    def head(self, key: str) -> ObjectInfo | None:
        self._maybe_fail("head")
        return super().head(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        self._maybe_fail("delete_many")
        super().delete_many(keys)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._maybe_fail("list")
        return super().list(prefix)


class RecordingClock(ManualClock):
    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        super().sleep(seconds)


def _retrying(inner: ObjectStore, clock: ManualClock, **kwargs: Any) -> RetryingObjectStore:
    return RetryingObjectStore(inner, clock=clock, rng=random.Random(7), **kwargs)


def test_retrying_recovers_from_transient_failures() -> None:
    inner, clock = FlakyStore(failures=3), RecordingClock()
    store = _retrying(inner, clock, base_delay_s=0.1, max_delay_s=0.25)
    store.put("k", b"v")
    assert inner.calls == ["put"] * 4
    assert len(clock.sleeps) == 3
    caps = [0.1, 0.2, 0.25]
    assert all(0 <= s <= cap for s, cap in zip(clock.sleeps, caps, strict=True))
    inner.failures = 2
    assert store.get("k") == b"v"
    inner.failures = 1
    assert store.head("k") == ObjectInfo("k", 1)
    inner.failures = 1
    assert store.get_suffix("k", 1) == b"v"
    inner.failures = 1
    store.delete_many(iter(["k"]))
    assert inner.head("k") is None


def test_retrying_waits_steadily_on_contention_not_backing_off() -> None:
    """A `ContendedError` (S3's 409: a racing conditional write, not an outage) is retried
    after a fresh random wait of at most `base_delay_s` each time: no exponential growth."""
    inner, clock = FlakyStore(failures=8, error=ContendedError), RecordingClock()
    store = _retrying(inner, clock, base_delay_s=0.05, max_delay_s=2.0, max_attempts=20)
    assert store.put_if_absent("k", b"v") is True
    assert inner.calls == ["put_if_absent"] * 9
    assert len(clock.sleeps) == 8 and all(0 <= s <= 0.05 for s in clock.sleeps)


def test_retrying_gives_up_after_max_attempts() -> None:
    inner, clock = FlakyStore(failures=100), RecordingClock()
    store = _retrying(inner, clock, max_attempts=4)
    with pytest.raises(UnavailableError, match="failed 4 times") as info:
        store.put("k", b"v")
    assert inner.calls == ["put"] * 4
    assert len(clock.sleeps) == 3
    assert isinstance(info.value.__cause__, UnavailableError)


def test_retrying_respects_the_deadline() -> None:
    inner, clock = FlakyStore(failures=100), RecordingClock()
    store = _retrying(
        inner, clock, max_attempts=1000, base_delay_s=1.0, max_delay_s=1.0, deadline_s=5.0
    )
    start = clock.monotonic()
    with pytest.raises(UnavailableError, match=r"deadline_s=5\.0"):
        store.get("k")
    assert clock.monotonic() - start <= 5.0
    assert 3 < len(inner.calls) < 1000


def test_retrying_is_deterministic_for_a_seed() -> None:
    def sleeps() -> list[float]:
        clock = RecordingClock()
        with pytest.raises(UnavailableError):
            _retrying(FlakyStore(failures=100), clock).put("k", b"v")
        return clock.sleeps

    assert sleeps() == sleeps()


def test_retrying_passes_other_errors_through_at_once() -> None:
    inner, clock = FlakyStore(), RecordingClock()
    store = _retrying(inner, clock)
    with pytest.raises(ObjectNotFoundError):
        store.get("missing")
    with pytest.raises(InvalidArgumentError):
        store.put("bad//key", b"v")
    assert inner.calls == ["get", "put"]
    assert clock.sleeps == []


def test_retrying_conditional_create_after_a_lost_reply() -> None:
    inner = FlakyStore(failures=1, lose_reply=True)
    store = _retrying(inner, RecordingClock())
    # The first try created the object but "failed"; the retry finds it: it is ours.
    assert store.put_if_absent("k", b"mine") is True
    assert inner.calls == ["put_if_absent", "put_if_absent", "get"]
    # A competitor's object is not mistaken for ours.
    inner.put("other", b"theirs")
    inner.failures = 1
    inner.calls.clear()
    assert store.put_if_absent("other", b"mine") is False
    # No failed try, no ambiguity: a plain False without reading back.
    inner.calls.clear()
    assert store.put_if_absent("k", b"mine") is False
    assert inner.calls == ["put_if_absent"]


def test_retrying_read_back_keeps_to_the_call_deadline() -> None:
    """The read-back that settles an ambiguous create has what is left of the call's
    deadline, not a deadline of its own (the call took up to twice its deadline)."""
    clock = RecordingClock()

    class Frozen(MemoryObjectStore):
        """Try 1 of the create times out but is applied; try 2 finds the key; every read
        times out."""

        tries = 0

        def put_if_absent(self, key: str, data: bytes) -> bool:
            self.tries += 1
            if self.tries == 1:
                super().put_if_absent(key, data)
                clock.advance(1.0)
                raise UnavailableError("timed out (applied)")
            return super().put_if_absent(key, data)

        def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
            clock.advance(1.0)
            raise UnavailableError("timed out")

    for seed in range(5):
        store = RetryingObjectStore(
            Frozen(),
            clock=clock,
            rng=random.Random(seed),
            max_attempts=1000,
            base_delay_s=1.0,
            max_delay_s=1.0,
            deadline_s=5.0,
            attempt_timeout_s=1.0,
        )
        start = clock.monotonic()
        with pytest.raises(UnavailableError):
            store.put_if_absent("k", b"mine")
        assert clock.monotonic() - start <= 5.0, f"seed {seed}"


def test_retrying_list_resumes_after_a_failure_midway() -> None:
    class BreaksMidList(MemoryObjectStore):
        broke = False

        def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
            for i, info in enumerate(super().list(prefix)):
                if i == 3 and not self.broke:
                    self.broke = True
                    raise UnavailableError("connection reset while listing")
                yield info

    inner = BreaksMidList()
    keys = [f"k{i}" for i in range(8)]
    for key in keys:
        inner.put(key, b"v")
    store = _retrying(inner, RecordingClock())
    assert [i.key for i in store.list()] == keys
    assert inner.broke


def test_retrying_argument_checks() -> None:
    clock = ManualClock()
    with pytest.raises(InvalidArgumentError):
        RetryingObjectStore("x", clock=clock, rng=random.Random())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_attempts"):
        _retrying(MemoryObjectStore(), clock, max_attempts=0)
    with pytest.raises(InvalidArgumentError, match="deadline_s"):
        _retrying(MemoryObjectStore(), clock, deadline_s=-1)


def test_retrying_over_s3_slowdown(scripted: Callable[..., ScriptedS3]) -> None:
    server = scripted(_sequence([SLOW_DOWN, SLOW_DOWN, OK]))
    clock = RecordingClock()
    store = _retrying(server.store(max_attempts=1), clock)
    store.put("k", b"v")
    assert server.methods() == ["PUT"] * 3
    assert len(clock.sleeps) == 2
    assert store.describe().startswith("retrying(s3://bucket/")


# ==============================================================================================
# MetricsObjectStore
# ==============================================================================================


def test_metrics_count_calls_and_bytes() -> None:
    store = MetricsObjectStore(MemoryObjectStore())
    store.put("a", b"12345")
    store.put("b", b"xy")
    assert store.put_if_absent("c", b"123") is True
    assert store.put_if_absent("c", b"456") is False
    assert store.get("a", 1, 3) == b"23"
    assert store.get_suffix("a", 4) == b"2345"
    assert store.head("a") is not None
    assert [i.key for i in store.list()] == ["a", "b", "c"]
    store.delete_many(["a", "b"])
    with pytest.raises(ObjectNotFoundError):
        store.get("a")
    m = store.metrics
    assert m == ObjectStoreMetrics(
        puts=2,
        put_bytes=7,
        conditional_puts=2,
        conditional_put_bytes=3,
        conditional_put_conflicts=1,
        gets=3,
        get_bytes=6,
        heads=1,
        deletes=1,
        deleted_keys=2,
        lists=1,
        listed_objects=3,
        errors=1,
    )
    assert m.requests == 10
    assert store.reset() == m
    assert store.metrics == ObjectStoreMetrics()
    with pytest.raises(AttributeError):
        m.puts = 0  # type: ignore[misc]
    assert store.describe() == f"metrics({store.inner.describe()})"


def test_metrics_are_thread_safe() -> None:
    store = MetricsObjectStore(MemoryObjectStore())

    def work(t: int) -> None:
        for i in range(300):
            store.put(f"t{t}/{i}", b"abc")
            store.get(f"t{t}/{i}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = store.metrics
    assert (m.puts, m.put_bytes, m.gets, m.get_bytes) == (2400, 7200, 2400, 7200)


def test_wrappers_stack_over_a_real_store(tmp_path: Path) -> None:
    store = MetricsObjectStore(
        RetryingObjectStore(LocalObjectStore(tmp_path), clock=ManualClock(), rng=random.Random(1))
    )
    store.put("x/1", b"abc")
    assert store.get("x/1") == b"abc"
    assert re.fullmatch(r"metrics\(retrying\(file://.+\)\)", store.describe())
    store.close()


def test_an_http_server_that_is_not_s3_is_named(scripted: Callable[..., ScriptedS3]) -> None:
    """An endpoint that answers HTTP but not S3 (a web server's HTML 404, 405 or 501, no S3
    headers) is reported as such, not as a missing object; the same through `s3stream.open`."""
    import s3stream

    page: Reply = (404, {"Content-Type": "text/html"}, b"<html>Not Found</html>")
    server = scripted(_sequence([page]), s3_headers=False)
    store = server.store()
    for call in (lambda: store.get("k"), lambda: store.head("k"), lambda: store.put("k", b"v")):
        with pytest.raises(S3StreamError, match="did not answer like S3") as info:
            call()
        assert not isinstance(info.value, ObjectNotFoundError)
    for status in (405, 501):
        other = scripted(_sequence([(status, {}, b"nope")]), s3_headers=False).store()
        with pytest.raises(S3StreamError, match="did not answer like S3"):
            other.put("k", b"v")
    with pytest.raises(S3StreamError, match="did not answer like S3"):
        s3stream.open(
            "s3://bucket/prefix",
            storage_options={
                "endpoint_url": server.endpoint_url,
                "aws_access_key_id": "a",
                "aws_secret_access_key": "b",
            },
            settings=s3stream.ClientSettings(store_timeout_ms=2_000),
        )


def test_local_listing_skips_names_that_are_not_keys(tmp_path: Path) -> None:
    """Names other tools leave under the root (a ``\\``, bytes that are not UTF-8) were
    listed as keys that `get` and `delete_many` then refused (a delete of a whole listing
    failed); a prefix with a NUL raised a bare ValueError."""
    root = tmp_path / "objects"
    store = LocalObjectStore(root, fsync=False)
    store.put("data/ok", b"1")
    (root / "data" / "back\\slash").write_bytes(b"x")
    os.mkdir(os.path.join(os.fsencode(root / "data"), b"not-utf8-\xff"))
    (root / "data" / "plain").mkdir()
    keys = [info.key for info in store.list("")]
    assert keys == ["data/ok"]
    store.delete_many(keys)
    assert list(store.list("a\x00/b")) == [] and list(store.list("a/\x00")) == []


def test_s3_requests_count_every_try_botocore_sends_itself() -> None:
    """With `max_attempts` > 1 botocore retries a dropped connection itself; such an error
    carries no RetryAttempts, so each call was counted as one request although three were
    sent (and billed)."""
    from s3stream.metrics.registry import MetricsRegistry
    from s3stream.objectstore.wrappers import MetricsObjectStore

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(50)

    def drop_every_connection() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=drop_every_connection, daemon=True).start()
    try:
        raw = _s3_on_loopback_port(server.getsockname()[1], max_attempts=3)
        store = MetricsObjectStore(raw, registry=MetricsRegistry())
        for call in (lambda: store.get("k"), lambda: store.head("k"), lambda: list(store.list())):
            with pytest.raises(UnavailableError):
                call()
        family = store.registry.family("s3stream.objectstore.requests")
        assert family is not None
        counted = {p.labels[1]: int(p.value) for p in family.points}
        assert counted == {"GetObject": 3, "HeadObject": 3, "ListObjectsV2": 3}
        store.close()
    finally:
        server.close()
