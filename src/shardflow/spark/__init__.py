"""PySpark Structured Streaming source and sink for Kinesis, format ``shardflow``.

    import shardflow.spark
    shardflow.spark.register(spark)
    df = spark.readStream.format("shardflow").option("streamName", "orders").load()

Requires the ``spark`` extra (``pip install 'shardflow[spark]'``): pyspark 4.3 and pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "shardflow"


def register(spark: SparkSession) -> None:
    """Register the ``shardflow`` data source with ``spark`` (idempotent per session)."""
    from shardflow.spark.datasource import ShardflowDataSource

    spark.dataSource.register(ShardflowDataSource)


__all__ = ["FORMAT", "register"]
