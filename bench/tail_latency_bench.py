"""Tail latency: from `append` returning in the writer to a tailing reader seeing the batch.

- in-process: a `Stream.tail` in another thread of the writer's process (it sees a batch once
  it is durable in the WAL);
- cross-process: `StreamReader.tail` in this process following a writer process (it sees a
  batch once its upload is committed to the metadata log), on a local directory and on
  SeaweedFS (a throw-away ``weed mini``), with the writer's commit interval
  (`upload_interval_ms`) and the reader's poll interval (`tail_poll_ms`) printed beside.

Each batch carries its append time (wall clock, the same machine). Prints p50/p99 per case and
saves JSON to bench/results/tail_latency.json (or --out).

    .venv/bin/python bench/tail_latency_bench.py [--count 400] [--rate 200] [--no-s3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import s3stream
from s3stream import ClientSettings, RecordBatch

STAMP = struct.Struct("<q")


def percentiles(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "max_ms": round(ms[-1], 3),
    }


def in_process(root: Path, count: int, rate: float) -> dict[str, float]:
    lat: list[float] = []
    with s3stream.open(str(root)) as client:
        stream = client.create_stream()

        def consume() -> None:
            for b in stream.tail(0):
                lat.append((time.time_ns() - STAMP.unpack_from(b.view)[0]) / 1e6)
                if len(lat) == count:
                    return

        t = threading.Thread(target=consume)
        t.start()
        for _ in range(count):
            stream.append(RecordBatch(STAMP.pack(time.time_ns()) + b"x" * 100))
            time.sleep(1 / rate)
        t.join(60)
    return percentiles(lat)


WRITER = r"""
import struct, sys, time, json
import s3stream
from s3stream import ClientSettings, RecordBatch
url, count, rate, interval, opts, wal = sys.argv[1:7]
settings = ClientSettings(upload_interval_ms=int(interval))
with s3stream.open(url, wal=wal or None, settings=settings,
                   storage_options=json.loads(opts) or None) as client:
    s = client.create_stream()
    print(s.stream_id, flush=True)
    sys.stdin.readline()  # the reader is ready
    for _ in range(int(count)):
        s.append(RecordBatch(struct.pack("<q", time.time_ns()) + b"x" * 100))
        time.sleep(1 / float(rate))
"""


def cross_process(
    url: str, opts: dict[str, Any], wal: str, count: int, rate: float, interval_ms: int,
    poll_ms: int,
) -> dict[str, float]:  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, str(count), str(rate), str(interval_ms),
         json.dumps(opts), wal],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    sid = int(child.stdout.readline())
    lat: list[float] = []
    settings = ClientSettings(tail_poll_ms=poll_ms)
    with s3stream.open_reader(url, storage_options=opts or None, settings=settings) as reader:
        child.stdin.write("go\n")
        child.stdin.flush()
        for b in reader.tail(sid, 0):
            lat.append((time.time_ns() - STAMP.unpack_from(b.view)[0]) / 1e6)
            if len(lat) == count:
                break
    child.wait(60)
    return percentiles(lat)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=400)
    p.add_argument("--rate", type=float, default=200.0, help="appends per second")
    p.add_argument("--interval-ms", type=int, default=100, help="writer's upload_interval_ms")
    p.add_argument("--poll-ms", type=int, default=50, help="reader's tail_poll_ms")
    p.add_argument("--no-s3", action="store_true")
    p.add_argument("--out", type=Path, default=Path("bench/results/tail_latency.json"))
    a = p.parse_args()
    out: dict[str, Any] = {
        "count": a.count, "rate": a.rate, "upload_interval_ms": a.interval_ms,
        "tail_poll_ms": a.poll_ms,
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out["in_process_local"] = in_process(Path(tmp) / "a", a.count, a.rate)
        print("in-process, local directory (file WAL):", out["in_process_local"])
        out["cross_process_local"] = cross_process(
            str(Path(tmp) / "b"), {}, "", a.count, a.rate, a.interval_ms, a.poll_ms
        )
        print("cross-process, local directory:", out["cross_process_local"])
        if not a.no_s3:
            from s3stream.testing.seaweedfs import SeaweedS3Server

            with SeaweedS3Server(Path(tmp) / "weed") as server:
                opts = server.storage_options()
                url = f"s3://{server.bucket}/tail"
                out["cross_process_s3"] = cross_process(
                    url, opts, str(Path(tmp) / "w.wal"), a.count, a.rate, a.interval_ms,
                    a.poll_ms,
                )  # fmt: skip
                print("cross-process, SeaweedFS (file WAL writer):", out["cross_process_s3"])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
