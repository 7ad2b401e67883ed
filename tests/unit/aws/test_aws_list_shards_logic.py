"""list_shards' pagination logic against scripted page sequences (emulator quirks, expiry)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from shardflow.aws.kinesis import list_shards
from shardflow.errors import ResourceNotFoundError


def _shard(n: int) -> dict[str, Any]:
    return {
        "ShardId": f"shardId-{n:012d}",
        "HashKeyRange": {"StartingHashKey": str(n * 10), "EndingHashKey": str(n * 10 + 9)},
        "SequenceNumberRange": {"StartingSequenceNumber": "1"},
    }


def _error(code: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": 400}},
        "ListShards",
    )


class _ScriptedKinesis:
    """Answers ListShards from a function of the request; records every request."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []

    async def list_shards(self, **params: Any) -> dict[str, Any]:
        self.requests.append(params)
        result: dict[str, Any] = self.answer(params, len(self.requests))
        return result


async def test_follows_next_tokens_with_the_page_size() -> None:
    def answer(params: dict[str, Any], n: int) -> dict[str, Any]:
        page = {"Shards": [_shard(2 * (n - 1)), _shard(2 * (n - 1) + 1)]}
        return {**page, "NextToken": f"t{n}"} if n < 3 else page

    kinesis = _ScriptedKinesis(answer)
    shards = await list_shards(kinesis, "orders", max_results=2)
    assert [s.shard_id for s in shards] == [f"shardId-{n:012d}" for n in range(6)]
    assert kinesis.requests == [
        {"StreamName": "orders", "MaxResults": 2},
        {"NextToken": "t1", "MaxResults": 2},
        {"NextToken": "t2", "MaxResults": 2},
    ]


async def test_a_next_token_forever_on_repeated_pages_ends_the_listing() -> None:
    kinesis = _ScriptedKinesis(lambda params, n: {"Shards": [_shard(0)], "NextToken": "again"})
    shards = await list_shards(kinesis, "orders")
    assert [s.shard_id for s in shards] == ["shardId-000000000000"]
    assert len(kinesis.requests) == 2


async def test_an_arn_names_the_stream() -> None:
    arn = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
    kinesis = _ScriptedKinesis(lambda params, n: {"Shards": [_shard(0)]})
    await list_shards(kinesis, arn, shard_filter={"Type": "AT_LATEST"})
    assert kinesis.requests == [{"StreamARN": arn, "ShardFilter": {"Type": "AT_LATEST"}}]


async def test_a_rejected_token_is_sent_again_with_the_stream_named() -> None:
    def answer(params: dict[str, Any], n: int) -> dict[str, Any]:
        if "NextToken" in params and "StreamName" not in params:
            raise _error("InvalidToken")  # as moto answers a token sent alone
        if n == 1:
            return {"Shards": [_shard(0)], "NextToken": "t1"}
        if params["NextToken"] == "t1":
            return {"Shards": [_shard(1)], "NextToken": "t2"}
        return {"Shards": [_shard(2)]}

    kinesis = _ScriptedKinesis(answer)
    shards = await list_shards(kinesis, "orders")
    assert [s.shard_id for s in shards] == [f"shardId-{n:012d}" for n in range(3)]
    # Once the emulator wants the stream named, it is named from then on.
    assert kinesis.requests[1:] == [
        {"NextToken": "t1"},
        {"NextToken": "t1", "StreamName": "orders"},
        {"NextToken": "t2", "StreamName": "orders"},
    ]


async def test_an_expired_token_restarts_the_listing() -> None:
    def answer(params: dict[str, Any], n: int) -> dict[str, Any]:
        if n == 2:
            raise _error("ExpiredNextTokenException")
        if "NextToken" in params:
            return {"Shards": [_shard(1)]}
        return {"Shards": [_shard(0)], "NextToken": "t"}

    kinesis = _ScriptedKinesis(answer)
    shards = await list_shards(kinesis, "orders")
    assert [s.shard_id for s in shards] == ["shardId-000000000000", "shardId-000000000001"]
    assert [("NextToken" in r) for r in kinesis.requests] == [False, True, False, True]


async def test_a_missing_stream_is_raised_with_its_name() -> None:
    def answer(params: dict[str, Any], n: int) -> dict[str, Any]:
        raise _error("ResourceNotFoundException")

    kinesis = _ScriptedKinesis(answer)
    with pytest.raises(ResourceNotFoundError, match="no-such-stream"):
        await list_shards(kinesis, "no-such-stream")
    assert len(kinesis.requests) == 1
