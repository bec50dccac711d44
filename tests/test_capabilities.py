"""`ObjectStore.capabilities`: what each store claims, wrappers passing it on, `repr`, and the
metadata log refusing to commit through a store that cannot fence its writers."""

from __future__ import annotations

import dataclasses
import pickle
import random
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

import s3stream
from s3stream.clock import ManualClock
from s3stream.errors import InvalidArgumentError
from s3stream.metadata.manager import MetadataManager
from s3stream.objectstore import (
    FsspecObjectStore,
    LocalObjectStore,
    MemoryObjectStore,
    MetricsObjectStore,
    ObjectInfo,
    ObjectStore,
    RetryingObjectStore,
    S3ObjectStore,
    open_object_store,
)
from s3stream.objectstore.base import ObjectStoreCapabilities
from s3stream.objectstore.forwarding import ForwardingObjectStore
from s3stream.objectstore.requests import RequestCountingStore
from s3stream.objectstore.stack import store_stack
from s3stream.reader import StreamReader
from s3stream.testing.faults import FaultyObjectStore


def _fsspec_url() -> str:
    # fsspec's memory filesystem is process-wide: a root of our own.
    return f"memory://caps-{uuid.uuid4().hex}"


def _caps(**claims: object) -> ObjectStoreCapabilities:
    base: dict[str, object] = {
        "ranged_reads": True,
        "conditional_replace": False,
        "ordered_listing": True,
    }
    base.update(claims)
    return ObjectStoreCapabilities(**base)  # type: ignore[arg-type]


# -- what each store claims ---------------------------------------------------------------------


def test_each_store_states_its_guarantees(tmp_path: Path) -> None:
    assert MemoryObjectStore().capabilities == _caps(scheme="memory", atomic_create=True)
    assert LocalObjectStore(tmp_path).capabilities == _caps(scheme="file", atomic_create=True)
    # No client is needed to say what S3 guarantees.
    assert S3ObjectStore("bucket").capabilities == _caps(scheme="s3", atomic_create=True)
    fs = FsspecObjectStore(_fsspec_url())
    assert fs.capabilities == _caps(scheme="fsspec+memory", atomic_create=False)
    assert not fs.capabilities.fences_writers
    one = FsspecObjectStore(_fsspec_url(), single_writer=True)
    assert one.capabilities == _caps(
        scheme="fsspec+memory", atomic_create=False, single_writer=True
    )
    assert one.capabilities.fences_writers
    # Through the registry: an fsspec scheme without a dedicated store keeps its name.
    assert FsspecObjectStore(f"file://{tmp_path}/f", auto_mkdir=True).capabilities.scheme == (
        "fsspec+file"
    )


def test_capabilities_are_frozen() -> None:
    caps = MemoryObjectStore().capabilities
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.atomic_create = False  # type: ignore[misc]


def test_single_writer_is_a_storage_option() -> None:
    url = _fsspec_url()
    store = open_object_store(f"fsspec+{url}", {"single_writer": True})
    assert isinstance(store, FsspecObjectStore)
    assert store.capabilities.single_writer
    # The option survives pickling (Spark ships stores to executors) and is not fsspec's.
    again = pickle.loads(pickle.dumps(store))
    assert again.capabilities.single_writer
    with pytest.raises(InvalidArgumentError, match="single_writer must be a bool"):
        FsspecObjectStore(url, single_writer="yes")  # type: ignore[arg-type]


class _PlainStore(ObjectStore):
    """A third-party store that says nothing about its capabilities."""

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def put_if_absent(self, key: str, data: bytes) -> bool:
        raise NotImplementedError

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        raise NotImplementedError

    def head(self, key: str) -> ObjectInfo | None:
        raise NotImplementedError

    def delete_many(self, keys: Iterable[str]) -> None:
        raise NotImplementedError

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        raise NotImplementedError

    def describe(self) -> str:
        return "plain://somewhere"


def test_default_capabilities_are_the_contract() -> None:
    """A store that does not override `capabilities` claims what the ObjectStore contract
    already asks of it (atomic conditional create, ordered listings) and nothing more."""
    caps = _PlainStore().capabilities
    assert caps == ObjectStoreCapabilities(
        scheme="plain",
        atomic_create=True,
        ranged_reads=False,
        conditional_replace=False,
        ordered_listing=True,
    )


# -- wrappers pass the inner store's record on ---------------------------------------------------


def _wrappers(inner: ObjectStore) -> list[ObjectStore]:
    clock = ManualClock()
    metrics = MetricsObjectStore(inner, clock=clock)
    return [
        ForwardingObjectStore(inner),
        RequestCountingStore(inner),
        RetryingObjectStore(inner, clock=clock, rng=random.Random(1)),
        metrics,
        metrics.for_purpose("metadata"),
        FaultyObjectStore(inner, rng=random.Random(1)),
        store_stack(inner, clock=clock, rng=random.Random(1), timeout_s=5.0),
        MetricsObjectStore(
            RetryingObjectStore(
                FaultyObjectStore(inner, rng=random.Random(2)), clock=clock, rng=random.Random(3)
            ),
            clock=clock,
        ),
    ]


@pytest.mark.parametrize("single_writer", [False, True])
def test_every_wrapper_forwards_capabilities(single_writer: bool) -> None:
    inner = FsspecObjectStore(_fsspec_url(), single_writer=single_writer)
    for wrapper in _wrappers(inner):
        assert wrapper.capabilities == inner.capabilities, type(wrapper).__name__


def test_every_store_has_a_repr_naming_it(tmp_path: Path) -> None:
    stores: list[ObjectStore] = [
        MemoryObjectStore(),
        LocalObjectStore(tmp_path),
        S3ObjectStore("bucket", "p", endpoint_url="http://127.0.0.1:9"),
        FsspecObjectStore(_fsspec_url()),
        _PlainStore(),
    ]
    stores += _wrappers(MemoryObjectStore())
    for store in stores:
        text = repr(store)
        assert store.describe() in text, text
        assert type(store).__name__ in text, text
    assert repr(S3ObjectStore("b", "p")) == "<S3ObjectStore s3://b/p/>"


# -- the metadata log refuses a store that cannot fence ------------------------------------------


def _manager(store: ObjectStore, writer: str = "w1") -> MetadataManager:
    return MetadataManager(store, clock=ManualClock(), writer_id=writer)


def test_metadata_log_refuses_a_store_that_cannot_fence() -> None:
    store = FsspecObjectStore(_fsspec_url())
    manager = _manager(store_stack(store, clock=ManualClock(), rng=random.Random(1), timeout_s=5))
    manager.load()  # reading needs no fencing
    with pytest.raises(InvalidArgumentError) as info:
        manager.register_node("n1")
    message = str(info.value)
    for part in ("fsspec+memory://", "file://", "s3://", "memory://", "single_writer=True"):
        assert part in message, (part, message)
    assert list(store.list()) == [], "nothing may be written before the refusal"


def test_metadata_log_commits_with_single_writer_and_readers_need_nothing() -> None:
    url = _fsspec_url()
    writer = _manager(FsspecObjectStore(url, single_writer=True))
    writer.load()
    assert writer.register_node("n1") == 1
    stream = writer.create_stream({"k": "v"})
    # A reader on a plain (not single-writer) store of the same root: loads and follows.
    reader = _manager(FsspecObjectStore(url), writer="reader")
    reader.load()
    assert reader.get_stream(stream.stream_id).tags == {"k": "v"}
    assert reader.state.nodes["n1"].epoch == 1


@pytest.mark.parametrize("make", ["memory", "local"])
def test_metadata_log_accepts_stores_that_fence(make: str, tmp_path: Path) -> None:
    store: ObjectStore = MemoryObjectStore() if make == "memory" else LocalObjectStore(tmp_path)
    manager = _manager(store)
    manager.load()
    assert manager.register_node("n1") == 1


def test_open_refuses_fsspec_unless_single_writer(tmp_path: Path) -> None:
    url = f"fsspec+{_fsspec_url()}"
    with pytest.raises(InvalidArgumentError, match="single_writer=True"):
        s3stream.open(url, wal="memory://", node_id="n1", environ={})
    with s3stream.open(
        url, wal="memory://", node_id="n1", storage_options={"single_writer": True}, environ={}
    ) as client:
        stream = client.create_stream({"name": "s"})
    reader = StreamReader(open_object_store(url))
    try:
        assert [s.stream_id for s in reader.metadata.list_streams()] == [stream.stream_id]
    finally:
        reader.close()
