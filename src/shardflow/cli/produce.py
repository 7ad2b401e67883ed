"""``shardflow produce``: lines from stdin or a file into a stream."""

from __future__ import annotations


def produce() -> None:
    """Write lines from stdin or a file to a stream."""
    raise NotImplementedError
