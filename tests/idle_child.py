"""Child of tests/test_idle.py and bench/idle_bench.py: open a client, do a little work,
then sit idle and print how many times its threads were switched in over the window.

argv: root, seconds. Prints ``<context switches> <threads>``.
"""

from __future__ import annotations

import os
import sys
import time

import s3stream


def switches() -> int:
    total = 0
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/status") as f:
                for line in f:
                    if "ctxt_switches" in line:  # voluntary and involuntary
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass  # a thread that ended meanwhile
    return total


root, seconds = sys.argv[1], float(sys.argv[2])
client = s3stream.open(root)
stream = client.create_stream()
for _ in range(100):
    stream.append(s3stream.RecordBatch(b"x" * 100))
client.flush()
stream.fetch(0)
time.sleep(1.0)  # let start-up work (a first compaction pass) settle
before = switches()
time.sleep(seconds)
after = switches()
print(after - before, len(os.listdir(f"/proc/{os.getpid()}/task")))
client.close()
