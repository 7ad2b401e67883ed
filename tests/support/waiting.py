"""Waiting, bounded, for something other tasks make true."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], within: float, *, every: float = 0.05) -> None:
    """Poll ``condition`` every ``every`` seconds; TimeoutError after ``within`` seconds."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - state changes in other tasks
            await asyncio.sleep(every)
