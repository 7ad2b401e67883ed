"""Faults a consumer meets in production, through the fault proxy in front of moto.

A brownout (every GetRecords answered 500 for longer than any fixed number of retries lasts)
must not stop a shard: records written after it are handled. A deleted stream, which no
retry can fix, must end the consumer with the error, its leases released.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from shardflow.aws import AwsSettings
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.errors import ResourceNotFoundError, StartTimeoutError, TransientError
from shardflow.events import DiagnosticEvent, ShardFailed, ShardStarted
from shardflow.fetch import Polling
from shardflow.leases.settings import LeaseSettings
from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse, FaultProxy
from support.boto import lease_items
from support.streams import create_stream, kinesis_at, put
from support.waiting import until

BROWNOUT = 12.0
"""Longer than the fixed retries of earlier versions could ever last (at most ~11 s)."""

SETTINGS = ConsumerSettings(
    leases=LeaseSettings(
        failover_time=2.0, renew_interval=0.4, take_interval=0.5, safety_margin=0.3
    ),
    fetch=Polling(idle_time=0.2),
    checkpoint=CheckpointSettings(every_n=10, interval=0.5),
    drain_timeout=2.0,
)


@pytest.fixture
def proxy(moto_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url, seed=11) as proxy:
        yield proxy


def consumer_at(url: str, stream: str, **options: Any) -> Consumer:
    return Consumer(
        stream,
        f"app-{stream}",
        settings=replace(SETTINGS, **options.pop("settings", {})),
        aws=AwsSettings(endpoint_url=url),
        **options,
    )


def items(tag: str, count: int) -> list[tuple[str, bytes]]:
    return [(f"key-{i}", f"{tag}-{i}".encode()) for i in range(count)]


async def stream_with(url: str, stream: str, written: list[tuple[str, bytes]]) -> None:
    async with kinesis_at(url) as kinesis:
        await create_stream(kinesis, stream, 2)
        await put(kinesis, stream, written)


def collecting(seen: list[bytes]) -> Callable[[ConsumedRecord[bytes]], Awaitable[None]]:
    async def handle(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.data)

    return handle


async def test_records_written_after_a_getrecords_brownout_are_handled(
    proxy: FaultProxy, moto_url: str, stream_name: str
) -> None:
    await stream_with(moto_url, stream_name, items("before", 20))
    seen: list[bytes] = []
    events: list[DiagnosticEvent] = []
    handle = collecting(seen)

    # Leases with room for a stalled event loop: this test is about GetRecords failures not
    # restarting shards, and at failover 2 s a loop the suite's Spark JVMs starved for ~1.7 s
    # lost both leases (a different fault: its shards then restarted, as they must).
    leases = LeaseSettings(
        failover_time=6.0, renew_interval=1.0, take_interval=0.5, safety_margin=0.5
    )
    consumer = consumer_at(
        proxy.url, stream_name, on_event=events.append, settings={"leases": leases}
    )
    run = asyncio.create_task(consumer.consume(handle))
    try:
        await until(lambda: len(seen) >= 20, 30.0)
        rule = proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500), operation="GetRecords")
        started = time.monotonic()
        await until(lambda: proxy.injected_count(rule) >= 4, 10.0)
        async with kinesis_at(moto_url) as kinesis:
            await put(kinesis, stream_name, items("during", 20))
        await asyncio.sleep(BROWNOUT - (time.monotonic() - started))
        proxy.remove(rule)
        async with kinesis_at(moto_url) as kinesis:
            await put(kinesis, stream_name, items("after", 20))
        await until(lambda: len(seen) >= 60, 30.0)
        status = consumer.status()
        assert len(status.shards) == 2
        assert not status.parked
        assert not status.failed
        # Each shard rode the brownout out in its first worker: none stopped and started again.
        assert len([e for e in events if isinstance(e, ShardStarted)]) == 2
    finally:
        await consumer.close()
        await run
    assert sorted(seen) == sorted(
        d for tag in ("before", "during", "after") for _, d in items(tag, 20)
    )
    assert proxy.injected_count(rule) >= 10


async def test_a_deleted_stream_ends_the_consumer_with_the_error_and_releases_its_leases(
    proxy: FaultProxy, moto_url: str, stream_name: str
) -> None:
    await stream_with(moto_url, stream_name, items("r", 10))
    seen: list[bytes] = []
    events: list[DiagnosticEvent] = []
    errors: list[tuple[str, str, BaseException]] = []
    consumer = consumer_at(
        proxy.url,
        stream_name,
        on_event=events.append,
        on_error=lambda stream, shard, error: errors.append((stream, shard, error)),
    )

    run = asyncio.create_task(consumer.consume(collecting(seen)))
    await until(lambda: len(seen) >= 10, 30.0)
    async with kinesis_at(moto_url) as kinesis:
        await kinesis.delete_stream(StreamName=stream_name, EnforceConsumerDeletion=True)
    with pytest.raises(ResourceNotFoundError):
        await asyncio.wait_for(run, 30.0)

    assert errors
    assert all(isinstance(error, ResourceNotFoundError) for _, _, error in errors)
    failed = [e for e in events if isinstance(e, ShardFailed)]
    assert failed
    assert all(not e.parked for e in failed)
    status = consumer.status()
    assert set(status.failed) == {e.lease_key for e in failed}
    assert consumer.metrics().streams[stream_name].shard_failures >= 1
    table = lease_items(moto_url, f"app-{stream_name}")
    assert table
    assert all("leaseOwner" not in item for item in table.values())


async def test_a_consumer_started_during_a_kinesis_brownout_waits_it_out(
    proxy: FaultProxy, moto_url: str, stream_name: str
) -> None:
    """bench/chaos.py: a worker restarted inside a Kinesis brownout ran out of its first
    DescribeStreamSummary's retries (6 attempts) and exited. 12 failed in a row: the consumer
    starts once they pass and handles the stream."""
    await stream_with(moto_url, stream_name, items("r", 10))
    rule = proxy.add(
        ErrorResponse(INTERNAL_FAILURE, status=500), operation="DescribeStreamSummary", times=12
    )
    seen: list[bytes] = []
    consumer = consumer_at(proxy.url, stream_name, settings={"start_timeout": 60.0})
    run = asyncio.create_task(consumer.consume(collecting(seen)))
    try:
        await until(lambda: len(seen) >= 10 or run.done(), 60.0)
        assert not run.done(), f"the consumer ended: {run.exception()!r}"
    finally:
        await consumer.close()
        await run
    assert proxy.injected_count(rule) == 12
    assert sorted(seen) == sorted(d for _, d in items("r", 10))


async def test_start_gives_up_after_start_timeout_with_a_typed_error(
    proxy: FaultProxy, moto_url: str, stream_name: str
) -> None:
    await stream_with(moto_url, stream_name, items("r", 1))
    proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500), operation="DescribeStreamSummary")
    consumer = consumer_at(proxy.url, stream_name, settings={"start_timeout": 2.0})
    started = time.monotonic()
    with pytest.raises(StartTimeoutError) as caught:
        await consumer.start()
    took = time.monotonic() - started
    await consumer.close()
    assert isinstance(caught.value.__cause__, TransientError)
    assert caught.value.timeout == 2.0
    assert stream_name in str(caught.value)
    assert 2.0 <= took < 15.0, "tried until start_timeout, then stopped"


async def test_a_missing_stream_still_fails_start_at_once(proxy: FaultProxy) -> None:
    consumer = consumer_at(proxy.url, "no-such-stream", settings={"start_timeout": 60.0})
    started = time.monotonic()
    with pytest.raises(ResourceNotFoundError):
        await consumer.start()
    await consumer.close()
    assert time.monotonic() - started < 10.0
