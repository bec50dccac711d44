"""LogCache: recent batches by stream, served to tail readers without I/O."""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..types import FetchedBatch

__all__ = ["CachedBatch", "LogCache"]


@dataclass(slots=True)
class CachedBatch:
    """One acknowledged batch, with the encoded record the uploader writes into objects."""

    batch: FetchedBatch
    #: The encoded batch record (format.batch), ready to be copied into an object block.
    record: bytes | memoryview
    #: Position of the batch's WAL record; the WAL may be trimmed past it once uploaded.
    wal_position: int
    #: Stream epoch the batch was written under (a newer owner fences it off at commit).
    epoch: int
    #: Insertion order across all streams, assigned by the cache.
    seq: int = 0
    uploaded: bool = False


@dataclass(slots=True)
class _StreamTail:
    # Parallel lists; `head` skips evicted entries so eviction is O(1) amortised.
    offsets: list[int] = field(default_factory=list)
    entries: list[CachedBatch] = field(default_factory=list)
    head: int = 0

    def compact(self) -> None:
        if self.head > 1024 and self.head * 2 > len(self.entries):
            del self.offsets[: self.head]
            del self.entries[: self.head]
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
        # Uploaded entries in upload order, for eviction: (stream_id, entry).
        self._evict_queue: deque[tuple[int, CachedBatch]] = deque()
        # Not-yet-uploaded entries in WAL order; the uploader takes them as snapshots.
        self._pending: list[CachedBatch] = []
        self._last_seq = 0
        # Entries neither uploaded nor discarded, by seq: flush waits for the oldest.
        self._unfinished: OrderedDict[int, CachedBatch] = OrderedDict()

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

    def put(self, entry: CachedBatch) -> int:
        """Insert an acknowledged batch; returns the pending bytes afterwards."""
        b = entry.batch
        with self._lock:
            self._last_seq += 1
            entry.seq = self._last_seq
            self._unfinished[entry.seq] = entry
            tail = self._streams.get(b.stream_id)
            if tail is None:
                tail = self._streams[b.stream_id] = _StreamTail()
            tail.offsets.append(b.base_offset)
            tail.entries.append(entry)
            self._pending.append(entry)
            self._pending_bytes += len(entry.record)
            return self._pending_bytes

    def take_pending(self) -> list[CachedBatch]:
        """Hand every pending entry (in WAL order) to the uploader; they stay pinned."""
        with self._lock:
            taken, self._pending = self._pending, []
            return taken

    def mark_uploaded(self, entries: list[CachedBatch]) -> None:
        """Entries from `take_pending` are now in object storage: unpin and maybe evict."""
        with self._lock:
            for e in entries:
                e.uploaded = True
                self._unfinished.pop(e.seq, None)
                size = len(e.record)
                self._pending_bytes -= size
                self._uploaded_bytes += size
                self._evict_queue.append((e.batch.stream_id, e))
            self._evict_locked()

    def discard_stream(self, stream_id: int) -> list[CachedBatch]:
        """Forget a stream (destroyed or fenced); returns its pending entries."""
        with self._lock:
            tail = self._streams.pop(stream_id, None)
            if tail is None:
                return []
            dropped = [e for e in tail.entries[tail.head :] if not e.uploaded]
            for e in tail.entries[tail.head :]:
                if e.uploaded:
                    self._uploaded_bytes -= len(e.record)
            self._pending_bytes -= sum(len(e.record) for e in dropped)
            for e in dropped:
                self._unfinished.pop(e.seq, None)
            ids = {id(e) for e in dropped}
            self._pending = [e for e in self._pending if id(e) not in ids]
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
        out: list[FetchedBatch] = []
        with self._lock:
            tail = self._streams.get(stream_id)
            if tail is None or tail.head >= len(tail.entries) or tail.offsets[tail.head] > start:
                return out, False
            i = bisect.bisect_right(tail.offsets, start, lo=tail.head) - 1
            entries = tail.entries
            n = len(entries)
            total = 0
            while i < n:
                b = entries[i].batch
                if b.base_offset >= end:
                    break
                if out and total + len(b.payload) > max_bytes:
                    break
                out.append(b)
                total += len(b.payload)
                i += 1
        return out, True

    def _evict_locked(self) -> None:
        q = self._evict_queue
        while self._uploaded_bytes > self._max_uploaded and q:
            stream_id, e = q.popleft()
            tail = self._streams.get(stream_id)
            if tail is None:
                continue
            # Uploaded entries are evicted in upload order, which is each stream's offset order,
            # so the evicted entry is always at the head of its stream.
            if tail.head < len(tail.entries) and tail.entries[tail.head] is e:
                tail.head += 1
                self._uploaded_bytes -= len(e.record)
                tail.compact()
