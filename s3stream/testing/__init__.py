"""The public conformance kit: prove that a WAL or an object store keeps its contract.

Roles:

- `WalTests` (`s3stream.testing.wal`): a pytest base class; a subclass that says how to open a
  WAL over a durable medium inherits every test of the `WriteAheadLog` contract, gated by the
  capabilities the WAL claims, plus `WalStateMachine`, a Hypothesis state machine that checks
  the WAL against a plain list across appends, trims, resets, crashes and torn writes.
- `ObjectStoreTests` and `ObjectStoreStateMachine` (`s3stream.testing.objectstore`): the same
  for the `ObjectStore` contract, checked against a dict.
- `MetadataStoreTests` (`s3stream.testing.metadata`): the same for a `MetadataLogStore` (where
  the metadata log lives: the object store, PostgreSQL), over a `MetadataBackend`
  (`ObjectStoreBackend`, `PostgresBackend`): exactly one winner per entry across threads and
  processes, checkpoints, a manager on top, fencing, a rollback detected.
- `FaultyObjectStore` (`s3stream.testing.faults`): a seeded fault-injecting wrapper (transient
  errors, latency, ambiguous writes) for testing code that uses an object store; `FaultyWal`
  beside it: a WAL whose medium fails for a while, within the WAL contract.
- `StorageStateMachine` (`s3stream.testing.storage`): a whole client (streams, appends,
  fetches, trims, flushes, restarts, crashes, compaction) checked against a model;
  `FaultyStorageStateMachine`: the same under store and WAL faults that come and go.
- `s3stream.testing.disk_faults.failing_writes`: a real write fault under a running `FileWal`.
- `s3stream.testing.strategies`: Hypothesis strategies for records, keys and ranges.
- `s3stream.testing.profiles` and `s3stream.testing.plugin`: the Hypothesis profiles
  ``s3stream-quick`` and ``s3stream-long``, and the pytest plugin (registered through the
  ``pytest11`` entry point) that picks one per run.
- `s3stream.testing.postgres`: `PostgresServer`, a throw-away PostgreSQL server on loopback
  from the machine's binaries.
- Object-store servers on loopback, one interface (`s3stream.testing.store_servers`:
  `LoopbackStoreServer`): `seaweedfs` (SeaweedFS's S3), `s3_servers` (moto's S3: in-process as
  the fallback, `start_s3_server` picks one; in a process of its own with signatures checked,
  `moto_process`), `gcs_server` (fake-gcs-server) and `azurite` (Azurite's blob service).

This package imports nothing heavy itself: names are loaded from their submodule on first use,
so `s3stream.testing.seaweedfs` and `FaultyObjectStore` work without pytest or Hypothesis. The
modules that need them raise an `ImportError` that says to ``pip install 's3stream[testing]'``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .faults import FaultCounters, FaultRule, FaultyObjectStore, FaultyWal
    from .metadata import (
        MetadataBackend,
        MetadataStoreTests,
        ObjectStoreBackend,
        PostgresBackend,
    )
    from .objectstore import (
        ObjectStoreStateMachine,
        ObjectStoreTests,
        make_object_store_state_machine,
    )
    from .storage import FaultyStorageStateMachine, StorageStateMachine
    from .wal import WalStateMachine, WalTests, make_wal_state_machine

__all__ = [
    "MISSING_DEPENDENCIES_MESSAGE",
    "FaultCounters",
    "FaultRule",
    "FaultyObjectStore",
    "FaultyStorageStateMachine",
    "FaultyWal",
    "MetadataBackend",
    "MetadataStoreTests",
    "ObjectStoreBackend",
    "ObjectStoreStateMachine",
    "ObjectStoreTests",
    "PostgresBackend",
    "StorageStateMachine",
    "WalStateMachine",
    "WalTests",
    "make_object_store_state_machine",
    "make_wal_state_machine",
]

#: What the kit's modules say when pytest or Hypothesis is not installed.
MISSING_DEPENDENCIES_MESSAGE = (
    "s3stream.testing needs pytest and hypothesis: pip install 's3stream[testing]'"
)

_LAZY = {
    "FaultCounters": "faults",
    "FaultRule": "faults",
    "FaultyObjectStore": "faults",
    "FaultyWal": "faults",
    "FaultyStorageStateMachine": "storage",
    "MetadataBackend": "metadata",
    "MetadataStoreTests": "metadata",
    "ObjectStoreBackend": "metadata",
    "PostgresBackend": "metadata",
    "ObjectStoreStateMachine": "objectstore",
    "ObjectStoreTests": "objectstore",
    "make_object_store_state_machine": "objectstore",
    "StorageStateMachine": "storage",
    "WalStateMachine": "wal",
    "WalTests": "wal",
    "make_wal_state_machine": "wal",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
