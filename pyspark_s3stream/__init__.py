"""Auto-registration of the s3stream Spark data source.

PySpark (>= 4.0) imports every top-level module named ``pyspark_*`` it finds on the Python
path and registers its ``DefaultSource`` under ``DefaultSource.name()``, so with s3stream
installed ``spark.read.format("s3stream")`` works without an explicit
``spark.dataSource.register(...)``.
"""

import sys

try:
    from s3stream.spark.source import S3StreamDataSource as DefaultSource
except ImportError as exc:
    # Seen where this module is importable but s3stream's dependencies are not, e.g. Spark's
    # workers running another Python from the s3stream source tree. Spark would show the
    # bare ImportError; say which interpreter it was and what to set.
    raise ImportError(
        f"the s3stream Spark data source cannot be loaded by Spark's Python worker "
        f"{sys.executable}: {exc}. Set PYSPARK_PYTHON to an interpreter that has s3stream "
        "installed (the driver's) before starting the SparkSession"
    ) from exc

__all__ = ["DefaultSource"]
