"""Reads and lease writes through shardflow's clients, whose own requests skip botocore's
parameter validation (moto over HTTP): records are read, renewals and checkpoints written,
and a stale write is still refused by its condition; the same with a user's config that asks
for validation of every call."""

from __future__ import annotations

import uuid

import boto3
import pytest
from botocore.config import Config

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.validation import OwnRequestsUnvalidated
from shardflow.fetch.polling import Polling, PollingFetcher
from shardflow.leases import DynamoDBLeaseStore, Lease
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.positions import StartPosition
from shardflow.records import ExtendedSequenceNumber

MAX_POLLS = 20  # an empty answer now and then is normal; 3 records come within a few


@pytest.mark.parametrize("validate_all", [False, True], ids=["own-unvalidated", "all-validated"])
async def test_reads_and_lease_writes_work(
    moto_url: str, stream_name: str, validate_all: bool
) -> None:
    user = Config(parameter_validation=True) if validate_all else None
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url, botocore_config=user))
    plain = boto3.client("kinesis", endpoint_url=moto_url)
    plain.create_stream(StreamName=stream_name, ShardCount=1)
    plain.get_waiter("stream_exists").wait(StreamName=stream_name)
    for i in range(3):
        plain.put_record(StreamName=stream_name, Data=b"r%d" % i, PartitionKey="k")
    async with (
        factory.kinesis(own_requests=True) as kinesis,
        factory.dynamodb(own_requests=True) as dynamodb,
    ):
        # Kinesis: behind the one-pass PutRecords writer (see shardflow.aws.kinesis_json).
        skipping = isinstance(kinesis._serializer._wrapped, OwnRequestsUnvalidated)
        assert skipping is not validate_all
        assert isinstance(dynamodb._serializer, OwnRequestsUnvalidated) is not validate_all

        fetcher = PollingFetcher(
            kinesis,
            stream_name,
            "shardId-000000000000",
            StartPosition.trim_horizon(),
            Polling(idle_time=0.0),
        )
        read: list[bytes] = []
        for _ in range(MAX_POLLS):
            batch = await anext(fetcher)
            read.extend(record.data for record in batch.records)
            if len(read) >= 3:
                break
        assert read == [b"r0", b"r1", b"r2"]

        store = DynamoDBLeaseStore(dynamodb, f"app-{uuid.uuid4().hex[:8]}")
        await store.ensure_table()
        created = await store.create_if_absent(Lease(lease_key="shardId-000000000000"))
        held = await store.take(created, "w1")
        renewed = await store.renew(await store.renew(held, "w1"), "w1")
        assert renewed.lease_counter == held.lease_counter + 2
        position = ExtendedSequenceNumber(fetcher.last_sequence_number or "0")
        checkpointed = await store.checkpoint(renewed, "w1", position)
        assert checkpointed.checkpoint == position
        # The condition (owner and counter) is the server's: a stale renewal is refused.
        with pytest.raises(LeaseConditionFailedError):
            await store.renew(held, "w1")
        assert await store.get("shardId-000000000000") == checkpointed
