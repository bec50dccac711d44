"""Binding an object store to a metadata log kept outside it (PostgreSQL), one to one.

The data objects of a store are named by node id and node epoch, and node epochs come from the
metadata log. Two logs over one store (a second namespace, or an object-store log started
beside a database's) would restart the epochs and reuse each other's data keys: uploads would
overwrite live data. One log over two stores (two buckets sharing a namespace) would reference
objects that are not in the store being read. So each side records the other, the first
writer's record winning on each side:

- in the object store, ``{prefix}/metadata-store`` (created if absent): a JSON object with a
  random ``store_id``, the log's ``namespace_id`` and, for messages, where the log is;
- in the log, the namespace's row holds its ``namespace_id`` and, once bound, the store's
  ``store_id`` (`ExternalMetadataLog.bind_store`).

A writing client binds at open (`bind_log` with ``create=True``: at most one GET and one
conditional PUT in the store, two statements in the database); a reader only checks. Both refuse
a mismatch with an `InvalidArgumentError` that says where each side's other half is. The
object-store log needs no binding: it is in the store (and refuses to start where the marker
says the metadata lives elsewhere: `MetadataLog`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ..errors import InvalidArgumentError
from ..objectstore.base import ObjectStore
from .base import ExternalMetadataLog, MetadataLogStore
from .log import MetadataLog
from .marker import marker_key, read_marker, store_name

__all__ = ["bind_log"]


def bind_log(log: MetadataLogStore, store: ObjectStore, prefix: str, *, create: bool) -> None:
    """Check (and, if `create`, make) the binding of `log` to `store` (module docstring)."""
    if not isinstance(log, ExternalMetadataLog):
        return
    marker = read_marker(store, prefix)
    # A store bound to another log, or keeping its log in itself, is refused before anything
    # is made in this one (a mistyped namespace or schema, or a metadata URL given to a store
    # that needs none, left tables and a namespace row behind).
    if marker is None and MetadataLog(store, prefix).has_entry(1):
        raise InvalidArgumentError(
            f"{store_name(store)} (prefix {prefix!r}) keeps its metadata log in the store "
            f"itself, not in {log.describe()}: open it without a metadata URL (its data "
            "would otherwise be overwritten by a second log's nodes)"
        )
    namespace_id = log.namespace_id(create=create and marker is None)
    if marker is not None and marker["namespace_id"] != namespace_id:
        raise _elsewhere(log, store, prefix, marker)
    if marker is None:
        # A store without a marker cannot be the one the log is bound to: refuse before the
        # marker is made, or this store would stay bound to a log that refused it. Unless
        # the marker appeared meanwhile: another opener of this store bound it just now (4
        # writers opening a new store at once were refused as "another object store").
        bound = log.bound_store()
        if bound is not None:
            marker = read_marker(store, prefix)
            if marker is None or str(marker["store_id"]) != bound[0]:
                raise _mismatch_store(log, store, bound[1])
    made = False
    if marker is None:
        if not create:
            return
        fresh = {
            "store_id": uuid.uuid4().hex,
            "namespace_id": namespace_id,
            "metadata": log.describe(),
            "namespace": log.namespace,
        }
        data = json.dumps(fresh, sort_keys=True).encode()
        made = store.put_if_absent(marker_key(prefix), data)
        marker = fresh if made else read_marker(store, prefix)
        if marker is None:  # pragma: no cover - created or found just now
            raise InvalidArgumentError(f"{marker_key(prefix)!r} vanished while binding")
    if marker["namespace_id"] != namespace_id:
        raise _elsewhere(log, store, prefix, marker)
    store_id = str(marker["store_id"])
    bound = log.bind_store(store_id, store_name(store)) if create else log.bound_store()
    if bound is not None and bound[0] != store_id:
        if made:
            # Another store, opened at the same time with the same new namespace, bound it
            # first: the marker this call made would bind this store to a log that refuses
            # it, and every later open of it would be refused (by both sides).
            store.delete_many([marker_key(prefix)])
        raise _mismatch_store(log, store, bound[1])


def _elsewhere(
    log: MetadataLogStore, store: ObjectStore, prefix: str, marker: dict[str, Any]
) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"the metadata of {store_name(store)} (prefix {prefix!r}) lives in "
        f"{marker['metadata']}, not in {log.describe()} "
        f"({marker_key(prefix)!r} says so): open it with that metadata URL and namespace"
    )


def _mismatch_store(log: MetadataLogStore, store: ObjectStore, other: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{log.describe()} holds the metadata of another object store ({other or 'unnamed'}), "
        f"not of {store_name(store)}: give this store a namespace of its own (the metadata "
        "URL's ?namespace=)"
    )
