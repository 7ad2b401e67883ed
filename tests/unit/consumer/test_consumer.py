"""The Consumer's wiring, against the in-memory Kinesis and lease store (fast, no servers)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections import Counter
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from shardflow.aws import OpenClients
from shardflow.consumer import (
    ConsumedRecord,
    Consumer,
    ConsumerCollector,
    ConsumerSettings,
    ShardSession,
)
from shardflow.errors import HandlerError
from shardflow.events import (
    CheckpointWritten,
    DiagnosticEvent,
    LeaseAcquired,
    LeaseReleased,
    ShardFailed,
    ShardStarted,
)
from shardflow.fetch import Polling
from shardflow.leases import InMemoryLeaseStore, InMemoryLeaseTables
from shardflow.records import ExtendedSequenceNumber
from shardflow.testing import MemoryKinesis, consume_until_caught_up, fast_settings
from unit.consumer.test_shard_worker_kit import eventually


def stream_with(records: int, shards: int = 2, name: str = "s") -> MemoryKinesis:
    kinesis = MemoryKinesis()
    kinesis.create_stream(name, shards)
    kinesis.put_many(name, [(f"k{i}", f"{i}".encode()) for i in range(records)])
    return kinesis


def consumer_on(kinesis: MemoryKinesis, store: InMemoryLeaseStore, **options: Any) -> Consumer:
    settings = options.pop("settings", None) or fast_settings()
    return Consumer(
        "s",
        store.table_name,
        settings=settings,
        clients=OpenClients(kinesis=kinesis),
        lease_store=store,
        **options,
    )


async def test_consumer_and_producer_share_one_shape() -> None:
    """``async with`` closes it, ``close()`` ends it, ``metrics()`` is a method, clients come
    from a ``clients=`` factory; the old ``kinesis=`` and ``stop()`` still work, with a
    deprecation warning."""
    kinesis = stream_with(10, shards=1)
    store = InMemoryLeaseStore("app")
    seen: list[bytes] = []
    async with consumer_on(kinesis, store) as consumer:
        run = asyncio.create_task(consumer.consume(lambda r: seen.append(r.data)))
        await eventually(lambda: len(seen) == 10)
        assert consumer.metrics().streams["s"].records == 10
    assert not consumer.running
    await run
    with pytest.warns(DeprecationWarning, match="OpenClients"):
        old = Consumer("s", "app", kinesis=kinesis, lease_store=InMemoryLeaseStore("app"))
    run = asyncio.create_task(old.consume(lambda r: None))
    await eventually(lambda: old.running)
    with pytest.warns(DeprecationWarning, match="close"):
        await old.stop()
    await run


async def test_shards_api_hands_out_sessions_with_manual_checkpoints() -> None:
    kinesis = stream_with(40, shards=2)
    store = InMemoryLeaseStore("app")
    consumer = consumer_on(
        kinesis, store, settings=fast_settings(checkpoint=ConsumerSettings().checkpoint.__class__())
    )
    seen: list[bytes] = []
    sessions: list[ShardSession] = []

    async def process(session: ShardSession) -> None:
        _shard_id, batches, checkpointer = session
        async for batch in batches:
            seen.extend(r.data for r in batch)
            await checkpointer.checkpoint(batch[-1])

    async def run() -> None:
        tasks = []
        async with contextlib.aclosing(consumer.shards()) as stream_sessions:
            async for session in stream_sessions:
                sessions.append(session)
                tasks.append(asyncio.create_task(process(session)))
        await asyncio.gather(*tasks)

    runner = asyncio.create_task(run())
    await eventually(lambda: len(seen) == 40)
    await consumer.close()
    await asyncio.wait_for(runner, 5)

    assert len(sessions) == 2
    leases = await store.list_leases()
    last = {}
    for shard_id in kinesis.shard_ids("s"):
        records = kinesis.records("s", shard_id)
        last[shard_id] = ExtendedSequenceNumber(records[-1][0])
    assert {lease.lease_key: lease.checkpoint for lease in leases} == last
    assert all(lease.lease_owner is None for lease in leases)


async def test_session_acks_from_threads_move_the_checkpoint_over_the_acked_prefix() -> None:
    kinesis = stream_with(10, shards=1)
    store = InMemoryLeaseStore("app")
    consumer = consumer_on(kinesis, store, settings=fast_settings(drain_timeout=0.2))
    acked_all = asyncio.Event()

    async def process(session: ShardSession) -> None:
        async for batch in session.batches:
            # Acknowledge out of order, from another thread; leave record 7 (index 6) unacked.
            def ack(records: list[ConsumedRecord[bytes]]) -> None:
                for record in reversed(records):
                    if record.data != b"6":
                        record.ack()

            thread = threading.Thread(target=ack, args=(batch,))
            thread.start()
            thread.join()
            await eventually(lambda: session.pending.unacked == 1)
            acked_all.set()

    async def run() -> None:
        tasks = []
        async with contextlib.aclosing(consumer.shards()) as sessions:
            async for session in sessions:
                tasks.append(asyncio.create_task(process(session)))
        await asyncio.gather(*tasks)

    runner = asyncio.create_task(run())
    await asyncio.wait_for(acked_all.wait(), 5)
    await consumer.close()
    await asyncio.wait_for(runner, 5)
    (lease,) = await store.list_leases()
    sixth = kinesis.records("s", lease.shard_id)[5][0]
    assert lease.checkpoint == ExtendedSequenceNumber(sixth)  # up to the gap, not beyond


async def test_stop_consumer_policy_raises_the_handler_error() -> None:
    kinesis = stream_with(20, shards=2)

    def handle(record: ConsumedRecord[bytes]) -> None:
        if record.data == b"13":
            raise ValueError("bad record")

    settings = fast_settings(on_error="stop-consumer")
    with pytest.raises(HandlerError) as raised:
        await consume_until_caught_up("s", handle, kinesis=kinesis, settings=settings)
    assert isinstance(raised.value.__cause__, ValueError)


async def test_stop_shard_policy_parks_the_shard_and_others_go_on() -> None:
    kinesis = stream_with(30, shards=3)
    errors: list[tuple[str, str, BaseException]] = []
    seen: list[bytes] = []
    bad = kinesis.records("s", kinesis.shard_ids("s")[1])[2][2]

    def handle(record: ConsumedRecord[bytes]) -> None:
        if record.data == bad:
            raise ValueError("poison")
        seen.append(record.data)

    def failures(event: DiagnosticEvent) -> None:
        if isinstance(event, ShardFailed):
            assert event.error is not None
            errors.append((event.stream, event.shard_id, event.error))

    report = await consume_until_caught_up("s", handle, kinesis=kinesis, on_event=failures)
    bad_shard = kinesis.shard_ids("s")[1]
    assert [(s, sh) for s, sh, _ in errors] == [("s", bad_shard)]
    assert isinstance(errors[0][2], HandlerError)
    assert set(report.status.parked) == {bad_shard}
    others = [
        d
        for sh in kinesis.shard_ids("s")
        if sh != bad_shard
        for _, _, d in kinesis.records("s", sh)
    ]
    assert set(others) <= set(seen)
    # The parked shard's checkpoint stops right before the poison record.
    poison_at = kinesis.records("s", bad_shard)[1][0]
    assert report.checkpoints[bad_shard] == ExtendedSequenceNumber(poison_at)


async def test_events_reach_the_callback() -> None:
    kinesis = stream_with(10, shards=1)
    events: list[DiagnosticEvent] = []
    await consume_until_caught_up("s", lambda r: None, kinesis=kinesis, on_event=events.append)
    kinds = Counter(type(e) for e in events)
    assert kinds[LeaseAcquired] == 1
    assert kinds[ShardStarted] == 1
    assert kinds[CheckpointWritten] >= 1
    assert kinds[LeaseReleased] == 1
    written = [e for e in events if isinstance(e, CheckpointWritten)]
    assert sum(e.records for e in written) == 10


async def test_two_workers_share_the_shards_and_handle_every_record() -> None:
    kinesis = stream_with(0, shards=4)
    tables = InMemoryLeaseTables()
    seen: dict[str, list[bytes]] = {"a": [], "b": []}

    def worker(name: str) -> Consumer:
        store = InMemoryLeaseStore("app", tables=tables)
        return consumer_on(kinesis, store, settings=fast_settings(worker_id=f"worker-{name}"))

    first, second = worker("a"), worker("b")

    async def handle(name: str, record: ConsumedRecord[bytes]) -> None:
        seen[name].append(record.data)

    runs = [
        asyncio.create_task(first.consume(functools.partial(handle, "a"))),
        asyncio.create_task(second.consume(functools.partial(handle, "b"))),
    ]
    try:
        # The second worker takes its share from the first (balancing), then records arrive.
        await eventually(
            lambda: (
                first.running
                and second.running
                and len(first.status().shards) == 2
                and len(second.status().shards) == 2
            ),
            within=10,
        )
        await asyncio.sleep(0.3)  # a worker learns of a steal at its next renewal (0.2 s)
        kinesis.put_many("s", [(f"k{i}", f"{i}".encode()) for i in range(200)])
        await eventually(lambda: len(seen["a"]) + len(seen["b"]) >= 200, within=10)
    finally:
        await first.close()
        await second.close()
        await asyncio.gather(*runs)
    assert sorted(seen["a"] + seen["b"]) == sorted(f"{i}".encode() for i in range(200))
    assert seen["a"]
    assert seen["b"]


async def test_metrics_are_exported_through_prometheus_client() -> None:
    kinesis = stream_with(25, shards=1)
    store = InMemoryLeaseStore("app")
    consumer = consumer_on(kinesis, store)
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(consumer))
    run = asyncio.create_task(consumer.consume(lambda r: None))
    await eventually(lambda: consumer.metrics().streams.get("s") is not None)
    await eventually(lambda: consumer.metrics().streams["s"].records == 25)
    await eventually(
        lambda: (
            (
                registry.get_sample_value("shardflow_consumer_checkpoints_total", {"stream": "s"})
                or 0
            )
            > 0
        )
    )
    shard = kinesis.shard_ids("s")[0]
    assert registry.get_sample_value("shardflow_consumer_records_total", {"stream": "s"}) == 25
    assert (
        registry.get_sample_value(
            "shardflow_consumer_handler_latency_seconds_count", {"stream": "s"}
        )
        == 25
    )
    assert (
        registry.get_sample_value(
            "shardflow_consumer_millis_behind_latest", {"stream": "s", "shard": shard}
        )
        == 0
    )
    assert registry.get_sample_value(
        "shardflow_consumer_records_per_second", {"stream": "s"}
    ) == pytest.approx(2.5)
    await consumer.close()
    await run


async def test_request_stop_from_a_handler_stops_gracefully() -> None:
    kinesis = stream_with(50, shards=1)
    store = InMemoryLeaseStore("app")
    consumer = consumer_on(kinesis, store)
    handled: list[bytes] = []

    def handle(record: ConsumedRecord[bytes]) -> None:
        handled.append(record.data)
        if len(handled) == 20:
            consumer.request_stop()

    await asyncio.wait_for(consumer.consume(handle), 10)
    (lease,) = await store.list_leases()
    assert lease.lease_owner is None
    # The final checkpoint covers what the handler finished: at least the first 20.
    records = kinesis.records("s", lease.shard_id)
    assert lease.checkpoint >= ExtendedSequenceNumber(records[19][0])
    assert lease.checkpoint == ExtendedSequenceNumber(records[len(handled) - 1][0])


async def test_a_stopped_consumer_can_run_again() -> None:
    kinesis = stream_with(5, shards=1)
    store = InMemoryLeaseStore("app")
    for _ in range(2):
        await consume_until_caught_up("s", lambda r: None, kinesis=kinesis, lease_store=store)


def test_settings_refuse_nonsense() -> None:
    from shardflow.positions import StartPosition

    with pytest.raises(ValueError, match="initial position"):
        ConsumerSettings(initial_position=StartPosition.at_sequence_number("1"))
    with pytest.raises(ValueError, match="prefetch_records"):
        ConsumerSettings(prefetch_records=0)
    with pytest.raises(ValueError, match="out_of_range"):
        ConsumerSettings(out_of_range_sub_records="keep")  # type: ignore[arg-type]
    assert ConsumerSettings(prefetch_records=500).polling_for_prefetch(Polling()).max_records == 500


def test_a_consumed_record_is_the_record_plus_value_and_ack() -> None:
    import dataclasses
    from datetime import UTC, datetime

    from shardflow.consumer.checkpointing.acks import AckTracker
    from shardflow.records import Record

    record = Record(
        data=b"d",
        partition_key="pk",
        sequence_number="42",
        sub_sequence_number=3,
        explicit_hash_key="7",
        approximate_arrival_timestamp=datetime(2024, 1, 1, tzinfo=UTC),
        shard_id="shard",
        stream_name="stream",
        aggregated=True,
        last_sub_sequence_number=9,
    )
    tracker = AckTracker("shard")
    consumed = ConsumedRecord.of(record, {"v": 1}, tracker.deliver(record))
    for field in dataclasses.fields(Record):
        assert getattr(consumed, field.name) == getattr(record, field.name), field.name
    assert isinstance(consumed, Record)
    assert consumed.value == {"v": 1}
    assert not tracker.all_acked
    consumed.ack()
    assert tracker.all_acked
