"""Where each micro-batch ended, per shard: the record that makes replays read the same records.

Stored under ``<metadataPath>/<run id>/<batch, 12 digits>/<shard id>`` by one of the stores of
:mod:`shardflow.spark.source.metadata_store` (S3, DynamoDB or a shared directory). The run id
comes from the query's first offset, so a new query (new checkpoint) never sees an old
query's ends.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from shardflow.spark.source.positions import Kind, ShardPosition

StopReason = Literal["tip", "budget", "cutoff", "end", "until"]


@dataclass(frozen=True, slots=True)
class DataLoss:
    """Records skipped because they were gone: after ``after``, up to ``resumed_at``."""

    after: str
    resumed_at: str | None


@dataclass(frozen=True, slots=True)
class ShardBatchEnd:
    """How reading one shard in one micro-batch ended.

    ``end`` is where the next batch starts (``SHARD_END`` once the shard is fully read);
    ``rows`` how many rows the batch held; ``stopped`` why reading stopped (``budget`` means
    more records are known to wait); ``lost`` any records found missing; ``start`` where the
    batch started (None in ends recorded before it was kept), so that an end is never applied
    to a batch that started elsewhere.
    """

    end: str
    rows: int
    stopped: StopReason
    lost: DataLoss | None = None
    start: str | None = None

    @property
    def position(self) -> ShardPosition:
        return ShardPosition.from_text(self.end)

    @property
    def shard_ended(self) -> bool:
        return self.position.kind is Kind.SHARD_END

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ShardBatchEnd:
        raw: dict[str, Any] = json.loads(text)
        lost = raw.get("lost")
        return cls(
            end=str(raw["end"]),
            rows=int(raw["rows"]),
            stopped=raw["stopped"],
            lost=DataLoss(**lost) if lost else None,
            start=None if raw.get("start") is None else str(raw["start"]),
        )
