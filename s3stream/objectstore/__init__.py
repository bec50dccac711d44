"""Object storage behind s3stream: the contract, its implementations, and wrappers.

Roles:

* `ObjectStore` / `ObjectInfo` (``base``) — the contract: put, conditional create, ranged
  get, head, delete, list, over immutable objects.
* Implementations — `LocalObjectStore` (a directory; atomic rename and exclusive link),
  `MemoryObjectStore` (a dict; for tests), `S3ObjectStore` (``s3``: boto3, pooled and
  retried), `FsspecObjectStore` (``fsspec_store``: any other fsspec URL). boto3 and fsspec
  are imported only when such a store is first used.
* ``registry`` — `open_object_store(url)` picks an implementation by URL scheme;
  `register_object_store` and the ``s3stream.object_stores`` entry points add more.
* ``wrappers`` — concerns stacked around any store: `RetryingObjectStore` (backoff on
  `UnavailableError`), `MetricsObjectStore` (request and byte counts, `ObjectStoreMetrics`).
"""

from __future__ import annotations

from .base import ObjectInfo, ObjectStore
from .fsspec_store import FsspecObjectStore
from .local import LocalObjectStore
from .memory import MemoryObjectStore
from .registry import open_object_store, register_object_store
from .s3 import S3ObjectStore
from .wrappers import MetricsObjectStore, ObjectStoreMetrics, RetryingObjectStore

__all__ = [
    "FsspecObjectStore",
    "LocalObjectStore",
    "MemoryObjectStore",
    "MetricsObjectStore",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreMetrics",
    "RetryingObjectStore",
    "S3ObjectStore",
    "open_object_store",
    "register_object_store",
]
