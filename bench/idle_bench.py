"""Wake-ups of an idle client: context switches of all its threads over a quiet window.

A client that has appended, flushed and read, then sits idle, should not wake (its threads
wait on conditions with deadlines; the upload interval is the only timer). Runs
tests/idle_child.py in a fresh process (so nothing else counts) and saves JSON to
bench/results/idle.json (or --out).

    .venv/bin/python bench/idle_bench.py [--seconds 10] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = Path(__file__).resolve().parent.parent / "tests" / "idle_child.py"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench/results/idle.json"))
    a = p.parse_args()
    rounds = []
    for _ in range(a.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(
                [sys.executable, str(CHILD), str(Path(tmp) / "store"), str(a.seconds)],
                capture_output=True, text=True, check=True, timeout=a.seconds + 120,
            ).stdout.split()  # fmt: skip
        switches, threads = int(out[0]), int(out[1])
        rounds.append({"switches": switches, "threads": threads, "per_s": switches / a.seconds})
        print(f"{switches} context switches in {a.seconds:g} s over {threads} threads "
              f"({switches / a.seconds:.2f}/s)")  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"seconds": a.seconds, "rounds": rounds}, indent=2) + "\n")
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
