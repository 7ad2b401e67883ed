"""The source's offset: what one micro-batch reads, as the JSON Spark logs in its checkpoint.

An offset names the batch (``batch``, -1 before the first one), the position every known
shard starts at in that batch (``shards``), which shards the batch reads and how many rows
each may give at most (``read``; -1 means no limit), the run it belongs to (``run``, which
keys the metadata store) and, under Trigger.AvailableNow, the arrival-time cutoff
(``until``). Where the batch *ends* is not in the offset: each task records it in the
metadata store the first time it reads its shard, and the next offset starts there.

Spark compares offsets as JSON strings, so every dict is built with sorted keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardflow.errors import SourceMetadataError
from shardflow.spark.source.positions import ShardPosition

VERSION = 1
UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class SourceOffset:
    run: str
    batch: int
    shards: Mapping[str, ShardPosition]
    read: Mapping[str, int] = field(default_factory=dict)
    until_ms: int | None = None
    data_loss_events: int = 0
    # The losses the previous batch found, per shard ("after X, resumed at Y"): shown once.
    data_lost: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        raw: dict[str, Any] = {
            "batch": self.batch,
            "dataLossEvents": self.data_loss_events,
            "read": {shard: self.read[shard] for shard in sorted(self.read)},
            "run": self.run,
            "shards": {shard: self.shards[shard].to_text() for shard in sorted(self.shards)},
        }
        if self.data_lost:
            raw["lastDataLoss"] = {shard: self.data_lost[shard] for shard in sorted(self.data_lost)}
        if self.until_ms is not None:
            raw["until"] = self.until_ms
        raw["v"] = VERSION
        return dict(sorted(raw.items()))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SourceOffset:
        try:
            if raw.get("v") != VERSION:
                raise ValueError(f"unknown offset version {raw.get('v')!r}")
            until = raw.get("until")
            return cls(
                run=str(raw["run"]),
                batch=int(raw["batch"]),
                shards={
                    str(shard): ShardPosition.from_text(str(text))
                    for shard, text in dict(raw["shards"]).items()
                },
                read={str(shard): int(limit) for shard, limit in dict(raw["read"]).items()},
                until_ms=None if until is None else int(until),
                data_loss_events=int(raw.get("dataLossEvents", 0)),
                data_lost={str(k): str(v) for k, v in dict(raw.get("lastDataLoss", {})).items()},
            )
        except (KeyError, TypeError, ValueError) as error:
            raise SourceMetadataError(
                f"not an offset of the shardflow source: {dict(raw)!r} ({error})"
            ) from error
