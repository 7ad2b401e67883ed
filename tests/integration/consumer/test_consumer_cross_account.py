"""The consumer reads streams of other accounts by ARN with a role per stream; its lease table
stays in its own account (the base credentials)."""

from __future__ import annotations

import boto3

from shardflow.aws import AwsSettings
from shardflow.aws.settings import AssumeRole
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.fetch import Polling
from shardflow.leases.settings import LeaseSettings
from support.accounts import ROLE_ARN, other_account_stream
from support.boto import make_stream, put_records
from support.consuming import consuming
from support.waiting import until

SETTINGS = ConsumerSettings(
    leases=LeaseSettings(failover_time=2.0, renew_interval=0.4, take_interval=0.5),
    fetch=Polling(idle_time=0.1),
    drain_timeout=2.0,
)


async def test_reads_an_own_stream_and_another_accounts_stream_with_its_role(
    moto_url: str, stream_name: str
) -> None:
    own = f"{stream_name}-own"[:128]
    put_records(
        make_stream(moto_url, own, 1), own, [(f"k{i}", f"own-{i}".encode()) for i in range(20)]
    )
    other = other_account_stream(moto_url, stream_name, shards=2)
    other_items = [(f"k{i}", f"other-{i}".encode()) for i in range(30)]
    put_records(other.kinesis, stream_name, other_items)

    app = f"app-{stream_name}"[:255]
    # The role for the other account's stream only: the own stream (and the lease table) are
    # reached with the base credentials.
    aws = AwsSettings(
        endpoint_url=moto_url,
        stream_roles={other.arn: AssumeRole(ROLE_ARN, session_name="billing-reader")},
    )
    seen: list[ConsumedRecord[bytes]] = []
    consumer = Consumer([own, other.arn], app, settings=SETTINGS, aws=aws)
    async with consuming(consumer, seen.append):
        await until(lambda: len(seen) >= 50, within=30.0)

    payloads = sorted(record.data for record in seen)
    assert payloads == sorted(
        [f"own-{i}".encode() for i in range(20)] + [d for _, d in other_items]
    )
    # The lease table is the consumer's own account's, with leases of both streams.
    table = boto3.client("dynamodb", endpoint_url=moto_url).scan(TableName=app)["Items"]
    assert {item["leaseKey"]["S"].split(":")[1] for item in table} == {own, stream_name}
