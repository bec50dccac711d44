"""Write order events with s3stream, then aggregate them with Spark.

Run: ``.venv/bin/python examples/spark_etl.py [--dir DIR] [--orders 200000]`` from any
directory (needs Java 17 and ``pip install 's3stream[spark]'``). The store goes to a new
temporary directory, removed at the end; ``--dir DIR`` keeps it in DIR instead, which must not
exist yet (the example creates it, and never deletes a directory it did not create).

1. An application appends JSON order events as records (key = customer id) to one stream per
   region, tagged ``topic=orders`` and ``partition=<n>``, and flushes: Spark only sees what is
   uploaded to the object store.
2. Spark reads them as Kafka-like rows (``spark.read.format("s3stream")``), parses the JSON
   values and computes revenue per region and product; the same aggregation runs in plain
   Python over ``Stream.read_records`` as a cross-check.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import s3stream
import s3stream.spark  # before the SparkSession: Spark's Python workers then run this Python
from s3stream import Record

REGIONS = ["eu", "us", "apac"]
PRODUCTS = ["book", "lamp", "chair", "mug", "desk"]


def write_orders(url: str, orders: int, seed: int) -> dict[tuple[str, str], float]:
    """Append `orders` events; return revenue per (region, product) computed from the
    records read back through the library."""
    rng = random.Random(seed)
    with s3stream.open(url, wal="memory://") as client:
        streams = [
            client.create_stream(tags={"topic": "orders", "partition": str(i), "region": r})
            for i, r in enumerate(REGIONS)
        ]
        batch: dict[int, list[Record]] = defaultdict(list)
        for n in range(orders):
            i = rng.randrange(len(REGIONS))
            event = {
                "order": n,
                "product": rng.choice(PRODUCTS),
                "amount": round(rng.uniform(1, 200), 2),
                "region": REGIONS[i],
            }
            batch[i].append(
                Record(
                    json.dumps(event).encode(),
                    key=b"customer-%d" % rng.randrange(5000),
                    timestamp=1_700_000_000_000 + n * 10,
                    headers=(("schema", b"order-v1"),),
                )
            )
            if len(batch[i]) == 500:
                streams[i].append_records(batch.pop(i), compression="zstd")
        for i, records in batch.items():
            streams[i].append_records(records, compression="zstd")
        client.flush()  # make everything visible to Spark

        revenue: dict[tuple[str, str], float] = defaultdict(float)
        for s in streams:
            for _, rec in s.read_records(s.start_offset):
                event = json.loads(rec.value or b"{}")
                revenue[(event["region"], event["product"])] += event["amount"]
        return revenue


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="keep the store in this new directory (must not exist)")
    ap.add_argument("--orders", type=int, default=200_000)
    args = ap.parse_args()
    if args.dir is None:
        with tempfile.TemporaryDirectory(prefix="s3stream-etl-") as tmp:
            run(Path(tmp) / "store", args.orders)
        return
    root = Path(args.dir)
    if root.exists() or root.is_symlink():
        sys.exit(f"{root} exists: give --dir a path that does not exist yet")
    run(root, args.orders)
    print(f"the store is in {root}")


def run(root: Path, orders_count: int) -> None:
    """Write `orders_count` orders to a new store at `root`, aggregate them with Spark and
    check the result against the library's own read-back."""
    expected = write_orders(str(root), orders_count, seed=7)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    try:
        event = StructType(
            [
                StructField("product", StringType()),
                StructField("amount", DoubleType()),
                StructField("region", StringType()),
            ]
        )
        orders = (
            spark.read.format("s3stream")
            .option("subscribe", "orders")
            .load(str(root))
            .select(
                "key",
                "partition",
                "timestamp",
                F.from_json(F.col("value").cast("string"), event).alias("e"),
            )
        )
        revenue = (
            orders.groupBy("e.region", "e.product")
            .agg(F.round(F.sum("e.amount"), 2).alias("revenue"), F.count("*").alias("orders"))
            .orderBy("region", "product")
        )
        revenue.show(len(REGIONS) * len(PRODUCTS))
        got = {(r["region"], r["product"]): r["revenue"] for r in revenue.collect()}
        assert got.keys() == expected.keys()
        for k, v in expected.items():
            assert abs(got[k] - v) < 0.01, (k, got[k], v)
        print(f"{orders_count} orders: Spark's revenue per region and product matches read_records")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
