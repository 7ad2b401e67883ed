"""Finding a shard's end by GetRecords, for servers whose subscriptions never report it."""

from __future__ import annotations

import logging
from typing import Any

from shardflow.aws.kinesis import arn_ref, stream_ref
from shardflow.positions import StartPosition
from shardflow.shards import ChildShard

log = logging.getLogger("shardflow.fetch")


async def shard_end_at(
    kinesis: Any, stream: str, shard_id: str, position: StartPosition
) -> tuple[ChildShard, ...] | None:
    """The shard's children if it is closed and nothing is left to read at ``position``;
    None if records or a next iterator follow (or the check failed: it is only a check).

    Two calls (GetShardIterator, then GetRecords of at most one record); the record a probe
    may see is not handed out: the subscription delivers it.
    """
    params = {**stream_ref(stream), "ShardId": shard_id, **position.iterator_params()}
    try:
        iterator = (await kinesis.get_shard_iterator(**params)).get("ShardIterator")
        if not iterator:
            return None
        answer = await kinesis.get_records(ShardIterator=iterator, Limit=1, **arn_ref(stream))
    except Exception as exc:
        log.debug("shard-end check of %s failed: %s", shard_id, type(exc).__name__)
        return None
    if answer.get("Records") or answer.get("NextShardIterator"):
        return None
    return tuple(ChildShard.from_api(c) for c in answer.get("ChildShards", ()))
