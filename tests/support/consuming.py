"""A consumer running in a task for the length of a block."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from shardflow.consumer import Consumer


@asynccontextmanager
async def consuming(consumer: Consumer, handler: Any, **options: Any) -> AsyncIterator[None]:
    """``consumer.consume(handler, **options)`` runs in a task while the block does; when the
    block ends (or fails) the consumer is closed and its task awaited (its error raised)."""
    run = asyncio.create_task(consumer.consume(handler, **options))
    try:
        yield
    finally:
        await consumer.close()
        await run
