"""Planned handoff between live consumers over HTTP: moto's server for Kinesis and DynamoDB
(with the lease table's DynamoDB stream), in-process consumers, short lease timings.

A producer keeps writing uniquely numbered records while workers join and leave; every
record must be handled exactly once (zero lost, zero twice): that is what planned handoff
promises over KCL's release-and-steal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from shardflow.consumer import ConsumedRecord, ConsumerSettings
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.events import LeaseAcquired, LeaseLost, LeaseReleased
from shardflow.fetch import Polling
from shardflow.leases.settings import LeaseSettings
from support.boto import lease_items
from support.fleet import FleetWorker
from support.streams import create_stream, kinesis_at, put
from support.waiting import until

LIMIT = 30.0

LEASES = LeaseSettings(
    failover_time=3.0,
    renew_interval=0.5,
    take_interval=10.0,  # far apart: pick-up, not the take cycle, must move the leases
    safety_margin=0.3,
    pickup="stream",
    pickup_poll_interval=0.1,
    handoff_timeout=5.0,
)
SETTINGS = ConsumerSettings(
    leases=LEASES,
    fetch=Polling(idle_time=0.1),
    checkpoint=CheckpointSettings(every_n=20, interval=0.5),
    drain_timeout=2.0,
)


class Worker(FleetWorker):
    """One in-process consumer that records what it handled; with :attr:`hold` set, its
    handler hangs on a ``-hang`` record until ``hold`` is."""

    def __init__(self, url: str, stream: str, app: str, name: str, **settings: Any) -> None:
        super().__init__(url, stream, app, name, replace(SETTINGS, **settings))
        self.hold: asyncio.Event | None = None
        self.hanging = asyncio.Event()

    async def handle(self, record: ConsumedRecord[bytes]) -> None:
        if self.hold is not None and record.data.endswith(b"-hang"):
            self.hanging.set()
            await self.hold.wait()
        self.handled.append(record.data)


@contextlib.asynccontextmanager
async def producing(url: str, stream: str, rate: float = 60.0) -> AsyncIterator[list[bytes]]:
    """Write numbered records (``rate`` per second, in small batches) until the block ends."""
    written: list[bytes] = []

    async def produce() -> None:
        async with kinesis_at(url) as kinesis:
            batch = 0
            while True:
                items = [(f"k{batch}-{i}", f"r-{batch}-{i}".encode()) for i in range(6)]
                await put(kinesis, stream, items)
                written.extend(data for _, data in items)
                batch += 1
                await asyncio.sleep(6 / rate)

    task = asyncio.create_task(produce())
    try:
        yield written
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def assert_exactly_once(written: list[bytes], *workers: Worker) -> None:
    handled = Counter(data for worker in workers for data in worker.handled)
    lost = [data for data in written if data not in handled]
    twice = [data for data, count in handled.items() if count > 1]
    assert not lost, f"{len(lost)} records never handled, e.g. {lost[:3]}"
    assert not twice, f"{len(twice)} records handled twice, e.g. {twice[:3]}"


async def everything_handled(written: list[bytes], *workers: Worker) -> None:
    def done() -> bool:
        seen = {data for worker in workers for data in worker.handled}
        return all(data in seen for data in written)

    await until(done, LIMIT)


@pytest.fixture
async def four_shards(moto_url: str, stream_name: str) -> str:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 4)
    return stream_name


async def test_a_stopping_worker_hands_its_leases_over_without_loss_or_repeats(
    moto_url: str, four_shards: str
) -> None:
    app = f"app-{four_shards}"
    a = Worker(moto_url, four_shards, app, "a")
    b = Worker(moto_url, four_shards, app, "b")
    async with producing(moto_url, four_shards) as written:
        a.start()
        await until(lambda: a.owned() == 4 and len(a.handled) > 20, LIMIT)
        b.start()
        # The joiner asks for leases; the owner drains and hands them over: 2 and 2.
        await until(lambda: a.owned() == 2 and b.owned() == 2, LIMIT)
        assert a.consumer.status().shards  # still working
        await asyncio.sleep(0.5)
        await a.stop()
        await until(lambda: b.owned() == 4, LIMIT)
        await asyncio.sleep(0.5)
    await everything_handled(written, a, b)
    await b.stop()

    assert_exactly_once(written, a, b)
    assert {e.how for e in b.of(LeaseAcquired)} == {"handoff"}, "never stolen, never expired"
    assert not a.of(LeaseLost)
    assert {e.why for e in a.of(LeaseReleased)} == {"handoff"}
    assert all("checkpointOwner" not in item for item in lease_items(moto_url, app).values())


async def test_scale_out_moves_leases_by_handoff_without_loss_or_repeats(
    moto_url: str, four_shards: str
) -> None:
    app = f"app-{four_shards}"
    a = Worker(moto_url, four_shards, app, "a")
    b = Worker(moto_url, four_shards, app, "b")
    c = Worker(moto_url, four_shards, app, "c", leases=replace(LEASES, pickup="poll"))
    async with producing(moto_url, four_shards) as written:
        a.start()
        await until(lambda: a.owned() == 4 and len(a.handled) > 20, LIMIT)
        b.start()
        c.start()  # polls the table instead of reading its stream: a mixed fleet
        await until(lambda: sorted(w.owned() for w in (a, b, c)) == [1, 1, 2], LIMIT)
        await asyncio.sleep(1.0)
    await everything_handled(written, a, b, c)
    for worker in (a, b, c):
        await worker.stop()

    assert_exactly_once(written, a, b, c)
    for joiner in (b, c):
        assert {e.how for e in joiner.of(LeaseAcquired)} <= {"handoff", "free"}
    assert not a.of(LeaseLost)


async def test_a_handoff_the_owner_cannot_finish_in_time_waits_for_its_drain_not_the_timeout(
    moto_url: str, stream_name: str
) -> None:
    """The next owner never takes a handoff over on ``handoff_timeout`` while the old owner
    renews it (that owner may still be running a handler for the shard): it receives the lease
    once the old owner's drain ended the hung handler (cancelled after ``drain_timeout``)."""
    app = f"app-{stream_name}"
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 2)
        before = [(f"k{i}", f"before-{i}".encode()) for i in range(20)]
        await put(kinesis, stream_name, before)
        quick = replace(LEASES, handoff_timeout=1.5)
        a = Worker(moto_url, stream_name, app, "a", leases=quick, drain_timeout=4.0)
        a.hold = asyncio.Event()  # a's handler hangs on a "-hang" record until released
        b = Worker(moto_url, stream_name, app, "b", leases=quick)
        a.start()
        await until(lambda: len(a.handled) == 20, LIMIT)
        b.start()
        await until(lambda: a.owned() == 1 and b.owned() == 1, LIMIT)
        await asyncio.sleep(0.8)  # checkpoints written
        hang = [(f"k{i}", f"x{i}-hang".encode()) for i in range(20)]
        await put(kinesis, stream_name, hang)
        await until(lambda: len(b.handled) > 0 and b.handled[-1].endswith(b"-hang"), LIMIT)
        await asyncio.wait_for(a.hanging.wait(), LIMIT)  # a is stuck in its handler now
    loop = asyncio.get_running_loop()
    stopped_at = loop.time()
    stopping = asyncio.create_task(a.stop())  # hands its lease to b, cannot drain
    await until(lambda: b.owned() == 2, LIMIT)
    waited = loop.time() - stopped_at
    await everything_handled([data for _, data in before + hang], b, a)
    a.hold.set()
    await stopping
    await b.stop()

    assert waited > quick.handoff_timeout + 1.0, "taken over on the handoff timeout"
    assert waited >= 4.0 - 0.5, "the new owner waits for the old one's drain"
    assert [e.how for e in b.of(LeaseAcquired)][-1] == "handoff", "completed, not taken over"
    assert not a.of(LeaseLost)
    assert [e.why for e in a.of(LeaseReleased)][-1] == "handoff"
    handled = Counter(b.handled + a.handled)
    assert all(handled[data] >= 1 for _, data in before + hang), "nothing lost"
    assert all(handled[data] == 1 for _, data in before), "checkpoints before the hang hold"
