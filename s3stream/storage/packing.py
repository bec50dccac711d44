"""Packing pending batches into objects: which streams get their own object, which share one.

Streams with at least `stream_split_bytes` pending become *stream objects*; all the others
share one *stream-set object*. Keys are unique by construction (node id, node epoch registered
in the metadata log, and a per-client counter), so no randomness and no coordination is needed.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import re
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import crc32c
import zstandard

from ..cache.log_cache import (
    APART,
    APART_MIN_BYTES,
    BASE,
    COUNT,
    KIND,
    RECORD,
    SKIP,
    TS,
    CachedBatch,
    entry_block_record,
)
from ..format.batch import BATCH_HEADER
from ..format.block import BlockInfo
from ..format.objects import ObjectWriter
from ..format.timestamps import time_range
from ..metadata.model import ObjectKind
from ..metadata.state import MetadataState
from ..settings import ClientSettings
from ..types import BatchKind
from ..validation import check_node_id, is_node_id

__all__ = [
    "DEFAULT_DATA_PREFIX",
    "KeyFactory",
    "ObjectKey",
    "PackedObject",
    "data_prefix_for",
    "pack_groups",
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
        or int(epoch) == 0  # node epochs begin at 1: no session ever made such a key
    ):
        return None
    return ObjectKey(node_id, int(epoch))


class KeyFactory:
    """Makes unique data-object keys for one client session (`parse_object_key` reads them)."""

    def __init__(self, node_id: str, node_epoch: int, prefix: str = DEFAULT_DATA_PREFIX) -> None:
        self._prefix = prefix
        self._node_id = check_node_id(node_id)
        self._node_epoch = node_epoch
        self._base = f"{prefix}/{node_id}/{node_epoch:08d}"
        self._counter = itertools.count()
        self._lock = threading.Lock()

    @property
    def prefix(self) -> str:
        """The data prefix of the keys made (`data_prefix_for`)."""
        return self._prefix

    def session_ended(self, state: MetadataState) -> bool:
        """Whether the session these keys belong to has ended in `state` (its node taken
        over or registered again since): the orphan sweep may then delete any object whose
        key this factory made and no entry references."""
        return state.registered_again(self._node_id, self._node_epoch) is not None

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


_records_of = operator.itemgetter(RECORD)
_aparts_of = operator.itemgetter(APART)
_skips_of = operator.itemgetter(SKIP)
_ts_of = operator.itemgetter(TS)
_kinds_of = operator.itemgetter(KIND)


def pack_groups(
    by_stream: Mapping[int, list[CachedBatch]], settings: ClientSettings, keys: KeyFactory
) -> list[PackedObject]:
    """Turn pending entries grouped by stream (each stream's in offset order) into objects.

    The work is per stream and per block; what is per entry runs in C (`map`, `join`,
    `accumulate`), in one pass over each stream's entries while they are in the CPU's cache
    (a stream's entries lie apart in memory: each pass over them in stream order costs cache
    misses), so an upload of 10,000 streams costs not much more than one of one stream."""

    def writer() -> ObjectWriter:
        return ObjectWriter(
            block_target_bytes=settings.block_target_bytes,
            compression=settings.block_compression,
            zstd_level=settings.zstd_level,
        )

    # Blocks are built whole from small uncompressed batches, where the writer's per-batch
    # Python dominates (`_add_blocks`); large batches are few per block and go to the writer
    # one by one, which keeps them as views (a block built here would be one more copy of
    # every byte in memory until the object is finished); compressed blocks are the
    # writer's to compress. A stream of RAW batches of small records only (most of an upload
    # of many streams) is cut into blocks without Python per batch (`_raw_blocks`).
    blocks = settings.block_compression == "none"
    target = settings.block_target_bytes
    out: list[PackedObject] = []
    shared: ObjectWriter | None = None
    for sid in sorted(by_stream):
        lst = by_stream[sid]
        if not lst:
            continue
        records = list(map(_records_of, lst))
        skips = list(map(_skips_of, lst))
        heads = map(operator.sub, map(len, records), skips)
        sizes = list(map(operator.add, heads, map(len, map(_aparts_of, lst))))
        own = sum(sizes) >= settings.stream_split_bytes
        # A stream with a record of _LARGE bytes or more is added batch by batch.
        small = blocks and max(sizes) < _LARGE
        if own:
            w = writer()
        else:
            if shared is None:
                shared = writer()
            w = shared
        if small and all(kind == _RAW for kind in set(map(_kinds_of, lst))):
            # Cut without Python per batch; the writer lays the object out (one way).
            for info, data in _raw_blocks(sid, lst, target, records, skips, sizes):
                w.add_block(info, data, location="upload")
        elif small:
            _add_blocks(w, sid, lst, target)
        else:
            _add_batches(w, sid, lst)
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


def _add_batches(w: ObjectWriter, sid: int, entries: list[CachedBatch]) -> None:
    """Add a stream's entries batch by batch, as views of their records."""
    for e in entries:
        w.add(sid, e[BASE], e[COUNT], e[TS], entry_block_record(e), e[APART] or None)


_RAW = int(BatchKind.RAW)
#: Where a batch record's header keeps its properties' length (format.batch.BATCH_HEADER).
_U32 = struct.Struct("<I")
_PROPS_LEN_AT = 32
#: A stream with a batch record this large or larger is packed batch by batch (`pack_groups`):
#: the only way that takes a payload kept apart from its record's head.
_LARGE = 4096
assert _LARGE <= APART_MIN_BYTES


def _add_blocks(w: ObjectWriter, sid: int, entries: list[CachedBatch], target: int) -> None:
    """Add a stream's entries as whole blocks, cut where `ObjectWriter.add` would cut them
    (the object is byte for byte the same: tests/test_write_path.py).

    `ObjectWriter.add` checks and indexes every batch on its own (about 3 us of Python a
    batch, on the uploader thread, which at 100-byte batches took the GIL from the appending
    thread for as long as the appends themselves took); a block needs only its batches'
    offsets and timestamps, which the entries carry (a RECORDS batch's time range is read
    from its records, as `add` reads it), and one crc32c. (Streams of RAW batches only take
    `_raw_blocks`, which does this without Python per batch.)
    """
    run: list[bytes] = []
    run_size = 0
    first: CachedBatch | None = None
    base_max = t_lo = t_hi = 0
    end = 0
    decompressor: zstandard.ZstdDecompressor | None = None

    def close() -> None:
        nonlocal run, run_size, first
        assert first is not None
        data = run[0] if len(run) == 1 else b"".join(run)
        block = BlockInfo(
            stream_id=sid,
            start_offset=first[BASE],
            end_offset=end,
            position=0,
            stored_size=run_size,
            raw_size=run_size,
            batch_count=len(run),
            first_timestamp=first[TS],
            max_timestamp=base_max,
            compressed=False,
            crc=crc32c.crc32c(data),
            time_range=(t_lo, t_hi),
        )
        w.add_block(block, data, location="upload")
        run, run_size, first = [], 0, None

    for e in entries:
        record = e[RECORD]
        skip = e[SKIP]
        # Sliced (a copy of a small record), not viewed: a memoryview is an object the cyclic
        # GC tracks, and hundreds of thousands alive at once during an upload made the
        # appending thread pay for full collections.
        rec = record[skip:]
        size = len(rec)
        if first is not None and run_size + size > target:
            close()
        ts = e[TS]
        if e[KIND] == _RAW:
            lo = hi = ts
        else:
            if decompressor is None:
                decompressor = zstandard.ZstdDecompressor()
            (props_len,) = _U32.unpack_from(record, skip + _PROPS_LEN_AT)
            payload = memoryview(record)[skip + BATCH_HEADER.size + props_len :]
            lo, hi = time_range(e[KIND], e[COUNT], ts, payload, decompressor=decompressor)
        if first is None:
            first = e
            base_max, t_lo, t_hi = ts, lo, hi
        else:
            if ts > base_max:
                base_max = ts
            if lo < t_lo:
                t_lo = lo
            if hi > t_hi:
                t_hi = hi
        run.append(rec)
        run_size += size
        end = e[BASE] + e[COUNT]
    if first is not None:
        close()


def _raw_blocks(
    sid: int,
    entries: list[CachedBatch],
    target: int,
    records: list[bytes],
    skips: list[int],
    sizes: list[int],
) -> list[tuple[BlockInfo, bytes]]:
    """The blocks (as `ObjectWriter.add_block` takes them) of a stream of RAW batches only
    (a batch's time range is its timestamp), cut where `ObjectWriter.add` would cut them:
    the cuts from running sums, each block's bytes, bounds and timestamps from slices, all
    in C; Python runs per block, not per batch (but for one slice of each record).
    `records`, `skips`, `sizes`: each entry's WAL record, where its batch record starts, and
    the batch record's bytes."""
    if min(skips) == max(skips):
        skip = skips[0]
        parts = [r[skip:] for r in records] if skip else records
    else:
        parts = [r[k:] for r, k in zip(records, skips, strict=True)]
    stamps = list(map(_ts_of, entries))
    ends = list(itertools.accumulate(sizes))
    n = len(entries)
    out: list[tuple[BlockInfo, bytes]] = []
    a = 0
    done = 0  # record bytes of the blocks before entry `a`
    while a < n:
        # The block takes entries while they fit in `target` (at least one), as `add` cuts.
        b = max(a + 1, bisect.bisect_right(ends, done + target, a, n))
        data = parts[a] if b == a + 1 else b"".join(parts[a:b])
        block_stamps = stamps[a:b]
        hi = max(block_stamps)
        last = entries[b - 1]
        size = len(data)
        info = BlockInfo(
            stream_id=sid,
            start_offset=entries[a][BASE],
            end_offset=last[BASE] + last[COUNT],
            position=0,
            stored_size=size,
            raw_size=size,
            batch_count=b - a,
            first_timestamp=stamps[a],
            max_timestamp=hi,
            compressed=False,
            crc=crc32c.crc32c(data),
            time_range=(min(block_stamps), hi),
        )
        out.append((info, data))
        done = ends[b - 1]
        a = b
    return out
