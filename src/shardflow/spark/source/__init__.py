"""Reading Kinesis from Spark: batch reads and Structured Streaming micro-batches.

``stream_reader`` and ``batch_reader`` check the options (raising
:class:`~shardflow.errors.SparkOptionError` naming a bad one) and build the readers;
the modules here hold one idea each: positions and offsets (what a batch reads), the
metadata store (where it ended), admission control, lineage, probing, the per-shard read
and its Arrow output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
    from pyspark.sql.types import StructType


def _check_schema(schema: StructType) -> None:
    from shardflow.errors import SparkOptionError
    from shardflow.spark.schema import RECORD_SCHEMA

    def columns(of: StructType) -> list[tuple[str, str]]:
        return [(field.name, field.dataType.simpleString()) for field in of.fields]

    if columns(schema) != columns(RECORD_SCHEMA):
        raise SparkOptionError(
            "schema",
            "the source's columns are fixed (leave .schema() out): " + RECORD_SCHEMA.simpleString(),
        )


def batch_reader(options: Mapping[str, str], schema: StructType) -> DataSourceReader:
    """The reader behind ``spark.read.format("shardflow")``."""
    from shardflow.spark.source.batch import batch_reader_for

    _check_schema(schema)
    return batch_reader_for(options)


def stream_reader(options: Mapping[str, str], schema: StructType) -> DataSourceStreamReader:
    """The reader behind ``spark.readStream.format("shardflow")``."""
    from shardflow.spark.source.stream import stream_reader_for

    _check_schema(schema)
    return stream_reader_for(options)
