"""The embedded moto processes requests one at a time, so concurrent writes behave as on AWS.

Plain ``moto.server`` fails both tests now and then: concurrent PutRecords to one shard can get
the same sequence number (one record silently replaces the other), and concurrent conditional
puts can all see ``attribute_not_exists`` hold.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError


def _client(service: str, url: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        service, endpoint_url=url, region_name="us-east-1", config=Config(max_pool_connections=32)
    )


def test_concurrent_put_records_to_one_shard_lose_nothing(moto_url: str, stream_name: str) -> None:
    kinesis = _client("kinesis", moto_url)
    kinesis.create_stream(StreamName=stream_name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=stream_name)

    def put(batch: int) -> list[str]:
        entries = [{"Data": f"{batch}-{i}".encode(), "PartitionKey": "k"} for i in range(25)]
        response = kinesis.put_records(StreamName=stream_name, Records=entries)
        assert response["FailedRecordCount"] == 0
        return [r["SequenceNumber"] for r in response["Records"]]

    with ThreadPoolExecutor(max_workers=16) as pool:
        sequence_numbers = [s for batch in pool.map(put, range(64)) for s in batch]
    assert len(set(sequence_numbers)) == len(sequence_numbers) == 64 * 25

    shard_id = kinesis.list_shards(StreamName=stream_name)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(
        StreamName=stream_name, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    stored = kinesis.get_records(ShardIterator=iterator, Limit=10_000)["Records"]
    assert sorted(r["Data"] for r in stored) == sorted(
        f"{b}-{i}".encode() for b in range(64) for i in range(25)
    )


def test_concurrent_conditional_puts_have_exactly_one_winner(
    moto_url: str, stream_name: str
) -> None:
    dynamodb = _client("dynamodb", moto_url)
    table = f"race-{stream_name}"
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )

    def claim(round_and_worker: tuple[int, int]) -> tuple[int, bool]:
        key, worker = round_and_worker
        try:
            dynamodb.put_item(
                TableName=table,
                Item={"k": {"S": str(key)}, "owner": {"S": str(worker)}},
                ConditionExpression="attribute_not_exists(k)",
            )
            return key, True
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return key, False

    attempts = [(key, worker) for key in range(20) for worker in range(8)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(claim, attempts))
    winners = {key: sum(won for k, won in outcomes if k == key) for key in range(20)}
    assert winners == dict.fromkeys(range(20), 1)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTTP_PROXY", raising=False)
