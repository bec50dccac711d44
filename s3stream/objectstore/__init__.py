"""Object storage behind s3stream: the contract, its implementations, and wrappers.

Roles:

* `ObjectStore` / `ObjectInfo` (``base``) — the contract: put, conditional create, ranged
  get, head, delete, list, over immutable objects; `ObjectStoreCapabilities`, what a store
  guarantees beyond it or lacks (a conditional create atomic across processes, ...).
* Implementations — `LocalObjectStore` (a directory; atomic rename and exclusive link),
  `MemoryObjectStore` (a dict; for tests), `S3ObjectStore` (``s3``: boto3, pooled,
  one try per call), `GcsObjectStore` (``gcs``: google-cloud-storage, the JSON API),
  `AzureObjectStore` (``azure``: obstore), `FsspecObjectStore` (``fsspec_store``: any other
  fsspec URL; its conditional create is not atomic across processes). Each service's client
  library is imported only when such a store is first used.
* ``registry`` — `open_object_store(url)` picks an implementation by URL scheme;
  `register_object_store` and the ``s3stream.object_stores`` entry points add more.
* ``wrappers`` — concerns stacked around any store: `RetryingObjectStore` (backoff on
  `UnavailableError`: the one retry layer), `MetricsObjectStore` (request and byte counts,
  `ObjectStoreMetrics`).
"""

from __future__ import annotations

from .azure import AzureObjectStore
from .base import ObjectInfo, ObjectStore, ObjectStoreCapabilities
from .fsspec_store import FsspecObjectStore
from .gcs import GcsObjectStore
from .local import LocalObjectStore
from .memory import MemoryObjectStore
from .registry import open_object_store, register_object_store
from .s3 import S3ObjectStore
from .wrappers import MetricsObjectStore, ObjectStoreMetrics, RetryingObjectStore

__all__ = [
    "AzureObjectStore",
    "FsspecObjectStore",
    "GcsObjectStore",
    "LocalObjectStore",
    "MemoryObjectStore",
    "MetricsObjectStore",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreCapabilities",
    "ObjectStoreMetrics",
    "RetryingObjectStore",
    "S3ObjectStore",
    "open_object_store",
    "register_object_store",
]
