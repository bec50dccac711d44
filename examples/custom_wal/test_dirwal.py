"""DirWal proved by s3stream's conformance kit: every contract test plus the state machine."""

import random
from pathlib import Path

from dirwal import DirWal

from s3stream.testing import WalTests


class TestDirWal(WalTests):
    def make_medium(self, tmp_path: Path) -> Path:
        return tmp_path / "wal"

    def open_wal(self, medium: Path) -> DirWal:
        return DirWal(medium)

    def tear_tail(self, medium: Path, rng: random.Random) -> None:
        # A crash while writing the next record leaves its temporary file half written.
        torn = medium / f"{rng.randrange(1 << 40):020d}.rec.tmp"
        torn.write_bytes(rng.randbytes(rng.randrange(1, 4096)))
