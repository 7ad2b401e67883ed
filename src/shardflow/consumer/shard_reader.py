"""The reading side of a shard worker: fetcher -> intake -> prefetch buffer, in one task.

The task pulls a batch only when the previous one fitted into the buffer, so the buffer's
bounds hold the fetcher back; within a batch, records are unpacked and shaped a piece at a
time and cut into chunks as they come, so a full buffer holds the unpacking back too. It ends at the shard's end (the buffer is finished), when the
buffer is closed, or on an error (handed to the buffer, which raises it to the reader of the
records once they are drained).
"""

from __future__ import annotations

import asyncio
import contextlib

from shardflow.consumer.intake import Intake, RecordIntake
from shardflow.consumer.metrics import ConsumerMetrics
from shardflow.consumer.prefetch import Chunk, PrefetchBuffer
from shardflow.consumer.worker_contract import FetcherFactory
from shardflow.positions import StartPosition
from shardflow.records import Record
from shardflow.shards import ChildShard


class ShardReader:
    """Fills ``buffer`` with the shard's records from ``start`` (see the module doc)."""

    def __init__(
        self,
        fetchers: FetcherFactory,
        intake: RecordIntake,
        buffer: PrefetchBuffer,
        *,
        stream: str,
        metrics: ConsumerMetrics | None = None,
    ) -> None:
        self._fetchers = fetchers
        self._intake = intake
        self._buffer = buffer
        self._stream = stream
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self.millis_behind_latest: int | None = None
        """MillisBehindLatest of the last batch fetched."""
        self.caught_up = False
        """The last batch found nothing more to read (for now)."""
        self.children: tuple[ChildShard, ...] = ()
        """The child shards reported with the shard's last batch."""
        self._reported_out_of_range = (0, 0)

    def start(self, start: StartPosition) -> None:
        """Begin reading at ``start`` on the running loop."""
        if self._task is None:
            self._task = asyncio.create_task(
                self._read(start), name=f"shardflow-fetch-{self._intake.shard_id}"
            )

    async def stop(self) -> None:
        """Stop reading (a fetch in progress is abandoned)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _read(self, start: StartPosition) -> None:
        buffer = self._buffer
        fetcher = self._fetchers(start)
        try:
            async for batch in fetcher:
                self.millis_behind_latest = batch.millis_behind_latest
                if not await self._put(batch.records):
                    return
                self.caught_up = batch.caught_up
                if batch.shard_ended:
                    self.children = batch.child_shards
                    break
            await buffer.finish()
        except Exception as exc:
            await buffer.fail(exc)
        finally:
            # A fan-out fetcher holds a subscription (an open connection): end it.
            close = getattr(fetcher, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    async def _put(self, records: list[Record]) -> bool:
        """Shape ``records`` into chunks of at most half the buffer's bounds and put each as
        soon as it is cut; False if the buffer was closed. A record bigger than the byte bound
        forms a chunk of its own. The next chunk is begun only once the buffer has room for it,
        so at most ``prefetch_records`` user records (plus the rest of one piece) exist at once:
        the unpacking waits, not a finished chunk."""
        buffer = self._buffer
        max_records, max_bytes = buffer.chunk_records, buffer.chunk_bytes
        items: list[Intake] = []
        size = 0
        begun = False  # the chunk in the making was begun with room for it in the buffer
        async with contextlib.aclosing(self._intake.pieces(records)) as pieces:
            while True:
                if not begun:
                    if not await buffer.wait_for_room():
                        return False
                    begun = True
                piece = await anext(pieces, None)
                if piece is None:
                    break
                for item in piece:
                    record_size = item.size
                    if items and (len(items) >= max_records or size + record_size > max_bytes):
                        if not await buffer.put(Chunk(items, size)):
                            return False
                        items, size, begun = [], 0, False
                    items.append(item)
                    size += record_size
                self._report_out_of_range()
        return not items or await buffer.put(Chunk(items, size))

    def _report_out_of_range(self) -> None:
        if self._metrics is None:
            return
        counts = self._intake.counts
        delivered = counts.out_of_range - counts.dropped
        before_delivered, before_dropped = self._reported_out_of_range
        if (delivered, counts.dropped) != self._reported_out_of_range:
            self._metrics.out_of_range(
                self._stream,
                delivered=delivered - before_delivered,
                dropped=counts.dropped - before_dropped,
            )
            self._reported_out_of_range = (delivered, counts.dropped)
