"""One owned shard handed to user code by :meth:`Consumer.shards`: its batches and checkpointer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from shardflow.consumer.checkpointing.acks import ConsumedRecord, PendingCounts, Rejected
from shardflow.consumer.checkpointing.checkpoint import Checkpointer
from shardflow.consumer.delivery.engine import delivered
from shardflow.consumer.lifecycle.shard import ShardWorker

log = logging.getLogger("shardflow.consumer")


class ShardSession:
    """A shard this worker owns now: read :attr:`batches`, acknowledge, checkpoint.

    Unpacks as ``shard_id, batches, checkpointer``. ``batches`` yields lists of
    :class:`~shardflow.consumer.checkpointing.acks.ConsumedRecord` in shard order and ends when the shard
    ends, the lease is lost or given up, or the consumer stops; ask for the next batch only
    once the previous one is handled (that is what bounds the prefetch). Mark records handled
    with ``record.ack()`` (any task, any order), ``checkpointer.stage(record)`` (everything up to
    it) or ``await checkpointer.checkpoint(record)`` (and write now). Nothing is acknowledged
    for you. Once ``batches`` ends, the consumer writes the final checkpoint (SHARD_END when the
    shard ended and every record was handled) and lets the lease go as needed.
    """

    def __init__(self, worker: ShardWorker) -> None:
        self._worker = worker
        self.stream = worker.stream
        self.shard_id = worker.shard_id
        self.lease_key = worker.lease.lease_key
        self._closed = asyncio.Event()
        self.batches: AsyncIterator[list[ConsumedRecord[Any]]] = self._batches()

    @property
    def checkpointer(self) -> Checkpointer:
        return self._worker.checkpointer

    @property
    def pending(self) -> PendingCounts:
        """Delivered, unacknowledged, acknowledged-not-checkpointed and checkpointed records."""
        return self._worker.checkpointer.pending

    @property
    def shard_ended(self) -> bool:
        """Whether :attr:`batches` ended because the shard's end was read: every record of the
        closed shard was handed out (the consumer writes SHARD_END once all are acknowledged).
        False while reading, and when it ended by a stop, a handoff or a loss."""
        return self._worker.end_reached

    @property
    def millis_behind_latest(self) -> int | None:
        """How far behind the stream's tip the last fetch of the shard was (None: unknown)."""
        return self._worker.millis_behind_latest

    @property
    def lost(self) -> bool:
        """Whether the lease is lost: stop, nothing more will be checkpointed."""
        return self._worker.lost

    def __iter__(self) -> Iterator[Any]:
        return iter((self.shard_id, self.batches, self.checkpointer))

    def __repr__(self) -> str:
        return f"ShardSession(stream={self.stream!r}, shard_id={self.shard_id!r})"

    async def _batches(self) -> AsyncIterator[list[ConsumedRecord[Any]]]:
        """The shard's records, delivered; a record the deserializer rejects stops the shard
        (with its :class:`~shardflow.errors.DeserializationError`) once the records before it
        were handed out: user code that reads batches itself has no failure policy."""
        worker = self._worker
        try:
            async with contextlib.aclosing(delivered(worker)) as pieces:
                async for piece in pieces:
                    if isinstance(piece, Rejected):
                        log.error("shard %s: %s", worker.shard_id, piece.error)
                        worker.fail(piece.error)
                        return
                    yield piece
                    del piece  # not kept alive while the next is awaited (see reader.chunks)
        finally:
            self._closed.set()

    async def wait_closed(self, stopping: asyncio.Event) -> None:
        """Wait until user code is done with :attr:`batches` (or stopped using the shard).

        When the consumer stops (``stopping``) or the lease ends, user code gets the shard's
        ``drain_timeout`` more seconds to notice, as batches end then
        (:meth:`~shardflow.consumer.lifecycle.shard.ShardWorker.settle`).
        """
        await self._worker.settle(asyncio.ensure_future(self._closed.wait()), stopping)
