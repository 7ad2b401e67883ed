"""Running many small lease writes with a bounded number in flight, without a task per item."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def run_bounded(
    items: Iterable[T], work: Callable[[T], Awaitable[None]], *, concurrency: int
) -> None:
    """Call ``work(item)`` for every item, at most ``concurrency`` at a time.

    ``min(concurrency, len(items))`` tasks pull from one shared iterator. ``work`` handles its
    own errors; one that escapes cancels the rest and is raised.
    """
    pending = list(items)
    if not pending:
        return
    source = iter(pending)

    async def drain() -> None:
        for item in source:
            await work(item)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, len(pending))):
            group.create_task(drain())
