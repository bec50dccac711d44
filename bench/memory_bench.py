"""Memory WAL benchmark: throughput, sustained small appends, RSS against the budgets, many
streams (issue 19).

Every case runs in a fresh interpreter (this script with ``--case``), so its peak RSS is its
own. The object store is a local directory under a temporary directory (as in
`foundation_bench.py`); the WAL is ``memory://`` unless the case says file WAL. Cases:

- ``idle``: a client that appended one batch, flushed and read it: the RSS every other case
  is compared against.
- ``large``: MB/s of 64 KiB batches through `Stream.append` (one stream); the batches are
  made before the clock starts (64 distinct payloads, reused), so only the append is timed.
  Past ``max_pending_bytes`` (512 MiB) appends go at the pace of uploads, i.e. of the disk's
  writes with fsync (``dd conv=fdatasync`` did 490 MB/s here); ``large-nofsync`` is the same
  on a store that does not sync (``fsync=False``): the client's own pace; ``large-memory``
  the same on ``s3stream.open("memory://")`` (memory WAL and memory store, the in-memory
  configuration: no device anywhere; the uploaded objects stay in the process, so its RSS is
  not compared with the budgets).
- ``rss-large``: 1 GiB of 64 KiB appends, each of a payload of its own (a copy made per
  append, as an application reading from a socket has): peak RSS. The client keeps large
  payloads without copying them, so reused payloads (``large``) would hide what it holds.
- ``sustained``: 5 million 100-byte appends, appends/s per window of 500,000 (the curve shows
  whether the rate holds as the process ages), with the time the cyclic GC took per window.
- ``rss-small-128`` / ``rss-small-8``: 2 million 100-byte appends with a LogCache budget
  (``log_cache_bytes``) of 128 MiB / 8 MiB; peak RSS against the budget.
- ``throttled``: 64 KiB appends for 20 s while uploads are throttled to 8 MB/s (the client's
  ``background_bytes_per_s``): peak RSS, the rate appends get, and the longest append wait.
- ``streams-{memory,file}-{1,10000}``: 100-byte appends round-robin over 1 or 10,000 streams
  (memory WAL, or the file WAL on a temporary directory), appends/s; the ratio is reported.

The budget of a case is ``log_cache_bytes + max_pending_bytes`` as configured; the target is
peak RSS <= 1.3 x budget + the idle client's RSS. Prints a table and saves JSON to
bench/results/<date>-memory/ (or --out).

    .venv/bin/python bench/memory_bench.py [--quick] [--cases large,sustained,...] [--out F]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
ALL_CASES = (
    "idle",
    "large",
    "large-nofsync",
    "large-memory",
    "rss-large",
    "sustained",
    "rss-small-128",
    "rss-small-8",
    "throttled",
    "streams-memory-1",
    "streams-memory-10000",
    "streams-file-1",
    "streams-file-10000",
)


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _GcTimer:
    """Seconds spent in cyclic garbage collections (gc.callbacks), for the report only."""

    def __init__(self) -> None:
        self.total = 0.0
        self.collections = 0
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._t0
            self.collections += 1


def _open(
    root: Path | None, settings: dict[str, Any], wal: str = "memory://", fsync: bool = True
) -> Any:
    """A client on a local directory `root` (None: ``memory://``, a memory store)."""
    import s3stream

    if root is None:
        return s3stream.open("memory://", settings=settings)
    options = None if fsync else {"fsync": False}
    return s3stream.open(str(root), wal=wal, settings=settings, storage_options=options)


def _budget(settings: dict[str, Any]) -> int:
    from s3stream import ClientSettings

    s = ClientSettings(**settings)
    return s.log_cache_bytes + s.max_pending_bytes


def case_idle(root: Path, quick: bool) -> dict[str, Any]:
    from s3stream import RecordBatch

    with _open(root, {}) as c:
        s = c.create_stream()
        s.append(RecordBatch(b"x" * 100, base_timestamp=0))
        c.flush()
        s.fetch(0)
        gc.collect()
        rss = _rss_now()
    return {"rss": rss, "peak_rss": _peak_rss()}


def case_large(root: Path | None, quick: bool, fsync: bool = True) -> dict[str, Any]:
    from s3stream import RecordBatch

    size = 64 * 1024
    total = (256 if quick else 1024) * MiB
    n = total // size
    settings: dict[str, Any] = {}
    # Distinct payloads, as an application has: one shared payload would hide copies.
    payloads = [os.urandom(size) for _ in range(64)]
    with _open(root, settings, fsync=fsync) as c:
        s = c.create_stream()
        batches = [RecordBatch(p, base_timestamp=0) for p in payloads]
        t0 = time.perf_counter()
        for i in range(n):
            s.append(batches[i & 63])
        dt = time.perf_counter() - t0
        c.flush()
    return {
        "batches": n,
        "bytes": n * size,
        "seconds": dt,
        "mb_per_s": n * size / 1e6 / dt,
        "peak_rss": _peak_rss(),
        "budget": _budget(settings),
    }


def case_rss_large(root: Path, quick: bool) -> dict[str, Any]:
    from s3stream import RecordBatch

    size = 64 * 1024
    total = (256 if quick else 1024) * MiB
    n = total // size
    settings: dict[str, Any] = {}
    templates = [memoryview(os.urandom(size)) for _ in range(64)]
    with _open(root, settings) as c:
        s = c.create_stream()
        t0 = time.perf_counter()
        for i in range(n):
            # bytes(view) copies: every append brings a payload nobody else holds.
            s.append(RecordBatch(bytes(templates[i & 63]), base_timestamp=0))
        dt = time.perf_counter() - t0
        c.flush()
    return {
        "batches": n,
        "bytes": n * size,
        "seconds": dt,
        "mb_per_s_with_copies": n * size / 1e6 / dt,
        "peak_rss": _peak_rss(),
        "budget": _budget(settings),
    }


def _small_appends(root: Path, n: int, window: int, settings: dict[str, Any]) -> dict[str, Any]:
    from s3stream import RecordBatch

    gct = _GcTimer()
    windows = []
    with _open(root, settings) as c:
        s = c.create_stream()
        batch = RecordBatch(b"x" * 100, base_timestamp=0)
        append = s.append
        done = 0
        max_rss = 0
        while done < n:
            k = min(window, n - done)
            g0, c0 = gct.total, gct.collections
            t0 = time.perf_counter()
            for _ in range(k):
                append(batch)
            dt = time.perf_counter() - t0
            done += k
            rss = _rss_now()
            max_rss = max(max_rss, rss)
            windows.append(
                {
                    "appends": done,
                    "appends_per_s": k / dt,
                    "gc_s": gct.total - g0,
                    "gc_share": (gct.total - g0) / dt,
                    "collections": gct.collections - c0,
                    "rss": rss,
                    "cached_bytes": c._storage.log_cache.cached_bytes,
                }
            )
            print(
                f"  {done:>9,} appends: {k / dt:10,.0f}/s  gc {100 * (gct.total - g0) / dt:4.1f}%"
                f"  rss {rss / MiB:7.1f} MiB",
                file=sys.stderr,
            )
        c.flush()
    rates = [w["appends_per_s"] for w in windows]
    return {
        "appends": n,
        "window": window,
        "windows": windows,
        "first_window_per_s": rates[0],
        "min_window_per_s": min(rates),
        "last_window_per_s": rates[-1],
        "overall_per_s": n / sum(window / r for r in rates),
        "gc_share": gct.total / sum(window / r for r in rates),
        "peak_rss": _peak_rss(),
        "max_sampled_rss": max_rss,
        "budget": _budget(settings),
        "settings": settings,
    }


def case_sustained(root: Path, quick: bool) -> dict[str, Any]:
    n = 1_000_000 if quick else 5_000_000
    return _small_appends(root, n, 100_000 if quick else 500_000, {})


def _rss_small(root: Path, quick: bool, cache_mib: int) -> dict[str, Any]:
    n = 500_000 if quick else 2_000_000
    return _small_appends(root, n, n // 4, {"log_cache_bytes": cache_mib * MiB})


def case_throttled(root: Path, quick: bool) -> dict[str, Any]:
    from s3stream import RecordBatch
    from s3stream.errors import BackpressureError

    seconds = 8.0 if quick else 20.0
    size = 64 * 1024
    settings: dict[str, Any] = {"background_bytes_per_s": 8_000_000}
    payloads = [os.urandom(size) for _ in range(64)]
    waits: list[float] = []
    refused = 0
    with _open(root, settings) as c:
        s = c.create_stream()
        batches = [RecordBatch(p, base_timestamp=0) for p in payloads]
        t_end = time.perf_counter() + seconds
        i = 0
        samples = []
        last_sample = 0.0
        t_start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                break
            try:
                s.append(batches[i & 63], timeout_s=60)
                i += 1
            except BackpressureError:
                refused += 1
            t1 = time.perf_counter()
            waits.append(t1 - t0)
            if t1 - last_sample >= 0.5:
                last_sample = t1
                ps = c._storage.log_cache.pending_bytes
                samples.append({"t": t1 - t_start, "rss": _rss_now(), "pending_bytes": ps})
        dt = time.perf_counter() - t_start
        pending = c._storage.log_cache.pending_bytes
        # Close without waiting for the backlog to drain at 8 MB/s: abandon keeps it in the WAL.
        c.abandon()
    waits.sort()
    return {
        "seconds": dt,
        "appends": i,
        "refused": refused,
        "mb_per_s": i * size / 1e6 / dt,
        "wait_p50_ms": 1e3 * waits[len(waits) // 2],
        "wait_p99_ms": 1e3 * waits[int(len(waits) * 0.99)],
        "wait_max_ms": 1e3 * waits[-1],
        "pending_at_end": pending,
        "samples": samples,
        "peak_rss": _peak_rss(),
        "budget": _budget(settings),
        "settings": settings,
    }


def _streams(root: Path, quick: bool, wal: str, count: int) -> dict[str, Any]:
    from collections import deque

    from s3stream import RecordBatch

    n = 300_000 if quick else 1_000_000
    wal_url = "memory://" if wal == "memory" else (root / "wal").as_uri()
    with _open(root / "store", {}, wal=wal_url) as c:
        ss = [c.create_stream() for _ in range(count)]
        batch = RecordBatch(b"x" * 100, base_timestamp=0)
        # Warm-up: every stream has taken one append (first appends allocate per-stream state).
        for s in ss:
            s.append(batch)
        i = 0
        t0, cpu0 = time.perf_counter(), time.thread_time()
        if wal == "memory":
            # The memory WAL acknowledges at once: plain synchronous appends.
            for _ in range(n // count):
                for s in ss:
                    s.append(batch)
                    i += 1
        else:
            # The file WAL syncs: a window of appends in flight, as a pipelining producer.
            window: deque[Any] = deque()
            for _ in range(n // count):
                for s in ss:
                    window.append(s.append_async(batch))
                    i += 1
                    if len(window) >= 1024:
                        window.popleft().result()
            for f in window:
                f.result()
        dt, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    return {
        "streams": count,
        "wal": wal,
        "appends": i,
        "appends_per_s": i / dt,
        "thread_cpu_us_per_append": cpu / i * 1e6,
    }


CASES: dict[str, Any] = {
    "idle": case_idle,
    "large": case_large,
    "large-nofsync": lambda r, q: case_large(r, q, fsync=False),
    "large-memory": lambda r, q: case_large(None, q),
    "rss-large": case_rss_large,
    "sustained": case_sustained,
    "rss-small-128": lambda r, q: _rss_small(r, q, 128),
    "rss-small-8": lambda r, q: _rss_small(r, q, 8),
    "throttled": case_throttled,
    "streams-memory-1": lambda r, q: _streams(r, q, "memory", 1),
    "streams-memory-10000": lambda r, q: _streams(r, q, "memory", 10_000),
    "streams-file-1": lambda r, q: _streams(r, q, "file", 1),
    "streams-file-10000": lambda r, q: _streams(r, q, "file", 10_000),
}


def _child(case: str, quick: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="s3s-membench-", dir="/tmp"))
    try:
        result = CASES[case](tmp / "store", quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import s3stream

    result["package"] = os.path.dirname(s3stream.__file__)
    print(json.dumps(result))


def _run(case: str, quick: bool, impl: Path | None) -> dict[str, Any]:
    print(f"{case} ...", file=sys.stderr, flush=True)
    args = [sys.executable, __file__, "--case", case] + (["--quick"] if quick else [])
    env = None
    if impl is not None:
        # The package under `impl` comes before the installed one (a pristine copy of HEAD).
        paths = [str(impl), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    out = subprocess.run(
        args, capture_output=False, stdout=subprocess.PIPE, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(res: dict[str, Any]) -> list[tuple[str, str, str]]:
    mb = MiB
    idle = res.get("idle", {}).get("rss", 0)
    rows: list[tuple[str, str, str]] = []
    if "idle" in res:
        rows.append(("idle client RSS", f"{idle / mb:.1f} MiB", "-"))
    if "large" in res:
        rows.append(("64 KiB appends, MB/s", f"{res['large']['mb_per_s']:,.0f}", ">= 1,000"))
    if "large-nofsync" in res:
        r = res["large-nofsync"]
        rows.append(("64 KiB appends, store without fsync, MB/s", f"{r['mb_per_s']:,.0f}", "-"))
    if "large-memory" in res:
        r = res["large-memory"]
        rows.append(
            ("64 KiB appends, memory:// (WAL and store), MB/s", f"{r['mb_per_s']:,.0f}", "-")
        )
    if "rss-large" in res:
        r = res["rss-large"]
        rows.append(
            ("64 KiB appends of fresh payloads, MB/s", f"{r['mb_per_s_with_copies']:,.0f}", "-")
        )
    if "sustained" in res:
        r = res["sustained"]
        rows.append(
            (
                f"100 B appends/s over {r['appends']:,} (first / min / last window)",
                f"{r['first_window_per_s']:,.0f} / {r['min_window_per_s']:,.0f} / "
                f"{r['last_window_per_s']:,.0f}",
                ">= 150,000 sustained",
            )
        )
        rows.append(("  GC share of wall time", f"{100 * r['gc_share']:.1f}%", "-"))
    for name in ("large", "rss-large", "sustained", "rss-small-128", "rss-small-8", "throttled"):
        if name in res:
            r = res[name]
            limit = 1.3 * r["budget"] + idle
            rows.append(
                (
                    f"peak RSS, {name} (budget {r['budget'] / mb:.0f} MiB)",
                    f"{r['peak_rss'] / mb:,.0f} MiB ({(r['peak_rss'] - idle) / r['budget']:.2f}x)",
                    f"<= {limit / mb:,.0f} MiB",
                )
            )
    if "throttled" in res:
        r = res["throttled"]
        rows.append(
            (
                "throttled 8 MB/s: append MB/s, wait p99 / max ms",
                f"{r['mb_per_s']:.1f}, {r['wait_p99_ms']:.0f} / {r['wait_max_ms']:.0f}",
                "~8, no stall growing",
            )
        )
    for wal in ("memory", "file"):
        one, many = res.get(f"streams-{wal}-1"), res.get(f"streams-{wal}-10000")
        if one and many:
            rows.append(
                (
                    f"10,000 streams / 1 stream, {wal} WAL",
                    f"{many['appends_per_s']:,.0f} / {one['appends_per_s']:,.0f} = "
                    f"{many['appends_per_s'] / one['appends_per_s']:.2f}x",
                    ">= 0.9x",
                )
            )
            rows.append(
                (
                    f"  appending thread CPU per append, 1 / 10,000 streams, {wal} WAL",
                    f"{one['thread_cpu_us_per_append']:.2f} / "
                    f"{many['thread_cpu_us_per_append']:.2f} us",
                    "-",
                )
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    p.add_argument("--cases", default=",".join(ALL_CASES))
    today = datetime.date.today().isoformat()
    default_out = Path(__file__).parent / "results" / f"{today}-memory" / "memory.json"
    p.add_argument("--out", type=Path, default=default_out)
    p.add_argument(
        "--impl",
        type=Path,
        help="a directory holding another s3stream package to measure (e.g. HEAD's, from "
        "`git archive HEAD s3stream | tar -x -C DIR`), instead of the installed one",
    )
    a = p.parse_args()
    if a.case:
        _child(a.case, a.quick)
        return
    cases = [c for c in a.cases.split(",") if c]
    if "idle" not in cases:
        cases.insert(0, "idle")
    res = {c: _run(c, a.quick, a.impl) for c in cases}
    rows = _table(res)
    w = max(len(r[0]) for r in rows)
    print(f"{'figure':{w}}  {'measured':>32}  target")
    for name, value, target in rows:
        print(f"{name:{w}}  {value:>32}  {target}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    impl = None if a.impl is None else str(a.impl)
    a.out.write_text(json.dumps({"quick": a.quick, "impl": impl, "results": res}, indent=2) + "\n")
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
