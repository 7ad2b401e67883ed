"""list_shards pages through real emulators: kinesis-local pages correctly, moto needs help.

A fault proxy with no rules sits in front of each emulator and counts the ListShards calls,
which shows that the listing really took several pages.
"""

from __future__ import annotations

import time
from typing import Any

import boto3

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import list_shards
from shardflow.testing.faults import FaultProxy


def _create(endpoint: str, stream: str, shards: int) -> list[str]:
    """Create the stream, wait until it is ACTIVE; its shard ids as DescribeStream tells."""
    client: Any = boto3.client("kinesis", endpoint_url=endpoint)
    client.create_stream(StreamName=stream, ShardCount=shards)
    deadline = time.monotonic() + 20
    while True:
        description = client.describe_stream(StreamName=stream)["StreamDescription"]
        if description["StreamStatus"] == "ACTIVE" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert description["StreamStatus"] == "ACTIVE"
    assert not description["HasMoreShards"]
    return sorted(s["ShardId"] for s in description["Shards"])


async def _listed(endpoint: str, stream: str, max_results: int | None) -> list[str]:
    async with ClientFactory(AwsSettings(endpoint_url=endpoint)).kinesis() as kinesis:
        shards = await list_shards(kinesis, stream, max_results=max_results)
    return [s.shard_id for s in shards]


async def test_pages_through_kinesis_local(kinesis_local_url: str, stream_name: str) -> None:
    expected = _create(kinesis_local_url, stream_name, 7)
    with FaultProxy(kinesis_local_url) as proxy:
        assert await _listed(proxy.url, stream_name, max_results=2) == expected
        assert proxy.forwarded("ListShards") == 4  # 2 + 2 + 2 + 1
        assert await _listed(proxy.url, stream_name, max_results=None) == expected
        assert proxy.forwarded("ListShards") == 5


async def test_pages_through_moto_and_terminates(moto_url: str, stream_name: str) -> None:
    expected = _create(moto_url, stream_name, 5)
    with FaultProxy(moto_url) as proxy:
        assert await _listed(proxy.url, stream_name, max_results=2) == expected
        # First page; the token alone (rejected by moto); then two pages with the stream named.
        assert proxy.forwarded("ListShards") == 4
