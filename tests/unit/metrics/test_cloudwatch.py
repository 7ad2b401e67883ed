"""The CloudWatch publisher: statistic sets, levels, dimensions, batches within PutMetricData's
limits, and failures that drop (counted, logged once a minute) instead of raising."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from shardflow.metrics.cloudwatch import (
    MAX_DATUMS_PER_CALL,
    CloudWatch,
    CloudWatchPublisher,
    MetricBuffer,
    batches,
    datums,
)


def test_values_become_one_statistic_set_per_name_and_dimensions() -> None:
    buffer = MetricBuffer(CloudWatch())
    for value in (3, 1, 8):
        buffer.add(
            "RecordsProcessed", value, "Count", "SUMMARY", Operation="ProcessTask", ShardId="s-1"
        )
    buffer.add("RecordsProcessed", 5, "Count", "SUMMARY", Operation="ProcessTask", ShardId="s-2")
    stats = buffer.get("RecordsProcessed", Operation="ProcessTask", ShardId="s-1")
    assert stats is not None
    assert stats.as_dict() == {"SampleCount": 3.0, "Sum": 12.0, "Minimum": 1.0, "Maximum": 8.0}
    entries = datums(buffer, datetime(2025, 1, 1, tzinfo=UTC))
    assert len(entries) == 2
    assert entries[0]["Dimensions"] == [
        {"Name": "Operation", "Value": "ProcessTask"},
        {"Name": "ShardId", "Value": "s-1"},
    ]
    assert entries[0]["Unit"] == "Count"


@pytest.mark.parametrize(
    ("level", "sent"),
    [("NONE", set()), ("SUMMARY", {"Time"}), ("DETAILED", {"Time", "RenewLease.Time"})],
)
def test_levels_filter_as_the_kcls(level: Any, sent: set[str]) -> None:
    buffer = MetricBuffer(CloudWatch(level=level))
    buffer.add("Time", 1.0, "Milliseconds", "SUMMARY", Operation="RenewAllLeases")
    buffer.add("RenewLease.Time", 1.0, "Milliseconds", "DETAILED", Operation="RenewAllLeases")
    assert {key[0] for key, _ in buffer.items()} == sent


def test_disabled_dimensions_aggregate_over_them_and_operation_stays() -> None:
    settings = CloudWatch(dimensions=frozenset({"ShardId"}))
    assert "Operation" in settings.dimensions
    buffer = MetricBuffer(settings)
    buffer.add(
        "CurrentLeases", 2, "Count", "SUMMARY", Operation="RenewAllLeases", WorkerIdentifier="a"
    )
    buffer.add(
        "CurrentLeases", 3, "Count", "SUMMARY", Operation="RenewAllLeases", WorkerIdentifier="b"
    )
    stats = buffer.get("CurrentLeases", Operation="RenewAllLeases")
    assert stats is not None
    assert stats.count == 2
    with pytest.raises(ValueError, match="unknown dimensions"):
        CloudWatch(dimensions=frozenset({"Host"}))


def test_batches_keep_within_the_per_call_limits() -> None:
    buffer = MetricBuffer(CloudWatch())
    for i in range(2_500):
        buffer.add(
            "RecordsProcessed",
            1,
            "Count",
            "SUMMARY",
            Operation="ProcessTask",
            ShardId=f"shardId-{i:012d}",
        )
    entries = datums(buffer, datetime.now(UTC))
    sizes = [len(batch) for batch in batches(entries)]
    assert sizes == [MAX_DATUMS_PER_CALL, MAX_DATUMS_PER_CALL, 500]
    long_names = [dict(entry, MetricName="x" * 200_000) for entry in entries[:10]]
    assert [len(b) for b in batches(long_names)] == [2, 2, 2, 2, 2]  # ~200 kB each, 500 kB a call


def test_over_max_datums_values_are_dropped_and_counted() -> None:
    buffer = MetricBuffer(CloudWatch(max_datums=2))
    for shard in ("a", "b", "c"):
        buffer.add("Success", 1, "Count", "SUMMARY", Operation="ProcessTask", ShardId=shard)
    buffer.add("Success", 1, "Count", "SUMMARY", Operation="ProcessTask", ShardId="a")
    assert len(buffer) == 2
    assert buffer.overflowed == 1


async def test_a_failing_send_drops_counts_and_warns_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1_000.0]
    calls: list[list[dict[str, Any]]] = []

    async def put(namespace: str, data: list[dict[str, Any]]) -> None:
        calls.append(data)
        raise ConnectionError("CloudWatch is down")

    publisher = CloudWatchPublisher(CloudWatch(), "app", put, now=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="shardflow.metrics.cloudwatch"):
        for step in range(3):
            publisher.buffer.add("Success", 1, "Count", "SUMMARY", Operation="ProcessTask")
            await publisher.flush()
            now[0] += 20.0 if step == 0 else 45.0
        publisher.buffer.add("Success", 1, "Count", "SUMMARY", Operation="ProcessTask")
        await publisher.flush()
    assert len(calls) == 4
    assert publisher.failed_calls == 4
    assert publisher.dropped == 4
    assert publisher.sent == 0
    warnings = [r for r in caplog.records if "PutMetricData failed" in r.getMessage()]
    assert len(warnings) == 2  # at 1,000 s and 1,065 s; not at 1,020 s nor 1,110 s


async def test_collect_adds_gauges_before_each_send_and_sent_counts() -> None:
    sent: list[tuple[str, list[dict[str, Any]]]] = []

    async def put(namespace: str, data: list[dict[str, Any]]) -> None:
        sent.append((namespace, data))

    def collect(buffer: MetricBuffer) -> None:
        buffer.add("CurrentLeases", 4, "Count", "SUMMARY", Operation="RenewAllLeases")

    publisher = CloudWatchPublisher(CloudWatch(interval=0.01), "app", put, collect=collect)
    task = asyncio.create_task(publisher.run())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sent
    assert all(namespace == "app" for namespace, _ in sent)
    assert sent[0][1][0]["MetricName"] == "CurrentLeases"
    assert publisher.sent == publisher.calls == len(sent)


async def test_nothing_is_sent_at_level_none() -> None:
    async def put(namespace: str, data: list[dict[str, Any]]) -> None:
        raise AssertionError("sent at NONE")

    publisher = CloudWatchPublisher(CloudWatch(level="NONE"), "app", put)
    publisher.buffer.add("Success", 1, "Count", "SUMMARY", Operation="ProcessTask")
    await publisher.flush()
    await publisher.run()  # returns at once
