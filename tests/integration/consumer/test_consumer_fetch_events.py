"""The consumer's fetch diagnostics over HTTP: FetchThrottled when GetRecords is throttled (moto
behind the fault proxy), SubscriptionRenewed when fan-out subscriptions are renewed
(kinesis-local). Leases live on moto."""

from __future__ import annotations

import asyncio
from typing import Any

from shardflow.aws import AwsSettings, Backoff, ClientFactory
from shardflow.aws.kinesis import list_shards
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.events import DiagnosticEvent, FetchThrottled, SubscriptionRenewed
from shardflow.fetch import FanOut, Polling
from shardflow.leases import DynamoDBLeaseStore
from shardflow.leases.settings import LeaseSettings
from shardflow.testing.faults import THROTTLED, ErrorResponse, FaultProxy
from support import streams
from support.waiting import until

LEASES = LeaseSettings(failover_time=3.0, renew_interval=0.5, take_interval=0.5)
THROTTLE_CAP = 0.1


async def create_stream(kinesis: Any, name: str) -> str:
    """A one-shard stream; returns its shard id."""
    await streams.create_stream(kinesis, name, 1)
    (shard,) = await list_shards(kinesis, name)
    return shard.shard_id


async def put(kinesis: Any, stream: str, tag: str, count: int) -> list[bytes]:
    """``count`` records under one key, ``tag-0`` onwards; returns their data."""
    data = [f"{tag}-{i}".encode() for i in range(count)]
    await streams.put(kinesis, stream, [("k", d) for d in data])
    return data


async def test_throttled_get_records_reach_on_event_as_fetch_throttled(
    moto_url: str, stream_name: str
) -> None:
    app = f"app-{stream_name}"
    events: list[DiagnosticEvent] = []
    seen: list[bytes] = []
    settings = ConsumerSettings(
        worker_id="worker-throttled",
        leases=LEASES,
        fetch=Polling(
            idle_time=0.1,
            throttle_backoff=Backoff(base=0.05, cap=THROTTLE_CAP, max_attempts=10),
        ),
        drain_timeout=1.0,
    )
    async with (
        FaultProxy(moto_url) as proxy,
        ClientFactory(AwsSettings(endpoint_url=moto_url)).kinesis() as kinesis,
        ClientFactory(AwsSettings(endpoint_url=moto_url)).dynamodb() as dynamodb,
    ):
        shard_id = await create_stream(kinesis, stream_name)
        written = await put(kinesis, stream_name, "r", 20)
        proxy.add(ErrorResponse(THROTTLED), operation="GetRecords", times=3)
        consumer = Consumer(
            stream_name,
            app,
            settings=settings,
            aws=AwsSettings(endpoint_url=proxy.url),  # Kinesis through the proxy
            lease_store=DynamoDBLeaseStore(dynamodb, app),
            on_event=events.append,
        )
        run = asyncio.create_task(consumer.consume(lambda r: seen.append(r.data)))
        try:
            await until(lambda: len(seen) >= len(written), within=20)
        finally:
            async with asyncio.timeout(10):
                await consumer.close()
                await run
        await proxy.idle()
        injected = proxy.injected(kind="error", operation="GetRecords")

    throttled = [e for e in events if isinstance(e, FetchThrottled)]
    assert len(injected) == 3
    assert len(throttled) == len(injected)
    for event in throttled:
        assert (event.worker_id, event.stream, event.shard_id) == (
            "worker-throttled",
            stream_name,
            shard_id,
        )
        assert event.operation == "GetRecords"
        assert 0.0 <= event.delay <= THROTTLE_CAP
    assert consumer.metrics().streams[stream_name].fetch_throttles == 3
    assert sorted(seen) == sorted(written)  # every record, once: throttling lost nothing


async def test_renewed_subscriptions_reach_on_event_as_subscription_renewed(
    kinesis_local_url: str, moto_url: str, stream_name: str
) -> None:
    app = f"app-{stream_name}"
    efo_name = f"efo-{stream_name}"[:128]
    events: list[DiagnosticEvent] = []
    seen: list[ConsumedRecord[bytes]] = []
    settings = ConsumerSettings(
        fetch=FanOut(consumer_name=efo_name, renew_after=2.0, event_timeout=8.0, read_timeout=10.0),
        leases=LEASES,
        drain_timeout=1.0,
    )

    def renewals() -> list[SubscriptionRenewed]:
        return [e for e in events if isinstance(e, SubscriptionRenewed)]

    async with (
        ClientFactory(AwsSettings(endpoint_url=kinesis_local_url)).kinesis() as kinesis,
        ClientFactory(AwsSettings(endpoint_url=moto_url)).dynamodb() as dynamodb,
    ):
        shard_id = await create_stream(kinesis, stream_name)
        written = await put(kinesis, stream_name, "before", 10)
        consumer = Consumer(
            stream_name,
            app,
            settings=settings,
            aws=AwsSettings(endpoint_url=kinesis_local_url),
            lease_store=DynamoDBLeaseStore(dynamodb, app),
            on_event=events.append,
        )
        run = asyncio.create_task(consumer.consume(lambda r: seen.append(r)))
        try:
            await until(lambda: len(seen) >= len(written), within=15)
            # Records written between renewals arrive through the renewed subscriptions.
            await until(lambda: len(renewals()) >= 1, within=8)
            written += await put(kinesis, stream_name, "between", 10)
            await until(lambda: len(renewals()) >= 2, within=8)
            await until(lambda: len(seen) >= len(written), within=8)
        finally:
            async with asyncio.timeout(15):
                await consumer.close()
                await run

    assert sorted(r.data for r in seen) == sorted(written)  # nothing lost or repeated
    renewed = renewals()
    for event in renewed:
        assert (event.stream, event.shard_id, event.consumer_name) == (
            stream_name,
            shard_id,
            efo_name,
        )
        assert event.reason == "renew_due"
    # Each subscription resumed after the last event read: never before a record handed out.
    last_of_first_batch = max(int(r.sequence_number) for r in seen[:10])
    first_kind, first_sequence = (renewed[0].position or "").split(" ")
    assert first_kind == "AFTER_SEQUENCE_NUMBER"
    assert int(first_sequence) >= last_of_first_batch
    assert consumer.metrics().streams[stream_name].subscription_renewals == len(renewed)
