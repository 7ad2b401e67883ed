"""What Spark ships to an executor task: one shard's read plan and where to record its end."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from shardflow.aws.settings import AwsSettings
from shardflow.spark.source.metadata_location import MetadataLocation
from shardflow.spark.source.shard_read import ShardReadPlan


@dataclass(frozen=True, slots=True)
class BatchSlot:
    """Which micro-batch of which run a streaming task belongs to, and the metadata store."""

    metadata: MetadataLocation
    run_id: str
    batch: int


class ShardPartition(InputPartition):
    """One Spark task: read one shard as ``plan`` says (and, when streaming, record its end)."""

    def __init__(self, plan: ShardReadPlan, aws: AwsSettings, slot: BatchSlot | None) -> None:
        super().__init__(plan.shard_id)
        self.plan = plan
        self.aws = aws
        self.slot = slot

    def __repr__(self) -> str:
        return f"ShardPartition({self.plan.shard_id}, from {self.plan.start})"
