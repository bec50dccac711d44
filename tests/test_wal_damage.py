"""Damage to a crashed writer's file WAL, end to end with real processes.

A child process appends 60 batches (each acknowledged) to a local store and is killed with
SIGKILL before anything is uploaded, so the WAL alone holds them. Each kind of damage must then
make `s3stream.open` raise `CorruptionError` naming the WAL, and `s3stream verify` exit non-zero
naming it, never a store that opens with the 60 batches silently gone; ``accept_wal_loss=True``
goes on without them. The undamaged crash image recovers all 60, and ``verify`` passes on it
without writing anything.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import s3stream
from s3stream.errors import CorruptionError
from s3stream.wal.file import read_wal_header
from s3stream.wal.framing import DATA_START, SLOT_BYTES

BATCHES = 60

WRITER = textwrap.dedent(
    """
    import sys, time
    import s3stream
    from s3stream import ClientSettings, RecordBatch

    settings = ClientSettings(upload_threshold_bytes=256 << 20, upload_interval_ms=3_600_000)
    client = s3stream.open(sys.argv[1], settings=settings)
    stream = client.create_stream()
    for i in range(int(sys.argv[2])):
        stream.append(RecordBatch(f"batch {i} ".encode() * 20, count=1))
    print("acked", flush=True)
    time.sleep(3600)
    """
)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose writer was killed after 60 acknowledged appends (none uploaded)."""
    root = tmp_path_factory.mktemp("crashed") / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(BATCHES)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "acked"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return root


def copy_of(crashed: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "store"
    shutil.copytree(crashed, root)
    (wal,) = (root / "wal").glob("*.wal")
    return root, wal


def listing(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def verify(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "s3stream", "verify", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def read_all(root: Path, **kw: object) -> int:
    client = s3stream.open(root, **kw)  # type: ignore[arg-type]
    try:
        (info,) = client.list_streams()
        stream = client.open_stream(info.stream_id)
        return len(stream.fetch(0, max_bytes=1 << 24).batches)
    finally:
        client.close()


def flip_first_record(wal: Path) -> None:
    header = read_wal_header(wal)
    at = DATA_START + header.start % header.capacity + 40  # inside the first record's bytes
    with open(wal, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))


def damage_newest_header(wal: Path) -> None:
    with open(wal, "r+b") as f:
        f.seek(read_wal_header(wal).slot_index * SLOT_BYTES + 20)
        f.write(b"\xff\x00\xff")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "flipped byte in the first record": flip_first_record,
    "damaged newest header": damage_newest_header,
    "emptied": lambda wal: os.truncate(wal, 0),
    "truncated": lambda wal: os.truncate(wal, DATA_START + 4096),
    "deleted": lambda wal: wal.unlink(),
}


def test_the_crash_image_recovers_every_batch_and_verifies(crashed: Path, tmp_path: Path) -> None:
    root, _ = copy_of(crashed, tmp_path)
    before = listing(root)
    result = verify(root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not closed; its records are uploaded by the node's next open" in result.stdout
    assert listing(root) == before, "verify wrote to the store"
    assert read_all(root) == BATCHES


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_refused_and_verify_names_it(crashed: Path, tmp_path: Path, kind: str) -> None:
    root, wal = copy_of(crashed, tmp_path)
    DAMAGE[kind](wal)
    before = listing(root)
    result = verify(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert str(wal) in result.stdout and ("DAMAGED" in result.stdout or "MISSING" in result.stdout)
    assert listing(root) == before, "verify wrote to the store"
    with pytest.raises(CorruptionError) as info:
        read_all(root)
    assert str(wal) in str(info.value)
    assert "accept_wal_loss=True" in str(info.value)
    # Refusing changed nothing: the same answer again, and the evidence is still there.
    with pytest.raises(CorruptionError):
        read_all(root)
    # What is still readable comes back (a truncated WAL keeps the records before the cut).
    kept = read_all(root, accept_wal_loss=True)
    assert (0 < kept < BATCHES) if kind == "truncated" else kept == 0


def test_take_over_of_a_damaged_wal_is_refused_unless_the_loss_is_accepted(
    crashed: Path, tmp_path: Path
) -> None:
    root, wal = copy_of(crashed, tmp_path)
    flip_first_record(wal)
    with s3stream.open(root, node_id="other") as other:
        with pytest.raises(CorruptionError, match="accept_wal_loss"):
            other.take_over("local", wal=wal.as_uri())
        report = other.take_over("local", wal=wal.as_uri(), accept_wal_loss=True)
        assert report.node_id == "local"
        (info,) = other.list_streams()
        assert info.end_offset == 0  # the damaged records are gone, by the caller's choice
