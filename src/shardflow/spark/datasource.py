"""The ``shardflow`` Python data source: one class that Spark instantiates per query.

It only routes: reading lives in ``shardflow.spark.source``, writing in ``shardflow.spark.sink``.
Spark pickles this class by reference, so the package must be importable on executors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource

if TYPE_CHECKING:
    from pyspark.sql.datasource import (
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        DataSourceWriter,
    )
    from pyspark.sql.types import StructType


class ShardflowDataSource(DataSource):
    """Kinesis Data Streams as a Spark source (batch and streaming) and sink."""

    @classmethod
    def name(cls) -> str:
        # Not "kinesis" or "aws-kinesis": built-in JVM sources of those names win over Python ones.
        return "shardflow"

    def schema(self) -> StructType | str:
        from shardflow.spark.schema import RECORD_SCHEMA
        from shardflow.spark.source.options import check_options

        # Spark asks for the schema when a source is defined (.load()): the earliest moment a
        # bad option can be reported. Which of read / readStream it is shows only later.
        check_options(dict(self.options))
        return RECORD_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        from shardflow.spark.source import batch_reader

        return batch_reader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from shardflow.spark.source import stream_reader

        return stream_reader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from shardflow.spark.sink import batch_writer

        return batch_writer(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from shardflow.spark.sink import stream_writer

        return stream_writer(dict(self.options), schema, overwrite)
