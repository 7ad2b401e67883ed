"""Spark's writer classes for the sink: Arrow batches in on executors, counts logged on commit.

Spark pickles the writer to each task; it carries only the checked columns and options, and
each task builds its own producer (clients do not pickle, and a task must flush its own).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from shardflow.spark.sink.columns import SinkColumns
from shardflow.spark.sink.options import SinkOptions
from shardflow.spark.sink.task import SinkCommitMessage, write_rows

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("shardflow.spark.sink")


class ShardflowArrowWriter(DataSourceArrowWriter):
    """``df.write.format("shardflow")``: each task writes its rows and flushes before it ends."""

    def __init__(self, columns: SinkColumns, options: SinkOptions) -> None:
        self.columns = columns
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_rows(iterator, self.columns, self.options)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("wrote %s", summarize(messages, self.options.connection.stream_label))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Records of tasks that succeeded are in the stream already: Kinesis has no rollback.
        log.warning(
            "write to %s aborted after tasks had written %s",
            self.options.connection.stream_label,
            summarize(messages, self.options.connection.stream_label),
        )


class ShardflowStreamArrowWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("shardflow")``: one write per task and micro-batch."""

    def __init__(self, columns: SinkColumns, options: SinkOptions) -> None:
        self.columns = columns
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_rows(iterator, self.columns, self.options)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("batch %d: wrote %s", batchId, summarize(messages, self.stream_label))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "batch %d aborted after tasks had written %s (they are written again on retry)",
            batchId,
            summarize(messages, self.stream_label),
        )

    @property
    def stream_label(self) -> str:
        return self.options.connection.stream_label


def summarize(messages: Sequence[object], stream: str) -> str:
    """``"N records to STREAM (shard: n, ...)"`` over the tasks' commit messages."""
    per_shard: Counter[str] = Counter()
    producers: set[str] = set()
    records = 0
    for message in messages:
        if isinstance(message, SinkCommitMessage):
            records += message.records
            per_shard.update(message.records_per_shard)
            if message.producer:
                producers.add(message.producer)
    shards = ", ".join(f"{shard}: {n}" for shard, n in sorted(per_shard.items()))
    summary = f"{records} records to {stream}" + (f" ({shards})" if shards else "")
    if producers:
        summary += f" through producer(s) {', '.join(sorted(producers))}"
    return summary
