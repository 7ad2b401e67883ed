"""CloudWatch metrics under the KCL's names (issue 24 item 1): a KCL dashboard's metric queries
(name + dimensions) return data for a shardflow consumer on moto's CloudWatch, and a CloudWatch
brownout drops metrics (counted) without touching the records.

A real consumer against moto's server over HTTP; the dashboard's queries are the plain SDK's
ListMetrics, GetMetricStatistics and GetMetricData."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from shardflow import AwsSettings, ConsumedRecord, Consumer, ConsumerSettings
from shardflow.aws.clients import ClientFactory
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.fetch import Polling
from shardflow.leases.settings import LeaseSettings
from shardflow.metrics.cloudwatch import CloudWatch
from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse, FaultProxy
from support.streams import create_stream, kinesis_at, put
from support.waiting import until

SETTINGS = ConsumerSettings(
    worker_id="worker-a",
    leases=LeaseSettings(failover_time=3.0, renew_interval=0.5, take_interval=0.5),
    fetch=Polling(idle_time=0.2),
    checkpoint=CheckpointSettings(every_n=10, interval=0.5),
    drain_timeout=2.0,
    metrics=CloudWatch(interval=1.0),
)


@asynccontextmanager
async def cloudwatch_at(url: str) -> AsyncIterator[Any]:
    async with ClientFactory(AwsSettings(endpoint_url=url)).cloudwatch() as client:
        yield client


async def statistics(
    cloudwatch: Any, namespace: str, name: str, dimensions: dict[str, str]
) -> dict[str, float]:
    """GetMetricStatistics over the last hour, summed over its datapoints (as an alarm asks)."""
    now = dt.datetime.now(dt.UTC)
    answer = await cloudwatch.get_metric_statistics(
        Namespace=namespace,
        MetricName=name,
        Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
        StartTime=now - dt.timedelta(hours=1),
        EndTime=now + dt.timedelta(minutes=5),
        Period=60,
        Statistics=["SampleCount", "Sum", "Maximum"],
    )
    points = answer["Datapoints"]
    return {
        "SampleCount": sum(p["SampleCount"] for p in points),
        "Sum": sum(p["Sum"] for p in points),
        "Maximum": max((p["Maximum"] for p in points), default=0.0),
    }


async def consume_some(consumer: Consumer, expected: int) -> list[bytes]:
    seen: list[bytes] = []

    async def handle(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.data)

    run = asyncio.create_task(consumer.consume(handle))
    try:
        await until(lambda: len(seen) >= expected, 30.0)
        await asyncio.sleep(1.5)  # one more interval: gauges and lease counts sent
    finally:
        await consumer.close()
        await run
    return seen


async def test_a_kcl_dashboards_queries_return_data(moto_url: str, stream_name: str) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 2)
        await put(kinesis, stream_name, [(f"k{i}", b"x" * 100) for i in range(40)])
        shards = [
            s["ShardId"] for s in (await kinesis.list_shards(StreamName=stream_name))["Shards"]
        ]
    application = f"app-{stream_name}"
    consumer = Consumer(
        stream_name, application, settings=SETTINGS, aws=AwsSettings(endpoint_url=moto_url)
    )
    seen = await consume_some(consumer, 40)
    assert len(seen) == 40

    async with cloudwatch_at(moto_url) as cloudwatch:
        # The dashboard's widgets: per shard ProcessTask, per worker the lease metrics.
        records = 0.0
        data_bytes = 0.0
        for shard in shards:
            dims = {"Operation": "ProcessTask", "ShardId": shard}
            processed = await statistics(cloudwatch, application, "RecordsProcessed", dims)
            records += processed["Sum"]
            data_bytes += (await statistics(cloudwatch, application, "DataBytesProcessed", dims))[
                "Sum"
            ]
            behind = await statistics(cloudwatch, application, "MillisBehindLatest", dims)
            assert behind["SampleCount"] > 0, shard
            assert (await statistics(cloudwatch, application, "Success", dims))["Sum"] > 0
            assert (await statistics(cloudwatch, application, "Time", dims))["SampleCount"] > 0
        assert records == 40
        assert data_bytes == sum(len(b"x" * 100) + len(f"k{i}") for i in range(40))

        worker = {"WorkerIdentifier": "worker-a"}
        current = await statistics(
            cloudwatch, application, "CurrentLeases", {"Operation": "RenewAllLeases", **worker}
        )
        assert current["Maximum"] == 2
        renewals = await statistics(
            cloudwatch, application, "Success", {"Operation": "RenewAllLeases", **worker}
        )
        assert renewals["Sum"] > 0
        taken = await statistics(
            cloudwatch, application, "TakenLeases", {"Operation": "TakeLeases", **worker}
        )
        assert taken["Sum"] == 2

        listed = await cloudwatch.list_metrics(Namespace=application, MetricName="RecordsProcessed")
        listed_dims = [
            {d["Name"]: d["Value"] for d in metric["Dimensions"]} for metric in listed["Metrics"]
        ]
        assert {"Operation": "ProcessTask", "ShardId": shards[0]} in listed_dims

        now = dt.datetime.now(dt.UTC)
        answer = await cloudwatch.get_metric_data(
            MetricDataQueries=[
                {
                    "Id": "behind",
                    "MetricStat": {
                        "Metric": {
                            "Namespace": application,
                            "MetricName": "MillisBehindLatest",
                            "Dimensions": [
                                {"Name": "Operation", "Value": "ProcessTask"},
                                {"Name": "ShardId", "Value": shards[0]},
                            ],
                        },
                        "Period": 60,
                        "Stat": "Maximum",
                    },
                }
            ],
            StartTime=now - dt.timedelta(hours=1),
            EndTime=now + dt.timedelta(minutes=5),
        )
        assert answer["MetricDataResults"][0]["Values"], answer


async def test_summary_level_leaves_detailed_metrics_out(moto_url: str, stream_name: str) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, [(f"k{i}", b"y") for i in range(5)])
    application = f"app-{stream_name}"
    settings = replace(SETTINGS, metrics=CloudWatch(interval=1.0, level="SUMMARY"))
    consumer = Consumer(
        stream_name, application, settings=settings, aws=AwsSettings(endpoint_url=moto_url)
    )
    await consume_some(consumer, 5)
    async with cloudwatch_at(moto_url) as cloudwatch:
        names = {
            m["MetricName"]
            for m in (await cloudwatch.list_metrics(Namespace=application))["Metrics"]
        }
    assert "RecordsProcessed" in names
    assert "RenewLease.Time" not in names  # DETAILED
    assert "UpdateLease.Success" not in names


async def test_a_cloudwatch_brownout_drops_metrics_not_records(
    moto_url: str, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, [(f"k{i}", b"z") for i in range(20)])
    application = f"app-{stream_name}"
    with FaultProxy(moto_url, seed=3) as proxy:
        rule = proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500), service="CloudWatch")
        consumer = Consumer(
            stream_name,
            application,
            settings=SETTINGS,
            aws=AwsSettings(endpoint_url=proxy.url, sdk_max_attempts=1),
        )
        with caplog.at_level(logging.WARNING, logger="shardflow.metrics.cloudwatch"):
            seen = await consume_some(consumer, 20)
        assert len(seen) == 20  # every record handled while CloudWatch failed
        proxy.wait_idle()
        assert proxy.injected_count(rule) >= 2
    cloudwatch_state = consumer._cloudwatch  # the publisher's counters
    assert cloudwatch_state is not None
    publisher = cloudwatch_state.publisher
    assert publisher.failed_calls >= 2
    assert publisher.dropped > 0
    assert publisher.sent == 0
    warnings = [r for r in caplog.records if "PutMetricData failed" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited: once a minute at most
    async with cloudwatch_at(moto_url) as cloudwatch:
        listed = await cloudwatch.list_metrics(Namespace=application)
    assert listed["Metrics"] == []
