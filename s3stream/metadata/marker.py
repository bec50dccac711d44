"""The marker object saying that a store's metadata log lives outside the store.

``{prefix}/metadata-store`` is a small JSON object (``store_id``, ``namespace_id``,
``metadata``: where the log is, ``namespace``) that `binding.bind_log` creates when a store is
first opened with an external log (PostgreSQL). Its presence makes the object-store log refuse
to start beside it (`MetadataLog`) and a reader of the store without the metadata URL refuse to
show an empty store (`StreamReader`): both say where the metadata is instead.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import CorruptionError, InvalidArgumentError, ObjectNotFoundError
from ..objectstore.base import ObjectStore

__all__ = ["MARKER_NAME", "check_not_bound_elsewhere", "marker_key", "read_marker", "store_name"]

#: Name, under the metadata prefix, of the marker object.
MARKER_NAME = "metadata-store"
#: How a wrapper of the store stack describes itself around the store: ``metrics(...)``.
_WRAPPED = re.compile(r"[a-z_]+\((.*)\)")


def marker_key(prefix: str) -> str:
    """Key of the marker of the store's namespace under `prefix`."""
    return f"{prefix}/{MARKER_NAME}"


def store_name(store: ObjectStore) -> str:
    """The store's description without the wrappers of its stack (``file:///data``)."""
    name = store.describe()
    while (match := _WRAPPED.fullmatch(name)) is not None:
        name = match.group(1)
    return name


def read_marker(store: ObjectStore, prefix: str) -> dict[str, Any] | None:
    """The marker under `prefix`, or None; `CorruptionError` if it is not one."""
    key = marker_key(prefix)
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        return None
    try:
        marker = json.loads(data)
        if not isinstance(marker, dict) or not all(
            isinstance(marker.get(k), str) for k in ("store_id", "namespace_id", "metadata")
        ):
            raise ValueError("not the expected JSON object")
    except ValueError as exc:
        raise CorruptionError(f"{key!r} is not a metadata binding: {exc}", location=key) from exc
    return marker


def check_not_bound_elsewhere(store: ObjectStore, prefix: str) -> None:
    """Refuse (`InvalidArgumentError`) to use the store's own log when the marker says its
    metadata lives in another backend: one GET."""
    marker = read_marker(store, prefix)
    if marker is None:
        return
    raise InvalidArgumentError(
        f"the metadata of {store_name(store)} (prefix {prefix!r}) lives in "
        f"{marker['metadata']}, not in the store ({marker_key(prefix)!r} says so): open it "
        "with that metadata URL (s3stream.open(url, metadata=...), the CLI's --metadata, the "
        "Spark option metadata); a second log here would reuse the other log's data keys"
    )
