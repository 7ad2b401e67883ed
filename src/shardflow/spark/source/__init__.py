"""Reading Kinesis from Spark: batch reads and Structured Streaming micro-batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
    from pyspark.sql.types import StructType


def batch_reader(options: Mapping[str, str], schema: StructType) -> DataSourceReader:
    """The reader behind ``spark.read.format("shardflow")``."""
    raise NotImplementedError("the shardflow Spark source is being built (issue 6)")


def stream_reader(options: Mapping[str, str], schema: StructType) -> DataSourceStreamReader:
    """The reader behind ``spark.readStream.format("shardflow")``."""
    raise NotImplementedError("the shardflow Spark source is being built (issue 6)")
