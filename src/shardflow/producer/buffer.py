"""The producer's bounded buffer: backpressure on ``put`` and flush barriers.

Every accepted record is counted (records and bytes) until it has a result. ``reserve``
waits while the buffer is full; a flush waits until every record accepted before it has a
result. Flushes use epochs: a record belongs to the epoch open when it was accepted; a flush
closes the open epoch and waits until it and every earlier epoch is empty. That costs a few
integer updates per record instead of tracking each record.
"""

from __future__ import annotations

import asyncio
from collections import deque

from shardflow.errors import ProducerClosedError


class Epoch:
    """Records accepted between two flushes; ``pending`` counts those without a result."""

    __slots__ = ("done", "pending")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.pending = 0
        self.done = done


class RecordBuffer:
    """Counts pending records and bytes; makes ``reserve`` wait while full; runs flushes."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.records = 0
        self.nbytes = 0
        self._loop = asyncio.get_running_loop()
        self._waiters: deque[tuple[asyncio.Future[Epoch], int]] = deque()
        self._epochs: deque[Epoch] = deque([Epoch(self._loop.create_future())])
        self._closed = False

    @property
    def flushing(self) -> bool:
        """True while some flush waits (records should be sent without lingering)."""
        return len(self._epochs) > 1

    def has_room(self, nbytes: int) -> bool:
        # An empty buffer takes any record, so a record as large as the limit never waits forever.
        return self.records == 0 or (
            self.records < self.max_records and self.nbytes + nbytes <= self.max_bytes
        )

    def try_reserve(self, nbytes: int) -> Epoch | None:
        """Count one record of ``nbytes`` if there is room and nobody waits; else None."""
        if self._closed:
            raise ProducerClosedError("the producer is closed")
        if self._waiters:
            return None
        # (has_room and _count, inlined: this runs once per record)
        records = self.records
        if records and (records >= self.max_records or self.nbytes + nbytes > self.max_bytes):
            return None
        self.records = records + 1
        self.nbytes += nbytes
        epoch = self._epochs[-1]
        epoch.pending += 1
        return epoch

    async def reserve(self, nbytes: int) -> Epoch:
        """Wait for room for one record of ``nbytes`` (first come, first served), then count it."""
        epoch = self.try_reserve(nbytes)
        if epoch is not None:
            return epoch
        waiter: asyncio.Future[Epoch] = self._loop.create_future()
        self._waiters.append((waiter, nbytes))
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result(), nbytes)  # granted, but the caller went away
                self.wake()
            else:
                self._drop_waiter(waiter)
            raise

    def released(self, records: int, nbytes: int) -> None:
        """``records`` records of ``nbytes`` in all have their results; their epochs' ``pending``
        counts were lowered by the caller. Call :meth:`wake` after."""
        self.records -= records
        self.nbytes -= nbytes

    def release(self, epoch: Epoch, nbytes: int) -> None:
        """One record of ``nbytes`` has its result. Call :meth:`wake` after a batch of these."""
        self.records -= 1
        self.nbytes -= nbytes
        epoch.pending -= 1

    def wake(self) -> None:
        """Admit waiting ``reserve`` calls that now fit and complete finished flushes."""
        waiters = self._waiters
        while waiters:
            waiter, nbytes = waiters[0]
            if waiter.done():  # cancelled while waiting
                waiters.popleft()
                continue
            if not self.has_room(nbytes):
                break
            waiters.popleft()
            waiter.set_result(self._count(nbytes))
        epochs = self._epochs
        while len(epochs) > 1 and epochs[0].pending == 0:
            finished = epochs.popleft()
            if not finished.done.done():
                finished.done.set_result(None)

    def flush(self) -> asyncio.Future[None]:
        """A future done when every record counted so far has its result.

        While it is pending :attr:`flushing` is True. Awaiting it through ``asyncio.shield``
        lets one flusher give up without disturbing others.
        """
        current = self._epochs[-1]
        if current.pending == 0 and len(self._epochs) == 1:
            done = self._loop.create_future()
            done.set_result(None)
            return done
        self._epochs.append(Epoch(self._loop.create_future()))
        self.wake()
        return current.done

    def close(self) -> None:
        """Refuse new records; waiting ``reserve`` calls fail with ProducerClosedError."""
        self._closed = True
        while self._waiters:
            waiter, _ = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(
                    ProducerClosedError("the producer closed while put waited for buffer room")
                )

    @property
    def closed(self) -> bool:
        return self._closed

    def _count(self, nbytes: int) -> Epoch:
        self.records += 1
        self.nbytes += nbytes
        epoch = self._epochs[-1]
        epoch.pending += 1
        return epoch

    def _drop_waiter(self, waiter: asyncio.Future[Epoch]) -> None:
        for i, (candidate, _) in enumerate(self._waiters):
            if candidate is waiter:
                del self._waiters[i]
                break
        self.wake()  # the next waiter may fit now that this one left the queue
