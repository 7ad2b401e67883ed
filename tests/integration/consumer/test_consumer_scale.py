"""One consumer holds many leases: 200 shards on kinesalite, 200 leases on moto's DynamoDB.

Every lease is taken and kept through a renewal round (moto does ~110 conditional writes/s, so
the failover time is long enough for 200 renewals per round), every record of every shard is
delivered once, and memory grows by a bounded amount per shard. The benchmark
(``bench/consumer.py``) runs the same with 1,000 shards.
"""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import wait_for_active
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.events import DiagnosticEvent, LeaseAcquired, LeaseLost, LeaseRenewed
from shardflow.fetch import Polling
from shardflow.leases.settings import LeaseSettings
from support.waiting import until

SHARDS = 200
PER_SHARD = 3
# Renew every ~6.6 s: 200 renewals per round are ~30 writes/s, well within moto's pace.
FAILOVER = 20.0
LIMIT = 45.0
# Measured ~40-60 KiB per shard (bench/consumer.py); the bound leaves room for noise while
# still catching a per-shard leak of whole record batches or unbounded buffers.
MAX_KIB_PER_SHARD = 300

pytestmark = pytest.mark.slow


def rss_kib() -> float:
    return float(psutil.Process().memory_info().rss) / 1024


async def test_one_consumer_holds_200_leases_and_reads_every_shard(
    kinesalite_url: str, moto_url: str, stream_name: str
) -> None:
    app = f"{stream_name}-app"
    async with ClientFactory(AwsSettings(endpoint_url=kinesalite_url)).kinesis() as kinesis:
        await kinesis.create_stream(StreamName=stream_name, ShardCount=SHARDS)
        try:
            await wait_for_active(kinesis, stream_name)
            shards = (await kinesis.list_shards(StreamName=stream_name))["Shards"]
            assert len(shards) == SHARDS
            expected: set[bytes] = set()
            entries = []
            for n, shard in enumerate(shards):
                for k in range(PER_SHARD):
                    data = f"{n}-{k}".encode()
                    expected.add(data)
                    start_key = shard["HashKeyRange"]["StartingHashKey"]
                    entries.append(
                        {"Data": data, "PartitionKey": "p", "ExplicitHashKey": start_key}
                    )
            for i in range(0, len(entries), 500):
                answer = await kinesis.put_records(
                    StreamName=stream_name, Records=entries[i : i + 500]
                )
                assert answer.get("FailedRecordCount", 0) == 0

            acquired: set[str] = set()
            renewed: set[str] = set()
            lost: list[LeaseLost] = []

            def on_event(event: DiagnosticEvent) -> None:
                if isinstance(event, LeaseAcquired):
                    acquired.add(event.shard_id)
                elif isinstance(event, LeaseRenewed):
                    renewed.add(event.shard_id)
                elif isinstance(event, LeaseLost):
                    lost.append(event)

            consumer = Consumer(
                stream_name,
                app,
                settings=ConsumerSettings(
                    leases=LeaseSettings(failover_time=FAILOVER),
                    fetch=Polling(idle_time=5.0),
                ),
                aws=AwsSettings(endpoint_url=moto_url),
                kinesis=kinesis,
                on_event=on_event,
            )
            seen: list[bytes] = []

            async def handle(record: ConsumedRecord[bytes]) -> None:
                seen.append(record.data)

            baseline = rss_kib()
            running = asyncio.create_task(consumer.consume(handle))
            try:
                await until(
                    lambda: len(acquired) == SHARDS and len(seen) >= len(expected),
                    LIMIT,
                    every=0.1,
                )
                # One full renewal round of every lease (renew interval ~6.6 s).
                started = time.monotonic()
                await until(lambda: len(renewed) == SHARDS, LIMIT, every=0.1)
                assert time.monotonic() - started < FAILOVER
                grown = rss_kib() - baseline
            finally:
                await consumer.close()
                await running

            assert not lost
            assert len(seen) == len(expected)
            assert set(seen) == expected
            assert grown / SHARDS < MAX_KIB_PER_SHARD, f"{grown / SHARDS:.0f} KiB per shard"
        finally:
            await kinesis.delete_stream(StreamName=stream_name)
