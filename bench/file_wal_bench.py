"""File WAL benchmark: the disk's own fdatasync limit next to what `FileWal` makes of it.

Measures, in one run on one directory (so on one disk):

- raw: a sequential ``pwrite`` + ``fdatasync`` loop at 4 KiB, 64 KiB, 256 KiB and 1 MiB
  (MB/s; fdatasync p50/p99), buffered and with O_DIRECT, on a preallocated file whose blocks
  were written once before (the ring's steady state);
- the WAL: durable appends of 1 KiB and 64 KiB records from 1, 4 and 16 threads (each
  drives its commit and waits for its ack, as `Stream.append` does) and pipelined from one
  thread (many futures outstanding); appends/s, MB/s and ack latency p50/p99/p999; a trimmer
  thread frees space like the uploader would; run with buffered I/O and with O_DIRECT;
- recovery: time to reopen and replay 256 MiB and 1 GiB of untrimmed 64 KiB records (and
  256 MiB of 4 KiB records), page cache dropped for the file first.

Prints a table with the ratios against the targets and saves JSON (and a PNG plot if matplotlib
is installed)::

    .venv/bin/python bench/file_wal_bench.py --out bench/results/file_wal.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from _stats import pct

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from s3stream.settings import FileWalSettings  # noqa: E402
from s3stream.wal.file import FileWal  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

TARGETS = {
    "durable_64k_vs_raw": 0.70,
    "pipelined_1k_appends_per_s": 20_000,
    "moderate_p99_vs_fdatasync_p99": 3.0,
    "recovery_1gib_s": 10.0,
}


# -- raw device limit ---------------------------------------------------------------------------


def prepare_file(path: Path, size: int) -> None:
    """A preallocated file whose blocks were all written once (no unwritten extents left)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        chunk = bytes(8 * MiB)
        for off in range(0, size, len(chunk)):
            os.pwrite(fd, chunk[: min(len(chunk), size - off)], off)
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_loop(
    path: Path, size: int, write_bytes: int, seconds: float, direct: bool
) -> dict[str, Any]:
    flags = os.O_RDWR | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    buf = mmap.mmap(-1, write_bytes)
    buf.write(os.urandom(write_bytes))
    sync_lat: list[float] = []
    op_lat: list[float] = []
    off = 0
    n = 0
    t_end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    try:
        while time.perf_counter() < t_end:
            a = time.perf_counter()
            os.pwrite(fd, buf, off)
            b = time.perf_counter()
            os.fdatasync(fd)
            c = time.perf_counter()
            sync_lat.append(c - b)
            op_lat.append(c - a)
            n += 1
            off = (off + write_bytes) % (size - write_bytes)
    finally:
        os.close(fd)
        buf.close()
    dt = time.perf_counter() - t0
    return {
        "write_bytes": write_bytes,
        "direct": direct,
        "ops": n,
        "mb_per_s": n * write_bytes / dt / 1e6,
        "ops_per_s": n / dt,
        "fdatasync_p50_ms": pct(sync_lat, 0.5) * 1e3,
        "fdatasync_p99_ms": pct(sync_lat, 0.99) * 1e3,
        "write_sync_p50_ms": pct(op_lat, 0.5) * 1e3,
        "write_sync_p99_ms": pct(op_lat, 0.99) * 1e3,
    }


# -- the WAL ------------------------------------------------------------------------------------


class Trimmer:
    """Trims to the highest acknowledged position now and then, as the uploader would."""

    def __init__(self, wal: FileWal, interval_s: float = 0.1) -> None:
        self.wal = wal
        self.high = -1
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.interval = interval_s
        self.thread.start()

    def note(self, position: int) -> None:
        with self.lock:
            if position > self.high:
                self.high = position

    def _run(self) -> None:
        done = -1
        while not self.stop.wait(self.interval):
            with self.lock:
                target = self.high
            if target > done:
                self.wal.trim(target)
                done = target

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def open_wal(path: Path, capacity: int, direct: bool) -> FileWal:
    if path.exists():
        path.unlink()
    wal = FileWal(path, settings=FileWalSettings(capacity_bytes=capacity, direct_io=direct))
    for _ in wal.recover():
        pass
    # One lap first: the ring's blocks are then written, as in the steady state.
    trim = Trimmer(wal)
    chunk = os.urandom(1 * MiB)
    futs = []
    for _ in range(capacity // MiB + 8):
        fut = wal.append(chunk)
        fut.add_done_callback(lambda f: trim.note(f.result()))
        futs.append(fut)
    for f in futs:
        f.result()
    trim.close()
    return wal


def wal_sync_threads(wal: FileWal, record: bytes, threads: int, seconds: float) -> dict[str, Any]:
    trim = Trimmer(wal)
    lat: list[list[float]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    t_end = [0.0]

    def worker(i: int) -> None:
        mine = lat[i]
        barrier.wait()
        while time.perf_counter() < t_end[0]:
            a = time.perf_counter()
            fut = wal.append(record)
            wal.drive(fut)  # as `Stream.append` does before it blocks
            pos = fut.result()
            mine.append(time.perf_counter() - a)
            trim.note(pos)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    t_end[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    barrier.wait()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    trim.close()
    allv = [x for v in lat for x in v]
    return summarize(allv, len(record), dt, mode=f"{threads} thread(s), sync")


def wal_pipelined(wal: FileWal, record: bytes, outstanding: int, seconds: float) -> dict[str, Any]:
    trim = Trimmer(wal)
    lat: list[float] = []
    window = threading.Semaphore(outstanding)

    def done(t0: float, fut: Future[int]) -> None:
        lat.append(time.perf_counter() - t0)
        trim.note(fut.result())
        window.release()

    n = 0
    last: Future[int] | None = None
    t0 = time.perf_counter()
    t_end = t0 + seconds
    while time.perf_counter() < t_end:
        window.acquire()
        fut = wal.append(record)
        a = time.perf_counter()
        fut.add_done_callback(lambda f, a=a: done(a, f))
        last = fut
        n += 1
    if last is not None:
        last.result()
    dt = time.perf_counter() - t0
    trim.close()
    return summarize(lat, len(record), dt, mode=f"pipelined, {outstanding} outstanding")


def summarize(lat: list[float], record_bytes: int, dt: float, mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "record_bytes": record_bytes,
        "appends": len(lat),
        "appends_per_s": len(lat) / dt,
        "mb_per_s": len(lat) * record_bytes / dt / 1e6,
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "p999_ms": pct(lat, 0.999) * 1e3,
        "mean_ms": statistics.fmean(lat) * 1e3 if lat else float("nan"),
    }


# -- recovery -----------------------------------------------------------------------------------


def recovery(directory: Path, total: int, record_bytes: int, direct: bool) -> dict[str, Any]:
    path = directory / f"recovery-{total}-{record_bytes}.wal"
    if path.exists():
        path.unlink()
    capacity = total + 64 * MiB
    settings = FileWalSettings(capacity_bytes=capacity, direct_io=direct)
    wal = FileWal(path, settings=settings)
    for _ in wal.recover():
        pass
    record = os.urandom(record_bytes)
    n = total // record_bytes
    t0 = time.perf_counter()
    futs: list[Future[int]] = []
    for _ in range(n):
        futs.append(wal.append(record))
        if len(futs) >= 4096:
            futs[-1].result()
            futs.clear()
    for f in futs:
        f.result()
    fill_s = time.perf_counter() - t0
    wal._abandon()  # a crash: recovery must scan, no clean-shutdown tail to trust
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold: read from the disk
    os.close(fd)
    t0 = time.perf_counter()
    wal = FileWal(path, settings=settings)
    count = 0
    nbytes = 0
    for rec in wal.recover():
        count += 1
        nbytes += len(rec.data)
    dt = time.perf_counter() - t0
    wal.close()
    path.unlink()
    assert count == n, f"recovered {count} of {n} records"
    return {
        "untrimmed_bytes": total,
        "record_bytes": record_bytes,
        "records": count,
        "fill_s": fill_s,
        "recovery_s": dt,
        "recovery_mb_per_s": nbytes / dt / 1e6,
    }


# -- driver -------------------------------------------------------------------------------------


RAW_SIZES = (4 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)


def wal_configs() -> list[tuple[int, str]]:
    """(record bytes, mode) of every WAL run: 1/4/16 threads waiting, and pipelined."""
    return [(size, mode) for size in (1 * KiB, 64 * KiB) for mode in ("1", "4", "16", "pipe")]


def run(directory: Path, quick: bool) -> dict[str, Any]:
    """Rounds of every measurement, interleaved, so that a noisy shared disk hurts the raw
    loop and the WAL alike; ratios are computed per round and their median is reported."""
    directory.mkdir(parents=True, exist_ok=True)
    rounds = 2 if quick else 4
    seconds = 0.5 if quick else 1.0
    results: dict[str, Any] = {
        "environment": {
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "directory": str(directory),
            "filesystem": filesystem_of(directory),
            "quick": quick,
            "load_average_at_start": os.getloadavg(),
            "rounds": rounds,
            "seconds_per_measurement": seconds,
        }
    }
    raw_file = directory / "raw.bin"
    raw_size = 256 * MiB
    prepare_file(raw_file, raw_size)
    capacity = (256 if quick else 512) * MiB
    wals = {
        direct: open_wal(directory / f"bench-{direct}.wal", capacity, direct)
        for direct in (False, True)
    }
    raw_rounds: list[list[dict[str, Any]]] = []
    wal_rounds: list[list[dict[str, Any]]] = []
    try:
        for rnd in range(rounds):
            raws, runs = [], []
            for direct in (False, True):
                for size in RAW_SIZES:
                    r = raw_loop(raw_file, raw_size, size, seconds / 2, direct)
                    raws.append(r)
                    log(f"[{rnd}] raw {'direct' if direct else 'buffered'} {size // KiB} KiB", r)
                for size, mode in wal_configs():
                    record = os.urandom(size)
                    if mode == "pipe":
                        r = wal_pipelined(
                            wals[direct], record, 1024 if size <= 4 * KiB else 64, seconds
                        )
                    else:
                        r = wal_sync_threads(wals[direct], record, int(mode), seconds)
                    r["direct"] = direct
                    runs.append(r)
                    kind = "direct" if direct else "buffered"
                    log(f"[{rnd}] wal {kind} {size // KiB} KiB {r['mode']}", r)
            raw_rounds.append(raws)
            wal_rounds.append(runs)
    finally:
        for wal in wals.values():
            wal.close()
        raw_file.unlink()
    results["raw"] = merge_rounds(raw_rounds, ("write_bytes", "direct"))
    results["wal"] = merge_rounds(wal_rounds, ("record_bytes", "mode", "direct"))
    results["per_round_targets"] = [
        evaluate(r, w) for r, w in zip(raw_rounds, wal_rounds, strict=True)
    ]

    rec = []
    sizes = [(32 * MiB, 64 * KiB), (128 * MiB, 64 * KiB), (32 * MiB, 4 * KiB)]
    if not quick:
        sizes = [(256 * MiB, 64 * KiB), (1 * GiB, 64 * KiB), (256 * MiB, 4 * KiB)]
    for total, rb in sizes:
        r = recovery(directory, total, rb, direct=False)
        rec.append(r)
        log(f"recovery {total // MiB} MiB of {rb // KiB} KiB records", r)
    results["recovery"] = rec
    results["targets"] = summarize_targets(results)
    results["environment"]["load_average_at_end"] = os.getloadavg()
    return results


def merge_rounds(rounds: list[list[dict[str, Any]]], key: tuple[str, ...]) -> list[dict[str, Any]]:
    """One entry per configuration: medians over rounds of every number, plus the rounds."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for runs in rounds:
        for r in runs:
            entry = merged.setdefault(
                tuple(r[k] for k in key), {k: r[k] for k in key} | {"rounds": []}
            )
            entry["rounds"].append(r)
    for entry in merged.values():
        first = entry["rounds"][0]
        for k, v in first.items():
            if isinstance(v, float) or (
                isinstance(v, int) and not isinstance(v, bool) and k not in key
            ):
                entry[k] = statistics.median(r[k] for r in entry["rounds"])
    return list(merged.values())


def evaluate(raw_runs: list[dict[str, Any]], wal_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The target ratios of one round."""
    out: dict[str, Any] = {}
    for direct in (False, True):
        tag = "direct" if direct else "buffered"
        raw = {r["write_bytes"]: r for r in raw_runs if r["direct"] == direct}
        wal = [r for r in wal_runs if r["direct"] == direct]

        def find(size: int, mode: str, runs: list[dict[str, Any]] = wal) -> dict[str, Any]:
            return next(r for r in runs if r["record_bytes"] == size and r["mode"].startswith(mode))

        one = find(64 * KiB, "1 thread")
        best64 = max((r for r in wal if r["record_bytes"] == 64 * KiB), key=lambda r: r["mb_per_s"])
        moderate = find(1 * KiB, "4 thread")
        out[tag] = {
            "durable_64k_1thread_vs_raw_64k": one["mb_per_s"] / raw[64 * KiB]["mb_per_s"],
            "durable_64k_best_vs_raw_64k": best64["mb_per_s"] / raw[64 * KiB]["mb_per_s"],
            "pipelined_1k_appends_per_s": find(1 * KiB, "pipelined")["appends_per_s"],
            "moderate_p99_ms": moderate["p99_ms"],
            "device_fdatasync_p99_ms_4k": raw[4 * KiB]["fdatasync_p99_ms"],
            "moderate_p99_vs_fdatasync_p99": moderate["p99_ms"] / raw[4 * KiB]["fdatasync_p99_ms"],
        }
    return out


def summarize_targets(results: dict[str, Any]) -> dict[str, Any]:
    per_round = results["per_round_targets"]
    out: dict[str, Any] = {"moderate_load": "4 threads, 1 KiB records, each waiting for its ack"}
    for tag in ("buffered", "direct"):
        out[tag] = {k: statistics.median(r[tag][k] for r in per_round) for k in per_round[0][tag]}
    big = [r for r in results["recovery"] if r["record_bytes"] == 64 * KiB]
    largest = max(big, key=lambda r: r["untrimmed_bytes"])
    out["recovery_largest_bytes"] = largest["untrimmed_bytes"]
    out["recovery_largest_s"] = largest["recovery_s"]
    out["recovery_1gib_s_estimate"] = largest["recovery_s"] * GiB / largest["untrimmed_bytes"]
    out["goals"] = TARGETS
    return out


def filesystem_of(directory: Path) -> str:
    best = ""
    fstype = "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, kind = line.split()[:3]
            if str(directory.resolve()).startswith(mnt) and len(mnt) >= len(best):
                best, fstype = mnt, f"{kind} on {dev} ({mnt})"
    except OSError:
        pass
    return fstype


def log(what: str, r: dict[str, Any]) -> None:
    keys = [k for k in r if isinstance(r[k], float)]
    print(f"{what:50s} " + "  ".join(f"{k}={r[k]:.3g}" for k in keys), flush=True)


def print_table(results: dict[str, Any]) -> None:
    t = results["targets"]
    print("\nTargets, median over rounds (buffered / direct):")
    row: Callable[[str, str, str], None] = lambda name, goal, fmt: print(  # noqa: E731
        f"  {name:58s} {fmt.format(t['buffered'][name])} / {fmt.format(t['direct'][name])}"
        f"   goal {goal}"
    )
    row("durable_64k_1thread_vs_raw_64k", ">= 0.70", "{:.2f}")
    row("durable_64k_best_vs_raw_64k", ">= 0.70", "{:.2f}")
    row("pipelined_1k_appends_per_s", ">= 20000", "{:,.0f}")
    row("moderate_p99_vs_fdatasync_p99", "<= 3.0", "{:.2f}")
    print(
        f"  recovery of {t['recovery_largest_bytes'] // MiB} MiB: {t['recovery_largest_s']:.2f} s"
        f" (1 GiB: {t['recovery_1gib_s_estimate']:.2f} s)   goal 1 GiB < 10 s"
    )


def plot(results: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, size in zip(axes, (1 * KiB, 64 * KiB), strict=True):
        runs = [r for r in results["wal"] if r["record_bytes"] == size]
        labels = [f"{'D' if r['direct'] else 'B'} {r['mode'].split(',')[0]}" for r in runs]
        ax.bar(range(len(runs)), [r["mb_per_s"] for r in runs], color="tab:blue")
        raw = [r for r in results["raw"] if r["write_bytes"] == max(size, 4 * KiB)]
        for r in raw:
            ax.axhline(
                r["mb_per_s"],
                ls="--",
                color="tab:red" if r["direct"] else "tab:orange",
                label=f"raw {'direct' if r['direct'] else 'buffered'} "
                f"{r['write_bytes'] // KiB} KiB",
            )
        ax.set_xticks(range(len(runs)), labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("durable MB/s")
        ax.set_title(f"FileWal, {size // KiB} KiB records (B=buffered, D=O_DIRECT)")
        ax2 = ax.twinx()
        ax2.plot(range(len(runs)), [r["p99_ms"] for r in runs], "k.", label="p99 ms")
        ax2.set_ylabel("ack latency p99 (ms)")
        ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"plot: {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=REPO / "bench" / ".tmp" / "file_wal")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "file_wal.json")
    parser.add_argument("--quick", action="store_true", help="shorter runs, smaller recovery")
    args = parser.parse_args()
    try:
        results = run(args.dir, args.quick)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}")
    plot(results, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
