"""One shard, one running handler: after a lost lease, a handoff, or at a stop, nobody starts
the shard while a handler call of its previous run still runs (in-memory Kinesis and leases).

- an ``async def`` handler in flight when the lease is lost is cancelled at once;
- a plain handler's thread cannot be stopped: the same process does not start the shard again
  until it returns, it is reported after ``drain_timeout`` (event, metric, status), and a
  lease still held is not let go (a handoff completes only once it returns; at a stop the
  lease is left to expire).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from shardflow.aws.clients import OpenClients
from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.events import DiagnosticEvent, HandlerOverrun, LeaseAcquired, LeaseLost
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.leases.memory import InMemoryLeaseStore
from shardflow.leases.model import Lease
from shardflow.testing import MemoryKinesis
from shardflow.testing.harness import fast_settings
from support.dispatch_kit import dispatching
from support.waiting import until

RECORDS = [f"r{i}".encode() for i in range(5)]


def stream() -> MemoryKinesis:
    kinesis = MemoryKinesis()
    kinesis.create_stream("orders", shard_count=1)
    for data in RECORDS:
        kinesis.put("orders", data, partition_key="k")
    return kinesis


class Spans:
    """Handler calls in progress (from any thread), and the most at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0
        self.seen: list[bytes] = []

    def enter(self) -> None:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)

    def leave(self, data: bytes | None = None) -> None:
        with self._lock:
            self.running -= 1
            if data is not None:
                self.seen.append(data)


def blocking_handler(spans: Spans, first_call: threading.Event, go_on: threading.Event) -> Any:
    """A plain handler whose first call blocks its thread until ``go_on``."""

    def handle(record: ConsumedRecord[bytes]) -> None:
        spans.enter()
        try:
            if not first_call.is_set():
                first_call.set()
                go_on.wait(20.0)
            spans.leave(record.data)
        except BaseException:
            spans.leave()
            raise

    return handle


async def only_lease(store: InMemoryLeaseStore) -> Lease:
    (lease,) = await store.list_leases()
    return lease


async def steal(store: InMemoryLeaseStore, by: str) -> Lease:
    """Take the lease as another worker would (retried past our own renewals)."""
    while True:
        try:
            return await store.take(await only_lease(store), by)
        except LeaseConditionFailedError:
            continue


def of(events: list[DiagnosticEvent], kind: type[Any]) -> Callable[[], list[Any]]:
    return lambda: [e for e in events if isinstance(e, kind)]


def consumer_for(
    kinesis: MemoryKinesis,
    store: InMemoryLeaseStore,
    events: list[DiagnosticEvent],
    **settings: Any,
) -> Consumer:
    return Consumer(
        "orders",
        "app",
        settings=fast_settings(worker_id="a", **settings),
        clients=OpenClients(kinesis=kinesis),
        lease_store=store,
        on_event=events.append,
    )


@dataclass
class BlockedRun:
    """A consumer of ``stream()`` (worker "a") whose plain handler's first call blocks its
    thread until ``go_on`` is set."""

    store: InMemoryLeaseStore
    events: list[DiagnosticEvent]
    spans: Spans
    go_on: threading.Event
    consumer: Consumer
    run: asyncio.Task[None]


@asynccontextmanager
async def handler_blocked(dispatch: bool = False, **settings: Any) -> AsyncIterator[BlockedRun]:
    """Yields once the handler's first call blocks; on the way out the thread is let go and
    the consumer closed (nothing more if the test closed it already)."""
    store = InMemoryLeaseStore("app")
    events: list[DiagnosticEvent] = []
    spans = Spans()
    first_call = threading.Event()
    go_on = threading.Event()
    if dispatch:
        settings["dispatch"] = dispatching()
    consumer = consumer_for(stream(), store, events, drain_timeout=0.3, **settings)
    run = asyncio.create_task(consumer.consume(blocking_handler(spans, first_call, go_on)))
    try:
        await until(first_call.is_set, 10.0)
        yield BlockedRun(store, events, spans, go_on, consumer, run)
    finally:
        go_on.set()
        await consumer.close()
        await run


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "per-record"])
async def test_an_async_handler_in_flight_is_cancelled_when_the_lease_is_lost(batch: bool) -> None:
    store = InMemoryLeaseStore("app")
    events: list[DiagnosticEvent] = []
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handle(_: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    consumer = consumer_for(stream(), store, events, drain_timeout=10.0)
    run = asyncio.create_task(consumer.consume(handle, batch=batch))
    try:
        await until(started.is_set, 10.0)
        await steal(store, "thief")
        await until(of(events, LeaseLost), 10.0)
        # At once: not after drain_timeout (10 s), not when the handler returns (30 s).
        await asyncio.wait_for(cancelled.wait(), 2.0)
    finally:
        await consumer.close()
        await run


async def take_back(r: BlockedRun) -> None:
    """Another worker takes the lease, then frees it: this process takes it back at once."""
    taken = await steal(r.store, "thief")
    await until(of(r.events, LeaseLost), 10.0)
    await r.store.release(taken, "thief")
    await until(lambda: len(of(r.events, LeaseAcquired)()) >= 2, 10.0)


@pytest.mark.parametrize("dispatch", [False, True], ids=["shard-order", "dispatch"])
async def test_a_lease_taken_back_waits_for_the_old_handler_thread_which_is_reported(
    dispatch: bool,
) -> None:
    async with handler_blocked(dispatch) as r:
        consumer, spans = r.consumer, r.spans
        await take_back(r)
        # drain_timeout after the loss the thread still runs: reported, the shard still waits.
        (overrun,) = await _first(of(r.events, HandlerOverrun), 5.0)
        assert (overrun.running, overrun.lease_lost, overrun.waited) == (1, True, 0.3)
        key = overrun.lease_key
        assert consumer.status().overrunning == {key: 1}
        assert consumer.metrics().streams["orders"].overrunning_shards == 1
        assert consumer.metrics().streams["orders"].handler_overruns == 1
        await asyncio.sleep(0.5)  # time enough for a second worker to start handling
        assert spans.seen == [], "the shard started again while its old handler ran"
        r.go_on.set()
        await until(lambda: set(RECORDS) <= set(spans.seen), 10.0)
        await until(lambda: not consumer.status().overrunning, 5.0)
        assert consumer.metrics().streams["orders"].overrunning_shards == 0
    assert spans.most_at_once == 1


@pytest.mark.parametrize("dispatch", [False, True], ids=["shard-order", "dispatch"])
async def test_a_handoff_completes_only_once_the_handler_thread_returned(dispatch: bool) -> None:
    async with handler_blocked(dispatch) as r:
        store = r.store
        # A KCL 3.x-style handoff to "b" begins: "a" sees it at its next renewal.
        await store.handoff(await only_lease(store), "a", "b")
        (overrun,) = await _first(of(r.events, HandlerOverrun), 5.0)
        assert not overrun.lease_lost
        await asyncio.sleep(1.0)  # several renewals and drain timeouts later
        lease = await only_lease(store)
        assert (lease.lease_owner, lease.checkpoint_owner) == ("b", "a"), (
            "handed over while the handler still ran"
        )
        assert not of(r.events, LeaseLost)(), "a kept the lease renewed meanwhile"
        r.go_on.set()
        await until(lambda: not r.consumer.status().shards, 10.0)  # the handover write is done
        lease = await only_lease(store)
        assert (lease.lease_owner, lease.checkpoint_owner) == ("b", None)


async def test_a_handler_thread_still_running_at_the_stop_leaves_the_lease_to_expire() -> None:
    async with handler_blocked() as r:
        async with asyncio.timeout(5.0):
            await r.consumer.close()  # returns although the thread runs on
            await r.run
        lease = await only_lease(r.store)
        assert lease.lease_owner == "a", "released while its handler still ran"
        assert [e.why for e in of(r.events, LeaseLost)()] == ["expired"]


async def _first(found: Callable[[], list[Any]], within: float) -> list[Any]:
    await until(lambda: bool(found()), within)
    return found()


async def test_a_stop_while_a_lease_taken_back_waits_for_the_old_thread_does_not_wait_for_it() -> (
    None
):
    async with handler_blocked() as r:
        await take_back(r)
        async with asyncio.timeout(5.0):
            await r.consumer.close()  # the thread runs on: the stop does not wait for it
            await r.run
        lease = await only_lease(r.store)
        assert lease.lease_owner == "a", "released while the old handler still ran"
        assert r.spans.seen == []


async def test_a_call_queued_behind_busy_threads_does_not_start_once_the_lease_lapsed() -> None:
    # The soak's case: a worker frozen by SIGSTOP wakes with calls queued in its thread pool,
    # checked against the lease before the freeze; the lease lapsed meanwhile. The thread
    # asks again when its turn comes, and the queued call never starts.
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from shardflow.consumer.delivery.calls import Invoker, NotStarted, RunningCalls

    release = threading.Event()
    ran: list[str] = []

    def handler(name: str) -> None:
        if name == "busy":
            release.wait(5)
        ran.append(name)

    lease = {"held": True}
    calls = RunningCalls()
    invoke: Invoker[str] = Invoker(handler, ThreadPoolExecutor(max_workers=1))
    busy = asyncio.ensure_future(invoke("busy", calls, lambda: lease["held"]))
    queued = asyncio.ensure_future(invoke("queued", calls, lambda: lease["held"]))
    await asyncio.sleep(0.05)
    lease["held"] = False  # lapsed while "queued" waited for the only thread
    release.set()
    await busy
    with pytest.raises(NotStarted):
        await queued
    assert ran == ["busy"]
    assert await calls.wait_idle(1.0)
