"""Every metadata log store of the library through the conformance kit (`MetadataStoreTests`):
the object-store log on a memory store, on a local directory and on every server of the matrix,
and the PostgreSQL log on the session's server (tests/conftest.py, ``postgres``)."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest

from s3stream.metadata.base import MetadataLogStore
from s3stream.metadata.log import MetadataLog
from s3stream.objectstore.local import LocalObjectStore
from s3stream.objectstore.memory import MemoryObjectStore
from s3stream.objectstore.registry import open_object_store
from s3stream.testing.metadata import (
    MetadataBackend,
    MetadataStoreTests,
    ObjectStoreBackend,
    PostgresBackend,
)
from s3stream.testing.store_servers import LoopbackStoreServer


class TestObjectLogOnMemoryStore(MetadataStoreTests):
    def make_backend(self, tmp_path: Path) -> MetadataBackend:
        return ObjectStoreBackend(MemoryObjectStore())


class TestObjectLogOnLocalDirectory(MetadataStoreTests):
    """Other processes race on the same directory (its conditional create is an O_EXCL link)."""

    race_seqs = 25  # each create is a file written, fsynced and linked

    def make_backend(self, tmp_path: Path) -> MetadataBackend:
        root = tmp_path / "store"
        return ObjectStoreBackend(
            LocalObjectStore(root), reopen=functools.partial(LocalObjectStore, root)
        )


class TestPostgresLog(MetadataStoreTests):
    """A namespace of its own per test, in the session server's database."""

    @pytest.fixture(autouse=True)
    def _server(self, postgres: Any) -> None:
        self.server = postgres

    def make_backend(self, tmp_path: Path) -> MetadataBackend:
        return PostgresBackend(self.server.url())


class TestPostgresLogInItsOwnSchema(MetadataStoreTests):
    """Tables created in a schema named by the URL (``?schema=``), on first write."""

    @pytest.fixture(autouse=True)
    def _server(self, postgres: Any) -> None:
        self.server = postgres

    def make_backend(self, tmp_path: Path) -> MetadataBackend:
        return PostgresBackend(self.server.url(schema="kit_schema"))

    # The rest of the kit ran on the default schema already: the basics suffice here.
    test_concurrency_processes_one_winner_per_seq = None  # type: ignore[assignment]
    test_manager_race_two_writers = None  # type: ignore[assignment]


class TestObjectLogOnServers(MetadataStoreTests):
    """The object-store log on each store of the server matrix (tests/conftest.py
    ``store_server``: SeaweedFS, moto with signatures checked, fake-gcs-server, Azurite); other
    processes open the same prefix by URL and race on it."""

    # Each entry is a conditional create over HTTP, raced by every writer at once (SeaweedFS
    # answers simultaneous creates of one key with 409s that the retry layer backs off from).
    race_seqs = 10
    race_threads = 4

    @pytest.fixture(autouse=True)
    def _server(self, store_server: LoopbackStoreServer) -> None:
        self.server = store_server

    def make_backend(self, tmp_path: Path) -> MetadataBackend:
        url = self.server.url()
        reopen = functools.partial(open_object_store, url, self.server.storage_options())
        return ObjectStoreBackend(reopen(), reopen=reopen)


class _CheckThenCreateLog(MetadataLog):
    """A deliberately broken store: "create if absent" as a look, then a plain write, which
    two writers can both pass (an application-level check instead of an atomic create)."""

    def create_entry(self, seq: int, payload: bytes) -> bool:
        if self.has_entry(seq):
            return False
        time.sleep(0.002)  # the window a real backend's round trip would open
        self.store.put(self.entry_key(seq), payload)
        return True


class _BrokenBackend(ObjectStoreBackend):
    def _open(self) -> MetadataLogStore:
        return _CheckThenCreateLog(self.store, self.prefix)


def test_the_kit_catches_a_create_that_is_not_atomic(tmp_path: Path) -> None:
    class Kit(MetadataStoreTests):
        race_seqs = 10

        def make_backend(self, tmp_path: Path) -> MetadataBackend:
            return _BrokenBackend(MemoryObjectStore())

    kit = Kit()
    backend = kit.make_backend(tmp_path)
    with pytest.raises(AssertionError, match="more than one writer"):
        kit.test_concurrency_threads_one_winner_per_seq(backend)
    # The same kit passes the real object-store log on the same store kind.
    good = ObjectStoreBackend(MemoryObjectStore())
    kit.test_concurrency_threads_one_winner_per_seq(good)
