"""One shard, one running handler: a lease lost and taken back at once waits for the old run."""

from __future__ import annotations

import asyncio
import threading

from shardflow.aws.clients import OpenClients
from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.events import DiagnosticEvent, LeaseAcquired, LeaseLost
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.leases.memory import InMemoryLeaseStore
from shardflow.testing import MemoryKinesis
from shardflow.testing.harness import fast_settings
from support.waiting import until


async def test_a_lease_taken_back_does_not_start_while_the_old_handler_thread_runs() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("orders", shard_count=1)
    for i in range(5):
        kinesis.put("orders", f"r{i}".encode(), partition_key="k")
    store = InMemoryLeaseStore("app")
    events: list[DiagnosticEvent] = []
    lock = threading.Lock()
    running = 0
    most_at_once = 0
    first_call = threading.Event()
    go_on = threading.Event()
    seen: list[bytes] = []

    def handle(record: ConsumedRecord[bytes]) -> None:
        nonlocal running, most_at_once
        with lock:
            running += 1
            most_at_once = max(most_at_once, running)
        try:
            if not first_call.is_set():
                first_call.set()
                go_on.wait(10.0)  # still running when the lease is lost and taken back
            seen.append(record.data)
        finally:
            with lock:
                running -= 1

    consumer = Consumer(
        "orders",
        "app",
        settings=fast_settings(drain_timeout=0.3),
        clients=OpenClients(kinesis=kinesis),
        lease_store=store,
        on_event=events.append,
    )
    run = asyncio.create_task(consumer.consume(handle))
    try:
        await until(first_call.is_set, 10.0)
        # Another worker takes the lease, then frees it: this process takes it back at once.
        while True:
            (lease,) = await store.list_leases()
            try:
                taken = await store.take(lease, "thief")
                break
            except LeaseConditionFailedError:
                continue
        await until(lambda: any(isinstance(e, LeaseLost) for e in events), 10.0)
        await store.release(taken, "thief")
        await until(lambda: sum(isinstance(e, LeaseAcquired) for e in events) >= 2, 10.0)
        await asyncio.sleep(0.8)  # time enough for a second worker to start handling
        go_on.set()
        await until(lambda: {f"r{i}".encode() for i in range(5)} <= set(seen), 10.0)
    finally:
        go_on.set()
        await consumer.close()
        await run
    assert most_at_once == 1
