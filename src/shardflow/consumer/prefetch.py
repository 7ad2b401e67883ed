"""The bounded buffer between a shard's fetcher and its handler: backpressure in records and bytes.

The fetcher puts chunks of records; the handler side gets them and releases each chunk once it
is handled. Records count against the bounds from ``put`` until ``release``, so a slow handler
stops the fetcher: it waits in ``put`` and makes no further GetRecords calls. A chunk is at most
half of each bound (so the next one can be fetched while one is handled); a single record larger
than the byte bound is still let through, alone. A producer that makes records as it goes (the
unpacking of aggregates) waits in :meth:`wait_for_room` before it makes the next chunk, so that
no more records exist than the bounds allow.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from shardflow.consumer.intake import Intake


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
