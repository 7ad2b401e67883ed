"""Writing to Kinesis from Spark: ``df.write`` and ``df.writeStream`` through the producer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
    from pyspark.sql.types import StructType


def batch_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceWriter:
    """The writer behind ``df.write.format("shardflow")``."""
    raise NotImplementedError("the shardflow Spark sink is being built (issue 6)")


def stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> DataSourceStreamWriter:
    """The writer behind ``df.writeStream.format("shardflow")``."""
    raise NotImplementedError("the shardflow Spark sink is being built (issue 6)")
