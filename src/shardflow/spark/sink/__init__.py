"""Writing to Kinesis from Spark: ``df.write`` and ``df.writeStream`` through the producer.

::

    (df.selectExpr("to_json(struct(*)) AS data", "customer_id AS partitionKey")
       .writeStream.format("shardflow")
       .option("streamName", "alerts")
       .option("checkpointLocation", "/tmp/alerts-checkpoint")
       .start())

Columns: ``data`` (binary or string), ``partitionKey`` (string), optional ``explicitHashKey``.
Options: see :mod:`shardflow.spark.sink.options`. At-least-once: a task returns only after
every record it put is written; a failed task is retried and writes its rows again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from shardflow.errors import SparkOptionError

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
    from pyspark.sql.types import StructType


def batch_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceWriter:
    """The writer behind ``df.write.format("shardflow")`` (append only)."""
    from shardflow.spark.sink.columns import sink_columns
    from shardflow.spark.sink.options import sink_options
    from shardflow.spark.sink.writers import ShardflowArrowWriter

    if overwrite:
        raise SparkOptionError("mode", "a Kinesis stream cannot be overwritten; use mode('append')")
    return ShardflowArrowWriter(sink_columns(schema), sink_options(options))


def stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceStreamWriter:
    """The writer behind ``df.writeStream.format("shardflow")``.

    Every output mode appends: in ``complete`` mode each micro-batch writes the whole result
    table again, as Spark's Kafka sink does.
    """
    from shardflow.spark.sink.columns import sink_columns
    from shardflow.spark.sink.options import sink_options
    from shardflow.spark.sink.writers import ShardflowStreamArrowWriter

    return ShardflowStreamArrowWriter(sink_columns(schema), sink_options(options))
