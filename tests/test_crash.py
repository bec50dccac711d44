"""Crash test with real processes: SIGKILL a writer using the file WAL, recover, verify.

A child appends continuously (pipelined, so group commits are always in flight, and with a
small upload threshold, so uploads are frequent) and reports every acknowledged batch on
stdout. The parent kills it with SIGKILL at random moments; after each kill a new client
recovers the WAL and every acknowledged batch must read back byte-identical, with no
duplicates and no gaps in offsets.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import s3stream

CHILD = Path(__file__).with_name("crash_child.py")
KILLS = 20


def _run_and_kill(root: Path, seed: int, rng: random.Random) -> tuple[list[str], bool]:
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    # Wait for the child to start appending, then kill it at a random moment.
    deadline = time.monotonic() + 60
    while not any(ln.startswith("A ") for ln in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"child did not start appending: {err[-2000:]}")
        time.sleep(0.01)
    time.sleep(rng.uniform(0.05, 0.8))
    during_upload = lines.count("U+") > lines.count("U-")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t.join(5)
    return lines, during_upload


@pytest.mark.slow
def test_sigkill_file_wal_writer_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(1234)
    acked: dict[int, dict[int, tuple[int, str]]] = {}
    during_upload = 0
    for kill in range(KILLS):
        lines, in_upload = _run_and_kill(tmp_path, kill, rng)
        during_upload += in_upload
        for ln in lines:
            if ln.startswith("A "):
                _, sid, base, count, digest = ln.split()
                per = acked.setdefault(int(sid), {})
                assert int(base) not in per, "an offset was acknowledged twice"
                per[int(base)] = (int(count), digest)
        # A new client recovers the WAL; everything acknowledged must be there, exactly once.
        with s3stream.open(str(tmp_path), node_id="local") as client:
            for sid, per in acked.items():
                info = client.stream_info(sid)
                got: list[s3stream.FetchedBatch] = []
                off = 0
                while off < info.end_offset:
                    res = client.read(sid, off, max_bytes=1 << 20)
                    got.extend(res.batches)
                    off = res.next_offset
                # no gaps, no duplicates
                expect_off = 0
                for b in got:
                    assert b.base_offset == expect_off
                    expect_off = b.next_offset
                by_base = {b.base_offset: b for b in got}
                for base, (count, digest) in per.items():
                    b = by_base.get(base)
                    assert b is not None, f"kill {kill}: acked batch {sid}@{base} lost"
                    assert b.count == count
                    assert hashlib.sha256(b.payload).hexdigest() == digest
    total = sum(len(p) for p in acked.values())
    print(f"{KILLS} kills, {during_upload} during an upload, {total} acknowledged batches")
    assert total > KILLS * 10
    # The random kill times hit both group commits (always in flight) and uploads.
    assert during_upload >= 1, "no kill landed during an upload"
