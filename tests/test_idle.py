"""An idle client does not wake up: its background threads wait on conditions with deadlines,
never by polling (issue: at most one wake-up per second, counted as context switches)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("idle_child.py")


def test_an_idle_client_wakes_at_most_once_a_second(tmp_path: Path) -> None:
    seconds = 4.0
    out = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path / "store"), str(seconds)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    switches, threads = int(out[0]), int(out[1])
    # The main thread's own sleep is one switch; a 50 ms poll anywhere would be ~80.
    assert threads >= 2, "the client should run background threads"
    assert switches <= seconds, f"{switches} context switches in {seconds} s of idling"
