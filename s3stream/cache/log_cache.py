"""LogCache: recent batches by stream, served to tail readers without I/O.

Entries are plain tuples of ints, bytes and (rarely) a dict: CPython's cyclic garbage
collector stops tracking such tuples after their first collection, so a cache holding millions
of batches does not make every later allocation pay for ever longer collections. (With
dataclass entries, GC alone halved the append rate of 100-byte batches.) Nothing per entry is
tracked beyond that tuple: the bookkeeping of which entries are finished is a watermark, the
eviction queue holds the entries themselves.

Memory is counted honestly: an entry is charged its encoded record plus
`ENTRY_OVERHEAD_BYTES`, the Python objects it costs besides (the tuple, the record's bytes
header, its ints, its slots in the cache's lists and in a memory WAL), measured by
tests/test_write_path.py. At 100-byte batches the overhead is twice the data, so a budget
that counted the record alone let the process grow to several times it.
"""

from __future__ import annotations

import bisect
import itertools
import struct
import threading
from collections import deque
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType
from typing import Final

from ..format.batch import BATCH_HEADER
from ..types import BatchKind, FetchedBatch

__all__ = [
    "APART_MIN_BYTES",
    "ENTRY_OVERHEAD_BYTES",
    "CachedBatch",
    "LogCache",
    "Taken",
    "entry_batch",
    "entry_block_record",
    "entry_memory",
    "entry_size",
]

#: (stream_id, base_offset, count, timestamp, kind, properties or None, record, record_skip,
#:  wal_position, epoch, seq, apart). `record[record_skip:] + apart` is the encoded batch
#:  record (format.batch) that goes into object blocks. `apart` is empty, the payload being
#:  the tail of `record` (not kept besides: a second reference to the caller's payload would
#:  keep a second copy of it alive), unless the payload is large and was never copied behind
#:  its head (`put`'s `payload_apart`): then `record` is the head and `apart` the payload.
_Props = dict[str, str] | None
CachedBatch = tuple[int, int, int, int, int, _Props, bytes, int, int, int, int, bytes]
SID: Final = 0
BASE: Final = 1
COUNT: Final = 2
TS: Final = 3
KIND: Final = 4
PROPS: Final = 5
RECORD: Final = 6
SKIP: Final = 7
WALPOS: Final = 8
EPOCH: Final = 9
SEQ: Final = 10
APART: Final = 11

#: Bytes of Python objects one entry costs besides its record's data (64-bit CPython 3.11):
#: the 12-tuple with its GC header (152), the record's bytes header (33, rounded up by the
#: allocator), four ints of its own (base offset, timestamp, WAL position, seq: 4 x 32) and
#: about six list slots (the stream's entries, the pending list or the eviction
#: queue, a memory WAL's positions and records: 6 x 8), rounded up. tests/test_write_path.py
#: measures it with tracemalloc and fails if entries cost more. An entry with its payload
#: apart costs ~150 bytes more (a second bytes header, a memory WAL's pair), under 2% of the
#: `APART_MIN_BYTES` or more it holds, and is not charged them.
ENTRY_OVERHEAD_BYTES: Final = 384

#: A payload this large or larger may be kept apart from its record's head (`put`): copying
#: it behind the head cost more than the rest of the append (64 KiB: ~70 us, mostly page
#: faults of the fresh copy), and the copy doubled what the caller's batch held. Packing
#: builds blocks whole from records under 4096 bytes only (`storage/packing.py`), which
#: never have a payload apart.
APART_MIN_BYTES: Final = 8192

#: What an evicted entry's slot holds until its stream's list is cut (`_StreamTail.evict`):
#: it is never read (readers start at `head`) and holds no record.
_EVICTED: CachedBatch = (-1, -1, 0, 0, 0, None, b"", 0, 0, 0, 0, b"")


def _evicted(k: int) -> Iterator[CachedBatch]:
    return itertools.repeat(_EVICTED, k)


_KINDS = {int(k): k for k in BatchKind}
_record_of = itemgetter(RECORD)
_apart_of = itemgetter(APART)
_base_of = itemgetter(BASE)
_seq_of = itemgetter(SEQ)
_EMPTY: Mapping[str, str] = MappingProxyType({})
#: Where a batch record's header keeps its properties' length (format.batch.BATCH_HEADER).
_PROPS_LEN = struct.Struct("<I")
_PROPS_LEN_AT: Final = 32
assert BATCH_HEADER.unpack_from(BATCH_HEADER.pack(0, 0, 1, 0, 0, 0, 0, 7, 0))[7] == 7
assert _PROPS_LEN.unpack_from(BATCH_HEADER.pack(0, 0, 1, 0, 0, 0, 0, 7, 0), _PROPS_LEN_AT)[0] == 7


def entry_batch(e: CachedBatch) -> FetchedBatch:
    """The `FetchedBatch` a cache entry stands for; its payload is a view of the record."""
    props = e[PROPS]
    record = e[RECORD]
    skip = e[SKIP]
    apart = e[APART]
    if apart:
        payload: bytes | memoryview = apart
    else:
        # The record is `prefix, header, properties, payload`: the payload is what follows.
        (props_len,) = _PROPS_LEN.unpack_from(record, skip + _PROPS_LEN_AT)
        payload = memoryview(record)[skip + BATCH_HEADER.size + props_len :]
    return FetchedBatch(
        e[SID],
        e[BASE],
        e[COUNT],
        payload,
        e[TS],
        _EMPTY if props is None else MappingProxyType(props),
        _KINDS[e[KIND]],
    )


def _end_of(e: CachedBatch) -> int:
    """The offset after an entry's batch."""
    return e[BASE] + e[COUNT]


def _payload_len(e: CachedBatch) -> int:
    """Bytes of an entry's payload (fetch limits count payloads)."""
    n = len(e[RECORD]) + len(e[APART]) - e[SKIP] - BATCH_HEADER.size
    if e[PROPS] is None:
        return n
    return n - int(_PROPS_LEN.unpack_from(e[RECORD], e[SKIP] + _PROPS_LEN_AT)[0])


def entry_block_record(e: CachedBatch) -> memoryview:
    """The encoded batch record of an entry, without copying; with its payload apart, the
    record's head (the payload, `e[APART]`, follows it)."""
    return memoryview(e[RECORD])[e[SKIP] :]


def entry_size(e: CachedBatch) -> int:
    """Bytes of an entry's encoded batch record: what it adds to an object."""
    return len(e[RECORD]) + len(e[APART]) - e[SKIP]


def entry_memory(e: CachedBatch) -> int:
    """Bytes of memory an entry is charged: its whole record and `ENTRY_OVERHEAD_BYTES`."""
    return len(e[RECORD]) + len(e[APART]) + ENTRY_OVERHEAD_BYTES


def _memory_of(entries: list[CachedBatch]) -> int:
    """`entry_memory` of all `entries` (summed in C: no Python per entry)."""
    return (
        sum(map(len, map(_record_of, entries)))
        + sum(map(len, map(_apart_of, entries)))
        + len(entries) * ENTRY_OVERHEAD_BYTES
    )


@dataclass(slots=True)
class _StreamTail:
    # Entries in offset order (one list, not parallel lists of offsets and entries: an append
    # to 10,000 streams round robin touches as few cache lines per stream as it can);
    # entries before `head` are evicted (their slots hold `_EVICTED`, see `evict`);
    # entries [head, uploaded) are uploaded, [uploaded, taken) taken by uploads in flight,
    # [taken, len) pending and not yet taken.
    stream_id: int
    entries: list[CachedBatch] = field(default_factory=list)
    head: int = 0
    uploaded: int = 0
    taken: int = 0

    def evict(self, k: int) -> None:
        """Evict the `k` entries from `head` on. Their slots are overwritten at once (an
        evicted entry left in the list kept its record alive, memory no budget counts: 64
        KiB appends with the default budgets kept ~400 MiB of evicted records), in O(k); the
        list itself is cut only once the evicted prefix is half of it (cutting it at every
        eviction moved the whole list, a stream's pending entries included, per upload)."""
        h = self.head
        self.entries[h : h + k] = _evicted(k)
        self.head = h = h + k
        if h > 1024 and h * 2 > len(self.entries):
            del self.entries[:h]
            self.uploaded -= h
            self.taken -= h
            self.head = 0


class Taken:
    """Entries taken by one upload (`LogCache.take`): in WAL order, and grouped by stream.

    The groups are slices of the cache's own per-stream lists, so an upload of entries of
    10,000 streams is grouped with work per stream, not per entry (packing, the commit and
    `mark_uploaded` all read the groups)."""

    __slots__ = ("entries", "groups")

    def __init__(self, entries: list[CachedBatch], groups: dict[int, list[CachedBatch]]) -> None:
        #: Every entry taken, in WAL order (so each stream's in offset order).
        self.entries = entries
        #: Per stream (in no particular order), its entries taken, in offset order.
        self.groups = groups

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)


class LogCache:
    """Acknowledged batches per stream; pending ones pinned, uploaded ones evictable.

    Thread-safe. Inserts must come in WAL order (the storage inserts from WAL completion
    callbacks, which run in order), so each stream's entries are in offset order.

    Two measures: `pending_bytes` and `cached_bytes` are memory (records plus per-entry
    overhead, `entry_memory`), what the budgets ``max_pending_bytes`` and ``log_cache_bytes``
    bound; `untaken_bytes` are batch-record bytes (`entry_size`), what uploads are sized by.
    """

    def __init__(self, max_uploaded_bytes: int) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, _StreamTail] = {}
        self._max_uploaded = max_uploaded_bytes
        self._uploaded_bytes = 0
        self._pending_bytes = 0
        # Uploaded entries in upload order, for eviction, as runs of one stream's entries
        # from its head on: the stream's tail, entries left in the run, their memory, in
        # three parallel queues (no object per run for the garbage collector to walk). One
        # run per stream per upload, not per entry: a run evicted whole costs O(1).
        self._evict_tails: deque[_StreamTail] = deque()
        self._evict_left: deque[int] = deque()
        self._evict_memory: deque[int] = deque()
        # Not-yet-taken entries in WAL order; the uploader takes them as snapshots.
        self._pending: list[CachedBatch] = []
        # Streams with entries not yet taken (`_StreamTail.taken` < len): `take` groups an
        # upload's entries by stream from these, with work per stream, not per entry.
        self._untaken: dict[int, _StreamTail] = {}
        #: Record bytes of `_pending`: acknowledged, not yet taken by an upload.
        self._untaken_bytes = 0
        self._last_seq = 0
        # Entries finish (are uploaded or discarded) nearly always in seq order: every seq
        # below `_finished_below` is finished, and the few finished out of order wait in
        # `_finished_ahead` until the watermark reaches them. Flush waits for the watermark.
        self._finished_below = 1
        self._finished_ahead: set[int] = set()
        #: Streams whose writer stopped (closed, destroyed or fenced), by epoch: an append of
        #: that epoch or an older one completing afterwards is refused (`put` returns -1), not
        #: acknowledged after the close, cached again, uploaded and then found fenced or
        #: colliding with a reopen's offsets. One int per stream.
        self._stopped: dict[int, int] = {}
        #: Of those, the ones discarded (destroyed or fenced: what they held was let go).
        self._discarded: dict[int, int] = {}

    @property
    def pending_bytes(self) -> int:
        """Memory of acknowledged batches not yet uploaded (`entry_memory`)."""
        return self._pending_bytes

    @property
    def cached_bytes(self) -> int:
        """Memory held: pending plus uploaded-but-not-evicted (`entry_memory`)."""
        return self._pending_bytes + self._uploaded_bytes

    @property
    def last_seq(self) -> int:
        """Sequence number of the latest inserted entry (0 before any)."""
        return self._last_seq

    def oldest_unfinished_seq(self) -> int | None:
        """Seq of the oldest entry neither uploaded nor discarded (None: all are done)."""
        with self._lock:
            w = self._finished_below
            return w if w <= self._last_seq else None

    def _finish_locked(self, seq: int) -> None:
        w = self._finished_below
        if seq == w:
            w += 1
            ahead = self._finished_ahead
            while ahead and w in ahead:
                ahead.remove(w)
                w += 1
            self._finished_below = w
        elif seq > w:
            self._finished_ahead.add(seq)

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
        *,
        payload_apart: bool = False,
    ) -> int:
        """Insert an acknowledged batch; returns the record bytes not yet taken by an upload
        afterwards (the uploader is woken when they reach its threshold), or -1 if the
        stream's writer was stopped at `epoch` or a newer one (`refuse`, `discard_stream`:
        nothing is inserted). `payload` must be
        the tail of `record` (it is read from there: not kept, so it costs nothing more);
        with `payload_apart`, `record` ends where the payload would begin, and the payload
        (at least `APART_MIN_BYTES`) is kept as it is."""
        props = dict(properties) if properties else None
        apart = payload if payload_apart else b""
        size = len(record) + len(apart)
        with self._lock:
            if self._stopped and self._stopped.get(stream_id, -1) >= epoch:
                return -1
            seq = self._last_seq = self._last_seq + 1
            e: CachedBatch = (
                stream_id, base_offset, count, timestamp, int(kind), props,
                record, record_skip, wal_position, epoch, seq, apart,
            )  # fmt: skip
            tail = self._streams.get(stream_id)
            if tail is None:
                tail = self._streams[stream_id] = _StreamTail(stream_id)
            elif (
                tail.head < len(tail.entries)
                # `_end_of` inlined: this runs for every append
                and (last := tail.entries[-1])[BASE] + last[COUNT] != base_offset
                and tail.uploaded == len(tail.entries)
            ):
                # A new writer elsewhere in the stream (it was closed here, written by another
                # node, reopened here): a read would take the old entries and the new ones
                # for one run and skip what lies between. Uploaded entries are in objects.
                self._drop_tail_locked(tail)
                tail = self._streams[stream_id] = _StreamTail(stream_id)
            entries = tail.entries
            if tail.taken == len(entries):
                self._untaken[stream_id] = tail  # its first entry not yet taken
            entries.append(e)
            self._pending.append(e)
            self._pending_bytes += size + ENTRY_OVERHEAD_BYTES
            self._untaken_bytes += size - record_skip
            return self._untaken_bytes

    def charge(self, nbytes: int) -> None:
        """Count `nbytes` more (negative: fewer) of memory held for pending entries outside
        the cache against `pending_bytes`: the uploader's packed objects, a second copy of
        their entries until the upload commits (two 64 MiB uploads in flight are 128 MiB
        that the pending budget did not see)."""
        with self._lock:
            self._pending_bytes += nbytes

    @property
    def untaken_bytes(self) -> int:
        """Record bytes acknowledged and not yet taken by an upload (`entry_size`)."""
        return self._untaken_bytes

    def take(self, max_bytes: int | None = None) -> Taken:
        """Hand the oldest pending entries (in WAL order, and grouped by stream), about
        `max_bytes` of records (at least one; all without a limit), to the uploader; they
        stay pinned until `mark_uploaded`."""
        with self._lock:
            untaken = self._untaken
            if max_bytes is None or self._untaken_bytes <= max_bytes:
                taken, self._pending = self._pending, []
                self._untaken_bytes = 0
                groups: dict[int, list[CachedBatch]] = {}
                for sid, tail in untaken.items():
                    entries = tail.entries
                    if tail.taken < len(entries):
                        groups[sid] = entries[tail.taken :]
                        tail.taken = len(entries)
                untaken.clear()
                return Taken(taken, groups)
            total = n = 0
            for e in self._pending:
                size = len(e[RECORD]) + len(e[APART]) - e[SKIP]
                if n and total + size > max_bytes:
                    break
                total += size
                n += 1
            taken = self._pending[:n]
            del self._pending[:n]
            self._untaken_bytes -= total
            # Each stream's entries taken are those up to the last seq taken (seqs grow in
            # WAL order, and so in each stream's list).
            cut = taken[-1][SEQ]
            groups = {}
            for sid, tail in list(untaken.items()):
                entries = tail.entries
                t = tail.taken
                j = bisect.bisect_right(entries, cut, t, len(entries), key=_seq_of)
                if j > t:
                    groups[sid] = entries[t:j]
                    tail.taken = j
                    if j == len(entries):
                        del untaken[sid]
            return Taken(taken, groups)

    def mark_uploaded(self, taken: Taken, excluded: Collection[int] = ()) -> None:
        """Entries from `take` are now in object storage, except those of the streams in
        `excluded` (the caller discards those): unpin and maybe evict."""
        with self._lock:
            if excluded:
                self._finish_all_locked([e for e in taken.entries if e[SID] not in excluded])
            else:
                self._finish_all_locked(taken.entries)
            streams = self._streams
            moved = 0
            for sid, lst in taken.groups.items():
                if sid in excluded:
                    continue
                tail = streams.get(sid)
                if tail is None:
                    continue  # discarded meanwhile
                k = len(lst)
                u = tail.uploaded
                cached = tail.entries
                # Uploads commit in WAL order, so these are the stream's oldest pending
                # entries, unless the stream was discarded meanwhile (and cached anew).
                if (
                    u + k > len(cached)
                    or cached[u] is not lst[0]
                    or cached[u + k - 1] is not lst[-1]
                ):
                    k = 0
                    for e in lst:
                        if u + k < len(cached) and cached[u + k] is e:
                            k += 1
                    if not k:
                        continue
                    lst = cached[u : u + k]
                tail.uploaded = u + k
                if tail.taken < u + k:
                    tail.taken = u + k  # defensive: what is uploaded was taken
                memory = _memory_of(lst)
                moved += memory
                self._evict_tails.append(tail)
                self._evict_left.append(k)
                self._evict_memory.append(memory)
            self._pending_bytes -= moved
            self._uploaded_bytes += moved
            self._evict_locked()

    def _finish_all_locked(self, entries: list[CachedBatch]) -> None:
        """`_finish_locked` for each entry; at once when they are the next seqs in a row."""
        if not entries:
            return
        w = self._finished_below
        if entries[0][SEQ] == w and entries[-1][SEQ] == w + len(entries) - 1:
            # Seqs strictly increase in a list in WAL order: these are w, w+1, ... exactly.
            w += len(entries)
            ahead = self._finished_ahead
            while ahead and w in ahead:
                ahead.remove(w)
                w += 1
            self._finished_below = w
            return
        for e in entries:
            self._finish_locked(e[SEQ])

    def refuse(self, stream_id: int, epoch: int) -> None:
        """Refuse later `put`s of the stream at `epoch` or an older one (its writer stopped:
        appends still completing are not acknowledged), keeping what is cached."""
        with self._lock:
            self._refuse_locked(stream_id, epoch)

    def _refuse_locked(self, stream_id: int, epoch: int) -> None:
        if epoch > self._stopped.get(stream_id, -1):
            self._stopped[stream_id] = epoch

    def discard_stream(self, stream_id: int, epoch: int | None = None) -> list[CachedBatch]:
        """Forget a stream (destroyed or fenced); returns its pending entries. With `epoch`,
        later `put`s of that epoch or an older one are refused (appends still completing)."""
        with self._lock:
            if epoch is not None:
                self._refuse_locked(stream_id, epoch)
                if epoch > self._discarded.get(stream_id, -1):
                    self._discarded[stream_id] = epoch
            tail = self._streams.get(stream_id)
            return [] if tail is None else self._drop_tail_locked(tail)

    def forget_uploaded(self, stream_id: int) -> None:
        """Drop the stream's cached entries if all are uploaded (its writer released here:
        reads go to objects, and its memory is not kept for the client's life); entries
        still pending stay for their upload."""
        with self._lock:
            tail = self._streams.get(stream_id)
            if tail is not None and tail.uploaded == len(tail.entries):
                self._drop_tail_locked(tail)

    def _drop_tail_locked(self, tail: _StreamTail) -> list[CachedBatch]:
        """Remove a stream's entries from the cache; returns those not uploaded."""
        stream_id = tail.stream_id
        del self._streams[stream_id]
        self._untaken.pop(stream_id, None)
        dropped = tail.entries[tail.uploaded :]
        uploaded = tail.entries[tail.head : tail.uploaded]
        self._uploaded_bytes -= sum(entry_memory(e) for e in uploaded)
        if dropped:
            self._pending_bytes -= sum(entry_memory(e) for e in dropped)
            for e in dropped:
                self._finish_locked(e[SEQ])
            self._pending = [e for e in self._pending if e[SID] != stream_id]
            self._untaken_bytes = sum(entry_size(e) for e in self._pending)
        if uploaded:
            # Rare (a stream destroyed, fenced or released): its records go now, not when
            # eviction would have reached them.
            runs = [
                run
                for run in zip(self._evict_tails, self._evict_left, self._evict_memory, strict=True)
                if run[0] is not tail
            ]
            self._evict_tails = deque(run[0] for run in runs)
            self._evict_left = deque(run[1] for run in runs)
            self._evict_memory = deque(run[2] for run in runs)
        return dropped

    def discarded_epoch(self, stream_id: int) -> int | None:
        """The newest epoch at which the stream was discarded (`discard_stream` with an
        epoch; None: never)."""
        with self._lock:
            return self._discarded.get(stream_id)

    def first_offset(self, stream_id: int) -> int | None:
        """Lowest offset the cache can serve for the stream, or None if it holds none."""
        with self._lock:
            tail = self._streams.get(stream_id)
            if tail is None or tail.head >= len(tail.entries):
                return None
            return tail.entries[tail.head][BASE]

    def read(
        self, stream_id: int, start: int, end: int, max_bytes: int
    ) -> tuple[list[FetchedBatch], bool]:
        """Batches of the stream overlapping ``[start, end)``, at least one, up to `max_bytes`.

        Returns (batches, complete): `complete` is False when the cache does not hold
        `start` (evicted, never cached, or in a gap between writers), in which case the
        caller reads objects first. The batches are contiguous: a read stops at a gap.
        """
        found: list[CachedBatch] = []
        with self._lock:
            tail = self._streams.get(stream_id)
            entries = tail.entries if tail is not None else []
            if tail is None or tail.head >= len(entries) or entries[tail.head][BASE] > start:
                return [], False
            i = bisect.bisect_right(entries, start, lo=tail.head, key=_base_of) - 1
            n = len(entries)
            if i + 1 < n and _end_of(entries[i]) <= start:
                # `start` falls in a gap: `put` drops a stream's uploaded entries when a new
                # writer does not continue them, but keeps those still pending.
                return [], False
            total = 0
            expected = entries[i][BASE]
            while i < n:
                e = entries[i]
                if e[BASE] >= end or e[BASE] != expected:
                    break
                expected = e[BASE] + e[COUNT]
                size = _payload_len(e)
                if found and total + size > max_bytes:
                    break
                found.append(e)
                total += size
                i += 1
        return [entry_batch(e) for e in found], True

    def _evict_locked(self) -> None:
        tails, lefts, memories = self._evict_tails, self._evict_left, self._evict_memory
        streams = self._streams
        while self._uploaded_bytes > self._max_uploaded and tails:
            tail = tails[0]
            left = lefts[0]
            if streams.get(tail.stream_id) is not tail:
                # Discarded: its entries were uncounted then.
                tails.popleft()
                lefts.popleft()
                memories.popleft()
                continue
            # Runs are queued in upload order, each stream's in offset order, so a run's
            # entries are its stream's oldest cached ones: from `head` on.
            over = self._uploaded_bytes - self._max_uploaded
            memory = memories[0]
            if memory <= over:
                # The whole run goes: no Python per entry.
                tail.evict(left)
                self._uploaded_bytes -= memory
                tails.popleft()
                lefts.popleft()
                memories.popleft()
                continue
            entries = tail.entries
            h = tail.head
            freed = k = 0
            while k < left and freed < over:
                freed += entry_memory(entries[h + k])
                k += 1
            tail.evict(k)
            self._uploaded_bytes -= freed
            if k == left:
                tails.popleft()
                lefts.popleft()
                memories.popleft()
            else:
                lefts[0] = left - k
                memories[0] = memory - freed
