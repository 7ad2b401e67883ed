"""Reading a whole stream: every shard at once, parents before children, as one record stream.

A simple reader for tools, tests and demos (``shardflow tail`` uses it). It keeps no
checkpoints and coordinates with nobody: for processing with leases and checkpoints use the
consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from shardflow.aggregation import deaggregate as deaggregate_record
from shardflow.aws.clients import ClientFactory
from shardflow.aws.kinesis import list_shards
from shardflow.aws.settings import AwsSettings
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.fetch.polling import Polling, PollingFetcher
from shardflow.positions import PositionKind, StartPosition
from shardflow.records import Record
from shardflow.shards import ChildShard, ShardInfo

DEFAULT_SHARD_SYNC_INTERVAL = 10.0
"""Seconds between shard listings while following (KCL's parent-shard poll is 10 s too)."""


async def read_stream(
    stream: str,
    *,
    aws: AwsSettings | None = None,
    start: StartPosition | None = None,
    follow: bool = False,
    deaggregate: bool = True,
    polling: Polling | None = None,
    max_buffered_batches: int = 8,
    shard_sync_interval: float = DEFAULT_SHARD_SYNC_INTERVAL,
    kinesis: Any | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> AsyncGenerator[Record, None]:
    """The records of every shard of ``stream``, each shard in order, shards interleaved.

    ``start`` (default TRIM_HORIZON) may be TRIM_HORIZON, LATEST or AT_TIMESTAMP; sequence
    number positions name one shard and are refused here (use
    :class:`~shardflow.fetch.PollingFetcher`). A child shard is read only after all of
    its parents ended, from its beginning (or from the AT_TIMESTAMP moment), so the records of
    one partition key come out in the order they were written, across resharding.

    With ``follow=False`` reading stops once every shard is caught up (an empty batch at the
    tip) or ended; with ``follow=True`` it goes on until the caller stops iterating, and lists
    the shards every ``shard_sync_interval`` seconds to find new ones. ``deaggregate`` unpacks
    KPL aggregated records. ``polling`` defaults to :class:`Polling`, without an idle
    interval when not following (reading stops at the first caught-up poll anyway). At most
    ``max_buffered_batches`` batches wait between the shard readers and the caller. Pass
    ``kinesis`` to use an open client instead of building one from ``aws``. Close the iterator
    (``contextlib.aclosing``) when stopping early.
    """
    start = start or StartPosition.trim_horizon()
    if start.is_sequence_relative:
        raise ValueError(
            f"{start.kind} names a record of one shard; read that shard with a fetcher"
        )
    if max_buffered_batches < 1:
        raise ValueError("max_buffered_batches must be at least 1")
    async with AsyncExitStack() as stack:
        if kinesis is None:
            kinesis = await stack.enter_async_context(
                ClientFactory(aws).kinesis(stream=stream, own_requests=True)
            )
        run = _StreamRun(
            kinesis,
            stream,
            start=start,
            follow=follow,
            deaggregate=deaggregate,
            polling=polling or _default_polling(follow),
            queue_size=max_buffered_batches,
            shard_sync_interval=shard_sync_interval,
            clock=clock,
        )
        try:
            async for record in run.records():
                yield record
        finally:
            await run.stop()


def _default_polling(follow: bool) -> Polling:
    # Without follow, the call after the last records only confirms the shard is caught up:
    # make it at once (the per-shard call limit still applies) instead of an idle interval later.
    return Polling() if follow else Polling(idle_time=0.0)


async def read_all(
    stream: str,
    *,
    limit: int | None = None,
    aws: AwsSettings | None = None,
    start: StartPosition | None = None,
    deaggregate: bool = True,
    polling: Polling | None = None,
    kinesis: Any | None = None,
) -> list[Record]:
    """Every record of ``stream`` until caught up (at most ``limit``); the other arguments as
    :func:`read_stream`'s."""
    options: dict[str, Any] = {
        "aws": aws,
        "start": start,
        "deaggregate": deaggregate,
        "polling": polling,
        "kinesis": kinesis,
    }
    options["follow"] = False
    records: list[Record] = []
    if limit is not None and limit <= 0:
        return records
    async with contextlib.aclosing(read_stream(stream, **options)) as stream_records:
        async for record in stream_records:
            records.append(record)
            if limit is not None and len(records) >= limit:
                break
    return records


# --- what shard tasks tell the reader ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Records:
    records: list[Record]


@dataclass(frozen=True, slots=True)
class _ShardStopped:
    shard_id: str
    ended: bool  # reached its end (closed), as opposed to caught up while still open
    child_shards: tuple[ChildShard, ...]


@dataclass(frozen=True, slots=True)
class _Failed:
    error: Exception


@dataclass(frozen=True, slots=True)
class _Listing:
    shards: list[ShardInfo]


_Message = _Records | _ShardStopped | _Failed | _Listing


class _Lineage:
    """Which shards exist, which were started and which ended; who may start next."""

    def __init__(self) -> None:
        self.shards: dict[str, ShardInfo] = {}
        self.parents: dict[str, tuple[str, ...]] = {}
        self.started: set[str] = set()
        self.ended: set[str] = set()

    def learn_listing(self, shards: Iterable[ShardInfo]) -> None:
        for shard in shards:
            self.shards[shard.shard_id] = shard
            self.parents[shard.shard_id] = shard.parent_ids

    def learn_children(self, children: Iterable[ChildShard]) -> None:
        for child in children:
            self.parents.setdefault(child.shard_id, child.parent_shard_ids)

    def startable(self) -> list[str]:
        """Shards not yet started whose parents all ended (or are gone from the stream)."""
        return sorted(
            shard_id
            for shard_id, parents in self.parents.items()
            if shard_id not in self.started
            and shard_id not in self.ended
            and all(p in self.ended or p not in self.parents for p in parents)
        )

    def closed_and_drained(self, shard_id: str, last_sequence_number: str | None) -> bool:
        """Whether a caught-up shard is known closed with nothing left past what was read.

        Needed for emulators whose closed shards never end (moto): a closed shard gets no new
        records, so caught up means done. The sequence check keeps real Kinesis, whose ending
        sequence number lies beyond its last record, relying on the iterator's end instead.
        """
        shard = self.shards.get(shard_id)
        if shard is None or shard.ending_sequence_number is None:
            return False
        if last_sequence_number is None:
            return True
        return int(last_sequence_number) >= int(shard.ending_sequence_number)


class _StreamRun:
    """One reading of a stream: a task per shard feeding a bounded queue; lineage kept here."""

    def __init__(
        self,
        kinesis: Any,
        stream: str,
        *,
        start: StartPosition,
        follow: bool,
        deaggregate: bool,
        polling: Polling,
        queue_size: int,
        shard_sync_interval: float,
        clock: Clock,
    ) -> None:
        self._kinesis = kinesis
        self._stream = stream
        self._start = start
        # Children hold only records newer than their parents: from their start, unless the
        # caller asked for a moment, which may lie after a child's first records.
        self._child_start = (
            start if start.kind is PositionKind.AT_TIMESTAMP else StartPosition.trim_horizon()
        )
        self._follow = follow
        self._deaggregate: Callable[[Record], list[Record]] | None = (
            deaggregate_record if deaggregate else None
        )
        self._polling = polling
        self._queue: asyncio.Queue[_Message] = asyncio.Queue(maxsize=queue_size)
        self._sync_interval = shard_sync_interval
        self._clock = clock
        self._lineage = _Lineage()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sync_task: asyncio.Task[None] | None = None

    async def records(self) -> AsyncIterator[Record]:
        listing = await list_shards(self._kinesis, self._stream)
        self._lineage.learn_listing(listing)
        if self._start.kind is PositionKind.LATEST:
            # Closed shards hold nothing newer than now: skip them, start the open ones.
            self._lineage.ended.update(s.shard_id for s in listing if not s.is_open)
        self._start_ready(self._start)
        if self._follow:
            self._sync_task = asyncio.create_task(self._sync_shards())
        while self._tasks or self._follow:
            message = await self._queue.get()
            if isinstance(message, _Records):
                for record in message.records:
                    yield record
            elif isinstance(message, _ShardStopped):
                await self._shard_stopped(message)
            elif isinstance(message, _Listing):
                self._lineage.learn_listing(message.shards)
                self._start_ready(self._child_start)
            else:
                raise message.error

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *([self._sync_task] if self._sync_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _shard_stopped(self, message: _ShardStopped) -> None:
        self._tasks.pop(message.shard_id, None)
        if not message.ended:
            return
        self._lineage.ended.add(message.shard_id)
        self._lineage.learn_children(message.child_shards)
        # A fresh listing names children the service did not report (kinesalite) and any
        # other parent of a merged child that appeared after the first listing.
        self._lineage.learn_listing(await list_shards(self._kinesis, self._stream))
        self._start_ready(self._child_start)

    def _start_ready(self, position: StartPosition) -> None:
        for shard_id in self._lineage.startable():
            self._lineage.started.add(shard_id)
            fetcher = PollingFetcher(
                self._kinesis, self._stream, shard_id, position, self._polling, clock=self._clock
            )
            self._tasks[shard_id] = asyncio.create_task(
                self._guarded(self._read_shard(fetcher)), name=f"shardflow-read-{shard_id}"
            )

    async def _guarded(self, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:
            await self._queue.put(_Failed(exc))

    async def _read_shard(self, fetcher: PollingFetcher) -> None:
        async for batch in fetcher:
            records = batch.records
            if self._deaggregate is not None:
                records = [sub for record in records for sub in self._deaggregate(record)]
            if records:
                await self._queue.put(_Records(records))
            if batch.shard_ended:
                await self._queue.put(_ShardStopped(batch.shard_id, True, batch.child_shards))
                return
            if batch.caught_up:
                drained = self._lineage.closed_and_drained(
                    batch.shard_id, fetcher.last_sequence_number
                )
                if drained or not self._follow:
                    await self._queue.put(_ShardStopped(batch.shard_id, drained, ()))
                    return

    async def _sync_shards(self) -> None:
        # Runs only while following, which ends when the caller stops iterating (cancel).
        while True:
            await self._clock.sleep(self._sync_interval)
            try:
                shards = await list_shards(self._kinesis, self._stream)
            except Exception as exc:
                await self._queue.put(_Failed(exc))
                return
            await self._queue.put(_Listing(shards))
