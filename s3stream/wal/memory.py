"""The memory WAL: the contract with no durability beyond the process, for tests and demos.

Records live in a `MemoryWalMedium`. A new `MemoryWal` over the same medium recovers what the
previous one left, which is how tests simulate a crash: drop the WAL object, keep the medium.

Roles: `MemoryWalMedium` (the "disk") and `MemoryWal`. It is no `PipelinedWal`
(`s3stream.wal.pipeline`): with nothing to wait for, an append is stored and acknowledged on
the calling thread, so there is no pending queue, no writer and no room to wait for. Its
refusals and lifecycle are the same as the pipelined WALs' (`s3stream.wal.checks`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future

from .._futures import CompletedFutures
from .base import WalCapabilities, WalPosition, WalRecord, WriteAheadLog
from .checks import (
    check_trim_position,
    closed_error,
    not_ready_error,
    record_error,
    trim_past_acked_error,
)

__all__ = ["MemoryWal", "MemoryWalMedium"]

_CAPABILITIES = WalCapabilities(
    persistent=False, durable_on_ack=True, torn_writes=False, bounded_capacity=False, fencing=False
)
_MAX_RECORD_BYTES = _CAPABILITIES.max_record_bytes


class MemoryWalMedium:
    """The "disk" of a memory WAL: records and trim point, shared across WAL instances."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[WalRecord] = []
        #: Records at positions <= trimmed are gone.
        self.trimmed: int = -1
        self.next_position: int = 0


class MemoryWal(WriteAheadLog):
    """A WAL in memory; acknowledged at once, in order, on the calling thread."""

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
        if type(data) is not bytes or len(data) > _MAX_RECORD_BYTES:
            raise record_error(data, _MAX_RECORD_BYTES, self.describe())
        m = self._medium
        with m.lock:
            self._check_open()
            if not self._ready:
                raise not_ready_error(self.describe(), "append()")
            pos = m.next_position
            m.next_position = pos + 1
            m.records.append(WalRecord(pos, data))
        # Complete at birth: the record is stored before any later append can be.
        return self._done.result(pos)

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
            keep = 0
            while keep < len(m.records) and m.records[keep].position <= position:
                keep += 1
            del m.records[:keep]

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
