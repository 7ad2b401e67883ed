"""Readiness as a probe asks it: parked or failed shards, unrenewed leases, stalled shards."""

from __future__ import annotations

import asyncio

from shardflow.aws import OpenClients
from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.consumer.checkpointing.acks import PendingCounts
from shardflow.consumer.lifecycle.health import readiness
from shardflow.consumer.lifecycle.status import ConsumerStatus, ShardStatus
from shardflow.leases import InMemoryLeaseStore
from shardflow.testing import fast_settings
from support.dispatch_kit import stream_of
from unit.consumer.test_shard_worker_kit import eventually

PENDING = PendingCounts(delivered=10, unacked=2, acked_unchecked=0, checkpointed=8)


def shard(**overrides: object) -> ShardStatus:
    fields: dict[str, object] = {
        "stream": "s",
        "shard_id": "shardId-000000000001",
        "lease_key": "shardId-000000000001",
        "checkpoint": None,
        "pending": PENDING,
        "millis_behind_latest": 0,
        "caught_up": True,
        "unrenewed_for": 1.0,
        "idle_for": 0.0,
    }
    fields.update(overrides)
    return ShardStatus(**fields)  # type: ignore[arg-type]


def test_not_running_is_not_ready() -> None:
    health = readiness(None, renew_every=3.3)
    assert health.live
    assert not health.ready


def test_a_worker_with_no_shards_is_ready() -> None:
    assert readiness(ConsumerStatus("w", ()), renew_every=3.3).ready


def test_a_lease_unrenewed_for_two_intervals_is_not_ready() -> None:
    fresh = ConsumerStatus("w", (shard(unrenewed_for=6.0),))
    stale = ConsumerStatus("w", (shard(unrenewed_for=7.0),))
    assert readiness(fresh, renew_every=3.3).ready
    health = readiness(stale, renew_every=3.3)
    assert not health.ready
    assert "not renewed for 7.0 s" in health.describe()


def test_a_parked_shard_is_not_ready_and_says_why() -> None:
    status = ConsumerStatus("w", (), parked={"shardId-7": ValueError("poison")})
    health = readiness(status, renew_every=3.3)
    assert not health.ready
    assert health.describe() == "shard shardId-7 is parked: ValueError: poison"


def test_a_shard_behind_that_handles_nothing_is_stalled() -> None:
    behind = ConsumerStatus("w", (shard(caught_up=False, idle_for=200.0),))
    idle = ConsumerStatus("w", (shard(caught_up=True, idle_for=200.0),))
    assert not readiness(behind, renew_every=3.3, stall_after=120).ready
    assert readiness(idle, renew_every=3.3, stall_after=120).ready


async def test_a_running_consumer_is_ready_then_a_parked_shard_makes_it_not() -> None:
    kinesis = stream_of([("k", b"fine"), ("k", b"poison"), ("k", b"never")])

    async def handle(record: ConsumedRecord[bytes]) -> None:
        if record.data == b"poison":
            raise ValueError("poison")

    consumer = Consumer(
        "s",
        "app",
        settings=fast_settings(),
        clients=OpenClients(kinesis=kinesis),
        lease_store=InMemoryLeaseStore("app"),
    )
    assert not consumer.health().ready  # not started
    run = asyncio.create_task(consumer.consume(handle))
    await eventually(lambda: bool(consumer.running and consumer.status().parked))
    health = await asyncio.to_thread(consumer.health)  # as a probe's thread asks
    assert health.live
    assert not health.ready
    assert "parked: HandlerError" in health.describe()
    await consumer.close()
    await run
