"""Packing pending batches into objects: which streams get their own object, which share one.

Streams with at least `stream_split_bytes` pending become *stream objects*; all the others
share one *stream-set object*. Keys are unique by construction (node id, node epoch registered
in the metadata log, and a per-client counter), so no randomness and no coordination is needed.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from ..cache.log_cache import (
    BASE,
    COUNT,
    SID,
    TS,
    CachedBatch,
    entry_block_record,
    entry_size,
)
from ..format.objects import ObjectWriter
from ..metadata.model import ObjectKind
from ..settings import ClientSettings
from ..validation import check_node_id, is_node_id

__all__ = [
    "DEFAULT_DATA_PREFIX",
    "KeyFactory",
    "ObjectKey",
    "PackedObject",
    "data_prefix_for",
    "pack_objects",
    "parse_object_key",
]

#: Where data objects of the default namespace (metadata under ``meta/``) live.
DEFAULT_DATA_PREFIX = "data"


def data_prefix_for(metadata_prefix: str) -> str:
    """Where the data objects of the namespace whose metadata log is under `metadata_prefix`
    live: ``data`` for the default ``meta``, else ``{metadata_prefix}/data``, so that two
    namespaces in one store never write (nor sweep) each other's objects."""
    return DEFAULT_DATA_PREFIX if metadata_prefix == "meta" else f"{metadata_prefix}/data"


#: ``{prefix}/{node_id}/{node_epoch:08d}/{counter:012d}-{s|m}.s3o``: what `KeyFactory` makes.
_OBJECT_NAME = re.compile(r"\d{12,}-[sm]\.s3o")
_EPOCH = re.compile(r"\d{8,}")


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """Who wrote a data-object key made by `KeyFactory`: the node and its session (epoch)."""

    node_id: str
    node_epoch: int


def parse_object_key(key: str, prefix: str = DEFAULT_DATA_PREFIX) -> ObjectKey | None:
    """The parts of `key` if `KeyFactory` (with `prefix`) could have made it, else None: the
    one test of "is this one of our objects" (the orphan sweeper touches nothing else)."""
    if not key.startswith(prefix + "/"):
        return None
    parts = key[len(prefix) + 1 :].split("/")
    if len(parts) != 3:
        return None
    node_id, epoch, name = parts
    if (
        _OBJECT_NAME.fullmatch(name) is None
        or _EPOCH.fullmatch(epoch) is None
        or not is_node_id(node_id)
    ):
        return None
    return ObjectKey(node_id, int(epoch))


class KeyFactory:
    """Makes unique data-object keys for one client session (`parse_object_key` reads them)."""

    def __init__(self, node_id: str, node_epoch: int, prefix: str = DEFAULT_DATA_PREFIX) -> None:
        self._prefix = prefix
        self._base = f"{prefix}/{check_node_id(node_id)}/{node_epoch:08d}"
        self._counter = itertools.count()
        self._lock = threading.Lock()

    @property
    def prefix(self) -> str:
        """The data prefix of the keys made (`data_prefix_for`)."""
        return self._prefix

    def next_key(self, kind: ObjectKind) -> str:
        """A key never used before by any client on the same store."""
        with self._lock:
            n = next(self._counter)
        tag = "s" if kind is ObjectKind.STREAM else "m"
        return f"{self._base}/{n:012d}-{tag}.s3o"


@dataclass(frozen=True, slots=True)
class PackedObject:
    """An object ready to PUT, with what it holds."""

    key: str
    kind: ObjectKind
    data: bytes
    #: (stream_id, start_offset, end_offset) of each stream inside, sorted by stream id.
    ranges: list[tuple[int, int, int]]
    #: The smallest and largest timestamp of each stream inside.
    times: dict[int, tuple[int, int]]


def pack_objects(
    entries: Iterable[CachedBatch], settings: ClientSettings, keys: KeyFactory
) -> list[PackedObject]:
    """Turn pending entries (WAL order, so each stream's in offset order) into objects."""
    by_stream: dict[int, list[CachedBatch]] = {}
    sizes: dict[int, int] = {}
    for e in entries:
        sid = e[SID]
        lst = by_stream.get(sid)
        if lst is None:
            lst = by_stream[sid] = []
            sizes[sid] = 0
        lst.append(e)
        sizes[sid] += entry_size(e)

    def writer() -> ObjectWriter:
        return ObjectWriter(
            block_target_bytes=settings.block_target_bytes,
            compression=settings.block_compression,
            zstd_level=settings.zstd_level,
        )

    out: list[PackedObject] = []
    shared: ObjectWriter | None = None
    for sid in sorted(by_stream):
        own = sizes[sid] >= settings.stream_split_bytes
        if own:
            w = writer()
        else:
            if shared is None:
                shared = writer()
            w = shared
        for e in by_stream[sid]:
            w.add(sid, e[BASE], e[COUNT], e[TS], entry_block_record(e))
        if own:
            ranges = w.ranges()
            key = keys.next_key(ObjectKind.STREAM)
            data = w.finish()
            out.append(PackedObject(key, ObjectKind.STREAM, data, ranges, w.time_ranges()))
    if shared is not None and not shared.is_empty():
        ranges = shared.ranges()
        key = keys.next_key(ObjectKind.STREAM_SET)
        data = shared.finish()
        out.append(PackedObject(key, ObjectKind.STREAM_SET, data, ranges, shared.time_ranges()))
    return out
