"""An aggregating producer whose shard map goes stale at a split, for the tests of records it
puts again: after the split it still predicts the parent, so its aggregates land on one child
and those of their user records that belong to the other child are put again there."""

from __future__ import annotations

import asyncio

from shardflow.producer import Producer, ProducerSettings

KEYS = [f"key-{n}" for n in range(48)]
"""Partition keys spread over the whole hash key range (both children of a split)."""

STALE_MAP = ProducerSettings(aggregate=True, linger=0.2, shard_refresh_interval=3600.0)
"""Aggregates, and never refreshes its shard map on its own."""


async def wave(producer: Producer, label: str) -> list[tuple[str, bytes]]:
    """Put one record for each of :data:`KEYS`, data ``<label>-<n>``, and wait until all are
    in the stream; returns them as ``(key, data)``."""
    items = [(key, f"{label}-{n}".encode()) for n, key in enumerate(KEYS)]
    await asyncio.gather(*[await producer.put(data, key) for key, data in items])
    return items
