"""Which shard a record will land on: the stream's shard map, kept fresh.

The map is listed at start, again every ``interval`` seconds, and whenever the producer sees
evidence that it is stale (a record landed on a shard other than predicted, or no open shard
covers a hash key). Requests for a refresh are coalesced: while one listing runs or waits,
further requests join it, and listings are at least ``min_interval`` apart.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from shardflow.aws.kinesis import list_shards
from shardflow.shards import ShardInfo, ShardMap

log = logging.getLogger("shardflow.producer")


class ShardRouter:
    """The shard map of one stream, refreshed on demand (coalesced) and periodically.

    ``on_change`` is called (in the event loop) after a listing that changed the open shards.
    """

    def __init__(
        self,
        kinesis: Any,
        stream: str,
        *,
        interval: float = 60.0,
        min_interval: float = 1.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._kinesis = kinesis
        self._stream = stream
        self._interval = interval
        self._min_interval = min_interval
        self.on_change = on_change
        self._loop = asyncio.get_running_loop()
        self.shard_map = ShardMap(())
        # The open shards' ranges as parallel sorted lists, for a bisect per record.
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.ids: list[str] = []
        self.shards_by_id: dict[str, ShardInfo] = {}
        self.generation = 0
        self.refreshes = 0
        self.listed_at = float("-inf")  # loop time at which the current map's listing began
        self._last_started = float("-inf")
        self._queued: asyncio.Future[None] | None = None
        self._running: asyncio.Future[None] | None = None
        self._running_since = float("-inf")
        self._worker: asyncio.Task[None] | None = None
        self._periodic: asyncio.Task[None] | None = None

    async def load(self) -> None:
        """List the shards now; errors (e.g. ResourceNotFoundError) propagate."""
        await self._list()

    def start_periodic(self) -> None:
        if self._periodic is None:
            self._periodic = self._loop.create_task(self._every_interval())

    async def close(self) -> None:
        for task in (self._periodic, self._worker):
            if task is not None:
                task.cancel()
        for task in (self._periodic, self._worker):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._periodic = self._worker = None
        for future in (self._queued, self._running):
            if future is not None and not future.done():
                future.set_result(None)

    def shard_id_for(self, hash_key: int) -> str:
        """The open shard predicted for ``hash_key``, or "" if the map has no shard for it."""
        i = bisect.bisect_right(self.starts, hash_key) - 1
        return self.ids[i] if i >= 0 and hash_key <= self.ends[i] else ""

    def request_refresh(self, observed_at: float) -> asyncio.Future[None]:
        """Ask for a listing that starts after ``observed_at`` (loop time); resolves when done.

        Resolves at once if the current map was listed after ``observed_at``. Never raises:
        a failed listing is logged and the old map is kept.
        """
        if self.listed_at >= observed_at:
            done = self._loop.create_future()
            done.set_result(None)
            return done
        if self._running is not None and self._running_since >= observed_at:
            return self._running
        if self._queued is None:
            self._queued = self._loop.create_future()
        if self._worker is None:
            self._worker = self._loop.create_task(self._work())
        return self._queued

    async def _work(self) -> None:
        try:
            while self._queued is not None:
                pause = self._last_started + self._min_interval - self._loop.time()
                if pause > 0:
                    await asyncio.sleep(pause)
                done, self._queued = self._queued, None
                self._running = done
                self._running_since = self._loop.time()
                try:
                    await self._list()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("refreshing the shard map of %s failed: %s", self._stream, exc)
                finally:
                    self._running = None
                    if not done.done():
                        done.set_result(None)
        finally:
            self._worker = None

    async def _every_interval(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.request_refresh(self._loop.time())

    async def _list(self) -> None:
        started = self._loop.time()
        self._last_started = started
        shards = await list_shards(self._kinesis, self._stream)
        self.refreshes += 1
        new_map = ShardMap(shards)
        changed = _layout(new_map) != _layout(self.shard_map)
        self.shards_by_id = {shard.shard_id: shard for shard in shards}
        self.listed_at = started
        if changed:
            self.shard_map = new_map
            open_shards = new_map.shards
            self.starts = [shard.hash_range.start for shard in open_shards]
            self.ends = [shard.hash_range.end for shard in open_shards]
            self.ids = [shard.shard_id for shard in open_shards]
            self.generation += 1
            log.info(
                "shard map of %s: %d open shards (generation %d)",
                self._stream,
                len(new_map),
                self.generation,
            )
            if self.on_change is not None:
                self.on_change()


def _layout(shard_map: ShardMap) -> list[tuple[str, int, int]]:
    return [(s.shard_id, s.hash_range.start, s.hash_range.end) for s in shard_map.shards]
