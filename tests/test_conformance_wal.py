"""Every WAL of the library through the conformance kit (`s3stream.testing.WalTests`)."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

from s3stream.settings import FileWalSettings
from s3stream.testing.disk_faults import failing_writes
from s3stream.testing.wal import WalTests
from s3stream.wal.base import WriteAheadLog
from s3stream.wal.file import FileWal, read_wal_header
from s3stream.wal.framing import FrameScanner, body_crc, encode_frame_header
from s3stream.wal.memory import MemoryWal, MemoryWalMedium


class TestMemoryWal(WalTests):
    def make_medium(self, tmp_path: Path) -> MemoryWalMedium:
        return MemoryWalMedium()

    def open_wal(self, medium: MemoryWalMedium) -> WriteAheadLog:
        return MemoryWal(medium)

    def raw_bytes(self, medium: MemoryWalMedium) -> bytes:
        with medium.lock:
            return b"".join(r.data for r in medium.records)


# The state machine also runs as a plain unittest.TestCase (for runners other than a WalTests
# subclass); MemoryWal is cheap enough to run it both ways.
TestMemoryWalStateMachine = TestMemoryWal.state_machine()


class TestFileWal(WalTests):
    """The ring-buffer file WAL; crashes drop the process state through `FileWal._abandon`."""

    capacity_bytes = 16 << 20

    def make_medium(self, tmp_path: Path) -> Path:
        return tmp_path / "wal" / "ring.wal"

    def _settings(self, capacity_bytes: int, full_wait_ms: int = 2_000) -> FileWalSettings:
        return FileWalSettings(
            capacity_bytes=capacity_bytes,
            full_wait_ms=full_wait_ms,
            recovery_window_bytes=1 << 20,
        )

    def open_wal(self, medium: Path) -> WriteAheadLog:
        return FileWal(
            medium, node_id="kit", node_epoch=1, settings=self._settings(self.capacity_bytes)
        )

    def open_small_wal(self, medium: Path, capacity_bytes: int, full_wait_ms: int) -> WriteAheadLog:
        settings = self._settings(capacity_bytes, full_wait_ms)
        return FileWal(medium, node_id="kit", node_epoch=1, settings=settings)

    def open_wal_as(self, medium: Path, node_epoch: int) -> WriteAheadLog:
        # Another node taking this one over while it runs: past the holder lock, on purpose.
        settings = self._settings(self.capacity_bytes)
        return FileWal(
            medium, node_id="kit", node_epoch=node_epoch, settings=settings, take_over=True
        )

    def raw_bytes(self, medium: Path) -> bytes:
        return medium.read_bytes()

    def transient_fault(
        self, medium: Path, wal: WriteAheadLog
    ) -> contextlib.AbstractContextManager[None]:
        assert isinstance(wal, FileWal)
        return failing_writes(wal)

    def tear_tail(self, medium: Path, rng: random.Random) -> None:
        """Write a torn frame where the next append would have gone: a header whose body
        never fully landed, a header cut short, or plain garbage."""
        variant = rng.randrange(3)
        header = read_wal_header(medium)
        capacity, base = header.capacity, header.data_start

        def read(position: int, length: int) -> bytes:
            offset = position % capacity
            first = FileWal.read_raw(medium, base + offset, min(length, capacity - offset))
            if len(first) < length:
                first += FileWal.read_raw(medium, base, length - len(first))
            return first

        scanner = FrameScanner(
            read,
            start=header.start,
            bound=header.window_end,
            seed=header.seed,
            max_session=header.session,
            max_length=capacity,
            chunk_bytes=1 << 20,
        )
        for _ in scanner:
            pass
        end = scanner.end
        room = capacity - (end - header.start) - 64
        length = rng.randrange(1, max(2, min(3000, room - 64)))
        body = rng.randbytes(length)
        frame = encode_frame_header(
            end, header.session, length, body_crc(body, header.seed), header.seed
        )
        if variant == 0:  # the header landed, the body only partly
            kept = rng.randrange(length)
            torn = frame + body[:kept] + bytes(length - kept)
        elif variant == 1:  # the header itself is cut short
            cut = rng.randrange(1, len(frame))
            torn = frame[:cut] + rng.randbytes(len(frame) - cut + length)
        else:  # sectors of garbage
            torn = rng.randbytes(length + len(frame))
        torn = torn[: max(1, min(len(torn), room))]
        offset = end % capacity
        first = torn[: capacity - offset]
        with open(medium, "r+b") as f:
            f.seek(base + offset)
            f.write(first)
            if len(first) < len(torn):
                f.seek(base)
                f.write(torn[len(first) :])
