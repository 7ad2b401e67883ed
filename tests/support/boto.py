"""Kinesis and DynamoDB through plain boto3, the way a test checks what really happened:
streams created and written independently of shardflow, read back shard by shard, lease
tables read as raw items.
"""

from __future__ import annotations

from typing import Any

import boto3

from shardflow.aggregation import deaggregate
from shardflow.records import Record

#: GetRecords pages read per shard at most (the streams of tests are far smaller).
MAX_PAGES = 1_000


def boto_client(service: str, url: str) -> Any:
    """A boto3 client of ``service`` for the emulator at ``url``."""
    return boto3.client(service, endpoint_url=url, region_name="us-east-1")


def make_stream(url: str, stream: str, shards: int, *, max_attempts: int = 100) -> Any:
    """Create ``stream`` and wait until it exists (polling every 0.1 s); returns the client."""
    kinesis = boto_client("kinesis", url)
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": max_attempts}
    )
    return kinesis


def put_records(kinesis: Any, stream: str, items: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
    """Write ``(key, data)`` items in one PutRecords call; returns its entries (ShardId, ...).

    Fails the test if the stream refused any of them.
    """
    answer = kinesis.put_records(
        StreamName=stream, Records=[{"PartitionKey": k, "Data": d} for k, d in items]
    )
    assert answer.get("FailedRecordCount", 0) == 0
    entries: list[dict[str, Any]] = answer["Records"]
    return entries


def stored_records(url: str, stream: str) -> list[tuple[str, dict[str, Any]]]:
    """Every record in ``stream`` as GetRecords returns it, with its shard id: shard by shard
    (closed shards included), each from TRIM_HORIZON in sequence order."""
    kinesis = boto_client("kinesis", url)
    found: list[tuple[str, dict[str, Any]]] = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        shard_id = shard["ShardId"]
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for _ in range(MAX_PAGES):
            page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
            found += [(shard_id, raw) for raw in page["Records"]]
            iterator = page.get("NextShardIterator")
            if not page["Records"] or not iterator:
                break
    return found


def user_records(url: str, stream: str) -> list[Record]:
    """Every user record in ``stream``, in the order of :func:`stored_records`, KPL aggregates
    unpacked (a malformed aggregate fails the test)."""
    return [
        user
        for shard_id, raw in stored_records(url, stream)
        for user in deaggregate(
            Record(
                data=raw["Data"],
                partition_key=raw["PartitionKey"],
                sequence_number=raw["SequenceNumber"],
                shard_id=shard_id,
                stream_name=stream,
            ),
            on_malformed="raise",
        )
    ]


def lease_items(url: str, table: str) -> dict[str, dict[str, Any]]:
    """A lease table's items in DynamoDB's wire form by lease key; empty while it does not exist."""
    dynamodb = boto_client("dynamodb", url)
    try:
        found = dynamodb.scan(TableName=table, ConsistentRead=True)["Items"]
    except dynamodb.exceptions.ResourceNotFoundException:
        return {}
    return {item["leaseKey"]["S"]: item for item in found}
