"""Kinesis through shardflow's async clients: a client for an emulator, a stream ready to use,
records written (and checked written).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import list_shards, wait_for_active
from shardflow.shards import ShardInfo

#: The most records one PutRecords call takes.
PUT_RECORDS_LIMIT = 500


@asynccontextmanager
async def kinesis_at(url: str) -> AsyncIterator[Any]:
    """An async Kinesis client for the emulator at ``url``."""
    async with ClientFactory(AwsSettings(endpoint_url=url)).kinesis() as kinesis:
        yield kinesis


async def create_stream(kinesis: Any, name: str, shards: int) -> dict[str, Any]:
    """Create a stream of ``shards`` shards and wait until it is ACTIVE; returns its summary."""
    await kinesis.create_stream(StreamName=name, ShardCount=shards)
    return await wait_for_active(kinesis, name)


async def put(kinesis: Any, stream: str, items: list[tuple[str, bytes]]) -> list[tuple[str, str]]:
    """Write ``(key, data)`` items in order; returns each one's (shard id, sequence number).

    Fails the test if the stream refused any of them.
    """
    placed: list[tuple[str, str]] = []
    for i in range(0, len(items), PUT_RECORDS_LIMIT):
        chunk = items[i : i + PUT_RECORDS_LIMIT]
        answer = await kinesis.put_records(
            StreamName=stream, Records=[{"PartitionKey": k, "Data": d} for k, d in chunk]
        )
        assert answer.get("FailedRecordCount", 0) == 0
        placed += [(e["ShardId"], e["SequenceNumber"]) for e in answer["Records"]]
    return placed


def last_per_shard(placed: list[tuple[str, str]]) -> dict[str, str]:
    """The highest sequence number written to each shard, from ``put``'s answer."""
    last: dict[str, str] = {}
    for shard_id, sequence_number in placed:
        last[shard_id] = max(last.get(shard_id, "0"), sequence_number, key=int)
    return last


async def create_stream_holding(
    kinesis: Any, name: str, shards: int, items: list[tuple[str, bytes]]
) -> list[tuple[str, str]]:
    """:func:`create_stream`, then :func:`put` ``items`` in it; returns :func:`put`'s answer."""
    await create_stream(kinesis, name, shards)
    return await put(kinesis, name, items)


async def split_in_half(kinesis: Any, stream: str, shard: ShardInfo) -> None:
    """Split ``shard`` at the middle of its hash key range and wait until the stream is ACTIVE."""
    middle = (shard.hash_range.start + shard.hash_range.end + 1) // 2
    await kinesis.split_shard(
        StreamName=stream, ShardToSplit=shard.shard_id, NewStartingHashKey=str(middle)
    )
    await wait_for_active(kinesis, stream)


async def merge_children(kinesis: Any, stream: str, parent_id: str) -> None:
    """Merge the two open children of split shard ``parent_id`` again and wait until the
    stream is ACTIVE."""
    children = sorted(
        s.shard_id
        for s in await list_shards(kinesis, stream)
        if s.is_open and parent_id in s.parent_ids
    )
    await kinesis.merge_shards(
        StreamName=stream, ShardToMerge=children[0], AdjacentShardToMerge=children[1]
    )
    await wait_for_active(kinesis, stream)
