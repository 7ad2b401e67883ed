"""Several shards of one task read side by side, their chunks handed out as they come.

Each shard's read runs as its own asyncio task and puts its chunks, in shard order, into one
queue, then a marker that it is done: a shard's rows keep their order, and its end is known
only after its last chunk was taken. The queue holds as many chunks as the task has shards:
a task buffers no more than that (plus each read's one GetRecords asked ahead) while Spark
takes what came first. The reads overlap their round
trips (one shard's GetRecords waits while another's rows become Arrow), which is what makes
a task of many shards cost about what a task of one does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")


class Done:
    """The marker that follows a shard's last chunk."""

    __slots__ = ()


DONE = Done()


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


async def interleave(sources: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T | Done]]:
    """``(index, chunk)`` of every source as it comes, and ``(index, DONE)`` after a source's
    last chunk. The first failure of any source is raised (the other reads are stopped)."""
    if len(sources) == 1:
        # One shard: no queue, no extra task (the common case of a small stream).
        async for chunk in sources[0]:
            yield 0, chunk
        yield 0, DONE
        return
    queue: asyncio.Queue[tuple[int, T | Done | _Failed]] = asyncio.Queue(maxsize=len(sources))

    async def pump(index: int, source: AsyncIterator[T]) -> None:
        try:
            async for chunk in source:
                await queue.put((index, chunk))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # handed to the consumer, which raises it
            await queue.put((index, _Failed(error)))
            return
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        await queue.put((index, DONE))

    pumps = [asyncio.ensure_future(pump(i, source)) for i, source in enumerate(sources)]
    try:
        remaining = len(sources)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, _Failed):
                raise item.error
            if isinstance(item, Done):
                remaining -= 1
            yield index, item
    finally:
        for task in pumps:
            task.cancel()
        for task in pumps:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
