"""An object store held in a dict: the model for tests and ephemeral clients."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import InvalidArgumentError, ObjectNotFoundError
from ._common import as_bytes, check_prefix, check_suffix_length
from .base import ObjectInfo, ObjectStore, ObjectStoreCapabilities, check_key, check_range

__all__ = ["MemoryObjectStore", "from_url"]


class MemoryObjectStore(ObjectStore):
    """Objects in a process-local dict, guarded by one lock.

    Nothing is shared between instances: to let two components see the same objects, pass them
    the same instance. Every operation is atomic, `put_if_absent` included.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, bytes] = {}

    @classmethod
    def from_url(cls, url: str = "memory://", **storage_options: Any) -> MemoryObjectStore:
        """A fresh, empty store for a ``memory://`` URL (a name after the scheme is only a
        name; a query or a fragment is refused: options would be silently ignored)."""
        if "?" in url or "#" in url:
            raise InvalidArgumentError(
                f"a memory:// store URL takes no query or fragment (no options), got {url!r}"
            )
        if storage_options:
            names = ", ".join(sorted(storage_options))
            raise InvalidArgumentError(f"memory:// takes no storage_options, got: {names}")
        return cls()

    @property
    def capabilities(self) -> ObjectStoreCapabilities:
        # One process holds the dict, so every creator of a key races under the one lock.
        return ObjectStoreCapabilities(
            scheme="memory",
            atomic_create=True,
            ranged_reads=True,
            conditional_replace=False,
            ordered_listing=True,
        )

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        blob = as_bytes(data)
        with self._lock:
            self._objects[key] = blob

    def put_if_absent(self, key: str, data: bytes) -> bool:
        check_key(key)
        blob = as_bytes(data)
        with self._lock:
            if key in self._objects:
                return False
            self._objects[key] = blob
            return True

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(start, end)
        with self._lock:
            blob = self._objects.get(key)
        if blob is None:
            raise ObjectNotFoundError(f"no object {key!r} in {self.describe()}")
        if start == 0 and (end is None or end >= len(blob)):
            return blob
        return blob[start:end]

    def get_suffix(self, key: str, length: int) -> bytes:
        check_suffix_length(length)
        check_key(key)
        with self._lock:
            blob = self._objects.get(key)
        if blob is None:
            raise ObjectNotFoundError(f"no object {key!r} in {self.describe()}")
        return blob[-length:] if length < len(blob) else blob

    def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        with self._lock:
            blob = self._objects.get(key)
        return None if blob is None else ObjectInfo(key, len(blob))

    def delete_many(self, keys: Iterable[str]) -> None:
        # Validate every key before deleting any, so a bad key never leaves a half-done delete.
        checked = [check_key(key) for key in keys]
        with self._lock:
            for key in checked:
                self._objects.pop(key, None)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        with self._lock:
            found = [
                ObjectInfo(key, len(blob))
                for key, blob in self._objects.items()
                if key.startswith(prefix)
            ]
        found.sort(key=lambda info: info.key)
        return iter(found)

    def describe(self) -> str:
        return f"memory://{id(self):x}"


def from_url(url: str, **storage_options: Any) -> MemoryObjectStore:
    """Registry factory for ``memory://`` URLs: always a fresh, empty store."""
    return MemoryObjectStore.from_url(url, **storage_options)
