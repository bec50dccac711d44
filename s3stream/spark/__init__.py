"""Spark data source for s3stream (PySpark >= 4.0 Python Data Source API).

``spark.read.format("s3stream").load(url)`` and ``spark.readStream.format("s3stream")`` give
Kafka-like rows (``key``, ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``,
``timestampType``, optional ``headers``, plus ``stream_id`` and ``record_count``).

Roles:

- `options` — the reader options, validated into a picklable `SourceOptions`;
- `planning` — driver side: stream selection, offset ranges, partitions on block boundaries;
- `offsets` — streaming offsets (JSON form pinned to a metadata-log entry), admission control;
- `fetch` — executor side: ranged GETs of the planned blocks, a few in flight;
- `arrow` — executor side: batches → `pyarrow.RecordBatch`es (vectorised) or tuples;
- `source` — the `DataSource`, batch reader and stream reader that Spark calls.

With the package installed Spark finds the source by itself through
`pyspark_s3stream.DefaultSource` (PySpark registers the ``DefaultSource`` of every top-level
``pyspark_*`` module its Python worker can import); ``spark.dataSource.register(
S3StreamDataSource)`` is for a driver that has s3stream on its ``sys.path`` only. Importing
this package before the first `SparkSession` makes Spark's Python workers run this
interpreter when ``PYSPARK_PYTHON`` is unset. See ``docs/spark.md``.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path

from .source import (
    S3StreamBatchReader,
    S3StreamDataSource,
    S3StreamInputPartition,
    S3StreamStreamReader,
    spark_schema,
)

__all__ = [
    "S3StreamBatchReader",
    "S3StreamDataSource",
    "S3StreamInputPartition",
    "S3StreamStreamReader",
    "spark_schema",
]


def _arrange_worker_python() -> None:
    # Spark starts its Python workers, the one that looks up ``pyspark_*`` data sources
    # included, with $PYSPARK_PYTHON, else ``python3`` from PATH. Outside an activated virtual
    # environment that is another interpreter, without s3stream: "DATA_SOURCE_NOT_FOUND
    # ... s3stream.DefaultSource", or "No module named 's3stream'" in tasks. The JVM and the
    # SparkContext read the variable once, when they start, so it can only be set before the
    # first session.
    if os.environ.get("PYSPARK_PYTHON") or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return  # chosen by the user, or by spark-submit, which started this process
    if not sys.executable:
        return  # an embedded interpreter: nothing to name
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        return
    if not (sc.master or "").startswith("local"):
        return  # the workers run elsewhere: this interpreter's path means nothing there
    found = shutil.which(sc.pythonExec)
    if found is not None and (
        Path(found).parent == Path(sys.executable).parent
        or os.path.realpath(found) == os.path.realpath(sys.executable)
    ):
        return
    warnings.warn(
        f"Spark's Python workers run {sc.pythonExec!r} ({found or 'not on PATH'}), not this "
        f"interpreter ({sys.executable}); unless that one has s3stream installed, "
        'format("s3stream") fails. Set PYSPARK_PYTHON to this interpreter before the first '
        "SparkSession starts (importing s3stream.spark before creating it does that)",
        RuntimeWarning,
        stacklevel=3,
    )


_arrange_worker_python()
