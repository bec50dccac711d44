"""Property test: any interleaving of appends, fetches, trims, flushes, client restarts,
crashes and compactions returns exactly what a plain list model says — the kit's
`StorageStateMachine` over a local directory and over memory, with the memory WAL."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings

from s3stream.objectstore.base import ObjectStore
from s3stream.objectstore.local import LocalObjectStore
from s3stream.testing.storage import StorageStateMachine


class LocalDirectoryModel(StorageStateMachine):
    def make_store(self) -> ObjectStore:
        self.directory = tempfile.mkdtemp(prefix="s3s-model-")
        return LocalObjectStore(self.directory, fsync=False)

    def teardown(self) -> None:
        super().teardown()
        shutil.rmtree(self.directory, ignore_errors=True)


TestLocalDirectoryModel = LocalDirectoryModel.TestCase
TestLocalDirectoryModel.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestMemoryModel = StorageStateMachine.TestCase
TestMemoryModel.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
