"""A shard split while the producer writes (kinesis-local, which closes split shards for real).

The producer is not told about the split: it notices that records land on shards it did not
predict, lists the shards again, and from then on predicts the children. Nothing is lost.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from shardflow.aws import AwsSettings
from shardflow.producer import Producer, ProducerSettings, PutResult
from shardflow.shards import MAX_HASH_KEY
from support.boto import boto_client, make_stream, stored_records

PARENT = "shardId-000000000000"


def read_all(url: str, stream: str) -> list[tuple[str, str, bytes]]:
    """(shard id, partition key, data) of every record in every shard, closed ones included."""
    return [(shard_id, r["PartitionKey"], r["Data"]) for shard_id, r in stored_records(url, stream)]


def split_first_shard(url: str, stream: str) -> list[str]:
    """Split the first shard in two halves and wait for the stream; returns the open shard ids."""
    kinesis = boto_client("kinesis", url)
    kinesis.split_shard(
        StreamName=stream, ShardToSplit=PARENT, NewStartingHashKey=str((MAX_HASH_KEY // 2) // 2)
    )
    kinesis.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 200}
    )
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    return [s["ShardId"] for s in shards if "EndingSequenceNumber" not in s["SequenceNumberRange"]]


@pytest.mark.timeout(120)
async def test_a_split_while_producing_is_followed_and_nothing_is_lost(
    kinesis_local_url: str, stream_name: str
) -> None:
    make_stream(kinesis_local_url, stream_name, 2, max_attempts=200)
    settings = ProducerSettings(linger=0.01, min_shard_refresh_interval=0.1)
    written: list[tuple[str, bytes, asyncio.Future[PutResult]]] = []
    keys = [f"key-{n}" for n in range(40)]

    async with Producer(
        stream_name, settings=settings, aws=AwsSettings(endpoint_url=kinesis_local_url)
    ) as producer:

        async def wave(label: str, count: int) -> None:
            for n in range(count):
                key = keys[n % len(keys)]
                data = f"{label}-{n}".encode()
                written.append((key, data, await producer.put(data, key)))

        await wave("before", 120)
        await producer.flush()
        assert producer.predict_shard(keys[0]) is not None

        # Keep writing while the shard splits.
        split = asyncio.create_task(
            asyncio.to_thread(split_first_shard, kinesis_local_url, stream_name)
        )
        during = 0
        while not split.done():
            await wave(f"during{during}", 20)
            during += 1
            await asyncio.sleep(0.02)
        open_shards = await split
        assert during >= 1  # records were being written while the shard split
        assert PARENT not in open_shards
        await producer.flush()

        await wave("after", 160)
        await producer.flush()
        after = [
            (key, future.result()) for key, data, future in written if data.startswith(b"after")
        ]
        # The producer now predicts the children, and Kinesis agrees with every prediction.
        # Plain records that land on an unpredicted shard ask for a listing without waiting
        # for it (at most one per min_shard_refresh_interval, 0.1 s here): allow up to 5 s.
        for _ in range(50):
            if all(producer.predict_shard(key) == result.shard_id for key, result in after):
                break
            await asyncio.sleep(0.1)
        for key, result in after:
            assert result.shard_id in open_shards
            assert producer.predict_shard(key) == result.shard_id
        assert {r.shard_id for _, r in after} == set(open_shards)
        assert producer.metrics().shard_map_refreshes >= 2

    assert all(future.exception() is None for _, _, future in written)
    landed = read_all(kinesis_local_url, stream_name)
    assert Counter(data for _, _, data in landed) == Counter(data for _, data, _ in written)
    # Each record is in the shard its result named.
    where = {data: shard_id for shard_id, _, data in landed}
    assert all(where[data] == future.result().shard_id for _, data, future in written)
