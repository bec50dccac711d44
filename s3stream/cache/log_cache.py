"""LogCache: recent batches by stream, served to tail readers without I/O.

Entries are plain tuples of ints, bytes and (rarely) a dict: CPython's cyclic garbage
collector stops tracking such tuples after their first collection, so a cache holding millions
of batches does not make every later allocation pay for ever longer collections. (With
dataclass entries, GC alone halved the append rate of 100-byte batches.)
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ..types import BatchKind, FetchedBatch

__all__ = ["CachedBatch", "LogCache", "entry_batch", "entry_block_record"]

#: (stream_id, base_offset, count, timestamp, kind, properties or None, payload,
#:  record, record_skip, wal_position, epoch, seq). `record[record_skip:]` is the encoded
#:  batch record (format.batch) that goes into object blocks.
_Props = dict[str, str] | None
CachedBatch = tuple[int, int, int, int, int, _Props, bytes, bytes, int, int, int, int]
SID: Final = 0
BASE: Final = 1
COUNT: Final = 2
TS: Final = 3
KIND: Final = 4
PROPS: Final = 5
PAYLOAD: Final = 6
RECORD: Final = 7
SKIP: Final = 8
WALPOS: Final = 9
EPOCH: Final = 10
SEQ: Final = 11

_KINDS = {int(k): k for k in BatchKind}
_EMPTY: Mapping[str, str] = MappingProxyType({})


def entry_batch(e: CachedBatch) -> FetchedBatch:
    """The `FetchedBatch` a cache entry stands for."""
    props = e[PROPS]
    return FetchedBatch(
        e[SID],
        e[BASE],
        e[COUNT],
        e[PAYLOAD],
        e[TS],
        _EMPTY if props is None else MappingProxyType(props),
        _KINDS[e[KIND]],
    )


def entry_block_record(e: CachedBatch) -> memoryview:
    """The encoded batch record of an entry, without copying."""
    return memoryview(e[RECORD])[e[SKIP] :]


def entry_size(e: CachedBatch) -> int:
    """Bytes an entry accounts for (its encoded record)."""
    return len(e[RECORD]) - e[SKIP]


@dataclass(slots=True)
class _StreamTail:
    # Parallel lists; `head` skips evicted entries so eviction is O(1) amortised;
    # entries [head, uploaded) are uploaded, [uploaded, len) pending.
    offsets: list[int] = field(default_factory=list)
    entries: list[CachedBatch] = field(default_factory=list)
    head: int = 0
    uploaded: int = 0

    def compact(self) -> None:
        if self.head > 1024 and self.head * 2 > len(self.entries):
            del self.offsets[: self.head]
            del self.entries[: self.head]
            self.uploaded -= self.head
            self.head = 0


class LogCache:
    """Acknowledged batches per stream; pending ones pinned, uploaded ones evictable.

    Thread-safe. Inserts must come in WAL order (the storage inserts from WAL completion
    callbacks, which run in order), so each stream's entries are in offset order.
    """

    def __init__(self, max_uploaded_bytes: int) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, _StreamTail] = {}
        self._max_uploaded = max_uploaded_bytes
        self._uploaded_bytes = 0
        self._pending_bytes = 0
        # Uploaded entries in upload order, for eviction: (stream_id, size).
        self._evict_queue: deque[tuple[int, int]] = deque()
        # Not-yet-uploaded entries in WAL order; the uploader takes them as snapshots.
        self._pending: list[CachedBatch] = []
        #: Bytes of `_pending`: acknowledged, not yet taken by an upload.
        self._untaken_bytes = 0
        self._last_seq = 0
        # Seqs of entries neither uploaded nor discarded: flush waits for the oldest.
        self._unfinished: OrderedDict[int, None] = OrderedDict()

    @property
    def pending_bytes(self) -> int:
        """Bytes of acknowledged batches not yet uploaded."""
        return self._pending_bytes

    @property
    def cached_bytes(self) -> int:
        """Bytes held: pending plus uploaded-but-not-evicted."""
        return self._pending_bytes + self._uploaded_bytes

    @property
    def last_seq(self) -> int:
        """Sequence number of the latest inserted entry (0 before any)."""
        return self._last_seq

    def oldest_unfinished_seq(self) -> int | None:
        """Seq of the oldest entry neither uploaded nor discarded (None: all are done)."""
        with self._lock:
            return next(iter(self._unfinished), None)

    def put(
        self,
        stream_id: int,
        base_offset: int,
        count: int,
        timestamp: int,
        kind: int,
        properties: Mapping[str, str],
        payload: bytes,
        record: bytes,
        record_skip: int,
        wal_position: int,
        epoch: int,
    ) -> int:
        """Insert an acknowledged batch; returns the bytes not yet taken by an upload
        afterwards (the uploader is woken when they reach its threshold)."""
        props = dict(properties) if properties else None
        size = len(record) - record_skip
        with self._lock:
            seq = self._last_seq = self._last_seq + 1
            e: CachedBatch = (
                stream_id, base_offset, count, timestamp, int(kind), props, payload,
                record, record_skip, wal_position, epoch, seq,
            )  # fmt: skip
            tail = self._streams.get(stream_id)
            if tail is None:
                tail = self._streams[stream_id] = _StreamTail()
            tail.offsets.append(base_offset)
            tail.entries.append(e)
            self._pending.append(e)
            self._untaken_bytes += size
            self._unfinished[seq] = None
            self._pending_bytes += size
            return self._untaken_bytes

    @property
    def untaken_bytes(self) -> int:
        """Bytes acknowledged and not yet taken by an upload (a part of `pending_bytes`)."""
        return self._untaken_bytes

    def take_pending(self, max_bytes: int | None = None) -> list[CachedBatch]:
        """Hand the oldest pending entries (in WAL order), about `max_bytes` of them (at least
        one; all without a limit), to the uploader; they stay pinned until `mark_uploaded`."""
        with self._lock:
            if max_bytes is None or self._untaken_bytes <= max_bytes:
                taken, self._pending = self._pending, []
                self._untaken_bytes = 0
                return taken
            total = n = 0
            for e in self._pending:
                size = entry_size(e)
                if n and total + size > max_bytes:
                    break
                total += size
                n += 1
            taken = self._pending[:n]
            del self._pending[:n]
            self._untaken_bytes -= total
            return taken

    def mark_uploaded(self, entries: list[CachedBatch]) -> None:
        """Entries from `take_pending` are now in object storage: unpin and maybe evict."""
        with self._lock:
            for e in entries:
                self._unfinished.pop(e[SEQ], None)
                tail = self._streams.get(e[SID])
                if tail is None:
                    continue  # discarded meanwhile
                # Uploads commit in WAL order, so this is the stream's oldest pending entry.
                tail.uploaded += 1
                size = entry_size(e)
                self._pending_bytes -= size
                self._uploaded_bytes += size
                self._evict_queue.append((e[SID], size))
            self._evict_locked()

    def discard_stream(self, stream_id: int) -> list[CachedBatch]:
        """Forget a stream (destroyed or fenced); returns its pending entries."""
        with self._lock:
            tail = self._streams.pop(stream_id, None)
            if tail is None:
                return []
            dropped = tail.entries[tail.uploaded :]
            uploaded = tail.entries[tail.head : tail.uploaded]
            self._uploaded_bytes -= sum(entry_size(e) for e in uploaded)
            self._pending_bytes -= sum(entry_size(e) for e in dropped)
            for e in dropped:
                self._unfinished.pop(e[SEQ], None)
            self._pending = [e for e in self._pending if e[SID] != stream_id]
            self._untaken_bytes = sum(entry_size(e) for e in self._pending)
            return dropped

    def first_offset(self, stream_id: int) -> int | None:
        """Lowest offset the cache can serve for the stream, or None if it holds none."""
        with self._lock:
            tail = self._streams.get(stream_id)
            if tail is None or tail.head >= len(tail.entries):
                return None
            return tail.offsets[tail.head]

    def read(
        self, stream_id: int, start: int, end: int, max_bytes: int
    ) -> tuple[list[FetchedBatch], bool]:
        """Batches of the stream overlapping ``[start, end)``, at least one, up to `max_bytes`.

        Returns (batches, complete): `complete` is False when the cache no longer holds
        `start` (evicted or never cached), in which case the caller reads objects first.
        """
        found: list[CachedBatch] = []
        with self._lock:
            tail = self._streams.get(stream_id)
            if tail is None or tail.head >= len(tail.entries) or tail.offsets[tail.head] > start:
                return [], False
            i = bisect.bisect_right(tail.offsets, start, lo=tail.head) - 1
            entries = tail.entries
            n = len(entries)
            total = 0
            while i < n:
                e = entries[i]
                if e[BASE] >= end:
                    break
                size = len(e[PAYLOAD])
                if found and total + size > max_bytes:
                    break
                found.append(e)
                total += size
                i += 1
        return [entry_batch(e) for e in found], True

    def _evict_locked(self) -> None:
        q = self._evict_queue
        while self._uploaded_bytes > self._max_uploaded and q:
            stream_id, size = q.popleft()
            tail = self._streams.get(stream_id)
            if tail is None:
                continue
            # Uploaded entries are evicted in upload order, which is each stream's offset
            # order, so the evicted entry is always at the head of its stream.
            if tail.head < tail.uploaded:
                tail.head += 1
                self._uploaded_bytes -= size
                tail.compact()
