"""The consumer with enhanced fan-out: Kinesis on kinesis-local, leases on moto, over HTTP."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.fetch import FanOut
from shardflow.fetch.registration import describe_consumer, stream_arn_of
from shardflow.leases import DynamoDBLeaseStore
from shardflow.leases.settings import LeaseSettings
from support.streams import create_stream, put

SETTINGS = ConsumerSettings(
    fetch=FanOut(renew_after=120.0, event_timeout=8.0, read_timeout=10.0),
    leases=LeaseSettings(failover_time=3.0, renew_interval=0.5, take_interval=0.5),
    drain_timeout=1.0,
)


async def test_consumes_every_record_through_subscriptions(
    kinesis_local_url: str, moto_url: str, stream_name: str
) -> None:
    app = f"app-{stream_name}"
    written = [(f"k{i}", f"r{i}".encode()) for i in range(40)]
    seen: list[ConsumedRecord[bytes]] = []
    async with (
        ClientFactory(AwsSettings(endpoint_url=kinesis_local_url)).kinesis() as kinesis,
        ClientFactory(AwsSettings(endpoint_url=moto_url)).dynamodb() as dynamodb,
    ):
        await create_stream(kinesis, stream_name, 2)
        consumer = Consumer(
            stream_name,
            app,
            settings=replace(
                SETTINGS, fetch=replace(SETTINGS.fetch, consumer_name=f"efo-{stream_name}"[:128])
            ),
            aws=AwsSettings(endpoint_url=kinesis_local_url),
            lease_store=DynamoDBLeaseStore(dynamodb, app),
        )
        run = asyncio.create_task(consumer.consume(lambda r: seen.append(r)))
        try:
            await put(kinesis, stream_name, written)
            async with asyncio.timeout(30):
                while len(seen) < len(written):  # noqa: ASYNC110 - filled by the consumer
                    await asyncio.sleep(0.05)
        finally:
            async with asyncio.timeout(15):  # stopping closes the subscriptions promptly
                await consumer.close()
                await run
        registered = await describe_consumer(
            kinesis,
            stream_arn=await stream_arn_of(kinesis, stream_name),
            name=f"efo-{stream_name}"[:128],
        )
    assert sorted(r.data for r in seen) == sorted(d for _, d in written)
    assert registered.is_active  # kept for the next run (deregister_on_stop=False)
