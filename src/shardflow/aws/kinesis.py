"""Small Kinesis control-plane helpers shared by the producer, the consumer and the CLI."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from shardflow.aws.backoff import Backoff, retrying
from shardflow.errors import ResourceNotFoundError
from shardflow.shards import ShardInfo

_CONTROL_BACKOFF = Backoff(base=0.1, cap=2.0, max_attempts=6)


def stream_ref(stream: str) -> dict[str, str]:
    """Request parameters naming a stream by ARN or by name."""
    return {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}


def stream_name_of(stream: str) -> str:
    """The name part of a stream given by name or ARN (arn:aws:kinesis:r:a:stream/NAME)."""
    return stream.rsplit("/", 1)[-1] if stream.startswith("arn:") else stream


async def list_shards(
    kinesis: Any, stream: str, *, shard_filter: dict[str, Any] | None = None
) -> list[ShardInfo]:
    """Every shard of the stream (open and closed, or as filtered), following pagination.

    Guards against emulators that return a NextToken forever or repeat pages: a page that adds
    no new shard ends the listing.
    """
    shards: dict[str, ShardInfo] = {}
    params: dict[str, Any] = {**stream_ref(stream)}
    if shard_filter:
        params["ShardFilter"] = shard_filter
    while True:
        page = await retrying(
            lambda p=params: kinesis.list_shards(**p),  # type: ignore[misc]
            operation="ListShards",
            stream=stream,
            backoff=_CONTROL_BACKOFF,
        )
        before = len(shards)
        for raw in page.get("Shards", []):
            shard = ShardInfo.from_api(raw)
            shards[shard.shard_id] = shard
        token = page.get("NextToken")
        if not token or len(shards) == before:
            break
        params = {"NextToken": token}
    return sorted(shards.values(), key=lambda s: s.shard_id)


async def describe_stream_summary(kinesis: Any, stream: str) -> dict[str, Any]:
    page = await retrying(
        lambda: kinesis.describe_stream_summary(**stream_ref(stream)),
        operation="DescribeStreamSummary",
        stream=stream,
        backoff=_CONTROL_BACKOFF,
    )
    summary: dict[str, Any] = page["StreamDescriptionSummary"]
    return summary


async def wait_for_active(
    kinesis: Any, stream: str, *, max_wait: float = 60.0, poll: float = 0.1
) -> dict[str, Any]:
    """Wait until the stream is ACTIVE; returns its summary. Raises on timeout or absence."""
    deadline = time.monotonic() + max_wait
    while True:
        try:
            summary = await describe_stream_summary(kinesis, stream)
            if summary.get("StreamStatus") == "ACTIVE":
                return summary
        except ResourceNotFoundError:
            # Just created streams may be briefly invisible; a missing one stays missing.
            if time.monotonic() >= deadline:
                raise
        if time.monotonic() >= deadline:
            raise TimeoutError(f"stream {stream} not ACTIVE after {max_wait:.0f}s")
        await asyncio.sleep(poll)
