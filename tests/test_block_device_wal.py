"""The file WAL on a real block device: a loop device over a file, as a raw EBS or NVMe volume
is used (`wal="/dev/nvme1n1"`). A writer killed with SIGKILL loses no acknowledged append
across laps of the ring; a device holding anything else is refused and left as it was; a
device in use, or holding another store's records, is refused. Needs root and a free loop
device (`losetup`): skipped, saying why, elsewhere."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import s3stream
from s3stream import InvalidArgumentError, NodeInUseError, RecordBatch
from s3stream.wal.holder import live_holder

ROOT = Path(__file__).resolve().parents[1]
DEVICE_BYTES = 24 << 20
PAYLOAD_BYTES = 8 << 10

# Appends payload(i) for i = the stream's next offset on, printing each index once acked.
CHILD = """
import hashlib, sys
import s3stream
client = s3stream.open(sys.argv[1], wal=sys.argv[2])
streams = client.list_streams()
stream = client.open_stream(0) if streams else client.create_stream()
i = stream.next_offset
while True:
    seed = hashlib.sha256(str(i).encode()).digest()
    stream.append(s3stream.RecordBatch(seed * (int(sys.argv[3]) // len(seed))))
    print(i, flush=True)
    i += 1
"""


def payload(i: int) -> bytes:
    seed = hashlib.sha256(str(i).encode()).digest()
    return seed * (PAYLOAD_BYTES // len(seed))


@pytest.fixture
def device(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("a loop device needs root and losetup")
    image = tmp_path / "device.img"
    with open(image, "wb") as f:
        f.truncate(DEVICE_BYTES)
    made = subprocess.run(
        ["losetup", "--find", "--show", str(image)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"no loop device here: {made.stderr.strip()}")
    dev = Path(made.stdout.strip())
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "--detach", str(dev)], check=False)


def write_until_killed(store: Path, dev: Path, acks: int) -> int:
    """Run a writer until it acknowledged `acks` more appends, SIGKILL it; the highest index
    it acknowledged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("S3STREAM_")}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store), str(dev), str(PAYLOAD_BYTES)],
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    last, seen = -1, 0
    try:
        for line in proc.stdout:
            last, seen = int(line), seen + 1
            if seen >= acks:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    assert seen >= acks, f"the writer died after {seen} appends"
    return last


def read_all(store: Path, dev: Path) -> list[bytes]:
    with s3stream.open(str(store), wal=str(dev)) as client:
        stream = client.open_stream(0)
        got: list[bytes] = []
        while len(got) < stream.next_offset:
            got += [bytes(b.payload) for b in stream.fetch(len(got), max_bytes=1 << 22).batches]
        return got


def test_a_killed_writer_loses_nothing_acknowledged_across_laps_of_the_ring(
    device: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    lap = DEVICE_BYTES // PAYLOAD_BYTES  # appends per lap of the ring, about
    for _ in range(2):
        last = write_until_killed(store, device, lap + lap // 2)
        got = read_all(store, device)
        assert len(got) >= last + 1  # every acknowledged append (and maybe one more)
        assert all(got[i] == payload(i) for i in range(len(got)))


def test_a_device_holding_other_bytes_is_refused_and_left_as_it_was(
    device: Path, tmp_path: Path
) -> None:
    """What a filesystem, a partition table or another program leaves at the start of a
    device is not a WAL: refused, nothing written (a new volume reads as zeros)."""
    somebodys = os.urandom(64 << 10)
    with open(device, "r+b") as f:
        f.write(somebodys)
        f.flush()
        os.fsync(f.fileno())
    with pytest.raises(InvalidArgumentError, match="not an s3stream WAL"):
        s3stream.open(str(tmp_path / "store"), wal=str(device))
    with open(device, "rb") as f:
        assert f.read(len(somebodys)) == somebodys


def test_a_device_in_use_or_holding_another_stores_records_is_refused(
    device: Path, tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with s3stream.open(str(a), wal=str(device)) as client:
        client.create_stream().append(RecordBatch(b"held"))
        with pytest.raises(NodeInUseError):
            s3stream.open(str(b), wal=str(device))
    write_until_killed(a, device, 10)
    with pytest.raises(InvalidArgumentError, match="not the WAL this store recorded"):
        s3stream.open(str(b), wal=str(device))
    got = read_all(a, device)
    assert got[0] == b"held" and all(got[i] == payload(i) for i in range(1, len(got)))


def test_another_node_of_the_same_device_is_in_use_too(device: Path, tmp_path: Path) -> None:
    """A second device node of the WAL's device (``mknod`` with the same numbers, what a
    container's ``--device`` gives): the holder's lock was on the first node's inode, so an
    open through the second got past it, fenced the live writer, and a commit of the old
    writer in flight could then overwrite a record the new one had acknowledged. The holder
    claims the device itself now (``O_EXCL``). `live_holder` sees a device's holder, so a
    verify beside it scans again instead of calling its frames damage."""
    alias = tmp_path / "alias"
    rdev = device.stat().st_rdev
    os.mknod(alias, 0o600 | stat.S_IFBLK, rdev)
    a, b = tmp_path / "a", tmp_path / "b"
    assert live_holder(device) is None
    with s3stream.open(str(a), node_id="n1", wal=str(device)) as client:
        stream = client.create_stream()
        stream.append(RecordBatch(b"held"))
        assert live_holder(device) == (None, None)
        with pytest.raises(NodeInUseError, match="another node of the same device"):
            s3stream.open(str(a), node_id="n1", wal=str(alias))
        with pytest.raises(NodeInUseError):
            s3stream.open(str(b), wal=str(alias))
        stream.append(RecordBatch(b"after"))  # not fenced
        client.flush()
    assert live_holder(device) is None
    with s3stream.open(str(a), node_id="n1", wal=str(alias)) as again:  # free: it opens
        got = again.open_stream(stream.stream_id).fetch(0).batches
        assert [bytes(b.payload) for b in got] == [b"held", b"after"]
