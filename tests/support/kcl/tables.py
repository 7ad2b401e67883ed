"""A lease table as a KCL application that ran before leaves it: one lease per open shard.

KCL workers start in seconds on such a table; on a missing or empty one they first create it
and wait for a shard sync (70-120 s here), which tests and benches do not need to pay.
"""

from __future__ import annotations

from typing import Any

import boto3


def seed_lease_table(
    dynamodb_url: str, kinesis_url: str, application: str, stream: str, *, region: str = "us-east-1"
) -> list[str]:
    """Create ``application``'s lease table with a TRIM_HORIZON lease per open shard; the keys."""
    dynamodb: Any = boto3.client("dynamodb", endpoint_url=dynamodb_url, region_name=region)
    kinesis: Any = boto3.client("kinesis", endpoint_url=kinesis_url, region_name=region)
    dynamodb.create_table(
        TableName=application,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.get_waiter("table_exists").wait(TableName=application)
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    keys = [
        shard["ShardId"]
        for shard in shards
        if "EndingSequenceNumber" not in shard.get("SequenceNumberRange", {})
    ]
    for key in keys:
        dynamodb.put_item(
            TableName=application,
            Item={
                "leaseKey": {"S": key},
                "leaseCounter": {"N": "0"},
                "ownerSwitchesSinceCheckpoint": {"N": "0"},
                "checkpoint": {"S": "TRIM_HORIZON"},
                "checkpointSubSequenceNumber": {"N": "0"},
            },
        )
    return keys
