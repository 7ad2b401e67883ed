"""A shard worker's records through a :class:`ShardDispatcher`, from first record to checkpoint.

The consumer uses this in place of :meth:`ShardWorker.run` when dispatch settings are given.
The worker's delivery rules stay: records are submitted only while the shard may deliver; on
stop, when the lease is given up or when the shard fails (the dispatcher stopped, the key
function failed), records in flight get ``drain_timeout`` seconds, then are abandoned
unacknowledged; on lease loss they are abandoned at once (``async def`` handler calls are
cancelled; a thread runs on, counted in the worker's ``calls``, and the final checkpoint waits
for it, see :meth:`ShardWorker.finish`). Acknowledgements come from the dispatcher only, so
the final checkpoint needs no drain of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from shardflow.clock import Clock
from shardflow.consumer.dispatch.contracts import DeadLetterSink
from shardflow.consumer.dispatch.invoke import RecordHandler
from shardflow.consumer.dispatch.scheduler import ShardDispatcher
from shardflow.consumer.dispatch.settings import DispatchSettings
from shardflow.errors import DispatchStoppedError, KeyFunctionError
from shardflow.waits import first_of

if TYPE_CHECKING:
    from shardflow.consumer.records import ConsumedRecord
    from shardflow.consumer.shard_worker import ShardWorker
    from shardflow.consumer.worker_contract import ShardResult


async def run_dispatched(
    worker: ShardWorker, dispatcher: ShardDispatcher[ConsumedRecord[Any]]
) -> ShardResult:
    """Feed ``worker``'s records to ``dispatcher`` until the shard ends, stops, fails or is lost.

    Build the dispatcher with ``on_stop=worker.fail`` so that its stop fails the shard.
    """
    failed = asyncio.Event()
    work = asyncio.ensure_future(_feed_and_drain(worker, dispatcher, failed))
    lease = worker.lease
    try:
        await first_of(
            work,
            lease.lost,
            worker.wait_stop_requested(),
            lease.giving_up,
            dispatcher.wait_stopped(),
            failed,
        )
        if not work.done() and not lease.lost.is_set():
            # Stopping, handing off or failed: records in flight may still finish, for a while.
            await first_of(work, lease.lost, timeout=worker.settings.drain_timeout)
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            await dispatcher.abort()
        else:
            work.result()
    finally:
        work.cancel()
    return await worker.finish(drain_timeout=0.0)


async def _feed_and_drain(
    worker: ShardWorker,
    dispatcher: ShardDispatcher[ConsumedRecord[Any]],
    failed: asyncio.Event,
) -> None:
    try:
        async for records in worker.batches():
            for record in records:
                if not worker.may_deliver():
                    break
                await dispatcher.submit(record)
    except DispatchStoppedError:
        pass  # the worker heard of it through on_stop
    except KeyFunctionError as exc:
        worker.fail(exc)
        failed.set()
    with contextlib.suppress(DispatchStoppedError):
        await dispatcher.drain()


class DispatchedShards:
    """What the consumer runs per owned shard (call it with the shard's worker): a dispatcher
    of its own per shard, one worker-wide limit; and the running dispatchers, for releasing
    keys blocked by the ``block-key`` policy."""

    def __init__(
        self,
        handler: RecordHandler[ConsumedRecord[Any]],
        settings: DispatchSettings,
        *,
        sink: DeadLetterSink[ConsumedRecord[Any]] | None,
        executor: Executor | None,
        clock: Clock,
    ) -> None:
        if settings.needs_dead_letters and sink is None:
            raise ValueError(f"on_failure={settings.on_failure!r} needs a dead-letter destination")
        self._handler = handler
        self._settings = settings
        self._sink = sink
        self._executor = executor
        self._clock = clock
        per_worker = settings.max_in_flight_per_worker
        self._limit = asyncio.Semaphore(per_worker) if per_worker is not None else None
        # (stream, shard id) -> the dispatcher of a shard being processed now.
        self._running: dict[tuple[str, str], ShardDispatcher[ConsumedRecord[Any]]] = {}

    async def __call__(self, worker: ShardWorker) -> ShardResult:
        dispatcher: ShardDispatcher[ConsumedRecord[Any]] = ShardDispatcher(
            self._handler,
            worker.checkpointer.tracker,
            self._settings,
            sink=self._sink,
            worker_limit=self._limit,
            executor=self._executor,
            clock=self._clock,
            on_stop=worker.fail,
            lease_held=lambda: not worker.lost,
            calls=worker.calls,
        )
        where = (worker.stream, worker.shard_id)
        self._running[where] = dispatcher
        try:
            return await run_dispatched(worker, dispatcher)
        finally:
            if self._running.get(where) is dispatcher:
                del self._running[where]

    def blocked_keys(self) -> dict[tuple[str, str], frozenset[str]]:
        """Keys blocked now, per (stream, shard id) of the shards processed here."""
        return {
            where: dispatcher.blocked_keys
            for where, dispatcher in self._running.items()
            if dispatcher.blocked_keys
        }

    def release(self, key: str, *, stream: str | None = None, shard_id: str | None = None) -> int:
        """Unblock ``key`` on every matching shard processed here; how many shards had it."""
        released = 0
        for (shard_stream, shard), dispatcher in list(self._running.items()):
            if stream is not None and shard_stream != stream:
                continue
            if shard_id is not None and shard != shard_id:
                continue
            released += dispatcher.release(key)
        return released


def dispatched_driver(
    handler: RecordHandler[ConsumedRecord[Any]],
    settings: DispatchSettings,
    *,
    sink: DeadLetterSink[ConsumedRecord[Any]] | None,
    executor: Executor | None,
    clock: Clock,
) -> DispatchedShards:
    """What the consumer runs per owned shard (see :class:`DispatchedShards`)."""
    return DispatchedShards(handler, settings, sink=sink, executor=executor, clock=clock)
