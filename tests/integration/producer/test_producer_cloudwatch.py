"""The producer's metrics under the KPL's CloudWatch names (issue 24 item 1, producer side): a
KPL dashboard's metric queries (name + dimensions) return data for a shardflow producer on
moto's CloudWatch; entry failures show as ErrorsByCode; a CloudWatch brownout drops metrics
(counted, logged) and never a record.

A real producer against moto's server over HTTP (faults through FaultProxy); the dashboard's
queries are the plain SDK's GetMetricStatistics and ListMetrics."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

import pytest

from shardflow import AwsSettings
from shardflow.aws.clients import ClientFactory
from shardflow.metrics.cloudwatch import CloudWatch
from shardflow.producer import Producer, ProducerSettings
from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse, FaultProxy, PartialFailure
from support.boto import make_stream, user_records

NAMESPACE = "KinesisProducerLibrary"
# One call at a time: moto numbers records without a lock (see test_producer_moto).
SETTINGS = ProducerSettings(max_concurrent_requests=1, linger=0.01)


async def statistics(
    url: str, namespace: str, name: str, dimensions: dict[str, str]
) -> dict[str, float]:
    """GetMetricStatistics over the last hour, summed over its datapoints (as an alarm asks)."""
    now = dt.datetime.now(dt.UTC)
    async with ClientFactory(AwsSettings(endpoint_url=url)).cloudwatch() as cloudwatch:
        answer = await cloudwatch.get_metric_statistics(
            Namespace=namespace,
            MetricName=name,
            Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
            StartTime=now - dt.timedelta(hours=1),
            EndTime=now + dt.timedelta(minutes=5),
            Period=60,
            Statistics=["SampleCount", "Sum", "Minimum", "Maximum"],
        )
    points = answer["Datapoints"]
    return {
        "SampleCount": sum(p["SampleCount"] for p in points),
        "Sum": sum(p["Sum"] for p in points),
        "Minimum": min((p["Minimum"] for p in points), default=0.0),
        "Maximum": max((p["Maximum"] for p in points), default=0.0),
    }


async def produce(url: str, stream: str, count: int, settings: ProducerSettings) -> Producer:
    producer = Producer(stream, settings=settings, aws=AwsSettings(endpoint_url=url))
    async with producer:
        futures = [await producer.put(f"record-{i:04d}", f"key-{i % 13}") for i in range(count)]
        for future in futures:
            await future
    return producer


async def test_a_kpl_dashboards_queries_return_data(moto_url: str, stream_name: str) -> None:
    make_stream(moto_url, stream_name, 2)
    settings = ProducerSettings(
        max_concurrent_requests=1, linger=0.01, metrics=CloudWatch(interval=0.5)
    )
    producer = await produce(moto_url, stream_name, 120, settings)
    written = producer.metrics()
    assert written.records_succeeded == 120

    stream = {"StreamName": stream_name}
    put = await statistics(moto_url, NAMESPACE, "UserRecordsPut", stream)
    # 1 per record written, 0 per failure: Average = success rate, SampleCount = attempts.
    assert (put["SampleCount"], put["Sum"], put["Minimum"]) == (120, 120, 1)
    received = await statistics(moto_url, NAMESPACE, "UserRecordsReceived", stream)
    assert received["Sum"] == 120
    data = await statistics(moto_url, NAMESPACE, "UserRecordsDataPut", stream)
    assert data["Sum"] == written.bytes_succeeded
    kinesis = await statistics(moto_url, NAMESPACE, "KinesisRecordsPut", stream)
    assert kinesis["Sum"] == written.entries_succeeded == 120
    retries = await statistics(moto_url, NAMESPACE, "RetriesPerRecord", stream)
    assert (retries["SampleCount"], retries["Sum"]) == (120, 0)
    requests = await statistics(moto_url, NAMESPACE, "RequestTime", stream)
    assert requests["SampleCount"] == written.put_records_calls
    assert requests["Maximum"] > 0  # milliseconds of real calls
    per_request = await statistics(
        moto_url, NAMESPACE, "KinesisRecordsPerPutRecordsRequest", stream
    )
    assert (per_request["SampleCount"], per_request["Sum"]) == (written.put_records_calls, 120)
    users = await statistics(moto_url, NAMESPACE, "UserRecordsPerPutRecordsRequest", stream)
    assert users["Sum"] == 120
    per_kinesis = await statistics(moto_url, NAMESPACE, "UserRecordsPerKinesisRecord", stream)
    assert (per_kinesis["SampleCount"], per_kinesis["Maximum"]) == (120, 1)
    pending = await statistics(moto_url, NAMESPACE, "UserRecordsPending", stream)
    assert pending["SampleCount"] >= 1
    # Each metric also without dimensions: the KPL's global metric.
    async with ClientFactory(AwsSettings(endpoint_url=moto_url)).cloudwatch() as cloudwatch:
        listed = await cloudwatch.list_metrics(Namespace=NAMESPACE, MetricName="UserRecordsPut")
    assert {(m.get("Dimensions") or [{}])[0].get("Value") for m in listed["Metrics"]} >= {
        stream_name,
        None,
    }
    assert producer.cloudwatch_dropped == 0


async def test_entry_failures_are_errors_by_code_and_retries(
    moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 1)
    namespace = f"KPL-{stream_name}"[:255]
    settings = ProducerSettings(
        max_concurrent_requests=1, linger=0.01, metrics=CloudWatch(namespace=namespace)
    )
    with FaultProxy(moto_url, seed=11) as proxy:
        rule = proxy.add(PartialFailure(fraction=0.25), operation="PutRecords", times=3)
        producer = await produce(proxy.url, stream_name, 80, settings)
        proxy.wait_idle()
        refused = proxy.injected_count(rule)
    assert len(user_records(moto_url, stream_name)) == 80  # every record delivered
    written = producer.metrics()
    assert written.entries_failed > 0
    assert refused >= 1

    stream = {"StreamName": stream_name}
    by_code = await statistics(
        moto_url,
        namespace,
        "ErrorsByCode",
        {**stream, "ErrorCode": "ProvisionedThroughputExceededException"},
    )
    assert by_code["Sum"] == written.entries_failed
    every = await statistics(moto_url, namespace, "AllErrors", stream)
    assert every["Sum"] == written.entries_failed
    kinesis_put = await statistics(moto_url, namespace, "KinesisRecordsPut", stream)
    # Attempts (SampleCount) exceed successes (Sum) by the failed entries.
    assert kinesis_put["SampleCount"] - kinesis_put["Sum"] == written.entries_failed
    assert kinesis_put["Minimum"] == 0
    retries = await statistics(moto_url, namespace, "RetriesPerRecord", stream)
    assert retries["Sum"] == written.retries


async def test_a_cloudwatch_brownout_drops_metrics_not_records(
    moto_url: str, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    make_stream(moto_url, stream_name, 1)
    namespace = f"KPL-{stream_name}"[:255]
    settings = ProducerSettings(
        max_concurrent_requests=1,
        linger=0.01,
        metrics=CloudWatch(namespace=namespace, interval=0.2),
    )
    with FaultProxy(moto_url, seed=5) as proxy:
        rule = proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500), service="CloudWatch")
        with caplog.at_level(logging.WARNING, logger="shardflow.metrics.cloudwatch"):
            producer = Producer(
                stream_name,
                settings=settings,
                aws=AwsSettings(endpoint_url=proxy.url, sdk_max_attempts=1),
            )
            async with producer:
                for i in range(50):
                    await producer.put(f"r{i}", f"k{i}")
                    if i % 10 == 0:
                        await asyncio.sleep(0.1)  # a few sends fail while records flow
        proxy.wait_idle()
        assert proxy.injected_count(rule) >= 2
    assert len(user_records(moto_url, stream_name)) == 50
    assert producer.metrics().records_succeeded == 50
    assert producer.cloudwatch_dropped > 0
    warnings = [r for r in caplog.records if "PutMetricData failed" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited: once a minute at most
    async with ClientFactory(AwsSettings(endpoint_url=moto_url)).cloudwatch() as cloudwatch:
        listed: Any = await cloudwatch.list_metrics(Namespace=namespace)
    assert listed["Metrics"] == []
