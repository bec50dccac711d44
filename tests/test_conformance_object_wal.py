"""The object-store WAL through the conformance kit, on memory, local and every store of the
server matrix (S3 twice, GCS, Azure)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from s3stream.objectstore.base import ObjectStore
from s3stream.objectstore.local import LocalObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.wrappers import ForwardingObjectStore
from s3stream.settings import ObjectWalSettings
from s3stream.testing.faults import FaultRule, FaultyObjectStore
from s3stream.testing.store_servers import LoopbackStoreServer
from s3stream.testing.wal import WalTests
from s3stream.wal.base import WriteAheadLog
from s3stream.wal.object import ObjectWal

# Short intervals keep the kit's thousands of acknowledgements fast; batching itself is
# exercised in tests/test_object_wal.py.
_SETTINGS = ObjectWalSettings(
    wal_batch_interval_ms=1, wal_batch_max_bytes=256 << 10, max_unflushed_bytes=64 << 20
)


class FaultWindowStore(ForwardingObjectStore):
    """A store that works, except inside `failing()`: there every PUT fails, through the
    project's `FaultyObjectStore` — half of them before reaching the store, half after taking
    effect with the reply lost (so a WAL object whose PUT failed may exist or not)."""

    def __init__(self, inner: ObjectStore, seed: int = 11) -> None:
        self.faulty = FaultyObjectStore(
            inner,
            rng=random.Random(seed),
            rules=[
                FaultRule(
                    error_rate=0.5,
                    ambiguous_rate=0.5,
                    operations=frozenset({"put", "put_if_absent"}),
                )
            ],
        )
        super().__init__(self.faulty)
        self._suspension = self.faulty.healthy()
        self._suspension.__enter__()

    @contextlib.contextmanager
    def failing(self) -> Iterator[None]:
        """Inject the faults while inside (from every thread)."""
        self._suspension.__exit__(None, None, None)
        try:
            yield
        finally:
            self._suspension = self.faulty.healthy()
            self._suspension.__enter__()


class _ObjectWalHooks(WalTests):
    """Hooks shared by every store: the medium is the store (plus the WAL's prefix), behind a
    `FaultWindowStore` for `transient_fault`."""

    def make_store(self, tmp_path: Path) -> ObjectStore:
        raise NotImplementedError

    def make_medium(self, tmp_path: Path) -> FaultWindowStore:
        return FaultWindowStore(self.make_store(tmp_path))

    def transient_fault(
        self, medium: FaultWindowStore, wal: WriteAheadLog
    ) -> contextlib.AbstractContextManager[None]:
        return medium.failing()

    def open_wal(self, medium: ObjectStore) -> WriteAheadLog:
        return ObjectWal(medium, node_id="kit", node_epoch=1, prefix="wal", settings=_SETTINGS)

    def open_small_wal(
        self, medium: ObjectStore, capacity_bytes: int, full_wait_ms: int
    ) -> WriteAheadLog:
        settings = ObjectWalSettings(
            wal_batch_interval_ms=1,
            wal_batch_max_bytes=64 << 10,
            max_unflushed_bytes=capacity_bytes,
            full_wait_ms=max(full_wait_ms, 1),
        )
        return ObjectWal(medium, node_id="kit", node_epoch=1, prefix="wal", settings=settings)

    def open_wal_as(self, medium: ObjectStore, node_epoch: int) -> WriteAheadLog:
        return ObjectWal(
            medium, node_id="kit", node_epoch=node_epoch, prefix="wal", settings=_SETTINGS
        )

    def raw_bytes(self, medium: ObjectStore) -> bytes:
        return b"".join(medium.get(info.key) for info in medium.list("wal/"))


class TestObjectWalOnMemory(_ObjectWalHooks):
    def make_store(self, tmp_path: Path) -> ObjectStore:
        return MemoryObjectStore()


class TestObjectWalOnLocalDirectory(_ObjectWalHooks):
    def make_store(self, tmp_path: Path) -> ObjectStore:
        # No fsync: the kit simulates process crashes, not power loss.
        return LocalObjectStore(tmp_path / "store", fsync=False)


class TestObjectWalOnServers(_ObjectWalHooks):
    """On each store of the server matrix (tests/conftest.py ``store_server``: SeaweedFS, moto
    with signatures checked, fake-gcs-server, Azurite), a fresh prefix per medium. A subclass
    may open another store on the same servers (`open_at`)."""

    concurrency_threads = 4
    records_per_thread = 20

    @pytest.fixture(autouse=True)
    def _server(self, store_server: LoopbackStoreServer) -> None:
        self.server = store_server

    def open_at(self, prefix: str | None = None) -> ObjectStore:
        """A store on the server under `prefix` (fresh when None)."""
        return self.server.open_store(prefix)

    def make_store(self, tmp_path: Path) -> ObjectStore:
        return self.open_at()

    def test_state_machine(self, tmp_path: Path, pytestconfig: pytest.Config) -> None:
        pytest.skip(
            "the state machine runs on the memory and local stores (a server is too slow for it)"
        )
