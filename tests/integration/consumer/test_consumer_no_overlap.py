"""One shard, one running handler, across workers, over HTTP: moto's server for Kinesis and
DynamoDB, a fault proxy in front of it for one worker, in-process consumers.

Every handler call is logged with its start and end; for each shard no call may start before
the previous one (of any worker) ended:

- after a lost lease: the owner's lease table writes fail (a DynamoDB brownout for it
  alone) while its ``async def`` batch handler hangs; its lease runs out, the other worker
  takes it after ``failover_time``. The hung call must have been cancelled by then;
- after a handoff that outlives ``handoff_timeout``: the owner stops (handing its lease over)
  while its handler hangs; the next owner must not take the lease over on the timeout, only
  receive it once the old owner's drain ended its handler.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import pytest

from shardflow.consumer import ConsumedRecord, ConsumerSettings
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.events import LeaseAcquired, LeaseLost, LeaseReleased
from shardflow.fetch import Polling
from shardflow.leases.settings import LeaseSettings
from shardflow.testing.faults import ErrorResponse, FaultProxy
from support.fleet import FleetWorker
from support.streams import create_stream_holding, kinesis_at, put
from support.waiting import until

LIMIT = 40.0

LEASES = LeaseSettings(
    failover_time=3.0,
    renew_interval=0.5,
    take_interval=0.5,
    safety_margin=0.3,
    pickup="poll",
    pickup_poll_interval=0.1,
    handoff_timeout=1.0,
    max_leases_to_steal_at_once=0,  # the lease moves only by loss or handoff here
)
SETTINGS = ConsumerSettings(
    leases=LEASES,
    fetch=Polling(idle_time=0.1),
    checkpoint=CheckpointSettings(every_n=5, interval=0.3),
    drain_timeout=3.0,
)


@dataclass(frozen=True, slots=True)
class Span:
    worker: str
    shard: str
    start: float
    end: float


class Worker(FleetWorker):
    """One in-process consumer; an ``async def`` handler that logs every call's span and
    hangs on a ``-hang`` record while :attr:`hold` is unset (``hangs``)."""

    def __init__(
        self,
        url: str,
        stream: str,
        app: str,
        name: str,
        *,
        hangs: bool,
        batch: bool,
        leases: LeaseSettings = LEASES,
    ) -> None:
        super().__init__(url, stream, app, name, replace(SETTINGS, leases=leases), batch=batch)
        self.spans: list[Span] = []
        self.hangs = hangs
        self.hold = asyncio.Event()
        self.hanging = asyncio.Event()

    async def handle(self, arg: Any) -> None:
        records: list[ConsumedRecord[bytes]] = arg if self.batch else [arg]
        start = time.monotonic()
        try:
            if self.hangs and any(r.data.endswith(b"-hang") for r in records):
                self.hanging.set()
                await self.hold.wait()
            await asyncio.sleep(0.01)  # a call takes a while: overlaps have room to show
            self.handled.extend(r.data for r in records)
        finally:
            self.spans.append(Span(self.name, records[0].shard_id, start, time.monotonic()))

    async def stop(self) -> None:
        self.hold.set()
        await super().stop()


def assert_no_overlap(*workers: Worker) -> None:
    by_shard: dict[str, list[Span]] = defaultdict(list)
    for worker in workers:
        for span in worker.spans:
            by_shard[span.shard].append(span)
    for shard, spans in by_shard.items():
        spans.sort(key=lambda s: s.start)
        for before, after in itertools.pairwise(spans):
            assert after.start >= before.end, (
                f"shard {shard}: a call of {after.worker} started "
                f"{before.end - after.start:.2f}s before a call of {before.worker} ended"
            )


@pytest.fixture
def proxy(moto_url: str) -> Any:
    with FaultProxy(moto_url, seed=3) as proxy:
        yield proxy


BEFORE = [(f"k{i}", f"before-{i}".encode()) for i in range(10)]
HANG = [(f"k{i}", f"x{i}-hang".encode()) for i in range(10)]


async def test_after_a_lost_lease_no_two_handler_calls_of_the_shard_overlap(
    moto_url: str, proxy: FaultProxy, stream_name: str
) -> None:
    app = f"app-{stream_name}"
    async with kinesis_at(moto_url) as kinesis:
        await create_stream_holding(kinesis, stream_name, 1, BEFORE)
        a = Worker(proxy.url, stream_name, app, "a", hangs=True, batch=True)
        b = Worker(moto_url, stream_name, app, "b", hangs=False, batch=True)
        a.start()
        await until(lambda: len(a.handled) == len(BEFORE), LIMIT)
        b.start()
        await asyncio.sleep(1.0)  # b sees a's lease renewed: live, not b's to take
        await put(kinesis, stream_name, HANG)
        await asyncio.wait_for(a.hanging.wait(), LIMIT)
    # a's lease table writes fail from now on: its lease runs out, b takes it once expired.
    proxy.add(ErrorResponse("InternalServerError", status=500), service="DynamoDB")
    try:
        await until(lambda: {d for _, d in HANG} <= set(b.handled), LIMIT)
        assert [e.why for e in a.of(LeaseLost)] == ["expired"]
        assert [e.how for e in b.of(LeaseAcquired)] == ["expired"]
    finally:
        proxy.clear()
        await b.stop()
        await a.stop()
    assert_no_overlap(a, b)
    assert not any(data.endswith(b"-hang") for data in a.handled), "a's hung call was cancelled"


@pytest.mark.parametrize("batch", [False, True], ids=["per-record", "batch"])
async def test_after_a_handoff_outliving_its_timeout_no_two_handler_calls_overlap(
    moto_url: str, stream_name: str, batch: bool
) -> None:
    app = f"app-{stream_name}"
    asks = replace(LEASES, max_leases_to_steal_at_once=1)  # b asks a for its share
    async with kinesis_at(moto_url) as kinesis:
        await create_stream_holding(kinesis, stream_name, 2, BEFORE)
        a = Worker(moto_url, stream_name, app, "a", hangs=True, batch=batch)
        b = Worker(moto_url, stream_name, app, "b", hangs=False, batch=batch, leases=asks)
        a.start()
        await until(lambda: len(a.handled) == len(BEFORE), LIMIT)
        b.start()
        await until(lambda: a.owned() == 1 and b.owned() == 1, LIMIT)
        await asyncio.sleep(1.0)
        await put(kinesis, stream_name, HANG)
        await asyncio.wait_for(a.hanging.wait(), LIMIT)
    began = time.monotonic()
    # a hands its lease to b and cannot drain: its handler hangs until the drain cancels it.
    stopping = asyncio.create_task(a.consumer.close())
    try:
        await until(lambda: b.owned() == 2, LIMIT)
        waited = time.monotonic() - began
        await until(lambda: {d for _, d in HANG} <= set(a.handled) | set(b.handled), LIMIT)
    finally:
        await stopping
        await b.stop()
        await a.stop()
    assert waited > LEASES.handoff_timeout + 1.0, "taken over on the handoff timeout"
    assert waited >= SETTINGS.drain_timeout - 0.5, "received before a's drain ended"
    assert [e.how for e in b.of(LeaseAcquired)] == ["handoff", "handoff"], "never taken over"
    assert [e.why for e in a.of(LeaseReleased)] == ["handoff", "handoff"]
    assert_no_overlap(a, b)
