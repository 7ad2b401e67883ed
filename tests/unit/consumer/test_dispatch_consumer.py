"""The consumer with dispatch settings, against the in-memory Kinesis and lease store."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest

from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.errors import RetriesExhaustedError
from shardflow.leases import InMemoryLeaseStore
from shardflow.records import ExtendedSequenceNumber
from shardflow.testing import InMemoryDeadLetters, consume_until_caught_up, fast_settings
from support.dispatch_kit import (
    dispatch_consumer,
    dispatching,
    failing_on,
    stream_of,
)
from unit.consumer.test_shard_worker_kit import eventually


async def test_key_mode_handles_keys_in_parallel_in_order_and_checkpoints_the_end() -> None:
    items = [(f"customer-{i % 6}", f"{i}".encode()) for i in range(60)]
    kinesis = stream_of(items)
    order: dict[str, list[int]] = defaultdict(list)
    running = peak = 0

    async def handle(record: ConsumedRecord[bytes]) -> None:
        nonlocal running, peak
        order[record.partition_key].append(int(record.data))
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.002)
        running -= 1

    report = await consume_until_caught_up(
        "s", handle, kinesis=kinesis, settings=fast_settings(dispatch=dispatching(ordering="key"))
    )
    for key, numbers in order.items():
        assert numbers == sorted(numbers), key
    assert sum(len(n) for n in order.values()) == 60
    assert peak > 1
    (shard,) = kinesis.shard_ids("s")
    last = kinesis.records("s", shard)[-1][0]
    assert report.checkpoints[shard] == ExtendedSequenceNumber(last)


async def test_stop_shard_after_retries_parks_the_shard_before_the_poison_record() -> None:
    kinesis = stream_of([(f"k{i % 3}", f"{i}".encode()) for i in range(12)])
    calls: dict[bytes, int] = defaultdict(int)
    errors: list[BaseException] = []

    def handle(record: ConsumedRecord[bytes]) -> None:
        calls[record.data] += 1
        if record.data == b"5":
            raise ValueError("poison")

    report = await consume_until_caught_up(
        "s",
        handle,
        kinesis=kinesis,
        settings=fast_settings(dispatch=dispatching(ordering="shard")),
        on_error=lambda stream, shard, error: errors.append(error),
    )
    (shard,) = kinesis.shard_ids("s")
    assert set(report.status.parked) == {shard}
    assert calls[b"5"] == 2
    assert b"6" not in calls
    (error,) = errors
    assert isinstance(error, RetriesExhaustedError)
    assert report.checkpoints[shard] == ExtendedSequenceNumber(kinesis.records("s", shard)[4][0])


async def test_skip_dead_letters_the_poison_record_and_checkpoints_past_it() -> None:
    kinesis = stream_of([(f"k{i % 3}", f"{i}".encode()) for i in range(12)])
    store = InMemoryLeaseStore("app")
    sink = InMemoryDeadLetters()
    handled: list[bytes] = []

    handle = failing_on(b"5", ValueError, "poison", handled)

    consumer = dispatch_consumer(kinesis, store, ordering="key", on_failure="skip")
    run = asyncio.create_task(consumer.consume(handle, dead_letters=sink))
    await eventually(lambda: len(handled) == 11 and len(sink.letters) == 1)
    await consumer.close()
    await asyncio.wait_for(run, 5)
    assert sink.letters[0].data == b"5"
    assert sink.letters[0].error_type == "ValueError"
    assert sink.letters[0].attempts == 2
    (lease,) = await store.list_leases()
    assert lease.checkpoint == ExtendedSequenceNumber(kinesis.records("s", lease.shard_id)[-1][0])


async def test_stop_abandons_a_hanging_handler_after_the_drain_timeout() -> None:
    kinesis = stream_of([("a", b"0"), ("b", b"1"), ("a", b"2"), ("b", b"3")])
    store = InMemoryLeaseStore("app")
    done: list[bytes] = []
    cancelled: list[bytes] = []

    async def handle(record: ConsumedRecord[bytes]) -> None:
        if record.data == b"1":
            try:
                await asyncio.Event().wait()  # hangs until cancelled
            except asyncio.CancelledError:
                cancelled.append(record.data)
                raise
        done.append(record.data)

    settings = fast_settings(dispatch=dispatching(ordering="key"), drain_timeout=0.2)
    consumer = Consumer("s", "app", settings=settings, kinesis=kinesis, lease_store=store)
    run = asyncio.create_task(consumer.consume(handle))
    await eventually(lambda: sorted(done) == [b"0", b"2"])
    started = time.perf_counter()
    await consumer.close()
    await asyncio.wait_for(run, 5)
    assert time.perf_counter() - started < 3
    assert cancelled == [b"1"]  # no handler task outlives the consumer
    (lease,) = await store.list_leases()
    # Record 0 is done; 1 hung (abandoned, unacked): the checkpoint stops at 0.
    assert lease.checkpoint == ExtendedSequenceNumber(kinesis.records("s", lease.shard_id)[0][0])


async def test_dispatch_refuses_batches_by_key_and_a_missing_sink() -> None:
    kinesis = stream_of([])
    by_key = fast_settings(dispatch=dispatching(ordering="key"))
    consumer = Consumer(
        "s", "app", settings=by_key, kinesis=kinesis, lease_store=InMemoryLeaseStore("app")
    )
    with pytest.raises(ValueError, match="batch handler takes shard ordering"):
        await consumer.consume(lambda records: None, batch=True)
    skipping = fast_settings(dispatch=dispatching(on_failure="skip"))
    consumer = Consumer(
        "s", "app", settings=skipping, kinesis=kinesis, lease_store=InMemoryLeaseStore("app")
    )
    with pytest.raises(ValueError, match="dead_letters"):
        await consumer.consume(lambda record: None)
