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

Register with ``spark.dataSource.register(S3StreamDataSource)``; with the package installed
Spark also finds it by itself through `pyspark_s3stream.DefaultSource`. See ``docs/spark.md``.
"""

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
