"""The reading stage of one shard: fetcher -> intake -> a bounded prefetch buffer, in one task.

:class:`ShardReader` pulls a batch only when the previous one fitted into the
:class:`PrefetchBuffer`, so the buffer's bounds (records and bytes) hold the fetcher back;
within a batch, records are unpacked and shaped a piece at a time and cut into chunks as they
come, so a full buffer holds the unpacking back too. The delivery side gets chunks and releases
each once it is handled: records count against the bounds from ``put`` until ``release``, so a
slow handler stops the fetcher (it waits in ``put`` and makes no further GetRecords calls). A
chunk is at most half of each bound (so the next one can be fetched while one is handled); a
single record larger than the byte bound is still let through, alone. The task ends at the
shard's end (the buffer is finished), when the buffer is closed, or on an error (handed to the
buffer, which raises it to the reader of the records once they are drained).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from shardflow.consumer.metrics import ConsumerMetrics
from shardflow.fetch.batch import FetchedBatch
from shardflow.positions import StartPosition
from shardflow.read.intake import Intake, RecordIntake
from shardflow.records import Record
from shardflow.shards import ChildShard

FetcherFactory = Callable[[StartPosition], AsyncIterator[FetchedBatch]]
"""Opens a fetcher of the shard at a position (a PollingFetcher or a FanOutFetcher)."""


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
        self.ended = False
        """Every record of the shard was handed out by :meth:`chunks` (its end was read)."""
        self._reported_out_of_range = (0, 0)

    async def chunks(self, may_go_on: Callable[[], bool]) -> AsyncGenerator[Chunk, None]:
        """The buffered chunks in shard order, while ``may_go_on()``; :attr:`ended` once the
        shard's records are all out. A chunk's room in the buffer is given back when the next
        one is asked for (or the iteration ends), so ask only once the previous chunk is
        handled. Raises what reading failed with, once the chunks before it are out."""
        buffer = self._buffer
        # The chunk handed out is named only here, and forgotten once released: a local that
        # still held it while the next one is awaited would keep a whole chunk of records
        # alive beyond the buffer's bound (the last one of a drain until the shard's next).
        previous: Chunk | None = None
        try:
            while True:
                if previous is not None:
                    await buffer.release(previous)
                    previous = None
                if not may_go_on():
                    return
                previous = await buffer.get()
                if previous is None:
                    self.ended = buffer.finished
                    return
                if not may_go_on():
                    return
                yield previous
        finally:
            if previous is not None:
                await buffer.release(previous)

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
                records, caught_up = batch.records, batch.caught_up
                children = batch.child_shards if batch.shard_ended else None
                # The batch's records belong to the buffer's chunks from here: without this,
                # ``batch`` kept them all alive until the next GetRecords answered, long
                # after their chunks were handled and released.
                del batch
                if not await self._put(records):
                    return
                del records
                self.caught_up = caught_up
                if children is not None:
                    self.children = children
                    break
                # The next batch is asked for only once a chunk of it fits: fetched earlier,
                # it would only wait in memory (a whole GetRecords answer per shard) for the
                # handler, which is the slower side whenever the buffer is full.
                if not await buffer.wait_for_room():
                    return
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


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive records of one shard, handed over together."""

    items: Sequence[Intake]
    size: int
    """Bytes (data + partition key) of all records."""

    @property
    def records(self) -> int:
        return len(self.items)


class PrefetchBuffer:
    """A FIFO of chunks bounded by records and bytes in use (buffered or being handled)."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ValueError("prefetch bounds must be at least 1 record and 1 byte")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._queue: deque[Chunk] = deque()
        self._records = 0
        self._bytes = 0
        self._peak_records = 0
        self._peak_bytes = 0
        self._finished = False
        self._closed = False
        self._error: BaseException | None = None
        self._changed = asyncio.Condition()

    # --- sizes ---------------------------------------------------------------------------------

    @property
    def chunk_records(self) -> int:
        """The most records one chunk should hold: half the record bound (at least 1)."""
        return max(1, self.max_records // 2)

    @property
    def chunk_bytes(self) -> int:
        """The most bytes one chunk should hold: half the byte bound (at least 1)."""
        return max(1, self.max_bytes // 2)

    @property
    def records_in_use(self) -> int:
        """Records put and not yet released (buffered plus being handled)."""
        return self._records

    @property
    def bytes_in_use(self) -> int:
        return self._bytes

    @property
    def buffered_chunks(self) -> int:
        """Chunks put and not yet taken by ``get``."""
        return len(self._queue)

    @property
    def peak_records(self) -> int:
        """The most records ever in use at once."""
        return self._peak_records

    @property
    def peak_bytes(self) -> int:
        return self._peak_bytes

    @property
    def idle(self) -> bool:
        """Nothing buffered and nothing being handled."""
        return self._records == 0 and not self._queue

    # --- producer side -------------------------------------------------------------------------

    def _fits(self, chunk: Chunk) -> bool:
        if self._records == 0:
            return True  # an oversized chunk still goes through, alone
        return (
            self._records + chunk.records <= self.max_records
            and self._bytes + chunk.size <= self.max_bytes
        )

    def _has_room(self) -> bool:
        """A chunk of the largest size (half of each bound) would fit now."""
        return self._records == 0 or (
            self._records + self.chunk_records <= self.max_records
            and self._bytes + self.chunk_bytes <= self.max_bytes
        )

    async def wait_for_room(self) -> bool:
        """Wait until a chunk of the largest size fits (or nothing is in use); False if the
        buffer was closed meanwhile. A chunk cut after this returned is put without waiting."""
        if self._closed:
            return False
        if self._has_room():
            return True
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or self._has_room())
            return not self._closed

    async def put(self, chunk: Chunk) -> bool:
        """Wait for room, then append ``chunk``; False if the buffer was closed meanwhile."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or self._fits(chunk))
            if self._closed:
                return False
            self._queue.append(chunk)
            self._records += chunk.records
            self._bytes += chunk.size
            self._peak_records = max(self._peak_records, self._records)
            self._peak_bytes = max(self._peak_bytes, self._bytes)
            self._changed.notify_all()
            return True

    async def finish(self) -> None:
        """No more chunks will come (shard end): ``get`` returns None once the queue is empty."""
        async with self._changed:
            self._finished = True
            self._changed.notify_all()

    async def fail(self, error: BaseException) -> None:
        """The producer failed: ``get`` raises ``error`` once the queue is empty."""
        async with self._changed:
            self._error = error
            self._changed.notify_all()

    # --- consumer side -------------------------------------------------------------------------

    async def get(self) -> Chunk | None:
        """The next chunk, or None after :meth:`finish` (queue drained) or :meth:`close`."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._closed or bool(self._queue) or self._finished or self._error
            )
            if self._closed:
                return None
            if self._queue:
                return self._queue.popleft()
            if self._error is not None:
                raise self._error
            return None

    async def release(self, chunk: Chunk) -> None:
        """Give back the room ``chunk`` took: its records are handled (or abandoned)."""
        async with self._changed:
            self._records -= chunk.records
            self._bytes -= chunk.size
            self._changed.notify_all()

    async def close(self) -> None:
        """Stop at once: wake every waiter; ``get`` returns None and ``put`` False from now on."""
        async with self._changed:
            self._closed = True
            self._queue.clear()
            self._changed.notify_all()

    @property
    def finished(self) -> bool:
        """:meth:`finish` was called and every chunk was taken."""
        return self._finished and not self._queue
