"""``shardflow tail``: records from all shards of a stream."""

from __future__ import annotations


def tail() -> None:
    """Print records from all shards of a stream."""
    raise NotImplementedError
