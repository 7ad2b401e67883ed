"""The health probes over HTTP (issue 24 item 3): /readyz turns not-ready within failover_time
when the lease table browns out, and ready again after; /healthz stays live meanwhile.

A real consumer against moto's server through the fault proxy (DynamoDB answering 500), its
metrics port served by ``MetricsServer``, asked by a plain HTTP client as a kubelet would."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from dataclasses import replace

from prometheus_client import CollectorRegistry

from shardflow import AwsSettings, ConsumedRecord, Consumer, ConsumerSettings
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.fetch import Polling
from shardflow.leases.settings import LeaseSettings
from shardflow.metrics import ConsumerCollector, MetricsServer
from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse, FaultProxy
from support.streams import create_stream, kinesis_at, put
from support.waiting import until

FAILOVER = 3.0
SETTINGS = ConsumerSettings(
    leases=LeaseSettings(
        failover_time=FAILOVER, renew_interval=0.5, take_interval=0.5, safety_margin=0.3
    ),
    fetch=Polling(idle_time=0.2),
    checkpoint=CheckpointSettings(every_n=10, interval=0.5),
    drain_timeout=2.0,
)


def probe(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_readyz_follows_a_lease_table_brownout_and_healthz_stays_live(
    moto_url: str, stream_name: str
) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 2)
        await put(kinesis, stream_name, [(f"k{i}", b"x") for i in range(10)])
    seen: list[bytes] = []

    async def handle(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.data)

    with FaultProxy(moto_url, seed=5) as proxy:
        consumer = Consumer(
            stream_name,
            f"app-{stream_name}",
            settings=replace(SETTINGS),
            aws=AwsSettings(endpoint_url=proxy.url),
        )
        registry = CollectorRegistry()
        registry.register(ConsumerCollector(consumer))
        run = asyncio.create_task(consumer.consume(handle))
        with MetricsServer("127.0.0.1", 0, registry, health=consumer.health) as server:
            base = f"http://127.0.0.1:{server.address[1]}"

            async def status(path: str) -> tuple[int, str]:
                return await asyncio.to_thread(probe, base + path)

            try:
                await until(lambda: len(seen) >= 10, 30.0)
                assert (await status("/readyz")) == (200, "ok\n")
                assert (await status("/healthz"))[0] == 200
                rule = proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500), service="DynamoDB")
                browned = time.monotonic()
                while (answer := await status("/readyz"))[0] == 200:
                    assert time.monotonic() - browned < FAILOVER, "still ready at failover_time"
                    await asyncio.sleep(0.1)
                code, body = answer
                assert code == 503
                assert "not renewed" in body, body
                assert (await status("/healthz"))[0] == 200  # the loop turns: live
                assert proxy.injected_count(rule) > 0
                await asyncio.sleep(FAILOVER)  # leases lapse meanwhile
                proxy.remove(rule)
                recovered = time.monotonic()
                while (await status("/readyz"))[0] != 200:
                    assert time.monotonic() - recovered < 30, "not ready again after the brownout"
                    await asyncio.sleep(0.2)
                metrics = await status("/metrics")
                assert metrics[0] == 200
                assert "shardflow_consumer_records_total" in metrics[1]
            finally:
                await consumer.close()
                await run
