"""Records as GetRecords returns them, turned into :class:`~shardflow.records.Record`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardflow.records import Record


def record_from_kinesis(raw: Mapping[str, Any], *, shard_id: str, stream_name: str) -> Record:
    """One element of GetRecords' ``Records`` as a plain (not deaggregated) :class:`Record`."""
    return Record(
        data=bytes(raw["Data"]),
        partition_key=raw["PartitionKey"],
        sequence_number=raw["SequenceNumber"],
        approximate_arrival_timestamp=raw.get("ApproximateArrivalTimestamp"),
        shard_id=shard_id,
        stream_name=stream_name,
    )
