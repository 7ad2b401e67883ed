"""A shard worker's records through a :class:`ShardDispatcher`, from first record to checkpoint.

The consumer uses this in place of :meth:`ShardWorker.run` when dispatch settings are given.
The worker's delivery rules stay: records are submitted only while the shard may deliver; on
stop, when the lease is given up or when the shard fails (the dispatcher stopped, the key
function failed), records in flight get ``drain_timeout`` seconds, then are abandoned
unacknowledged; on lease loss they are abandoned at once. Acknowledgements come from the
dispatcher only, so the final checkpoint needs no drain of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from shardflow.clock import Clock
from shardflow.consumer.dispatch.contracts import DeadLetterSink
from shardflow.consumer.dispatch.invoke import RecordHandler
from shardflow.consumer.dispatch.scheduler import ShardDispatcher
from shardflow.consumer.dispatch.settings import DispatchSettings
from shardflow.errors import DispatchStoppedError, KeyFunctionError

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
    ending = [
        asyncio.ensure_future(worker.wait_stop_requested()),
        asyncio.ensure_future(lease.giving_up.wait()),
        asyncio.ensure_future(dispatcher.wait_stopped()),
        asyncio.ensure_future(failed.wait()),
    ]
    lost = asyncio.ensure_future(lease.lost.wait())
    try:
        await asyncio.wait({work, lost, *ending}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done() and not lost.done():
            # Stopping, handing off or failed: records in flight may still finish, for a while.
            await asyncio.wait(
                {work, lost},
                timeout=worker.settings.drain_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            await dispatcher.abort()
        else:
            work.result()
    finally:
        for waiter in (work, lost, *ending):
            waiter.cancel()
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


def dispatched_driver(
    handler: RecordHandler[ConsumedRecord[Any]],
    settings: DispatchSettings,
    *,
    sink: DeadLetterSink[ConsumedRecord[Any]] | None,
    executor: Executor | None,
    clock: Clock,
) -> Callable[[ShardWorker], Awaitable[ShardResult]]:
    """What the consumer runs per owned shard: a dispatcher of its own, one worker-wide limit."""
    if settings.needs_dead_letters and sink is None:
        raise ValueError(f"on_failure={settings.on_failure!r} needs a dead-letter destination")
    per_worker = settings.max_in_flight_per_worker
    limit = asyncio.Semaphore(per_worker) if per_worker is not None else None

    async def drive(worker: ShardWorker) -> ShardResult:
        dispatcher: ShardDispatcher[ConsumedRecord[Any]] = ShardDispatcher(
            handler,
            worker.checkpointer.tracker,
            settings,
            sink=sink,
            worker_limit=limit,
            executor=executor,
            clock=clock,
            on_stop=worker.fail,
        )
        return await run_dispatched(worker, dispatcher)

    return drive
