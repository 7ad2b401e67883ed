"""Driver-side check whether a shard has anything to read past a position, without reading it.

One GetShardIterator and one GetRecords with Limit=1 per shard: enough to decide whether a
micro-batch is worth planning. The record it may return is not handed on: the data itself is
only ever read by executor tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from shardflow.aws.backoff import retrying
from shardflow.aws.kinesis import arn_ref, stream_ref
from shardflow.backoff import Backoff
from shardflow.errors import InvalidArgumentError
from shardflow.spark.source.positions import Kind, ShardPosition

_PROBE_BACKOFF = Backoff(base=0.1, cap=2.0, max_attempts=6)


async def has_records(
    kinesis: Any, stream: str, shard_id: str, position: ShardPosition, cutoff_ms: int | None
) -> bool:
    """Whether a batch reading ``shard_id`` from ``position`` would find a record (one that
    arrived by ``cutoff_ms``, if given) or the shard's end. Unsure answers are yes."""
    if position.kind is Kind.SHARD_END:
        return False
    if position.kind is Kind.AFTER and position.sub_sequence_number is not None:
        return True  # the rest of an aggregate the last batch stopped inside
    params: dict[str, Any] = {**stream_ref(stream), "ShardId": shard_id}
    if position.kind is Kind.AFTER:
        assert position.sequence_number is not None
        params.update(
            ShardIteratorType="AFTER_SEQUENCE_NUMBER",
            StartingSequenceNumber=position.sequence_number,
        )
    else:
        params.update(position.iterator_start().iterator_params())
    try:
        answer = await retrying(
            lambda: kinesis.get_shard_iterator(**params),
            operation="GetShardIterator",
            stream=stream,
            shard_id=shard_id,
            backoff=_PROBE_BACKOFF,
        )
        iterator = answer.get("ShardIterator")
        if iterator is None:
            return True
        page: Mapping[str, Any] = await retrying(
            lambda: kinesis.get_records(ShardIterator=iterator, Limit=1, **arn_ref(stream)),
            operation="GetRecords",
            stream=stream,
            shard_id=shard_id,
            backoff=_PROBE_BACKOFF,
        )
    except InvalidArgumentError:
        return True  # a position the service no longer knows: the task reports the loss
    records = page.get("Records") or []
    if records:
        if cutoff_ms is None:
            return True
        arrived = records[0].get("ApproximateArrivalTimestamp")
        return arrived is None or arrived.timestamp() * 1000 <= cutoff_ms
    if page.get("NextShardIterator") is None:
        return True  # the shard ended: a batch records that, which lets its children start
    return bool(page.get("MillisBehindLatest"))


async def shards_with_records(
    kinesis: Any,
    stream: str,
    positions: Mapping[str, ShardPosition],
    cutoff_ms: int | None,
) -> set[str]:
    """The shards among ``positions`` that :func:`has_records` says yes for, probed together."""
    shard_ids = sorted(positions)
    answers = await asyncio.gather(
        *(has_records(kinesis, stream, s, positions[s], cutoff_ms) for s in shard_ids)
    )
    return {shard_id for shard_id, yes in zip(shard_ids, answers, strict=True) if yes}
