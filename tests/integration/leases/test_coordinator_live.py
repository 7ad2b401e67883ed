"""Lease coordinators against DynamoDB and Kinesis on moto's server, over HTTP.

Two coordinators (two worker ids) in one process share one lease table, each with its own
DynamoDB client as separate processes would have. Short timings (failover 2 s) keep the
whole module well under a minute.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import wait_for_active
from shardflow.errors import ShardLeaseLostError
from shardflow.events import DiagnosticEvent, LeaseAcquired, LeaseLost
from shardflow.leases import DynamoDBLeaseStore
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.settings import LeaseSettings
from shardflow.records import ExtendedSequenceNumber
from shardflow.testing.faults import ErrorResponse, FaultProxy
from support.boto import make_stream
from support.lease_backends import FAST, DynamoBackend

FAST_LEASES = LeaseSettings(
    failover_time=2.0,
    renew_interval=0.4,
    take_interval=1.0,
    safety_margin=0.3,
    handoff=False,  # the coordinator alone, KCL 2.x style: nobody here completes handoffs
    pickup="off",
)
LIMIT = 20.0


class Timeline:
    """Diagnostic events of every worker with the monotonic time they happened."""

    def __init__(self) -> None:
        self.events: list[tuple[float, DiagnosticEvent]] = []

    def __call__(self, event: DiagnosticEvent) -> None:
        self.events.append((time.monotonic(), event))

    def times(self, kind: type[Any], worker_id: str) -> dict[str, float]:
        """lease key -> the last time ``worker_id`` emitted ``kind`` for it."""
        return {
            event.lease_key: at
            for at, event in self.events
            if isinstance(event, kind) and event.worker_id == worker_id
        }


class Cluster:
    """Coordinators of one application: one table, one stream, a client per worker."""

    def __init__(self, moto_url: str, stream: str, stack: AsyncExitStack) -> None:
        self.moto_url = moto_url
        self.stream = stream
        self.backend = DynamoBackend(moto_url)
        self.stack = stack
        self.timeline = Timeline()
        self.coordinators: list[LeaseCoordinator] = []

    async def kinesis(self) -> Any:
        factory = ClientFactory(AwsSettings(endpoint_url=self.moto_url))
        return await self.stack.enter_async_context(factory.kinesis())

    async def worker(
        self,
        worker_id: str,
        *,
        settings: LeaseSettings = FAST_LEASES,
        dynamodb_url: str | None = None,
        start: bool = True,
    ) -> LeaseCoordinator:
        factory = ClientFactory(AwsSettings(endpoint_url=dynamodb_url or self.moto_url))
        client = await self.stack.enter_async_context(factory.dynamodb())
        store = DynamoDBLeaseStore(client, self.backend.table_name, backoff=FAST)
        coordinator = LeaseCoordinator(
            store,
            worker_id=worker_id,
            streams=[self.stream],
            kinesis=await self.kinesis(),
            settings=settings,
            on_event=self.timeline,
        )
        self.coordinators.append(coordinator)
        if start:
            await coordinator.start()
        return coordinator

    def leases(self) -> dict[str, dict[str, Any]]:
        items = self.backend.raw.scan(TableName=self.backend.table_name, ConsistentRead=True)
        return {item["leaseKey"]["S"]: item for item in items["Items"]}

    def owners(self) -> Counter[str | None]:
        return Counter(item.get("leaseOwner", {}).get("S") for item in self.leases().values())

    async def stop(self) -> None:
        for coordinator in self.coordinators:
            await coordinator.stop(release=False)
        await self.backend.aclose()


@pytest.fixture
async def cluster(moto_url: str, stream_name: str) -> AsyncIterator[Cluster]:
    async with AsyncExitStack() as stack:
        group = Cluster(moto_url, stream_name, stack)
        try:
            yield group
        finally:
            await group.stop()


async def until(condition: Callable[[], bool | Awaitable[bool]], limit: float = LIMIT) -> float:
    """Wait until ``condition()`` holds; the seconds it took. Fails the test after ``limit``."""
    started = time.monotonic()
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - started
        if time.monotonic() - started > limit:
            raise AssertionError(f"condition not met within {limit}s")
        await asyncio.sleep(0.05)


async def test_two_workers_of_a_new_application_converge_to_a_balanced_split(
    cluster: Cluster, moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 6)
    started = time.monotonic()
    a = await cluster.worker("worker-a")
    assert time.monotonic() - started < 5.0, "a new application holds leases within seconds"
    assert len(a.owned()) == 6
    b = await cluster.worker("worker-b")
    await until(lambda: cluster.owners() == Counter({"worker-a": 3, "worker-b": 3}))
    await asyncio.sleep(2 * FAST_LEASES.take_every)  # and it stays balanced
    assert cluster.owners() == Counter({"worker-a": 3, "worker-b": 3})
    await until(lambda: (len(a.owned()), len(b.owned())) == (3, 3))
    assert not set(a.owned()) & set(b.owned())
    items = cluster.leases()
    for key, owned in [*a.owned().items(), *b.owned().items()]:
        assert items[key]["leaseOwner"]["S"] == owned.worker_id
        assert int(items[key]["leaseCounter"]["N"]) >= owned.lease.lease_counter


async def test_a_worker_stopping_with_release_hands_everything_over_within_a_take_interval(
    cluster: Cluster, moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 4)
    a = await cluster.worker("worker-a")
    b = await cluster.worker("worker-b")
    await until(lambda: len(a.owned()) == len(b.owned()) == 2)
    await a.stop(release=True)
    assert cluster.owners()["worker-a"] == 0
    waited = await until(lambda: len(b.owned()) == 4)
    assert waited <= FAST_LEASES.take_every + 0.5
    assert cluster.owners() == Counter({"worker-b": 4})


async def test_a_crashed_workers_leases_are_taken_after_failover(
    cluster: Cluster, moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 4)
    a = await cluster.worker("worker-a")
    b = await cluster.worker("worker-b")
    await until(lambda: len(a.owned()) == len(b.owned()) == 2)
    held = dict(a.owned())
    await a.stop(release=False)  # renewals stop; the table still names worker-a
    crashed = time.monotonic()
    await until(lambda: len(b.owned()) == 4)
    taken = cluster.timeline.times(LeaseAcquired, "worker-b")
    for key, owned in held.items():
        assert taken[key] > owned.deadline, "not while worker-a could still use the lease"
        assert taken[key] - crashed >= FAST_LEASES.failover_time - FAST_LEASES.renew_every
        assert taken[key] - crashed <= 2 * FAST_LEASES.take_every + FAST_LEASES.failover_time + 1


async def test_a_worker_that_cannot_renew_stops_before_its_leases_move_and_never_checkpoints(
    cluster: Cluster, moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 4)
    async with FaultProxy(moto_url) as proxy:
        zombie = await cluster.worker("zombie", dynamodb_url=proxy.url)
        eager = LeaseSettings(
            failover_time=2.0,
            renew_interval=0.4,
            take_interval=0.2,
            safety_margin=0.3,
            max_leases_to_steal_at_once=0,
            handoff=False,
            pickup="off",
        )
        survivor = await cluster.worker("survivor", settings=eager)
        held = dict(zombie.owned())
        assert len(held) == 4
        await asyncio.sleep(FAST_LEASES.renew_every * 2)
        for owned in held.values():
            await owned.writer.write(ExtendedSequenceNumber("1000"))
        # From now on every UpdateItem of the zombie fails (a partitioned or throttled worker).
        proxy.add(ErrorResponse("InternalServerError"), service="DynamoDB", operation="UpdateItem")

        await until(lambda: len(survivor.owned()) == 4)
        lost = cluster.timeline.times(LeaseLost, "zombie")
        taken = cluster.timeline.times(LeaseAcquired, "survivor")
        for key, owned in held.items():
            assert owned.lost.is_set()
            assert owned.ended_why == "expired"
            assert lost[key] < taken[key], "the zombie stopped before the lease moved"
            assert lost[key] <= owned.deadline + 0.2

        failed_writes = len(proxy.injected(operation="UpdateItem"))
        assert failed_writes > 0, "the zombie's renewals really failed"
        for owned in held.values():
            with pytest.raises(ShardLeaseLostError):
                await owned.writer.write(ExtendedSequenceNumber("2000"))
        await proxy.idle()
        assert len(proxy.injected(operation="UpdateItem")) == failed_writes, "nothing sent"
        items = cluster.leases()
        assert {item["checkpoint"]["S"] for item in items.values()} == {"1000"}
        assert {item["leaseOwner"]["S"] for item in items.values()} == {"survivor"}


async def test_leases_of_a_resharded_stream_record_their_lineage(
    cluster: Cluster, moto_url: str, stream_name: str
) -> None:
    kinesis = make_stream(moto_url, stream_name, 2)
    first = kinesis.list_shards(StreamName=stream_name)["Shards"][0]
    low, high = (int(first["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
    kinesis.split_shard(
        StreamName=stream_name,
        ShardToSplit=first["ShardId"],
        NewStartingHashKey=str((low + high) // 2),
    )
    async with ClientFactory(AwsSettings(endpoint_url=moto_url)).kinesis() as client:
        await wait_for_active(client, stream_name)
    a = await cluster.worker("worker-a")
    items = cluster.leases()
    assert len(items) == 4
    children = [k for k, item in items.items() if "parentShardId" in item]
    assert len(children) == 2
    for key in children:
        assert items[key]["parentShardId"]["SS"] == [first["ShardId"]]
        assert items[key]["checkpoint"]["S"] == "TRIM_HORIZON"
    child = a.owned()[children[0]]
    assert not await a.parents_done(child)
    await a.owned()[first["ShardId"]].writer.write(ExtendedSequenceNumber("SHARD_END"))
    assert await a.parents_done(child)
