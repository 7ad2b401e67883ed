"""What Spark ships to an executor task: the read plans of its shards and where to record
their ends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from pyspark.sql.datasource import InputPartition

from shardflow.aws.settings import AwsSettings
from shardflow.spark.source.metadata_location import MetadataLocation
from shardflow.spark.source.shard_read import ShardReadPlan

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchSlot:
    """Which micro-batch of which run a streaming task belongs to, and the metadata store."""

    metadata: MetadataLocation
    run_id: str
    batch: int


class ShardPartition(InputPartition):
    """One Spark task: read each shard as its plan says, side by side (and, when streaming,
    record each shard's end as soon as all its rows are handed out)."""

    def __init__(
        self,
        plans: ShardReadPlan | Sequence[ShardReadPlan],
        aws: AwsSettings,
        slot: BatchSlot | None,
    ) -> None:
        self.plans: tuple[ShardReadPlan, ...] = (
            (plans,) if isinstance(plans, ShardReadPlan) else tuple(plans)
        )
        if not self.plans:
            raise ValueError("a partition reads at least one shard")
        super().__init__(",".join(plan.shard_id for plan in self.plans))
        self.aws = aws
        self.slot = slot

    @property
    def plan(self) -> ShardReadPlan:
        """The plan of a partition of one shard."""
        if len(self.plans) != 1:
            raise ValueError(f"this partition reads {len(self.plans)} shards")
        return self.plans[0]

    def __repr__(self) -> str:
        shards = ", ".join(f"{plan.shard_id} from {plan.start}" for plan in self.plans)
        return f"ShardPartition({shards})"


def tasks_of(items: Sequence[T], per_task: int) -> list[list[T]]:
    """``items`` (in order) cut into the fewest runs of at most ``per_task``, their sizes
    differing by one at most (10 by 4: 4, 3, 3, not 4, 4, 2): no task is left short."""
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    if not items:
        return []
    count = -(-len(items) // per_task)
    base, extra = divmod(len(items), count)
    tasks: list[list[T]] = []
    start = 0
    for index in range(count):
        size = base + (1 if index < extra else 0)
        tasks.append(list(items[start : start + size]))
        start += size
    return tasks
