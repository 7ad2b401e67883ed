"""The OpenTelemetry adapter: a real consumer and producer on the in-memory Kinesis, read by the
SDK's InMemoryMetricReader, under the names and labels the Prometheus collectors export."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from shardflow.aws import OpenClients
from shardflow.consumer import Consumer
from shardflow.leases import InMemoryLeaseStore
from shardflow.metrics import (
    ConsumerCollector,
    ConsumerMetricsSnapshot,
    ProducerCollector,
    ProducerMetricsSnapshot,
)
from shardflow.metrics.otel import (
    AlreadyInstrumentedError,
    instrument_consumer,
    instrument_producer,
)
from shardflow.producer import Producer
from shardflow.testing import MemoryKinesis, fast_settings
from unit.consumer.test_shard_worker_kit import eventually

Points = dict[str, dict[frozenset[tuple[str, Any]], tuple[Any, str]]]


def collected(reader: InMemoryMetricReader) -> Points:
    """Every data point by metric name and attributes: (value, unit)."""
    points: Points = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    attributes = frozenset((point.attributes or {}).items())
                    points.setdefault(metric.name, {})[attributes] = (value, metric.unit or "")
    return points


def value(points: Points, name: str, **attributes: str) -> float:
    return float(points[name][frozenset(attributes.items())][0])


def otel_names(registry: CollectorRegistry) -> set[str]:
    """What the adapter calls the Prometheus families that have samples (prometheus-client
    drops ``_total`` from a counter's family name; OpenTelemetry leaves out empty metrics)."""
    names: set[str] = set()
    for family in registry.collect():
        if not family.samples:
            continue
        if family.type == "histogram":
            names |= {f"{family.name}_count", f"{family.name}_sum"}
        else:
            names.add(family.name)
    return names


async def test_a_consumers_metrics_reach_the_reader_under_the_prometheus_names() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 1)
    kinesis.put_many("s", [(f"k{i}", f"{i}".encode()) for i in range(25)])
    store = InMemoryLeaseStore("app")
    consumer = Consumer(
        "s",
        store.table_name,
        settings=fast_settings(),
        clients=OpenClients(kinesis=kinesis),
        lease_store=store,
    )
    reader = InMemoryMetricReader()
    handle = instrument_consumer(consumer, meter=MeterProvider(metric_readers=[reader]))
    run = asyncio.create_task(consumer.consume(lambda r: None))
    try:
        await eventually(
            lambda: (
                value(collected(reader), "shardflow_consumer_checkpoints", stream="s") > 0
                if "shardflow_consumer_checkpoints" in collected(reader)
                else False
            )
        )
        points = collected(reader)
        shard = kinesis.shard_ids("s")[0]
        assert value(points, "shardflow_consumer_records", stream="s") == 25
        assert points["shardflow_consumer_bytes"][frozenset({("stream", "s")})][1] == "By"
        assert value(points, "shardflow_consumer_handler_latency_seconds_count", stream="s") == 25
        assert points["shardflow_consumer_handler_latency_seconds_sum"][
            frozenset({("stream", "s")})
        ][1] == ("s")
        assert (
            value(points, "shardflow_consumer_millis_behind_latest", stream="s", shard=shard) == 0
        )
        assert value(points, "shardflow_consumer_owned_shards", stream="s") == 1
        action = {"stream": "s", "action": "dropped"}
        assert value(points, "shardflow_consumer_out_of_range_sub_records", **action) == 0
        # Every family the Prometheus collector exports has its OpenTelemetry counterpart.
        registry = CollectorRegistry()
        registry.register(ConsumerCollector(consumer))
        assert otel_names(registry) <= set(points)
        assert len(otel_names(registry)) > 15
        handle.close()
        assert collected(reader) == {}
    finally:
        await consumer.close()
        await run


async def test_a_producers_metrics_reach_the_reader_under_the_prometheus_names() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("p", 2)
    reader = InMemoryMetricReader()
    async with Producer("p", clients=OpenClients(kinesis=kinesis)) as producer:
        handle = instrument_producer(producer, meter=MeterProvider(metric_readers=[reader]))
        futures = [await producer.put(f"{i}", f"k{i}") for i in range(12)]
        await producer.flush()
        await asyncio.gather(*futures)
        points = collected(reader)
        registry = CollectorRegistry()
        registry.register(ProducerCollector(producer))
        exported = otel_names(registry)
    assert value(points, "shardflow_producer_records_succeeded", stream="p") == 12
    assert (
        value(points, "shardflow_producer_put_records_entries", stream="p", result="succeeded")
        == 12
    )
    assert value(points, "shardflow_producer_record_latency_seconds_count", stream="p") == 12
    assert value(points, "shardflow_producer_record_size_bytes_sum", stream="p") > 0
    assert (
        points["shardflow_producer_record_size_bytes_sum"][frozenset({("stream", "p")})][1] == "By"
    )
    assert exported <= set(points)
    assert len(exported) > 10
    handle.close()


def test_one_snapshot_per_source_and_collection_and_producers_of_a_stream_merged() -> None:
    calls: list[str] = []

    def producer_of(name: str) -> Callable[[], ProducerMetricsSnapshot]:
        def snapshot() -> ProducerMetricsSnapshot:
            calls.append(name)
            return ProducerMetricsSnapshot("x", 0.0, 1.0, records_put=len(calls))

        return snapshot

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("app")
    instrument_producer(producer_of("a"), producer_of("b"), meter=meter)
    assert value(collected(reader), "shardflow_producer_records_put", stream="x") == 1 + 2
    assert value(collected(reader), "shardflow_producer_records_put", stream="x") == 3 + 4
    assert calls == ["a", "b", "a", "b"]


def test_a_namespace_is_instrumented_once_per_meter() -> None:
    """OpenTelemetry would keep the first instruments and silently drop the second's callbacks."""
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("app")
    empty = ConsumerMetricsSnapshot(0.0, 1.0)
    instrument_consumer(lambda: empty, meter=meter).close()
    with pytest.raises(AlreadyInstrumentedError, match="shardflow_consumer"):
        instrument_consumer(lambda: empty, meter=meter)
    instrument_consumer(lambda: empty, meter=meter, namespace="other_consumer")


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_importing_shardflow_metrics_does_not_import_opentelemetry() -> None:
    done = run_python(
        "import sys, shardflow, shardflow.metrics, shardflow.consumer, shardflow.producer\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_opentelemetry_the_import_error_names_the_extra() -> None:
    done = run_python(
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # as if the extra were not installed
        "import shardflow.metrics.otel"
    )
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "pip install 'shardflow[otel]'" in done.stderr
