"""Records as GetRecords returns them, turned into :class:`~shardflow.records.Record`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shardflow.records import Record, RecordBuilder, build_record


def record_from_kinesis(
    raw: Mapping[str, Any], *, shard_id: str, stream_name: str, build: RecordBuilder = build_record
) -> Record:
    """One element of GetRecords' ``Records`` as a plain (not deaggregated) :class:`Record`."""
    return records_from_kinesis((raw,), shard_id=shard_id, stream_name=stream_name, build=build)[0]


def records_from_kinesis(
    raws: Iterable[Mapping[str, Any]],
    *,
    shard_id: str,
    stream_name: str,
    build: RecordBuilder = build_record,
) -> list[Record]:
    """:func:`record_from_kinesis` of every element, in one loop (the per-record path: a
    GetRecords answer holds up to 10,000 records)."""
    return [
        build(
            raw["Data"] if type(raw["Data"]) is bytes else bytes(raw["Data"]),
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
        for raw in raws
    ]
