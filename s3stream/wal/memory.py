"""The memory WAL: the contract with no durability beyond the process, for tests and demos.

Records live in a `MemoryWalMedium`. A new `MemoryWal` over the same medium recovers what the
previous one left, which is how tests simulate a crash: drop the WAL object, keep the medium.

Roles: `MemoryWalMedium` (the "disk") and `MemoryWal`. It is no `PipelinedWal`
(`s3stream.wal.pipeline`): with nothing to wait for, an append is stored and acknowledged on
the calling thread, so there is no pending queue, no writer and no room to wait for. Its
refusals and lifecycle are the same as the pipelined WALs' (`s3stream.wal.checks`).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator, MutableSequence
from concurrent.futures import Future
from typing import overload

from .._futures import CompletedFutures
from .base import WalCapabilities, WalPosition, WalRecord, WriteAheadLog
from .checks import (
    check_trim_position,
    closed_error,
    not_ready_error,
    record_error,
    record_size_error,
    trim_past_acked_error,
)

__all__ = ["MemoryRecords", "MemoryWal", "MemoryWalMedium"]

_CAPABILITIES = WalCapabilities(
    persistent=False,
    durable_on_ack=True,
    torn_writes=False,
    bounded_capacity=False,
    fencing=False,
    acks_on_call=True,
)
_MAX_RECORD_BYTES = _CAPABILITIES.max_record_bytes


class MemoryRecords(MutableSequence[WalRecord]):
    """The records of a medium, in position order, read and written as `WalRecord`s.

    Kept as two parallel lists of positions and data, not as a list of `WalRecord`s: the
    garbage collector never stops tracking a named tuple (only exact tuples are untracked), so
    a memory WAL holding a million records made every collection walk a million objects (the
    appends' rate fell by half over the first million). Ints and bytes are never tracked.
    A record appended in two parts (`add_apart`) is kept as an exact tuple of two bytes, which
    the collector stops tracking too, and joined only when read.
    """

    __slots__ = ("_data", "_positions")

    def __init__(self) -> None:
        self._positions: list[int] = []
        self._data: list[bytes | tuple[bytes, bytes]] = []

    def __len__(self) -> int:
        return len(self._positions)

    @overload
    def __getitem__(self, i: int) -> WalRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[WalRecord]: ...

    def __getitem__(self, i: int | slice) -> WalRecord | list[WalRecord]:
        if isinstance(i, slice):
            return [
                WalRecord(p, _joined(d))
                for p, d in zip(self._positions[i], self._data[i], strict=True)
            ]
        return WalRecord(self._positions[i], _joined(self._data[i]))

    @overload
    def __setitem__(self, i: int, value: WalRecord) -> None: ...

    @overload
    def __setitem__(self, i: slice, value: Iterable[WalRecord]) -> None: ...

    def __setitem__(self, i: int | slice, value: WalRecord | Iterable[WalRecord]) -> None:
        if isinstance(i, slice):
            assert not isinstance(value, WalRecord)
            records = list(value)
            self._positions[i] = [r[0] for r in records]
            self._data[i] = [r[1] for r in records]
        else:
            assert isinstance(value, tuple)
            self._positions[i], self._data[i] = value[0], value[1]

    def __delitem__(self, i: int | slice) -> None:
        del self._positions[i]
        del self._data[i]

    def insert(self, index: int, value: WalRecord) -> None:
        self._positions.insert(index, value[0])
        self._data.insert(index, value[1])

    def append(self, value: WalRecord) -> None:
        self._positions.append(value[0])
        self._data.append(value[1])

    def add(self, position: int, data: bytes) -> None:
        """Append a record without building a `WalRecord` (the append path)."""
        self._positions.append(position)
        self._data.append(data)

    def add_apart(self, position: int, head: bytes, tail: bytes) -> None:
        """Append the record `head + tail` without joining them (kept as they are)."""
        self._positions.append(position)
        self._data.append((head, tail))

    def clear(self) -> None:
        self._positions.clear()
        self._data.clear()

    def positions(self) -> list[int]:
        """The positions, in order (a copy)."""
        return list(self._positions)

    def drop_through(self, position: int) -> None:
        """Drop the records at positions <= `position` (a prefix: positions are in order)."""
        keep = bisect.bisect_right(self._positions, position)
        del self._positions[:keep]
        del self._data[:keep]


def _joined(data: bytes | tuple[bytes, bytes]) -> bytes:
    """A stored record as one bytes object (`MemoryRecords.add_apart` keeps some in two)."""
    return data if isinstance(data, bytes) else b"".join(data)


class MemoryWalMedium:
    """The "disk" of a memory WAL: records and trim point, shared across WAL instances."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records = MemoryRecords()
        #: Records at positions <= trimmed are gone.
        self.trimmed: int = -1
        self.next_position: int = 0


class MemoryWal(WriteAheadLog):
    """A WAL in memory; acknowledged at once, in order, on the calling thread.

    Every record goes through `append_and_wait` (`append` and `append_parts` call it, and the
    client calls it directly, as the WAL claims `acks_on_call`): a subclass that changes how
    records are taken overrides that method.
    """

    def __init__(self, medium: MemoryWalMedium | None = None) -> None:
        self._medium = medium if medium is not None else MemoryWalMedium()
        self._ready = False
        self._closed = False
        self._done = CompletedFutures()

    @property
    def capabilities(self) -> WalCapabilities:
        return _CAPABILITIES

    @property
    def medium(self) -> MemoryWalMedium:
        """The shared storage behind this WAL."""
        return self._medium

    def recover(self) -> Iterator[WalRecord]:
        self._check_open()
        m = self._medium
        with m.lock:
            records = [r for r in m.records if r.position > m.trimmed]
        yield from records
        self._ready = True

    def append(self, data: bytes) -> Future[WalPosition]:
        # Complete at birth: the record is stored before any later append can be.
        return self._done.result(self.append_and_wait(data))

    def append_and_wait(self, head: bytes, tail: bytes = b"") -> WalPosition:
        """`WriteAheadLog.append_and_wait`: acknowledged on return, without a future (an
        append of 100 bytes spent a sixth of its time making, asking and reading one); a
        `tail` is kept apart from `head`, never joined on the way in, so a large payload
        behind a small head is not copied (recovery reads the joined record)."""
        if type(head) is not bytes or type(tail) is not bytes:
            raise record_error(head if type(head) is not bytes else tail, 0, self.describe())
        if len(head) + len(tail) > _MAX_RECORD_BYTES:
            raise record_size_error(len(head) + len(tail), _MAX_RECORD_BYTES, self.describe())
        m = self._medium
        with m.lock:
            pos = self._next_position_locked()
            # The caller's bytes are kept as they are (immutable): no copy.
            if tail:
                m.records.add_apart(pos, head, tail)
            else:
                m.records.add(pos, head)
        return pos

    def _next_position_locked(self) -> int:
        """The position of a record about to be appended (under the medium's lock)."""
        self._check_open()
        if not self._ready:
            raise not_ready_error(self.describe(), "append()")
        m = self._medium
        pos = m.next_position
        m.next_position = pos + 1
        return pos

    def trim(self, position: WalPosition) -> None:
        check_trim_position(position)
        m = self._medium
        with m.lock:
            self._check_open()
            if not self._ready:
                raise not_ready_error(self.describe(), "trim()")
            # Every record appended is acknowledged already.
            if position >= m.next_position:
                raise trim_past_acked_error(self.describe(), position, m.next_position - 1)
            if position <= m.trimmed:
                return
            m.trimmed = position
            # Records are in position order: drop the trimmed prefix.
            m.records.drop_through(position)

    def reset(self) -> None:
        m = self._medium
        with m.lock:
            self._check_open()
            m.records.clear()
            m.trimmed = m.next_position - 1
            self._ready = True

    def close(self) -> None:
        with self._medium.lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error(self.describe())
