"""The shardflow sink with a trace of its tasks, for tests of what a task does on an executor.

``shardflow_traced`` is the ``shardflow`` data source whose stream writer, after each task's
write returned (the point where Spark takes the task's commit message), appends one JSON line
to the file named by the ``traceFile`` option: the executor process, the Spark stage (one per
micro-batch), the producer the task wrote through (from its commit message), its rows, and
how many of those rows the stream held at that moment (read back with plain boto3). The
module is pickled by value (see :func:`register`): executors need not import the tests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from shardflow.spark.datasource import ShardflowDataSource

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


def register(spark: SparkSession) -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(TracedShardflow)


class TracedShardflow(ShardflowDataSource):
    @classmethod
    def name(cls) -> str:
        return "shardflow_traced"

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from shardflow.spark.sink import stream_writer

        # Spark hands options over with lower-cased names.
        options = {k: v for k, v in self.options.items() if k.lower() != "tracefile"}
        inner = stream_writer(options, schema, overwrite)
        return TracedWriter(
            inner,
            self.options["traceFile"],
            self.options["streamName"],
            self.options["endpointUrl"],
        )


class TracedWriter(DataSourceStreamArrowWriter):
    def __init__(self, inner: Any, trace: str, stream: str, endpoint: str) -> None:
        self.inner = inner
        self.trace = trace
        self.stream = stream
        self.endpoint = endpoint

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        rows: list[bytes] = []

        def passing() -> Iterator[pa.RecordBatch]:
            for batch in iterator:
                rows.extend(_as_bytes(v) for v in batch.column("data").to_pylist())
                yield batch

        message = self.inner.write(passing())
        stored = _stored(self.endpoint, self.stream)
        context = TaskContext.get()
        line = {
            "pid": os.getpid(),
            "stage": None if context is None else context.stageId(),
            "producer": message.producer,
            "rows": len(rows),
            "rows_in_stream": sum(1 for row in rows if row in stored),
            "data": [row.decode() for row in rows],
        }
        with open(self.trace, "a") as out:
            out.write(json.dumps(line) + "\n")
        return message

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.inner.commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.inner.abort(messages, batchId)


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _stored(endpoint: str, stream: str) -> set[bytes]:
    """Every record's data in the stream now."""
    import boto3

    kinesis = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1")
    found: set[bytes] = set()
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            found.update(bytes(r["Data"]) for r in page["Records"])
            if not page["Records"]:
                break
            iterator = page.get("NextShardIterator")
    return found
