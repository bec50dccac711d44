"""Spark scan throughput: the s3stream reader (Arrow path), Parquet, the reader (tuple path).

Run: ``.venv/bin/python bench/spark_bench.py [--records 10000000] [--dir /tmp/s3stream-bench]``.

1. Writes ``--records`` records (``--value-bytes`` incompressible value, 10-byte key,
   explicit timestamp) with the library into ``--streams`` streams of a local store, in
   batches of ``--batch`` records, then ``client.close()`` (uploads everything).
2. Writes the same rows as Parquet (snappy) to the same disk, through Spark.
3. In one SparkSession (``local[N]``), scans each three ways with
   ``df.write.format("noop")`` (every column materialised, nothing collected): our reader
   (Arrow path), ``spark.read.parquet``, our reader with ``useArrow=false`` (tuple path).
   After one warm-up scan of each, the fast scans alternate for ``--repeat`` rounds (so load
   from elsewhere on the machine hits them alike); the best time of each counts, and the
   ratio of each round is printed too. The tuple path runs once.
4. Per scan, the CPU seconds of the JVM and of the Python workers are read from ``/proc``
   (median over the rounds): a view of where the time goes that load from elsewhere on the
   machine distorts less than wall time.
5. For context, the same rounds also scan a *ceiling* source: a Python data source with our
   schema that yields one pre-decoded Arrow batch over and over (no I/O, no decoding). It is
   the most any Python data source can deliver here: Spark's own cost of taking Arrow
   batches from a Python worker and turning them into rows.

Prints rows/s for each and the ratio of our Arrow path to Parquet, and writes them as JSON
to ``--out`` (default ``bench/results/spark.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import s3stream
from s3stream import Record

REPO = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000


def write_records(url: str, records: int, streams: int, batch: int, value_bytes: int) -> float:
    """Write the records with the library; returns the seconds taken (appends + upload)."""
    pool = np.random.default_rng(42).integers(0, 256, 1 << 22, dtype=np.uint8).tobytes()
    span = len(pool) - value_bytes
    t = time.perf_counter()
    with s3stream.open(url, wal="memory://") as client:
        handles = [
            client.create_stream(tags={"topic": "bench", "partition": str(p)})
            for p in range(streams)
        ]
        pending = []
        for b in range((records + batch - 1) // batch):
            lo, hi = b * batch, min(records, (b + 1) * batch)
            recs = []
            for i in range(lo, hi):
                at = (i * 7919) % span
                recs.append(Record(pool[at : at + value_bytes], b"key-%06d" % (i % 10**6), T0 + i))
            pending.append(handles[b % streams].append_records_async(recs))
            if len(pending) > 64:
                pending.pop(0).result()
        for fut in pending:
            fut.result()
    return time.perf_counter() - t


def session(cores: int) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
    )
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("s3stream-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "4g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )


def ceiling_source(store: str, rows: int, partitions: int) -> type:
    """A data source yielding `rows` rows of one pre-decoded batch of ours, in `partitions`."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from s3stream.spark import spark_schema

    class CeilingReader(DataSourceReader):  # type: ignore[misc]
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(partitions)]

        def read(self, partition: InputPartition) -> Any:
            from s3stream.spark.options import parse_options
            from s3stream.spark.source import S3StreamBatchReader

            ours = S3StreamBatchReader(parse_options({"path": store}, streaming=False))
            batch = next(iter(ours.read(ours.partitions()[0])))
            todo = rows // partitions + (partition.value < rows % partitions)
            while todo > 0:
                yield batch if todo >= batch.num_rows else batch.slice(0, todo)
                todo -= batch.num_rows

    class Ceiling(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "s3stream_ceiling"

        def schema(self) -> Any:
            return spark_schema(False)

        def reader(self, schema: Any) -> DataSourceReader:
            return CeilingReader()

    return Ceiling


def child_cpu() -> dict[str, float]:
    """CPU seconds used so far by the processes below this one, split into the JVM and the
    Python workers (Linux /proc; empty elsewhere). Reused workers never exit, so their own
    counters are read, not the parent's counts of exited children."""
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name_end = text.rfind(")")
        fields = text[name_end + 2 :].split()
        name = text[text.find("(") + 1 : name_end]
        procs[int(stat.parent.name)] = (
            int(fields[1]),
            name,
            (int(fields[11]) + int(fields[12])) / tick,
        )
    out = {"jvm": 0.0, "python": 0.0}
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        for pid, (ppid, name, cpu) in procs.items():
            if ppid == parent:
                out["jvm" if name == "java" else "python"] += cpu
                todo.append(pid)
    return out


def scan(df: Any, cpu: dict[str, list[float]] | None = None) -> float:
    """Wall time of materialising every row and column of `df`; appends the CPU seconds of
    the JVM and of the Python workers to `cpu` when given."""
    before = child_cpu()
    t = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - t
    if cpu is not None:
        after = child_cpu()
        for k, v in after.items():
            cpu.setdefault(k, []).append(v - before.get(k, 0.0))
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1000, help="records per appended batch")
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/s3stream-spark-bench")
    ap.add_argument("--keep", action="store_true", help="reuse data already in --dir")
    ap.add_argument(
        "--out", default=str(REPO / "bench" / "results" / "spark.json"), help="JSON results file"
    )
    args = ap.parse_args()

    root = Path(args.dir)
    store, parquet = root / "store", root / "parquet"
    if not args.keep and root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    write_s = None
    if not store.exists():
        write_s = write_records(
            str(store), args.records, args.streams, args.batch, args.value_bytes
        )
        print(f"wrote {args.records:,} records with s3stream in {write_s:.1f} s")

    spark = session(args.cores)
    try:
        from s3stream.spark import S3StreamDataSource

        spark.dataSource.register(S3StreamDataSource)
        ours = spark.read.format("s3stream").load(str(store))
        if not parquet.exists():
            t = time.perf_counter()
            ours.write.parquet(str(parquet))
            print(f"wrote the same rows as Parquet in {time.perf_counter() - t:.1f} s")
        pq = spark.read.parquet(str(parquet))
        tuples = spark.read.format("s3stream").option("useArrow", "false").load(str(store))
        spark.dataSource.register(
            ceiling_source(str(store), args.records, ours.rdd.getNumPartitions())
        )
        ceiling = spark.read.format("s3stream_ceiling").load()
        n = pq.count()
        assert n == args.records == ours.count(), (n, args.records)

        # Rounds alternate the two fast scans so that load from elsewhere on the machine hits
        # both alike; the best round of each counts. The tuple path runs once, last.
        # A warm-up scan of each first: the JVM's JIT and the Python workers' imports would
        # otherwise land on whichever scan runs first.
        for df in (ours, pq, ceiling):
            scan(df)
        best = {"s3stream_arrow": float("inf"), "parquet": float("inf"), "ceiling": float("inf")}
        round_ratios: list[float] = []
        round_times: list[dict[str, float]] = []
        cpu: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.repeat):
            times: dict[str, float] = {}
            for name, df in (("s3stream_arrow", ours), ("parquet", pq), ("ceiling", ceiling)):
                times[name] = scan(df, cpu.setdefault(name, {}))
                best[name] = min(best[name], times[name])
            round_ratios.append(times["parquet"] / times["s3stream_arrow"])
            round_times.append({k: round(v, 3) for k, v in times.items()})
            print(
                "round: "
                + ", ".join(f"{k} {v:.2f} s" for k, v in times.items())
                + f"; arrow/parquet {round_ratios[-1]:.2f}",
                flush=True,
            )
        best["s3stream_tuples"] = scan(tuples)
        results: dict[str, Any] = {}
        for name, seconds in best.items():
            results[name] = {"seconds": round(seconds, 2), "rows_per_s": round(n / seconds)}
            # Median CPU seconds per scan: less sensitive to other load than wall time.
            med = {k: sorted(v)[len(v) // 2] for k, v in cpu.get(name, {}).items() if v}
            if med:
                results[name]["cpu_seconds_median"] = {k: round(v, 2) for k, v in med.items()}
            cpu_text = "  ".join(f"{k} cpu {v:5.2f} s" for k, v in med.items())
            print(
                f"{name:16s} {seconds:7.2f} s  {n / seconds / 1e6:6.2f} M rows/s  {cpu_text}",
                flush=True,
            )
        ratio = results["s3stream_arrow"]["rows_per_s"] / results["parquet"]["rows_per_s"]
        tuple_ratio = (
            results["s3stream_arrow"]["rows_per_s"] / results["s3stream_tuples"]["rows_per_s"]
        )
        of_ceiling = results["s3stream_arrow"]["rows_per_s"] / results["ceiling"]["rows_per_s"]
        median_ratio = sorted(round_ratios)[len(round_ratios) // 2]
        print(
            f"arrow path / parquet = {ratio:.2f} (best times; per round: "
            f"{', '.join(f'{r:.2f}' for r in round_ratios)}, median {median_ratio:.2f}); "
            f"arrow path / tuple path = {tuple_ratio:.1f}x; arrow path / ceiling = {of_ceiling:.2f}"
        )
        du = {
            "s3stream_bytes": sum(f.stat().st_size for f in store.rglob("*.s3o")),
            "parquet_bytes": sum(f.stat().st_size for f in parquet.rglob("*.parquet")),
        }
        print(
            f"on disk: s3stream {du['s3stream_bytes'] / 1e6:.0f} MB, "
            f"parquet {du['parquet_bytes'] / 1e6:.0f} MB"
        )
        if args.out:
            Path(args.out).write_text(
                json.dumps(
                    {
                        "records": n,
                        "streams": args.streams,
                        "batch": args.batch,
                        "value_bytes": args.value_bytes,
                        "cores": args.cores,
                        "cpu": platform.processor() or platform.machine(),
                        "write_seconds": None if write_s is None else round(write_s, 1),
                        **results,
                        "arrow_over_parquet": round(ratio, 3),
                        "arrow_over_parquet_per_round": [round(r, 3) for r in round_ratios],
                        "arrow_over_parquet_median_round": round(median_ratio, 3),
                        "round_seconds": round_times,
                        "arrow_over_ceiling": round(of_ceiling, 3),
                        "load_average_1min": round(os.getloadavg()[0], 2),
                        **du,
                    },
                    indent=2,
                )
                + "\n"
            )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
