"""What the fetchers emit (throttling, renewed subscriptions) as diagnostic events, and how the
consumer's metrics count them. Reuses the fakes of the polling and fan-out fetcher tests."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from botocore.exceptions import ClientError
from prometheus_client import CollectorRegistry

from shardflow.backoff import Backoff
from shardflow.clock import ManualClock
from shardflow.consumer import ConsumerCollector
from shardflow.consumer.metrics import ConsumerMetrics
from shardflow.events import (
    DiagnosticEvent,
    EventEmitter,
    FetchThrottled,
    ShardEmitter,
    SubscriptionRenewed,
)
from shardflow.fetch import FanOut, FanOutFetcher, Polling, PollingFetcher, RenewalReason
from shardflow.fetch.fanout import consumer_name_of
from shardflow.positions import StartPosition
from shardflow.testing import MemoryKinesis, consume_until_caught_up, fast_settings
from support.clocks import SteppingClock
from unit.fetch.test_fanout_fetcher import (
    END,
    QUICK,
    SHARD,
    FakeKinesis,
    event,
    finish,
    make,
    sequence_numbers,
    settle,
    wait_for_subscription,
)
from unit.fetch.test_fanout_fetcher import aws_error as subscribe_error
from unit.fetch.test_polling_fetcher import FakeShard
from unit.fetch.test_polling_fetcher import aws_error as get_records_error


class Reports:
    """Collects what a shard's fetcher emits, in order."""

    def __init__(self) -> None:
        self.throttled: list[tuple[str, float]] = []
        self.renewed: list[tuple[str | None, RenewalReason]] = []

    def observer(self) -> ShardEmitter:
        return EventEmitter("w1", subscribers=[self.hear]).for_shard("orders", SHARD)

    def hear(self, event: DiagnosticEvent) -> None:
        if isinstance(event, FetchThrottled):
            self.throttled.append((event.operation, event.delay))
        elif isinstance(event, SubscriptionRenewed):
            self.renewed.append((event.position, event.reason))


def failing_observer() -> ShardEmitter:
    def boom(*_: Any) -> None:
        raise RuntimeError("subscriber bug")

    return EventEmitter("w1", subscribers=[boom]).for_shard("orders", SHARD)


# --- polling ----------------------------------------------------------------------------------


def polling(shard: FakeShard, observer: ShardEmitter, **settings: Any) -> PollingFetcher:
    return PollingFetcher(
        shard,
        "orders",
        "shardId-000000000000",
        None,
        Polling(**settings),
        clock=shard.clock,
        rng=random.Random(7),
        events=observer,
    )


async def test_polling_reports_each_retried_throttle_with_the_delay_it_waits() -> None:
    shard = FakeShard(SteppingClock(), records=3)
    shard.faults = [
        get_records_error("ProvisionedThroughputExceededException"),
        get_records_error("ThrottlingException"),
    ]
    reports = Reports()
    batch = await anext(polling(shard, reports.observer()))
    assert [r.data for r in batch.records] == [b"payload-1", b"payload-2", b"payload-3"]
    assert [op for op, _ in reports.throttled] == ["GetRecords", "GetRecords"]
    # The delays reported are exactly the backoff waits the fetcher slept.
    assert [delay for _, delay in reports.throttled] == shard.clock.slept
    assert all(delay > 0 for delay in shard.clock.slept)
    assert reports.renewed == []


async def test_polling_does_not_report_other_failures_as_throttling() -> None:
    shard = FakeShard(SteppingClock(), records=2)
    shard.faults = [
        get_records_error("InternalFailure", status=500),
        get_records_error("ExpiredIteratorException"),
    ]
    reports = Reports()
    batch = await anext(polling(shard, reports.observer()))
    assert len(batch.records) == 2
    assert len(shard.clock.slept) == 1  # the 5xx was retried after a wait...
    assert reports.throttled == []  # ...but it was no throttle


async def test_polling_reports_every_throttle_it_waits_out() -> None:
    shard = FakeShard(SteppingClock(), records=1)
    shard.faults = [get_records_error("ThrottlingException")] * 5
    reports = Reports()
    fetcher = polling(shard, reports.observer(), throttle_backoff=Backoff(base=0.1, cap=1.0))
    assert len((await anext(fetcher)).records) == 1
    assert len(shard.call_times) == 6
    assert len(reports.throttled) == 5


async def test_polling_reads_on_when_the_observer_raises() -> None:
    shard = FakeShard(SteppingClock(), records=2)
    shard.faults = [get_records_error("ThrottlingException")]
    batch = await anext(polling(shard, failing_observer()))
    assert len(batch.records) == 2


# --- fan-out ----------------------------------------------------------------------------------


def fanout(
    observer: ShardEmitter, settings: FanOut = QUICK
) -> tuple[FanOutFetcher, FakeKinesis, ManualClock]:
    return make(settings, events=observer)


async def first_batch(fetcher: FanOutFetcher, kinesis: FakeKinesis, clock: ManualClock) -> None:
    """Subscribe and read one event (records 1, 2) on the first subscription."""
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([1, 2], continuation=2))
    await finish(pending, clock)


async def next_on_new_subscription(
    fetcher: FanOutFetcher, kinesis: FakeKinesis, clock: ManualClock, count: int, sequence: int
) -> None:
    """Read on until subscription number ``count`` is open; it delivers record ``sequence``."""
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, count)
    kinesis.streams[count - 1].push(event([sequence], continuation=sequence))
    assert sequence_numbers(await finish(pending, clock)) == [str(sequence)]


async def test_the_first_subscription_is_not_a_renewal() -> None:
    reports = Reports()
    fetcher, kinesis, clock = fanout(reports.observer())
    await first_batch(fetcher, kinesis, clock)
    assert fetcher.subscriptions == 1
    assert reports.renewed == []
    assert reports.throttled == []


async def test_a_due_renewal_is_reported_with_the_position_it_resumed_from() -> None:
    reports = Reports()
    fetcher, kinesis, clock = fanout(
        reports.observer(), FanOut(renew_after=8.0, event_timeout=10.0, read_timeout=20.0)
    )
    await first_batch(fetcher, kinesis, clock)
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 2)
    assert fetcher.renewals == 1
    assert reports.renewed == []  # open, but not proven yet: nothing came through it
    kinesis.streams[1].push(event([3], continuation=3))
    assert sequence_numbers(await finish(pending, clock)) == ["3"]
    assert reports.renewed == [(str(StartPosition.after_sequence_number("2")), "renew_due")]
    # The next renewal resumes after the newest continuation.
    await next_on_new_subscription(fetcher, kinesis, clock, 3, 4)
    assert reports.renewed[1] == (str(StartPosition.after_sequence_number("3")), "renew_due")
    assert len(reports.renewed) == 2


async def test_a_subscription_refused_inside_its_stream_is_no_renewal() -> None:
    # kinesis-local's answer to a subscription within 5 s of the previous one: an event stream
    # whose first message is ResourceInUse. Only the subscription after it takes over.
    reports = Reports()
    fetcher, kinesis, clock = fanout(
        reports.observer(), FanOut(renew_after=8.0, event_timeout=10.0, read_timeout=20.0)
    )
    await first_batch(fetcher, kinesis, clock)
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 2)
    kinesis.streams[1].push(subscribe_error("ResourceInUseException", in_stream=True))
    await wait_for_subscription(kinesis, clock, 3)
    kinesis.streams[2].push(event([3], continuation=3))
    assert sequence_numbers(await finish(pending, clock)) == ["3"]
    assert fetcher.subscriptions == 3
    assert reports.renewed == [(str(StartPosition.after_sequence_number("2")), "renew_due")]


@pytest.mark.parametrize(
    ("ending", "reason"),
    [
        (END, "closed"),
        (ConnectionResetError("peer gone"), "failed"),
        (subscribe_error("InternalFailure", in_stream=True), "failed"),
    ],
)
async def test_a_subscription_after_a_stream_that_ended_is_reported_with_why(
    ending: Any, reason: RenewalReason
) -> None:
    reports = Reports()
    fetcher, kinesis, clock = fanout(reports.observer())
    await first_batch(fetcher, kinesis, clock)
    kinesis.streams[0].push(ending)
    await next_on_new_subscription(fetcher, kinesis, clock, 2, 3)
    assert reports.renewed == [(str(StartPosition.after_sequence_number("2")), reason)]


async def test_silence_and_an_interrupted_read_are_reported_as_such() -> None:
    reports = Reports()
    fetcher, kinesis, clock = fanout(reports.observer())
    await first_batch(fetcher, kinesis, clock)
    pending = asyncio.ensure_future(anext(fetcher))
    await clock.advance(QUICK.event_timeout)  # no heartbeat: a dead connection
    await wait_for_subscription(kinesis, clock, 2)
    kinesis.streams[1].push(event([3], continuation=3))
    assert sequence_numbers(await finish(pending, clock)) == ["3"]
    pending = asyncio.ensure_future(anext(fetcher))
    await settle()
    pending.cancel()  # the caller gives up mid-read
    await settle()
    await next_on_new_subscription(fetcher, kinesis, clock, 3, 4)
    assert reports.renewed == [
        (str(StartPosition.after_sequence_number("2")), "silent"),
        (str(StartPosition.after_sequence_number("3")), "interrupted"),
    ]


async def test_a_throttled_subscribe_is_reported_with_its_delay_and_is_no_renewal() -> None:
    reports = Reports()
    settings = FanOut(
        renew_after=60.0,
        event_timeout=10.0,
        read_timeout=20.0,
        throttle_backoff=Backoff(base=2.0, cap=4.0, max_attempts=5),
    )
    fetcher, kinesis, clock = fanout(reports.observer(), settings)
    kinesis.subscribe_errors = [subscribe_error("LimitExceededException")] * 2
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    assert len(kinesis.subscribe_calls) == 3
    assert [op for op, _ in reports.throttled] == ["SubscribeToShard"] * 2
    # The fetcher's random source (seed 7) drew these delays: full jitter under 2 s, then 4 s.
    rng = random.Random(7)
    expected = [settings.throttle_backoff.delay(n, rng) for n in range(2)]
    assert [delay for _, delay in reports.throttled] == pytest.approx(expected)
    assert reports.renewed == []  # still the first subscription
    kinesis.streams[0].push(event([1], continuation=1))
    assert sequence_numbers(await finish(pending, clock)) == ["1"]


async def test_a_throttle_inside_the_stream_is_reported_then_the_renewal() -> None:
    reports = Reports()
    fetcher, kinesis, clock = fanout(reports.observer())
    await first_batch(fetcher, kinesis, clock)
    kinesis.streams[0].push(subscribe_error("LimitExceededException", in_stream=True))
    await next_on_new_subscription(fetcher, kinesis, clock, 2, 3)
    assert [op for op, _ in reports.throttled] == ["SubscribeToShard"]
    assert reports.renewed == [(str(StartPosition.after_sequence_number("2")), "failed")]


async def test_fanout_reads_on_when_the_observer_raises() -> None:
    fetcher, kinesis, clock = fanout(
        failing_observer(), FanOut(renew_after=8.0, event_timeout=10.0, read_timeout=20.0)
    )
    kinesis.subscribe_errors = [subscribe_error("LimitExceededException")]
    await first_batch(fetcher, kinesis, clock)
    await next_on_new_subscription(fetcher, kinesis, clock, 2, 3)  # renewal due


# --- the consumer's adapter -------------------------------------------------------------------


def test_metrics_count_what_the_events_report() -> None:
    clock = ManualClock(start=5.0, wall_offset=1_000.0)
    metrics = ConsumerMetrics(clock)
    events: list[DiagnosticEvent] = []
    shard = EventEmitter("w1", clock=clock, subscribers=[metrics.observe, events.append])
    emitter = shard.for_shard("orders", SHARD)
    emitter.emit(FetchThrottled, operation="SubscribeToShard", delay=1.25)
    emitter.emit(
        SubscriptionRenewed,
        consumer_name="billing",
        position="AFTER_SEQUENCE_NUMBER 42",
        reason="renew_due",
    )
    assert events == [
        FetchThrottled(
            worker_id="w1",
            at=1_005.0,
            stream="orders",
            shard_id=SHARD,
            operation="SubscribeToShard",
            delay=1.25,
        ),
        SubscriptionRenewed(
            worker_id="w1",
            at=1_005.0,
            stream="orders",
            shard_id=SHARD,
            consumer_name="billing",
            position="AFTER_SEQUENCE_NUMBER 42",
            reason="renew_due",
        ),
    ]
    counters = metrics.snapshot().streams["orders"]
    assert (counters.fetch_throttles, counters.subscription_renewals) == (1, 1)


def test_an_emitter_without_subscribers_builds_nothing() -> None:
    class Exploding(FetchThrottled):
        def __init__(self, **_: Any) -> None:
            raise AssertionError("built an event nobody hears")

    EventEmitter("w1").for_shard("orders", SHARD).emit(Exploding, operation="x", delay=0.0)


def test_the_consumer_name_comes_from_its_arn() -> None:
    arn = "arn:aws:kinesis:us-east-1:000000000000:stream/orders/consumer/billing:1700000000"
    assert consumer_name_of(arn) == "billing"


class ThrottlingKinesis(MemoryKinesis):
    """The in-memory Kinesis, refusing the first ``throttles`` GetRecords calls."""

    def __init__(self, throttles: int) -> None:
        super().__init__()
        self.throttles = throttles

    async def get_records(self, **params: Any) -> dict[str, Any]:
        if self.throttles > 0:
            self.throttles -= 1
            raise ClientError(
                {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow"}},
                "GetRecords",
            )
        return await super().get_records(**params)


async def test_a_consumer_emits_an_event_per_throttled_poll() -> None:
    kinesis = ThrottlingKinesis(throttles=2)
    kinesis.create_stream("s", 1)
    kinesis.put_many("s", [(f"k{i}", f"{i}".encode()) for i in range(5)])
    events: list[DiagnosticEvent] = []
    settings = fast_settings(
        fetch=Polling(
            idle_time=0.005, throttle_backoff=Backoff(base=0.01, cap=0.02, max_attempts=5)
        ),
        worker_id="worker-1",
    )
    seen: list[bytes] = []
    await consume_until_caught_up(
        "s",
        lambda r: seen.append(r.data),
        kinesis=kinesis,
        settings=settings,
        on_event=events.append,
    )
    assert len(seen) == 5
    throttled = [e for e in events if isinstance(e, FetchThrottled)]
    assert len(throttled) == 2
    (shard_id,) = kinesis.shard_ids("s")
    assert {(e.stream, e.shard_id, e.worker_id, e.operation) for e in throttled} == {
        ("s", shard_id, "worker-1", "GetRecords")
    }
    assert all(0 <= e.delay <= 0.02 for e in throttled)
    assert not any(isinstance(e, SubscriptionRenewed) for e in events)


async def test_throttles_and_renewals_are_exported_through_prometheus_client() -> None:
    metrics = ConsumerMetrics()
    emitter = EventEmitter("w1", subscribers=[metrics.observe]).for_shard("s", SHARD)
    emitter.emit(FetchThrottled, operation="GetRecords", delay=0.1)
    emitter.emit(FetchThrottled, operation="GetRecords", delay=0.1)
    emitter.emit(SubscriptionRenewed, consumer_name="c", position=None, reason="renew_due")
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(metrics.snapshot))
    assert (
        registry.get_sample_value("shardflow_consumer_fetch_throttles_total", {"stream": "s"}) == 2
    )
    assert (
        registry.get_sample_value("shardflow_consumer_subscription_renewals_total", {"stream": "s"})
        == 1
    )
