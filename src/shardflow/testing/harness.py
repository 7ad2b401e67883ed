"""Run the real consumer against in-memory Kinesis and leases until it has handled everything.

::

    from shardflow.testing import MemoryKinesis, consume_until_caught_up

    async def test_billing_handles_orders() -> None:
        kinesis = MemoryKinesis()
        kinesis.create_stream("orders", shard_count=2)
        kinesis.put("orders", b'{"id": 1}', partition_key="customer-1")
        seen = []
        report = await consume_until_caught_up("orders", seen.append, kinesis=kinesis)
        assert len(seen) == 1
        assert report.checkpoints  # lease key -> checkpoint, as a restart would find them

Everything but the two stand-ins is the production code path: lease coordinator, shard
workers, handlers, checkpointer, lease store semantics. Timing is compressed
(:func:`fast_settings`) so a run takes milliseconds, not KCL's seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from shardflow.aws.clients import OpenClients
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.consumer.consumer import Consumer
from shardflow.consumer.delivery.calls import Handler
from shardflow.consumer.lifecycle.status import ConsumerStatus
from shardflow.consumer.settings import ConsumerSettings
from shardflow.deadletter.destination import DeadLetterDestination
from shardflow.fetch.polling import Polling
from shardflow.leases.memory import InMemoryLeaseStore
from shardflow.leases.model import Lease
from shardflow.leases.settings import LeaseSettings
from shardflow.records import SHARD_END, ExtendedSequenceNumber
from shardflow.testing.memory import MemoryKinesis

FAST_LEASES: Final = LeaseSettings(
    failover_time=2.0,
    renew_interval=0.2,
    take_interval=0.05,
    shard_sync_interval=0.5,
    parent_poll_interval=0.02,
)
"""Lease timing for in-memory tests: a take cycle every 50 ms, parents polled every 20 ms."""


def fast_settings(**overrides: Any) -> ConsumerSettings:
    """Consumer settings for in-memory tests (fast leases and polls); ``overrides`` win."""
    base = ConsumerSettings(
        leases=FAST_LEASES,
        fetch=Polling(idle_time=0.005, max_calls_per_second=5),
        checkpoint=CheckpointSettings(every_n=100, interval=0.05),
        drain_timeout=1.0,
    )
    return replace(base, **overrides)


@dataclass(frozen=True, slots=True)
class ConsumeReport:
    """What a run left behind."""

    status: ConsumerStatus
    """The consumer's status just before it was stopped."""
    leases: list[Lease] = field(default_factory=list)
    """The lease table after the stop."""

    @property
    def checkpoints(self) -> dict[str, ExtendedSequenceNumber]:
        """Each lease's checkpoint, by lease key, after the stop."""
        return {lease.lease_key: lease.checkpoint for lease in self.leases}


async def consume_until_caught_up(
    stream: str | Sequence[str],
    handler: Handler,
    *,
    kinesis: MemoryKinesis,
    application_name: str = "test-app",
    lease_store: InMemoryLeaseStore | None = None,
    settings: ConsumerSettings | None = None,
    batch: bool = False,
    auto_ack: bool = True,
    dead_letters: DeadLetterDestination | None = None,
    within: float = 30.0,
    **consumer_options: Any,
) -> ConsumeReport:
    """Consume ``stream`` from ``kinesis`` with ``handler`` until every record put so far is
    handled, then stop gracefully (final checkpoints, leases released) and report.

    ``lease_store`` defaults to a fresh in-memory table named ``application_name``; pass the
    same store again to see a restart continue from the checkpoints. Raises TimeoutError if the
    consumer is not caught up within ``within`` seconds (e.g. a handler that never returns).
    """
    store = lease_store or InMemoryLeaseStore(application_name)
    consumer = Consumer(
        stream,
        application_name,
        settings=settings or fast_settings(),
        clients=OpenClients(kinesis=kinesis),
        lease_store=store,
        **consumer_options,
    )
    streams = [stream] if isinstance(stream, str) else list(stream)
    run = asyncio.create_task(
        consumer.consume(handler, batch=batch, auto_ack=auto_ack, dead_letters=dead_letters)
    )
    try:
        async with asyncio.timeout(within):
            status = await _wait_caught_up(consumer, store, kinesis, streams, run)
    except BaseException:
        consumer.request_stop()
        # Stopping waits drain_timeout at most for hanging handlers; then give up on it.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(run, consumer.settings.drain_timeout + 5.0)
        raise
    await consumer.close()
    await run  # raises what the consumer raised (on_error="stop-consumer")
    return ConsumeReport(status, await store.list_leases())


async def _wait_caught_up(
    consumer: Consumer,
    store: InMemoryLeaseStore,
    kinesis: MemoryKinesis,
    streams: list[str],
    run: asyncio.Task[None],
) -> ConsumerStatus:
    streak = 0
    while True:
        if run.done():
            run.result()  # raises the consumer's failure
            raise RuntimeError("the consumer stopped before it caught up")
        status = consumer.status()
        done = consumer.running and await _all_handled(consumer, status, store, kinesis, streams)
        # Twice in a row, a poll interval apart: a record put just now is then seen too.
        streak = streak + 1 if done else 0
        if streak >= 2:
            return status
        await asyncio.sleep(0.01)


async def _all_handled(
    consumer: Consumer,
    status: ConsumerStatus,
    store: InMemoryLeaseStore,
    kinesis: MemoryKinesis,
    streams: list[str],
) -> bool:
    stopped = {(shard.stream, shard.shard_id) for shard in status.shards if shard.error}
    for stream in streams:
        if any((stream, shard_id) not in stopped for shard_id in kinesis.unread_shards(stream)):
            return False
    if not all(shard.caught_up for shard in status.shards if not shard.error):
        return False
    processing = {shard.lease_key for shard in status.shards}
    for lease in await store.list_leases():
        if lease.checkpoint.sequence_number == SHARD_END or lease.lease_key in status.parked:
            continue
        if lease.lease_owner != consumer.worker_id or lease.lease_key not in processing:
            return False  # not taken yet, or waiting for its parents
    return True
