"""Admission control: how many rows each shard may give in one micro-batch."""

from __future__ import annotations

from collections.abc import Sequence

from shardflow.spark.source.offsets import UNLIMITED


def shard_budgets(
    shard_ids: Sequence[str], max_rows: int | None, per_shard_cap: int | None, batch: int
) -> dict[str, int]:
    """Row budgets that add up to at most ``max_rows`` (None: no total limit), each at most
    ``per_shard_cap``. When there are more shards than rows, the shards that get one row
    rotate with ``batch`` so that none starves."""
    ordered = sorted(shard_ids)
    if not ordered:
        return {}
    budgets: dict[str, int]
    if max_rows is None:
        budgets = {shard: UNLIMITED for shard in ordered}
    elif max_rows >= len(ordered):
        base, extra = divmod(max_rows, len(ordered))
        budgets = {shard: base + (1 if i < extra else 0) for i, shard in enumerate(ordered)}
    else:
        first = batch % len(ordered)
        rotated = ordered[first:] + ordered[:first]
        budgets = {shard: 1 for shard in rotated[:max_rows]}
    if per_shard_cap is not None:
        budgets = {
            shard: per_shard_cap if limit == UNLIMITED else min(limit, per_shard_cap)
            for shard, limit in budgets.items()
        }
    return budgets
