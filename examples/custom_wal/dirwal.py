"""DirWal: a write-ahead log that keeps each record in a file of its own, in one directory.

An example of a third-party WAL, written only against s3stream's public API, and proved
correct by the conformance kit (see ``test_dirwal.py``). Not fast - one file and two fsyncs per
record - but simple enough to read in one sitting.

Layout of the directory:

- ``<position>.rec`` (position zero-padded to 20 digits): a crc32c of the record bytes
  (4 bytes, little-endian), then the bytes. Written as ``<name>.tmp``, fsynced, renamed into
  place, and the directory fsynced: a record file is either absent or complete.
- ``TRIM``: the trim point in decimal, replaced the same way. Records at or below it are dead;
  `trim` deletes their files, and recovery deletes any it finds.

A crash can leave a ``.tmp`` file (a torn write): recovery deletes it. A complete record file
whose checksum does not match was damaged after it was written: recovery raises
`CorruptionError` rather than return it or silently skip it.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import crc32c

from s3stream.errors import CorruptionError, InvalidArgumentError, S3StreamError, StreamClosedError
from s3stream.wal import WalCapabilities, WalPosition, WalRecord, WriteAheadLog

__all__ = ["DirWal"]

_CRC = struct.Struct("<I")
_SUFFIX = ".rec"
_TMP = ".tmp"
_TRIM = "TRIM"
_CAPABILITIES = WalCapabilities(
    persistent=True,
    durable_on_ack=True,
    torn_writes=True,
    bounded_capacity=False,
    fencing=False,
    max_record_bytes=16 << 20,
)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + _TMP)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class DirWal(WriteAheadLog):
    """A WAL in `directory` (created if missing); appends are acknowledged once on disk."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._ready = False
        self._closed = False
        trim_file = self._dir / _TRIM
        self._trimmed = int(trim_file.read_text()) if trim_file.exists() else -1
        self._next = self._trimmed + 1

    @property
    def capabilities(self) -> WalCapabilities:
        return _CAPABILITIES

    def describe(self) -> str:
        return f"DirWal({self._dir})"

    def _path(self, position: int) -> Path:
        return self._dir / f"{position:020d}{_SUFFIX}"

    def _positions(self) -> list[int]:
        return sorted(int(p.name[: -len(_SUFFIX)]) for p in self._dir.glob(f"*{_SUFFIX}"))

    def recover(self) -> Iterator[WalRecord]:
        with self._lock:
            self._check_open()
            for leftover in self._dir.glob(f"*{_TMP}"):
                leftover.unlink()  # a write the crash cut short: never acknowledged
            records = []
            for position in self._positions():
                path = self._path(position)
                if position <= self._trimmed:
                    path.unlink()
                    continue
                raw = path.read_bytes()
                (crc,) = _CRC.unpack_from(raw) if len(raw) >= _CRC.size else (None,)
                data = raw[_CRC.size :]
                if crc != crc32c.crc32c(data):
                    raise CorruptionError(f"{path}: checksum mismatch", location=str(path))
                records.append(WalRecord(position, data))
            if records:
                self._next = records[-1].position + 1
        yield from records
        with self._lock:
            self._ready = True

    def append(self, data: bytes) -> Future[WalPosition]:
        if not isinstance(data, bytes):
            raise InvalidArgumentError(f"data must be bytes, not {type(data).__name__}")
        if len(data) > _CAPABILITIES.max_record_bytes:
            raise InvalidArgumentError(f"a record holds at most 16 MiB, got {len(data)} bytes")
        future: Future[WalPosition] = Future()
        with self._lock:
            self._check_open()
            if not self._ready:
                raise S3StreamError("DirWal: recover() or reset() must run before append()")
            position = self._next
            _write_atomically(self._path(position), _CRC.pack(crc32c.crc32c(data)) + data)
            self._next = position + 1
            # Completed under the lock, so futures complete in append order.
            future.set_result(position)
        return future

    def trim(self, position: WalPosition) -> None:
        if type(position) is not int:
            raise InvalidArgumentError(f"position must be an int, got {position!r}")
        with self._lock:
            self._check_open()
            self._trim_to(position)

    def _trim_to(self, position: int) -> None:
        if position <= self._trimmed:
            return
        # The trim point is durable before any file goes, so nothing trimmed can come back.
        _write_atomically(self._dir / _TRIM, str(position).encode())
        self._trimmed = position
        self._next = max(self._next, position + 1)
        for existing in self._positions():
            if existing > position:
                break
            self._path(existing).unlink()

    def reset(self) -> None:
        with self._lock:
            self._check_open()
            if not self._ready:
                found = self._positions()
                self._next = max(self._next, found[-1] + 1 if found else 0)
            self._trim_to(self._next - 1)
            self._ready = True

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosedError(f"{self.describe()} is closed")
