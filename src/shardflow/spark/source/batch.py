"""``spark.read.format("shardflow")``: every shard over a range, ``shardsPerTask`` shards a task.

The range starts at ``startingPosition`` (default TRIM_HORIZON) and ends at ``endingPosition``:
the tip at the time each task reads (LATEST, the default), a moment (records that arrived
after it are left out) or a sequence number per shard (inclusive). All shards are read, open
and closed, in parallel: a DataFrame has no order, and ``sequenceNumber`` orders each shard.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from shardflow.aws.kinesis import list_shards
from shardflow.fetch.registration import register_consumer
from shardflow.spark.source.execute import read_partition
from shardflow.spark.source.options import (
    ConsumerType,
    SourceOptions,
    parse_options,
    shards_per_task_for,
)
from shardflow.spark.source.partition import ShardPartition, tasks_of
from shardflow.spark.source.positions import ShardPosition
from shardflow.spark.source.runtime import runner
from shardflow.spark.source.shard_read import ShardReadPlan


class ShardflowBatchReader(DataSourceReader):
    """Reads a range of every shard of a stream as one Spark job."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        kinesis = runner().kinesis(options.connection.aws_settings())
        listing = runner().run(list_shards(kinesis, options.stream))
        consumer_arn = self._consumer_arn(kinesis)
        plans: list[ShardReadPlan] = []
        for shard in listing:
            start = options.starting.for_shard(shard.shard_id)
            if not isinstance(start, ShardPosition):
                continue  # LATEST for one shard of a batch read: nothing to read there
            end_sequence = options.ending.sequence_for(shard.shard_id)
            plan = ShardReadPlan(
                stream=options.stream,
                stream_label=options.connection.stream_label,
                shard_id=shard.shard_id,
                start=start,
                until=None if end_sequence is None else ShardPosition.after(end_sequence),
                cutoff_ms=options.ending.timestamp_ms,
                deaggregate=options.deaggregate,
                fail_on_data_loss=options.fail_on_data_loss,
                consumer_arn=consumer_arn,
                hash_range=shard.hash_range,
            )
            plans.append(plan)
        aws = options.connection.aws_settings()
        return [
            ShardPartition(group, aws, None)
            for group in tasks_of(plans, shards_per_task_for(len(plans), options.shards_per_task))
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ShardPartition)
        return read_partition(partition)

    def _consumer_arn(self, kinesis: Any) -> str | None:
        options = self.options
        if options.consumer_type is not ConsumerType.EFO or options.consumer_name is None:
            return None
        consumer = runner().run(register_consumer(kinesis, options.stream, options.consumer_name))
        return consumer.arn


def batch_reader_for(options: Mapping[str, str]) -> ShardflowBatchReader:
    return ShardflowBatchReader(parse_options(options, streaming=False))
