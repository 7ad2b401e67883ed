"""What a fetcher hands over: one GetRecords result of one shard as plain records, with lineage.

:func:`batch_from_kinesis` turns a GetRecords answer (or a SubscribeToShardEvent) into a
:class:`FetchedBatch` of plain :class:`~shardflow.records.Record` objects, not deaggregated:
what becomes of them (intake, delivery) is the reader's part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardflow.records import Record, RecordBuilder, build_record
from shardflow.shards import ChildShard


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """The records of one GetRecords call, exactly as Kinesis returned them (not deaggregated).

    ``millis_behind_latest`` is None when the service did not say. On the last batch of a closed
    shard ``shard_ended`` is True and ``child_shards`` lists the shards that continue it (empty
    if the service does not report them: read the parent ids from ListShards then).
    """

    shard_id: str
    records: list[Record]
    millis_behind_latest: int | None
    shard_ended: bool = False
    child_shards: tuple[ChildShard, ...] = field(default=())

    @property
    def has_next_iterator(self) -> bool:
        """Whether GetRecords returned a next iterator (False only at shard end)."""
        return not self.shard_ended

    @property
    def caught_up(self) -> bool:
        """No more records to read for now: an empty batch at the tip, or the shard's end.

        An empty batch alone is not enough: Kinesis returns empty batches while it walks past
        stretches of a shard's history that hold no records, with MillisBehindLatest > 0.
        """
        if self.shard_ended:
            return True
        return not self.records and not self.millis_behind_latest

    @property
    def last_sequence_number(self) -> str | None:
        return self.records[-1].sequence_number if self.records else None


def batch_from_kinesis(
    body: Mapping[str, Any],
    *,
    shard_id: str,
    stream_name: str,
    shard_ended: bool,
    build: RecordBuilder = build_record,
) -> FetchedBatch:
    """A GetRecords answer or a SubscribeToShardEvent as one batch; ``shard_ended`` is the
    caller's reading of ``body`` (the two say it differently). ``build`` makes each record
    (see :func:`records_from_kinesis`)."""
    return FetchedBatch(
        shard_id=shard_id,
        records=records_from_kinesis(
            body.get("Records", ()), shard_id=shard_id, stream_name=stream_name, build=build
        ),
        millis_behind_latest=body.get("MillisBehindLatest"),
        shard_ended=shard_ended,
        child_shards=tuple(ChildShard.from_api(c) for c in body.get("ChildShards", ())),
    )


def record_from_kinesis(raw: Mapping[str, Any], *, shard_id: str, stream_name: str) -> Record:
    """One element of GetRecords' ``Records`` as a plain (not deaggregated) :class:`Record`."""
    return records_from_kinesis((raw,), shard_id=shard_id, stream_name=stream_name)[0]


def records_from_kinesis(
    raws: Iterable[Mapping[str, Any]],
    *,
    shard_id: str,
    stream_name: str,
    build: RecordBuilder = build_record,
) -> list[Record]:
    """:func:`record_from_kinesis` of every element, in one loop (the per-record path: a
    GetRecords answer holds up to 10,000 records). ``build`` makes each record from the values
    of :data:`~shardflow.records.RECORD_FIELDS`: a plain :class:`Record` by default; the
    consumer has them made as the type it hands out, so that a record is one object from the
    fetch to the handler (a second object per record is a tenth of a batch handler's CPU, most
    of it in the garbage collector)."""
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
