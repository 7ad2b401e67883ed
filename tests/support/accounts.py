"""A second AWS account on moto's server: moto keeps each account's resources apart by the
caller's access key, and its STS hands out keys of the account of the role assumed. A stream
made with such keys is invisible to the base test credentials (account 123456789012): reaching
it takes the role, as a stream of another account does on AWS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3

OTHER_ACCOUNT = "222222222222"
ROLE_ARN = f"arn:aws:iam::{OTHER_ACCOUNT}:role/shardflow-reader"


@dataclass(frozen=True)
class OtherAccountStream:
    arn: str
    name: str
    region: str
    kinesis: Any
    """A boto3 Kinesis client of the other account (credentials of the role)."""


def role_client(url: str, service: str, region: str, role_arn: str = ROLE_ARN) -> Any:
    """A boto3 client of ``service`` with credentials of ``role_arn`` (moto STS)."""
    sts = boto3.client("sts", endpoint_url=url, region_name=region)
    credentials = sts.assume_role(RoleArn=role_arn, RoleSessionName="test-setup")["Credentials"]
    return boto3.client(
        service,
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
    )


def other_account_stream(
    url: str, name: str, *, shards: int = 1, region: str = "us-east-1"
) -> OtherAccountStream:
    """A stream of :data:`OTHER_ACCOUNT`, ACTIVE, with its ARN."""
    kinesis = role_client(url, "kinesis", region)
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    arn = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"]
    assert f":{OTHER_ACCOUNT}:" in arn
    return OtherAccountStream(arn, name, region, kinesis)


def read_all(kinesis: Any, stream: str) -> list[tuple[str, bytes]]:
    """Every (key, data) of every shard of ``stream``, from the start (boto3, one pass)."""
    found: list[tuple[str, bytes]] = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for _ in range(20):  # bounded: a few pages drain these small streams
            page = kinesis.get_records(ShardIterator=iterator, Limit=1000)
            found += [(r["PartitionKey"], r["Data"]) for r in page["Records"]]
            iterator = page.get("NextShardIterator")
            if not iterator or not page["Records"]:
                break
    return found
