"""The producer writes to a stream of another account, given by ARN, with a role to assume."""

from __future__ import annotations

from shardflow.aws import AwsSettings
from shardflow.aws.settings import AssumeRole
from shardflow.producer import Producer, ProducerSettings
from support.accounts import ROLE_ARN, other_account_stream, read_all


async def test_writes_to_another_accounts_stream_by_arn(moto_url: str, stream_name: str) -> None:
    other = other_account_stream(moto_url, stream_name, shards=2, region="eu-west-1")
    written = [(f"key-{i % 7}", f"record-{i}".encode()) for i in range(120)]
    aws = AwsSettings(endpoint_url=moto_url, role=AssumeRole(ROLE_ARN, session_name="writer"))
    # max_concurrent_requests=1: moto numbers records without a lock (see test_producer_moto).
    async with Producer(
        other.arn, settings=ProducerSettings(max_concurrent_requests=1), aws=aws
    ) as producer:
        results = [await producer.put(data, partition_key=key) for key, data in written]
        await producer.flush()
        for result in results:
            await result
    # Read back by the other account's own keys: the records are in its stream.
    assert sorted(read_all(other.kinesis, stream_name)) == sorted(written)
