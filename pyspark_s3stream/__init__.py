"""Auto-registration of the s3stream Spark data source.

PySpark (>= 4.0) imports every top-level module named ``pyspark_*`` it finds on the Python
path and registers its ``DefaultSource`` under ``DefaultSource.name()``, so with s3stream
installed ``spark.read.format("s3stream")`` works without an explicit
``spark.dataSource.register(...)``.
"""

from s3stream.spark.source import S3StreamDataSource as DefaultSource

__all__ = ["DefaultSource"]
