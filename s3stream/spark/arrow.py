"""Executor side, decoding: fetched batches → Kafka-like rows, as Arrow batches or tuples.

The decoder itself is `s3stream.arrow`, shared with `StreamReader.read_arrow` (one code path,
so a Spark query and an Arrow read of the same offsets see the same rows); it lives outside
this package because importing ``s3stream.spark`` imports pyspark. The planned `ReadSlice`s
this package fetches are its `RowSlice`s.
"""

from __future__ import annotations

from ..arrow import COLUMNS, MAX_TIMESTAMP_MS, arrow_batches, arrow_schema, tuple_rows

__all__ = ["COLUMNS", "MAX_TIMESTAMP_MS", "arrow_batches", "arrow_schema", "tuple_rows"]
