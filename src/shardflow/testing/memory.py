"""An in-memory Kinesis for unit tests of code that consumes with shardflow.

:class:`MemoryKinesis` stands in for the aiobotocore Kinesis client the consumer uses: the
calls ``list_shards``, ``get_shard_iterator``, ``get_records``, ``describe_stream_summary``,
``put_record`` and ``put_records`` answer with the same shapes as the service (errors are
botocore ``ClientError`` with the service's codes), plus ``split_shard`` and ``merge_shards``
so resharding can be tested. Feed it with :meth:`MemoryKinesis.put` (or ``put_records``), hand
it to :class:`~shardflow.consumer.Consumer` as ``clients=OpenClients(kinesis=...)``
(:class:`~shardflow.aws.OpenClients`) together with an
:class:`~shardflow.leases.InMemoryLeaseStore`, or let
:func:`shardflow.testing.consume_until_caught_up` wire everything.

This is a fake for *your* tests: it enforces no limits, never throttles and keeps every record
forever. shardflow's own behaviour is tested against real emulators over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from botocore.exceptions import ClientError

from shardflow.shards import MAX_HASH_KEY, HashKeyRange, hash_key_of, partition_key_hash

ACCOUNT_ID: Final = "123456789012"
REGION: Final = "us-east-1"
_FIRST_SEQUENCE: Final = 49_000_000_000_000_000_000


def _error(code: str, message: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


@dataclass(slots=True)
class _Stored:
    data: bytes
    partition_key: str
    sequence_number: str
    arrival: datetime
    explicit_hash_key: str | None = None


@dataclass(slots=True)
class _Shard:
    shard_id: str
    hash_range: HashKeyRange
    starting_sequence_number: str
    parents: tuple[str, ...] = ()
    records: list[_Stored] = field(default_factory=list)
    ending_sequence_number: str | None = None
    children: tuple[str, ...] = ()
    tip_read: bool = True
    """A GetRecords call found no record after what it returned, since the last put."""

    @property
    def is_open(self) -> bool:
        return self.ending_sequence_number is None

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "ShardId": self.shard_id,
            "HashKeyRange": {
                "StartingHashKey": str(self.hash_range.start),
                "EndingHashKey": str(self.hash_range.end),
            },
            "SequenceNumberRange": {"StartingSequenceNumber": self.starting_sequence_number},
        }
        if self.parents:
            described["ParentShardId"] = self.parents[0]
        if len(self.parents) > 1:
            described["AdjacentParentShardId"] = self.parents[1]
        if self.ending_sequence_number is not None:
            described["SequenceNumberRange"]["EndingSequenceNumber"] = self.ending_sequence_number
        return described


@dataclass(slots=True)
class _Stream:
    name: str
    created: datetime
    shards: dict[str, _Shard] = field(default_factory=dict)

    @property
    def arn(self) -> str:
        return f"arn:aws:kinesis:{REGION}:{ACCOUNT_ID}:stream/{self.name}"


class MemoryKinesis:
    """Kinesis streams in memory, answering like an aiobotocore Kinesis client (module doc)."""

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self._sequence = _FIRST_SEQUENCE
        self._shard_counter: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        """How often each client call was made, by operation name (for assertions)."""

    # --- setting up and feeding ----------------------------------------------------------------

    def create_stream(self, name: str, shard_count: int = 1) -> None:
        """A stream of ``shard_count`` open shards splitting the hash-key space evenly."""
        if name in self._streams:
            raise _error("ResourceInUseException", f"Stream {name} already exists", "CreateStream")
        if shard_count < 1:
            raise ValueError("a stream needs at least one shard")
        stream = self._streams[name] = _Stream(name, datetime.now(UTC))
        width = (MAX_HASH_KEY + 1) // shard_count
        for index in range(shard_count):
            end = MAX_HASH_KEY if index == shard_count - 1 else (index + 1) * width - 1
            self._new_shard(stream, HashKeyRange(index * width, end))

    def put(
        self,
        stream: str,
        data: bytes,
        partition_key: str,
        *,
        explicit_hash_key: str | None = None,
    ) -> tuple[str, str]:
        """Append one record to the open shard its hash key maps to; (shard id, sequence number)."""
        target = self._stream(stream, "PutRecord")
        hash_key = hash_key_of(partition_key, explicit_hash_key)
        for shard in target.shards.values():
            if shard.is_open and hash_key in shard.hash_range:
                sequence_number = self._next_sequence()
                shard.records.append(
                    _Stored(
                        data,
                        partition_key,
                        sequence_number,
                        datetime.now(UTC),
                        explicit_hash_key,
                    )
                )
                shard.tip_read = False
                return shard.shard_id, sequence_number
        raise AssertionError(f"no open shard of {stream} holds hash key {hash_key}")

    def put_many(self, stream: str, items: Iterable[tuple[str, bytes]]) -> list[tuple[str, str]]:
        """:meth:`put` for ``(partition key, data)`` items, in order."""
        return [self.put(stream, data, key) for key, data in items]

    def shard_ids(self, stream: str, *, open_only: bool = False) -> list[str]:
        return sorted(
            s.shard_id
            for s in self._stream(stream, "").shards.values()
            if s.is_open or not open_only
        )

    def records(self, stream: str, shard_id: str) -> list[tuple[str, str, bytes]]:
        """(sequence number, partition key, data) of every record of a shard, in order."""
        shard = self._shard(self._stream(stream, ""), shard_id, "")
        return [(r.sequence_number, r.partition_key, r.data) for r in shard.records]

    def unread_shards(self, stream: str) -> list[str]:
        """Shards with records (or an end) no GetRecords call has reached since the last put."""
        return sorted(
            s.shard_id for s in self._stream(stream, "").shards.values() if not s.tip_read
        )

    # --- client calls (the subset shardflow's consumer uses) ----------------------------------

    async def describe_stream_summary(self, **params: Any) -> dict[str, Any]:
        stream = self._named(params, "DescribeStreamSummary")
        await self._called("DescribeStreamSummary")
        return {
            "StreamDescriptionSummary": {
                "StreamName": stream.name,
                "StreamARN": stream.arn,
                "StreamStatus": "ACTIVE",
                "StreamCreationTimestamp": stream.created,
                "OpenShardCount": sum(1 for s in stream.shards.values() if s.is_open),
                "RetentionPeriodHours": 24,
            }
        }

    async def list_shards(self, **params: Any) -> dict[str, Any]:
        """Every shard in one page (ShardFilter and MaxResults are not applied)."""
        stream = self._named(params, "ListShards")
        await self._called("ListShards")
        return {"Shards": [shard.describe() for shard in stream.shards.values()]}

    async def get_shard_iterator(self, **params: Any) -> dict[str, Any]:
        stream = self._named(params, "GetShardIterator")
        shard = self._shard(stream, params.get("ShardId", ""), "GetShardIterator")
        await self._called("GetShardIterator")
        kind = params.get("ShardIteratorType")
        records = shard.records
        if kind == "TRIM_HORIZON":
            index = 0
        elif kind == "LATEST":
            index = len(records)
        elif kind == "AT_TIMESTAMP":
            moment = params["Timestamp"]
            if not isinstance(moment, datetime):
                moment = datetime.fromtimestamp(float(moment), UTC)
            index = next((i for i, r in enumerate(records) if r.arrival >= moment), len(records))
        elif kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
            wanted = int(params.get("StartingSequenceNumber", ""))
            after = kind == "AFTER_SEQUENCE_NUMBER"
            index = next(
                (
                    i
                    for i, r in enumerate(records)
                    if int(r.sequence_number) > wanted
                    or (not after and int(r.sequence_number) == wanted)
                ),
                len(records),
            )
        else:
            raise _error(
                "InvalidArgumentException", f"unknown ShardIteratorType {kind}", "GetShardIterator"
            )
        return {"ShardIterator": f"{stream.name}|{shard.shard_id}|{index}"}

    async def get_records(self, **params: Any) -> dict[str, Any]:
        await self._called("GetRecords")
        try:
            name, shard_id, position = str(params["ShardIterator"]).split("|")
            index = int(position)
        except (KeyError, ValueError):
            raise _error(
                "InvalidArgumentException", "invalid ShardIterator", "GetRecords"
            ) from None
        stream = self._stream(name, "GetRecords")
        shard = self._shard(stream, shard_id, "GetRecords")
        limit = int(params.get("Limit", 10_000))
        returned = shard.records[index : index + limit]
        after = index + len(returned)
        remaining = shard.records[after:]
        if not remaining:
            shard.tip_read = True
        answer: dict[str, Any] = {
            "Records": [
                {
                    "Data": r.data,
                    "PartitionKey": r.partition_key,
                    "SequenceNumber": r.sequence_number,
                    "ApproximateArrivalTimestamp": r.arrival,
                }
                for r in returned
            ],
            "MillisBehindLatest": self._behind(remaining),
        }
        if shard.is_open or remaining:
            answer["NextShardIterator"] = f"{name}|{shard_id}|{after}"
        else:
            answer["ChildShards"] = [
                {
                    "ShardId": child.shard_id,
                    "ParentShards": list(child.parents),
                    "HashKeyRange": child.describe()["HashKeyRange"],
                }
                for child in (stream.shards[c] for c in shard.children)
            ]
        return answer

    async def put_record(self, **params: Any) -> dict[str, Any]:
        await self._called("PutRecord")
        shard_id, sequence_number = self.put(
            self._named(params, "PutRecord").name,
            bytes(params["Data"]),
            params["PartitionKey"],
            explicit_hash_key=params.get("ExplicitHashKey"),
        )
        return {"ShardId": shard_id, "SequenceNumber": sequence_number}

    async def put_records(self, **params: Any) -> dict[str, Any]:
        await self._called("PutRecords")
        name = self._named(params, "PutRecords").name
        results = []
        for entry in params["Records"]:
            shard_id, sequence_number = self.put(
                name,
                bytes(entry["Data"]),
                entry["PartitionKey"],
                explicit_hash_key=entry.get("ExplicitHashKey"),
            )
            results.append({"ShardId": shard_id, "SequenceNumber": sequence_number})
        return {"FailedRecordCount": 0, "Records": results}

    async def split_shard(self, **params: Any) -> dict[str, Any]:
        stream = self._named(params, "SplitShard")
        parent = self._open_shard(stream, params["ShardToSplit"], "SplitShard")
        middle = int(params["NewStartingHashKey"])
        if not parent.hash_range.start < middle <= parent.hash_range.end:
            raise _error(
                "InvalidArgumentException", "NewStartingHashKey out of range", "SplitShard"
            )
        await self._called("SplitShard")
        self._close(parent)
        low = self._new_shard(
            stream, HashKeyRange(parent.hash_range.start, middle - 1), (parent.shard_id,)
        )
        high = self._new_shard(
            stream, HashKeyRange(middle, parent.hash_range.end), (parent.shard_id,)
        )
        parent.children = (low.shard_id, high.shard_id)
        return {}

    async def merge_shards(self, **params: Any) -> dict[str, Any]:
        stream = self._named(params, "MergeShards")
        first = self._open_shard(stream, params["ShardToMerge"], "MergeShards")
        second = self._open_shard(stream, params["AdjacentShardToMerge"], "MergeShards")
        low, high = sorted((first, second), key=lambda s: s.hash_range.start)
        if low.hash_range.end + 1 != high.hash_range.start:
            raise _error("InvalidArgumentException", "shards are not adjacent", "MergeShards")
        await self._called("MergeShards")
        self._close(first)
        self._close(second)
        child = self._new_shard(
            stream,
            HashKeyRange(low.hash_range.start, high.hash_range.end),
            (first.shard_id, second.shard_id),
        )
        first.children = second.children = (child.shard_id,)
        return {}

    # --- plumbing -------------------------------------------------------------------------------

    async def _called(self, operation: str) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        await asyncio.sleep(0)  # a real client yields to the loop on every call

    def _next_sequence(self) -> str:
        self._sequence += 1
        return str(self._sequence)

    def _new_shard(
        self, stream: _Stream, hash_range: HashKeyRange, parents: tuple[str, ...] = ()
    ) -> _Shard:
        number = self._shard_counter.get(stream.name, 0)
        self._shard_counter[stream.name] = number + 1
        shard = _Shard(f"shardId-{number:012d}", hash_range, self._next_sequence(), parents)
        stream.shards[shard.shard_id] = shard
        return shard

    def _close(self, shard: _Shard) -> None:
        shard.ending_sequence_number = self._next_sequence()
        # The shard's end is news to its readers: someone has to read it (and its children).
        shard.tip_read = False

    @staticmethod
    def _behind(remaining: list[_Stored]) -> int:
        if not remaining:
            return 0
        spread = remaining[-1].arrival - remaining[0].arrival
        return max(1, int(spread.total_seconds() * 1000))

    def _stream(self, name: str, operation: str) -> _Stream:
        stream = self._streams.get(name.rsplit("/", 1)[-1] if name.startswith("arn:") else name)
        if stream is None:
            raise _error(
                "ResourceNotFoundException",
                f"Stream {name} under account {ACCOUNT_ID} not found.",
                operation,
            )
        return stream

    def _named(self, params: Mapping[str, Any], operation: str) -> _Stream:
        name = params.get("StreamName") or params.get("StreamARN")
        if not name:
            raise _error(
                "InvalidArgumentException", "StreamName or StreamARN is required", operation
            )
        return self._stream(str(name), operation)

    @staticmethod
    def _shard(stream: _Stream, shard_id: str, operation: str) -> _Shard:
        shard = stream.shards.get(shard_id)
        if shard is None:
            raise _error(
                "ResourceNotFoundException",
                f"Shard {shard_id} in stream {stream.name} not found",
                operation,
            )
        return shard

    def _open_shard(self, stream: _Stream, shard_id: str, operation: str) -> _Shard:
        shard = self._shard(stream, shard_id, operation)
        if not shard.is_open:
            raise _error("ResourceInUseException", f"Shard {shard_id} is closed", operation)
        return shard


def partition_key_in(hash_range: HashKeyRange, prefix: str = "key") -> str:
    """A partition key whose MD5 hash lies in ``hash_range`` (found by trying ``prefix-N``)."""
    for n in range(1_000_000):
        key = f"{prefix}-{n}"
        if partition_key_hash(key) in hash_range:
            return key
    raise ValueError(f"no partition key found for {hash_range}")
