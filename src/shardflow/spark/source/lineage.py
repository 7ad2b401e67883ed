"""Which shards a micro-batch may read: a child only once all its parents are fully read.

A parent counts as fully read when its position is SHARD_END, which only a completed
micro-batch records, or when it is no longer in the stream at all (expired).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shardflow.shards import ShardInfo
from shardflow.spark.source.positions import Kind, ShardPosition


def readable_shards(
    positions: Mapping[str, ShardPosition], parents: Mapping[str, Iterable[str]]
) -> list[str]:
    """Shards not at SHARD_END whose known parents all are (or are unknown)."""
    return sorted(
        shard_id
        for shard_id, position in positions.items()
        if position.kind is not Kind.SHARD_END
        and all(
            parent not in positions or positions[parent].kind is Kind.SHARD_END
            for parent in parents.get(shard_id, ())
        )
    )


def parents_of(listing: Iterable[ShardInfo]) -> dict[str, tuple[str, ...]]:
    return {shard.shard_id: shard.parent_ids for shard in listing}
