"""Durable appends through the public API next to the disk's raw limit (issue 19).

Side by side, on one filesystem, in interleaved rounds (so a noisy shared disk hurts both):

- **raw**: a ``pwrite`` + ``fdatasync`` loop of the record size on a preallocated file whose
  blocks were written once (the device's steady-state limit); with N threads, N such loops
  on one descriptor, each at its own offsets (the kernel may share a journal commit between
  them, as the WAL shares one ``fdatasync`` between appenders);
- **raw-fresh** (for the record): the same loop on freshly preallocated (unwritten) blocks,
  which is what a new WAL's first lap of its ring writes to;
- **api**: `Stream.append` (durable when it returns) on a default ``s3stream.open(dir)``: the
  file WAL, uploads to the local directory running in the background as by default. A fresh
  store per measurement; N threads append to a stream each.

Cases: 64 KiB x 1 thread, 1 KiB x 1 thread, 1 KiB x 8 threads. Every measurement runs in a
fresh child process (one interpreter each, none warming the next), so several checkouts can be
compared in one run: ``--impl base=/path/to/checkout`` (repeatable; the default is this
tree) puts each checkout's ``api`` beside the others' in every round.

Ratios are computed per round (api ops/s / raw ops/s, api p99 / raw p99) and their medians
reported against the targets; JSON goes to ``bench/results/<date>-append/`` (and a PNG if
matplotlib is installed)::

    .venv/bin/python bench/append_bench.py [--rounds 5] [--seconds 2] [--impl base=/tmp/old]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _stats import pct

REPO = Path(__file__).resolve().parents[1]
KiB, MiB = 1 << 10, 1 << 20

#: (record bytes, threads) of each case.
CASES: tuple[tuple[int, int], ...] = ((64 * KiB, 1), (1 * KiB, 1), (1 * KiB, 8))
TARGETS = {
    "65536x1": {"ratio": 0.80, "p99_ratio": 1.5},
    "1024x1": {"ratio": 0.85, "p99_ratio": 1.5},
    "1024x8": {"ratio": 0.80, "p99_ratio": 1.5},
}
RAW_FILE_BYTES = 256 * MiB
#: The `api` of the first checkout with ``file_wal.zero_fill`` on (``--zero-fill``): the WAL
#: ring written once at creation, so appends run as on any lap after a new ring's first.
ZERO_FILLED = "zero-filled"


def summarize(lat: list[float], seconds: float, record_bytes: int) -> dict[str, Any]:
    return {
        "ops": len(lat),
        "ops_per_s": len(lat) / seconds,
        "mb_per_s": len(lat) * record_bytes / seconds / 1e6,
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "p999_ms": pct(lat, 0.999) * 1e3,
        "mean_ms": statistics.fmean(lat) * 1e3 if lat else float("nan"),
    }


def run_threads(threads: int, seconds: float, op: Any) -> tuple[list[float], float]:
    """Run `op(thread index)` in a loop on `threads` threads for `seconds`; latencies, time."""
    lat: list[list[float]] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    stop = [0.0]

    def worker(i: int) -> None:
        mine = lat[i]
        clock = time.perf_counter
        barrier.wait()
        while clock() < stop[0]:
            a = clock()
            op(i)
            mine.append(clock() - a)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    stop[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    barrier.wait()
    for t in ts:
        t.join()
    return [x for v in lat for x in v], time.perf_counter() - t0


# -- the measurements (each in a child process) ---------------------------------------------------


def measure_raw(path: Path, size: int, threads: int, seconds: float, fresh: bool) -> dict[str, Any]:
    if fresh:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.posix_fallocate(fd, 0, RAW_FILE_BYTES)
    else:
        fd = os.open(path, os.O_RDWR)
    buf = os.urandom(size)
    # Each thread writes sequentially in its own region, wrapping around.
    region = RAW_FILE_BYTES // threads // size * size
    offsets = [i * region for i in range(threads)]

    def op(i: int) -> None:
        off = offsets[i]
        os.pwrite(fd, buf, off)
        os.fdatasync(fd)
        off += size
        offsets[i] = off if off < (i + 1) * region else i * region

    try:
        for i in range(threads):
            op(i)  # warm
        cpu0 = time.process_time()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        lat, dt = run_threads(threads, seconds, op)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = time.process_time() - cpu0
    finally:
        os.close(fd)
        if fresh:
            path.unlink()
    return summarize(lat, dt, size) | per_append(len(lat), cpu, ru0, ru1)


def per_append(
    n: int, cpu: float, ru0: resource.struct_rusage, ru1: resource.struct_rusage
) -> dict[str, float]:
    """Process CPU time and context switches per operation: figures that move with the code
    rather than with the neighbours' load on a shared machine."""
    n = max(1, n)
    return {
        "process_cpu_us_per_append": cpu / n * 1e6,
        "voluntary_switches_per_append": (ru1.ru_nvcsw - ru0.ru_nvcsw) / n,
        "involuntary_switches_per_append": (ru1.ru_nivcsw - ru0.ru_nivcsw) / n,
    }


def measure_api(
    store: Path, size: int, threads: int, seconds: float, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    import s3stream
    from s3stream import RecordBatch

    batch = RecordBatch(os.urandom(size))
    opened = time.perf_counter()
    with s3stream.open(str(store), settings=settings or {}) as client:
        open_s = time.perf_counter() - opened
        streams = [client.create_stream() for _ in range(threads)]

        def op(i: int) -> None:
            streams[i].append(batch)

        warm_end = time.perf_counter() + min(0.3, seconds / 4)
        while time.perf_counter() < warm_end:
            op(0)
        collections = sum(s["collections"] for s in gc.get_stats())
        cpu0 = time.process_time()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        lat, dt = run_threads(threads, seconds, op)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = time.process_time() - cpu0
        collections = sum(s["collections"] for s in gc.get_stats()) - collections
    out = summarize(lat, dt, size) | per_append(len(lat), cpu, ru0, ru1)
    out["gc_collections"] = collections
    out["open_s"] = open_s
    out["s3stream"] = s3stream.__file__
    return out


def child_main(spec: dict[str, Any]) -> None:
    if spec["kind"] == "api":
        r = measure_api(
            Path(spec["store"]), spec["size"], spec["threads"], spec["seconds"],
            spec.get("settings"),
        )  # fmt: skip
    else:
        r = measure_raw(
            Path(spec["path"]), spec["size"], spec["threads"], spec["seconds"], spec["fresh"]
        )
    print(json.dumps(r), flush=True)


def in_child(spec: dict[str, Any], pythonpath: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# -- the driver -----------------------------------------------------------------------------------


def prepare_raw_file(path: Path) -> None:
    """Preallocated, and every block written once (no unwritten extents left)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, RAW_FILE_BYTES)
        chunk = bytes(8 * MiB)
        for off in range(0, RAW_FILE_BYTES, len(chunk)):
            os.pwrite(fd, chunk, off)
        os.fsync(fd)
    finally:
        os.close(fd)


def run(
    directory: Path,
    impls: dict[str, str | None],
    rounds: int,
    seconds: float,
    fresh_raw: bool,
    cases: tuple[tuple[int, int], ...] = CASES,
    zero_fill: bool = False,
) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    raw_file = directory / "raw.bin"
    prepare_raw_file(raw_file)
    runs: list[dict[str, Any]] = []
    try:
        for rnd in range(rounds):
            for size, threads in cases:
                # Raw and api alternate within the round; their order rotates between rounds.
                kinds: list[tuple[str, str | None]] = [("raw", None)]
                if fresh_raw:
                    kinds.append(("raw-fresh", None))
                kinds += [(f"api:{name}", path) for name, path in impls.items()]
                if zero_fill:
                    kinds.append((f"api:{ZERO_FILLED}", impls[next(iter(impls))]))
                shift = rnd % len(kinds)
                for kind, pythonpath in kinds[shift:] + kinds[:shift]:
                    spec: dict[str, Any] = {"size": size, "threads": threads, "seconds": seconds}
                    if kind.startswith("api"):
                        store = directory / f"store-{rnd}-{size}-{threads}"
                        spec |= {"kind": "api", "store": str(store)}
                        if kind == f"api:{ZERO_FILLED}":
                            spec["settings"] = {"file_wal.zero_fill": True}
                        try:
                            r = in_child(spec, pythonpath)
                        finally:
                            shutil.rmtree(store, ignore_errors=True)
                    else:
                        fresh = kind == "raw-fresh"
                        path = directory / "fresh.bin" if fresh else raw_file
                        spec |= {"kind": "raw", "path": str(path), "fresh": fresh}
                        r = in_child(spec, None)
                    r |= {"round": rnd, "kind": kind, "size": size, "threads": threads}
                    runs.append(r)
                    print(
                        f"[{rnd}] {size // KiB:>2} KiB x{threads} {kind:14s} "
                        f"{r['ops_per_s']:8.0f} ops/s  p50 {r['p50_ms']:.3f}  "
                        f"p99 {r['p99_ms']:.3f} ms",
                        flush=True,
                    )
    finally:
        raw_file.unlink(missing_ok=True)
    names = dict(impls) | ({ZERO_FILLED: None} if zero_fill else {})
    return {"runs": runs, "summary": summarize_runs(runs, names, rounds, cases)}


def summarize_runs(
    runs: list[dict[str, Any]],
    impls: dict[str, str | None],
    rounds: int,
    cases: tuple[tuple[int, int], ...] = CASES,
) -> dict[str, Any]:
    """Per case and implementation: medians over rounds of the per-round ratios."""
    out: dict[str, Any] = {}
    for size, threads in cases:
        case = f"{size}x{threads}"
        mine = [r for r in runs if r["size"] == size and r["threads"] == threads]
        by = {(r["round"], r["kind"]): r for r in mine}
        entry: dict[str, Any] = {
            "targets": TARGETS.get(case, {"ratio": float("nan"), "p99_ratio": float("nan")})
        }
        for kind in sorted({r["kind"] for r in mine}):
            rs = [r for r in mine if r["kind"] == kind]
            entry[kind] = {
                k: statistics.median(r[k] for r in rs)
                for k in (
                    "ops_per_s",
                    "p50_ms",
                    "p99_ms",
                    "p999_ms",
                    "process_cpu_us_per_append",
                    "voluntary_switches_per_append",
                    "involuntary_switches_per_append",
                )
                if k in rs[0]
            }
        for name in impls:
            ratios, p99s = [], []
            for rnd in range(rounds):
                api, raw = by.get((rnd, f"api:{name}")), by.get((rnd, "raw"))
                if api is None or raw is None:
                    continue
                ratios.append(api["ops_per_s"] / raw["ops_per_s"])
                p99s.append(api["p99_ms"] / raw["p99_ms"])
            entry[f"api:{name}"] |= {
                "ratio_median": statistics.median(ratios),
                "ratio_rounds": ratios,
                "p99_ratio_median": statistics.median(p99s),
                "p99_ratio_rounds": p99s,
            }
        out[case] = entry
    return out


def print_table(summary: dict[str, Any], impls: dict[str, str | None]) -> None:
    print("\nmedians over rounds (ratio = api ops/s / raw ops/s, per round; cpu = process CPU")
    print("microseconds, vsw/isw = voluntary/involuntary context switches, per append):")
    head = ("ratio", "goal", "p99 api", "p99 raw", "p99 x", "goal", "cpu", "vsw", "isw")
    widths = (6, 5, 8, 8, 6, 5, 6, 5, 5)
    columns = " ".join(f"{h:>{w}s}" for h, w in zip(head, widths, strict=True))
    print(f"  {'case':10s} {'impl':10s} {columns}")
    for case, entry in summary.items():
        raw = entry["raw"]
        print(
            f"  {case:10s} {'raw':10s} {'':6s} {'':5s} {'':8s} {raw['p99_ms']:8.3f} {'':6s} "
            f"{'':5s} {raw['process_cpu_us_per_append']:6.1f} "
            f"{raw['voluntary_switches_per_append']:5.2f} "
            f"{raw['involuntary_switches_per_append']:5.2f}"
        )
        for name in impls:
            e = entry[f"api:{name}"]
            t = entry["targets"]
            print(
                f"  {case:10s} {name:10s} {e['ratio_median']:6.2f} {t['ratio']:5.2f} "
                f"{e['p99_ms']:8.3f} {raw['p99_ms']:8.3f} "
                f"{e['p99_ratio_median']:6.2f} {t['p99_ratio']:5.2f} "
                f"{e['process_cpu_us_per_append']:6.1f} "
                f"{e['voluntary_switches_per_append']:5.2f} "
                f"{e['involuntary_switches_per_append']:5.2f}"
            )


def plot(summary: dict[str, Any], impls: dict[str, str | None], png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    cases = list(summary)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(impls))
    for j, name in enumerate(impls):
        xs = [i + j * width for i in range(len(cases))]
        ax1.bar(xs, [summary[c][f"api:{name}"]["ratio_median"] for c in cases], width, label=name)
        ax2.bar(
            xs, [summary[c][f"api:{name}"]["p99_ratio_median"] for c in cases], width, label=name
        )
    for ax, key, title in (
        (ax1, "ratio", "api ops/s / raw ops/s (higher is better)"),
        (ax2, "p99_ratio", "api p99 / raw p99 (lower is better)"),
    ):
        for i, c in enumerate(cases):
            goal = summary[c]["targets"][key]
            ax.hlines(goal, i - 0.1, i + 0.8, colors="k", linestyles="dashed")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], cases)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"plot: {png}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    p.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a checkout (the directory holding its s3stream package) to measure; repeatable",
    )
    p.add_argument("--no-fresh-raw", action="store_true", help="skip the raw-fresh loop")
    p.add_argument(
        "--zero-fill",
        action="store_true",
        help=f"also measure the first checkout with file_wal.zero_fill (as {ZERO_FILLED!r})",
    )
    p.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="BYTESxTHREADS",
        help="only these cases (e.g. 1024x8); repeatable; default: all three",
    )
    p.add_argument("--dir", type=Path, default=REPO / "bench" / ".tmp" / "append")
    p.add_argument("--out", type=Path, help="JSON file (default bench/results/<date>-append/)")
    args = p.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return
    impls: dict[str, str | None] = {}
    for item in args.impl:
        name, _, path = item.partition("=")
        impls[name] = str(Path(path).resolve())
    if not impls:
        impls["tree"] = str(REPO)
    cases = CASES
    if args.case:
        cases = tuple((int(b), int(t)) for b, _, t in (c.partition("x") for c in args.case))
    started = datetime.datetime.now(datetime.UTC)
    try:
        results = run(
            args.dir, impls, args.rounds, args.seconds, not args.no_fresh_raw, cases,
            args.zero_fill,
        )  # fmt: skip
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    results["environment"] = {
        "started": started.isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "rounds": args.rounds,
        "seconds_per_measurement": args.seconds,
        "impls": impls,
    }
    if args.zero_fill:
        impls[ZERO_FILLED] = impls[next(iter(impls))]
    print_table(results["summary"], impls)
    out = args.out or (
        REPO / "bench" / "results" / f"{started:%Y-%m-%d}-append" / f"append-{started:%H%M}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {out}")
    plot(results["summary"], impls, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
