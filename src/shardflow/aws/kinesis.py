"""Small Kinesis control-plane helpers shared by the producer, the consumer and the CLI."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from shardflow.aws.backoff import retrying
from shardflow.backoff import Backoff
from shardflow.errors import (
    AccessDeniedError,
    AwsError,
    ExpiredIteratorError,
    ResourceNotFoundError,
)
from shardflow.shards import ShardInfo

_CONTROL_BACKOFF = Backoff(base=0.1, cap=2.0, max_attempts=6)
# How often a listing whose NextToken expired is started over before giving up.
_LISTING_RESTARTS = 2
log = logging.getLogger("shardflow.aws")


def stream_ref(stream: str) -> dict[str, str]:
    """Request parameters naming a stream by ARN or by name."""
    return {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}


def arn_ref(stream: str) -> dict[str, str]:
    """``StreamARN`` for calls that name their stream by other means (GetRecords: the
    iterator) when the stream is given by ARN: required for a stream of another account, and
    what moto's server needs to find an ARN-named stream's records."""
    return {"StreamARN": stream} if stream.startswith("arn:") else {}


def stream_name_of(stream: str) -> str:
    """The name part of a stream given by name or ARN (arn:aws:kinesis:r:a:stream/NAME)."""
    return stream.rsplit("/", 1)[-1] if stream.startswith("arn:") else stream


async def list_shards(
    kinesis: Any,
    stream: str,
    *,
    shard_filter: dict[str, Any] | None = None,
    max_results: int | None = None,
) -> list[ShardInfo]:
    """Every shard of the stream (open and closed, or as filtered), following pagination.

    ``max_results`` is the page size (None: the service default). An expired NextToken restarts
    the listing. Guards against emulators: a page that adds no new shard ends the listing (some
    return a NextToken forever or repeat pages), and a NextToken the emulator rejects when sent
    alone, as the API requires, is sent again with the stream named (moto's tokens need that).
    """
    first: dict[str, Any] = {**stream_ref(stream)}
    if shard_filter:
        first["ShardFilter"] = shard_filter
    if max_results is not None:
        first["MaxResults"] = max_results
    for _ in range(_LISTING_RESTARTS):
        try:
            return await _list_pages(kinesis, stream, first)
        except ExpiredIteratorError:
            log.debug("ListShards token of %s expired; listing again", stream)
    return await _list_pages(kinesis, stream, first)


async def _list_pages(kinesis: Any, stream: str, first: dict[str, Any]) -> list[ShardInfo]:
    shards: dict[str, ShardInfo] = {}
    page = await _list_shards_call(kinesis, stream, first)
    token_needs_stream = False
    while True:
        before = len(shards)
        for raw in page.get("Shards", []):
            shard = ShardInfo.from_api(raw)
            shards[shard.shard_id] = shard
        token = page.get("NextToken")
        if not token or len(shards) == before:
            break
        params: dict[str, Any] = {"NextToken": token}
        if "MaxResults" in first:
            params["MaxResults"] = first["MaxResults"]
        if token_needs_stream:
            params.update(stream_ref(stream))
        try:
            page = await _list_shards_call(kinesis, stream, params)
        except AwsError as error:
            if token_needs_stream or not _token_rejected(error):
                raise
            token_needs_stream = True
            page = await _list_shards_call(kinesis, stream, {**params, **stream_ref(stream)})
    return sorted(shards.values(), key=lambda s: s.shard_id)


def _token_rejected(error: AwsError) -> bool:
    # Expired tokens are retryable (handled by restarting); a missing stream or a missing
    # permission would fail with the stream named too.
    return not error.retryable and not isinstance(error, ResourceNotFoundError | AccessDeniedError)


async def _list_shards_call(kinesis: Any, stream: str, params: dict[str, Any]) -> dict[str, Any]:
    page: dict[str, Any] = await retrying(
        lambda: kinesis.list_shards(**params),
        operation="ListShards",
        stream=stream,
        backoff=_CONTROL_BACKOFF,
    )
    return page


async def describe_stream_summary(kinesis: Any, stream: str) -> dict[str, Any]:
    page = await retrying(
        lambda: kinesis.describe_stream_summary(**stream_ref(stream)),
        operation="DescribeStreamSummary",
        stream=stream,
        backoff=_CONTROL_BACKOFF,
    )
    summary: dict[str, Any] = page["StreamDescriptionSummary"]
    return summary


def where(client: Any) -> str:
    """``region us-east-1 at http://127.0.0.1:4567``: where a client sends its calls."""
    meta = getattr(client, "meta", None)
    region = getattr(meta, "region_name", None)
    endpoint = getattr(meta, "endpoint_url", None)
    parts = [f"region {region}" if region else "", f"at {endpoint}" if endpoint else ""]
    return " ".join(part for part in parts if part) or "this client's account"


async def require_stream(kinesis: Any, stream: str) -> dict[str, Any]:
    """The stream's summary; a missing stream raises :class:`ResourceNotFoundError` saying
    which stream and where it was looked for."""
    try:
        return await describe_stream_summary(kinesis, stream)
    except ResourceNotFoundError as error:
        raise ResourceNotFoundError(
            f"stream {stream!r} not found in {where(kinesis)}",
            operation=error.operation,
            code=error.code,
            stream=stream,
        ) from error


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
