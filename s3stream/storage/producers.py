"""Idempotent producers: which (producer, sequence) pairs a stream has taken, and where.

An append with ``producer_id=p, sequence=k`` carries both in its batch's properties (the keys
`PRODUCER_KEY` and `SEQUENCE_KEY`), so they are durable with the batch: in the WAL, then in
objects. Per stream, a `ProducerTable` remembers for each producer its last sequence and the
results of its last `WINDOW` appends. Under the append lock (so that the check and the offset
assignment are one step):

- an unknown producer (new, or expired) may start at any sequence;
- ``k == last + 1`` is appended;
- ``k`` among the last `WINDOW` sequences is a duplicate: the original result is returned
  (its future, if it is still in flight) and nothing is written;
- anything else (a gap, or a sequence older than the window) raises `SequenceError`.

An append that failed (its future raised) did not happen: a later check drops it and every
sequence after it (the WAL fails every later append too), so the producer resends them. Every
append still in flight is tracked, not only the last `WINDOW`: with more failed appends in
flight than the window holds, ``last`` must still go back to just before the first failed one
(a sequence that never became durable must never count as taken).

After a crash, a reopen or a take-over, the table is rebuilt on the first idempotent append to
the stream, from the stream's committed batches, newest first, back to the expiry horizon (or
at most `scan_bytes`): recovery and take-over commit everything the WAL acknowledged before
any stream is opened, so every acknowledged append is seen. The scan also reads batches below
the stream's start offset while the objects holding them are still listed (a trim does not
delete data; compaction drops it later, and from then on a producer whose last batches were
trimmed is forgotten at a reopen: docs/records.md). Producers idle longer than `expiry_ms` are
forgotten (then treated as new); after a reopen, idle time counts from the commit time of
the producer's last batch: in an object written by compaction, from the times its range
records per source (`StreamRange.commits`: never earlier than the real one, at most a
little later where compaction had to join neighbours), not from the object's
`committed_ms`, which is its oldest source's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

from ..clock import Clock
from ..errors import InvalidArgumentError, SequenceError
from ..types import AppendResult, FetchedBatch, RecordBatch

__all__ = [
    "PRODUCER_KEY",
    "SEQUENCE_KEY",
    "WINDOW",
    "ProducerTable",
    "stamp_batch",
]

#: Batch property keys carrying the producer id and its sequence number.
PRODUCER_KEY = "s3stream.producer"
SEQUENCE_KEY = "s3stream.sequence"
#: Sequences per producer whose results are remembered (Kafka keeps 5 batches in flight).
WINDOW = 5

Outcome = AppendResult | Future[AppendResult]

#: A table this small is never swept for idle producers (`ProducerTable.record`).
_SWEEP_MIN = 1024


@dataclass(slots=True)
class _Producer:
    last: int
    #: (sequence, outcome) of its latest appends, oldest first, at most WINDOW.
    recent: deque[tuple[int, Outcome]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    last_ms: int = 0
    #: (sequence, future) of every append not yet known to be durable, oldest first. Not
    #: bounded by WINDOW: a failed append evicted from `recent` must still pull `last` back.
    #: Its length is bounded by the appends in flight (done ones are pruned at each check).
    pending: deque[tuple[int, Future[AppendResult]]] = field(default_factory=deque)
    #: Appended to (from any thread: deque.append is atomic) by a done callback when a
    #: pending append fails: only a hint that `pending` must be scanned for failures, so
    #: that checks need not scan every append in flight when nothing failed.
    failed_hint: deque[int] = field(default_factory=deque)


def _note_done(p: _Producer, sequence: int, clock: Clock | None, fut: Future[AppendResult]) -> None:
    """Done callback of a pending append: flag `p` for a failure scan if it failed; its
    settling is the producer's latest activity (a late acknowledgement must not leave it
    expired, or a retry right after would be written again)."""
    if _failed(fut):
        p.failed_hint.append(sequence)
    if clock is not None:
        p.last_ms = max(p.last_ms, clock.now_ms())


def check_unreserved(properties: Mapping[str, str]) -> None:
    """Refuse a caller's batch properties that name a producer or a sequence: a plain append
    carrying them would pass for an idempotent one when producers are rebuilt."""
    if PRODUCER_KEY in properties or SEQUENCE_KEY in properties:
        raise InvalidArgumentError(
            f"batch properties {PRODUCER_KEY!r} and {SEQUENCE_KEY!r} are reserved for "
            "producer_id and sequence"
        )


def stamp_batch(batch: RecordBatch, producer_id: str, sequence: int) -> RecordBatch:
    """`batch` with the producer's id and sequence added to its properties."""
    check_unreserved(batch.properties)
    props = dict(batch.properties)
    props[PRODUCER_KEY] = producer_id
    props[SEQUENCE_KEY] = str(sequence)
    return RecordBatch(
        batch.payload,
        count=batch.count,
        base_timestamp=batch.base_timestamp,
        properties=MappingProxyType(props),
        kind=batch.kind,
    )


def batch_identity(properties: Mapping[str, str]) -> tuple[str, int] | None:
    """(producer id, sequence) of a stored batch, or None for a batch without one."""
    pid = properties.get(PRODUCER_KEY)
    seq = properties.get(SEQUENCE_KEY)
    if pid is None or seq is None:
        return None
    try:
        return pid, int(seq)
    except ValueError:
        return None  # not written by this module: not an idempotent append


class ProducerTable:
    """The producers of one stream (guarded by the append lock; see the module docstring)."""

    def __init__(self, expiry_ms: int, clock: Clock | None = None) -> None:
        self._expiry_ms = expiry_ms
        #: Stamps the settling of each append (`_note_done`); without one, the call's time.
        self._clock = clock
        self._producers: dict[str, _Producer] = {}
        #: The table's size at which a new producer first sweeps out the idle ones (then
        #: twice the size left): one-shot producers never append again, so `check` alone
        #: would keep them for the stream's life.
        self._sweep_at = _SWEEP_MIN

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, stream_id: int, producer_id: str, sequence: int, now_ms: int) -> Outcome | None:
        """The outcome of an earlier append of (`producer_id`, `sequence`), or None if it is
        new and may be appended; `SequenceError` if it is out of order."""
        p = self._producers.get(producer_id)
        if p is None:
            return None
        if now_ms - p.last_ms > self._expiry_ms:
            if self._idle(p, now_ms):
                del self._producers[producer_id]
                return None
            # Not idle: an append of it is still in flight (a stalled WAL, a wall clock
            # stepping forward); a resend must find it, or it would be written twice.
            p.last_ms = now_ms
        self._drop_failed(p)
        if sequence == p.last + 1:
            return None
        for seq, outcome in p.recent:
            if seq == sequence:
                return outcome
        if sequence > p.last:
            raise SequenceError(
                f"stream {stream_id}: producer {producer_id!r} sent sequence {sequence} after "
                f"{p.last}: sequences {p.last + 1}..{sequence - 1} are missing",
                producer_id=producer_id,
                expected=p.last + 1,
                got=sequence,
            )
        oldest = p.recent[0][0] if p.recent else p.last + 1
        raise SequenceError(
            f"stream {stream_id}: producer {producer_id!r} sent sequence {sequence}, older than "
            f"the last {WINDOW} it remembers ({oldest}..{p.last}): cannot tell whether it was "
            "appended",
            producer_id=producer_id,
            expected=p.last + 1,
            got=sequence,
        )

    def record(self, producer_id: str, sequence: int, outcome: Outcome, now_ms: int) -> None:
        """Remember an append just made (after `check` returned None)."""
        p = self._producers.get(producer_id)
        if p is None:
            if len(self._producers) >= self._sweep_at:
                self._forget_idle(now_ms)
                self._sweep_at = max(_SWEEP_MIN, 2 * len(self._producers))
            p = self._producers[producer_id] = _Producer(sequence)
        p.last = sequence
        p.recent.append((sequence, outcome))
        p.last_ms = now_ms
        if isinstance(outcome, Future):
            _prune_durable(p)
            p.pending.append((sequence, outcome))
            # After the append: a callback of an already failed future runs right here.
            outcome.add_done_callback(partial(_note_done, p, sequence, self._clock))

    def _idle(self, p: _Producer, now_ms: int) -> bool:
        """Whether `p` is forgotten: idle past the expiry with no append in flight."""
        return now_ms - p.last_ms > self._expiry_ms and all(fut.done() for _, fut in p.pending)

    def _forget_idle(self, now_ms: int) -> None:
        """Drop the idle producers (as `check` drops one that comes back), in one pass."""
        for pid in [pid for pid, p in self._producers.items() if self._idle(p, now_ms)]:
            del self._producers[pid]

    def rebuild(
        self, batches_newest_first: Iterable[tuple[FetchedBatch, int]], now_ms: int
    ) -> None:
        """Learn producers from stored batches, newest first (a reopened stream), each with
        the time its object was committed (the library's clock: a batch's own timestamp is
        the caller's and may be anything)."""
        for b, committed_ms in batches_newest_first:
            ident = batch_identity(b.properties)
            if ident is None:
                continue
            pid, seq = ident
            p = self._producers.get(pid)
            result = AppendResult(b.stream_id, b.base_offset, b.count)
            if p is None:
                # Its last append was no later than its commit: expiry counts from there.
                p = self._producers[pid] = _Producer(seq, last_ms=min(now_ms, committed_ms))
                p.recent.append((seq, result))
            elif len(p.recent) < WINDOW and seq < p.recent[0][0]:
                p.recent.appendleft((seq, result))

    @staticmethod
    def _drop_failed(p: _Producer) -> None:
        """Forget appends whose write failed, and all after them (never written: the WAL
        fails every later append too). `last` becomes the sequence just before the first
        failed one, whether or not that one is still in `recent`: the appends before it are
        durable or still in flight (they may still become durable, or fail later and pull
        `last` back further); no sequence at or after a failed one counts as taken."""
        _prune_durable(p)
        # The window is checked directly as well: a future is done before its callbacks
        # run, so a resend racing the callback would otherwise get the failed future back.
        if not p.failed_hint and not any(
            isinstance(outcome, Future) and _failed(outcome) for _, outcome in p.recent
        ):
            return
        # Cleared before the scan: a failure that lands during the scan adds a new hint.
        p.failed_hint.clear()
        first = next(
            (seq for seq, fut in p.pending if _failed(fut)),
            None,
        )
        if first is None:
            return  # a stale hint: that sequence was dropped and resent already
        p.last = min(p.last, first - 1)
        kept = [(seq, outcome) for seq, outcome in p.recent if seq < first]
        p.recent.clear()
        p.recent.extend(kept)
        still = [(seq, fut) for seq, fut in p.pending if seq < first]
        p.pending.clear()
        p.pending.extend(still)


def _failed(fut: Future[AppendResult]) -> bool:
    """Whether the append of `fut` failed (it will never be durable)."""
    return fut.done() and (fut.cancelled() or fut.exception() is not None)


def _prune_durable(p: _Producer) -> None:
    """Drop from `p.pending` its oldest appends that are durable (succeeded): they can no
    longer fail, and an unpruned deque would grow with every append."""
    pending = p.pending
    while pending:
        fut = pending[0][1]
        if not fut.done() or _failed(fut):
            return
        pending.popleft()
