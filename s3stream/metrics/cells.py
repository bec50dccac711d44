"""Numbers that many threads add to without taking a lock: one row of slots per thread.

An append adds to a few counters and a histogram bucket. A lock per update costs about as much
as the rest of the instrumentation together (and contends between appending threads), so each
thread adds to a row of its own, which no other thread writes, and a reader sums the rows.
Rows are keyed by thread identifier: a thread that ends leaves its row (its counts stay in the
sums), and a new thread given the same identifier goes on adding to it, so the rows number at
most the threads ever alive at once.

A slot is an index into every row; instruments allocate contiguous ranges of slots once, at
creation, and then update them through `SlotRows.rows`. Sums read while threads write may miss
their latest updates (a histogram's count and sum may disagree by an update in flight), never
lose them.
"""

from __future__ import annotations

import threading

__all__ = ["SlotRows"]


class SlotRows:
    """The rows of one registry: `allocate` slots, add through `rows`, read with `sums`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._size = 0
        #: Row of each thread by ``threading.get_ident()`` (KeyError before the thread's
        #: first update; IndexError while shorter than the slots allocated since).
        self.rows: dict[int, list[float]] = {}

    def allocate(self, count: int) -> int:
        """Reserve `count` consecutive slots; the first one's index."""
        with self._lock:
            first = self._size
            self._size += count
            return first

    def row(self) -> list[float]:
        """The calling thread's row, made or lengthened to every slot allocated so far (the
        slow path of an update, taken once per thread and after each allocation)."""
        ident = threading.get_ident()
        with self._lock:
            row = self.rows.get(ident)
            if row is None:
                row = self.rows[ident] = []
            # Only the owning thread ever lengthens or writes its row.
            row.extend([0] * (self._size - len(row)))
            return row

    def sums(self, first: int, count: int) -> list[float]:
        """Totals over every row of slots ``[first, first + count)``."""
        end = first + count
        totals: list[float] = [0] * count
        with self._lock:
            rows = list(self.rows.values())
        for row in rows:
            for i, value in enumerate(row[first:end]):
                totals[i] += value
        return totals
