"""Records as GetRecords returns them, turned into :class:`~shardflow.records.Record`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardflow.records import Record, build_record


def record_from_kinesis(raw: Mapping[str, Any], *, shard_id: str, stream_name: str) -> Record:
    """One element of GetRecords' ``Records`` as a plain (not deaggregated) :class:`Record`."""
    return build_record(
        bytes(raw["Data"]),
        raw["PartitionKey"],
        raw["SequenceNumber"],
        0,
        None,
        raw.get("ApproximateArrivalTimestamp"),
        shard_id,
        stream_name,
        False,
        0,
        False,
    )
