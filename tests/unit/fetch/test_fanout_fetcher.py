"""The fan-out fetcher's positions, renewals and recovery, against a small fake event source and
a manual clock (no server, no botocore parsing: see the integration tests for those)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from botocore.exceptions import ClientError, EventStreamError

from shardflow.backoff import Backoff
from shardflow.clock import ManualClock
from shardflow.errors import (
    AccessDeniedError,
    ResourceNotFoundError,
)
from shardflow.events import SILENT, ShardEmitter
from shardflow.fetch.batch import FetchedBatch
from shardflow.fetch.fanout import FanOut, FanOutFetcher
from shardflow.fetch.pacing import SubscriptionPacer
from shardflow.positions import StartPosition

T = TypeVar("T")
ARRIVAL = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
CONSUMER = "arn:aws:kinesis:us-east-1:123456789012:stream/orders/consumer/app:1"
SHARD = "shardId-000000000000"
END = object()


def aws_error(code: str, *, in_stream: bool = False) -> ClientError:
    cls = EventStreamError if in_stream else ClientError
    return cls({"Error": {"Code": code, "Message": f"{code} happened"}}, "SubscribeToShard")


def event(
    sequence_numbers: list[int] | None = None,
    *,
    continuation: int | None,
    behind: int = 0,
    children: list[str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "Records": [
            {
                "Data": f"r{n}".encode(),
                "PartitionKey": f"k{n}",
                "SequenceNumber": str(n),
                "ApproximateArrivalTimestamp": ARRIVAL,
            }
            for n in sequence_numbers or []
        ],
        "MillisBehindLatest": behind,
    }
    if continuation is not None:
        body["ContinuationSequenceNumber"] = str(continuation)
    if children is not None:
        body["ChildShards"] = [
            {
                "ShardId": child,
                "ParentShards": [SHARD],
                "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"},
            }
            for child in children
        ]
    return {"SubscribeToShardEvent": body}


class FakeEventStream:
    """One subscription's events, pushed by the test: an event, an exception, or END."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = False

    def push(self, *items: Any) -> None:
        for item in items:
            self.queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._events()

    async def _events(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            item = await self.queue.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.closed = True


class FakeKinesis:
    """SubscribeToShard (and GetShardIterator/GetRecords for the closed-shard check)."""

    def __init__(self) -> None:
        self.subscribe_calls: list[dict[str, Any]] = []
        self.subscribe_errors: list[Exception] = []
        self.streams: list[FakeEventStream] = []
        self.get_records_answer: dict[str, Any] = {"Records": [], "NextShardIterator": "it-2"}
        self.iterator_calls: list[dict[str, Any]] = []

    async def subscribe_to_shard(self, **params: Any) -> dict[str, Any]:
        self.subscribe_calls.append(params)
        if self.subscribe_errors:
            raise self.subscribe_errors.pop(0)
        stream = FakeEventStream()
        self.streams.append(stream)
        return {"EventStream": stream}

    async def get_shard_iterator(self, **params: Any) -> dict[str, Any]:
        self.iterator_calls.append(params)
        return {"ShardIterator": "it-1"}

    async def get_records(self, **params: Any) -> dict[str, Any]:
        return self.get_records_answer

    @property
    def positions(self) -> list[dict[str, Any]]:
        return [call["StartingPosition"] for call in self.subscribe_calls]


QUICK = FanOut(
    renew_after=60.0,
    event_timeout=10.0,
    read_timeout=20.0,
    in_use_backoff=Backoff(base=0.5, cap=2.0),
    error_backoff=Backoff(base=0.2, cap=1.0),
    denied_for=0.0,
)


def make(
    settings: FanOut = QUICK,
    start: StartPosition | None = None,
    events: ShardEmitter = SILENT,
    closed_shard_check: float | None = None,
) -> tuple[FanOutFetcher, FakeKinesis, ManualClock]:
    clock = ManualClock(start=0.0)
    kinesis = FakeKinesis()
    fetcher = FanOutFetcher(
        kinesis,
        "orders",
        SHARD,
        start,
        settings,
        consumer_arn=CONSUMER,
        pacer=SubscriptionPacer(clock=clock),
        clock=clock,
        rng=random.Random(7),
        events=events,
        closed_shard_check=closed_shard_check,
    )
    return fetcher, kinesis, clock


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def wait_for_subscription(kinesis: FakeKinesis, clock: ManualClock, count: int) -> None:
    """Let time pass (pacing, backoff) until the fetcher opened ``count`` subscriptions."""
    for _ in range(600):
        await settle()
        if len(kinesis.streams) >= count:
            return
        await clock.advance(0.1)
    raise AssertionError(f"only {len(kinesis.streams)} subscriptions, expected {count}")


async def finish(task: Awaitable[T], clock: ManualClock, *, step: float = 0.1) -> T:
    """Advance time until ``task`` is done (bounded)."""
    future = asyncio.ensure_future(task)
    for _ in range(2000):
        await settle()
        if future.done():
            return future.result()
        await clock.advance(step)
    future.cancel()
    raise AssertionError("the fetcher did not answer")


def sequence_numbers(batch: FetchedBatch) -> list[str]:
    return [r.sequence_number for r in batch.records]


# --- positions -------------------------------------------------------------------------------


async def test_events_become_batches_and_move_the_resume_position() -> None:
    fetcher, kinesis, clock = make(start=StartPosition.latest())
    assert fetcher.resume_position == StartPosition.latest()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    assert kinesis.positions == [{"Type": "LATEST"}]
    assert kinesis.subscribe_calls[0]["ConsumerARN"] == CONSUMER
    assert kinesis.subscribe_calls[0]["ShardId"] == SHARD
    kinesis.streams[0].push(event([10, 11], continuation=11, behind=500))
    batch = await finish(pending, clock)
    assert sequence_numbers(batch) == ["10", "11"]
    assert [r.data for r in batch.records] == [b"r10", b"r11"]
    assert batch.records[0].stream_name == "orders"
    assert batch.records[0].shard_id == SHARD
    assert batch.records[0].approximate_arrival_timestamp == ARRIVAL
    assert batch.millis_behind_latest == 500
    assert not batch.caught_up
    assert not batch.shard_ended
    assert fetcher.last_sequence_number == "11"
    assert fetcher.resume_position == StartPosition.after_sequence_number("11")


async def test_heartbeats_are_empty_caught_up_batches_that_move_the_continuation() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([5], continuation=5), event(continuation=9))
    first = await finish(pending, clock)
    heartbeat = await finish(anext(fetcher), clock)
    assert sequence_numbers(first) == ["5"]
    assert heartbeat.records == []
    assert heartbeat.caught_up
    assert fetcher.last_sequence_number == "5"  # the last record...
    assert fetcher.continuation_sequence_number == "9"  # ...but progress goes on
    assert fetcher.resume_position == StartPosition.after_sequence_number("9")


async def test_timestamp_and_sequence_starts_are_passed_as_starting_positions() -> None:
    moment = datetime(2024, 5, 1, tzinfo=UTC)
    for start, expected in [
        (StartPosition.at_timestamp(moment), {"Type": "AT_TIMESTAMP", "Timestamp": moment}),
        (
            StartPosition.at_sequence_number("77"),
            {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": "77"},
        ),
        (StartPosition.trim_horizon(), {"Type": "TRIM_HORIZON"}),
    ]:
        fetcher, kinesis, clock = make(start=start)
        pending = asyncio.ensure_future(anext(fetcher))
        await wait_for_subscription(kinesis, clock, 1)
        assert kinesis.positions == [expected]
        pending.cancel()
        await settle()


# --- renewal ---------------------------------------------------------------------------------


async def test_a_subscription_is_renewed_after_renew_after_from_the_last_continuation() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([1, 2], continuation=2))
    await finish(pending, clock)
    # Heartbeats keep coming; the subscription turns 60 s old while the caller waits.
    batches = []
    for _ in range(12):
        kinesis.streams[-1].push(event(continuation=3))
        batches.append(await finish(anext(fetcher), clock))
        await clock.advance(5.0)
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 2)
    assert kinesis.streams[0].closed
    assert fetcher.renewals == 1
    assert kinesis.positions[1] == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "3"}
    kinesis.streams[1].push(event([4], continuation=4))
    batch = await finish(pending, clock)
    assert sequence_numbers(batch) == ["4"]


async def test_renewal_happens_while_waiting_for_an_event() -> None:
    fetcher, kinesis, clock = make(FanOut(renew_after=8.0, event_timeout=10.0, read_timeout=20.0))
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([1], continuation=1))
    await finish(pending, clock)
    pending = asyncio.ensure_future(anext(fetcher))  # nothing comes on the first subscription
    await clock.advance(7.9)
    await settle()
    assert len(kinesis.streams) == 1
    await wait_for_subscription(kinesis, clock, 2)
    assert clock.monotonic() == pytest.approx(8.0, abs=0.11)
    assert fetcher.renewals == 1
    assert kinesis.streams[0].closed
    kinesis.streams[1].push(event([2], continuation=2))
    assert sequence_numbers(await finish(pending, clock)) == ["2"]


async def test_a_slow_caller_gets_a_fresh_subscription_without_an_error() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([1], continuation=1), event([2], continuation=2))
    await finish(pending, clock)
    await clock.advance(600.0)  # the handler takes ten minutes over one batch
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 2)
    # The old stream was dropped unread (event 2 included): reading resumes after event 1.
    assert kinesis.streams[0].closed
    assert kinesis.positions[1] == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "1"}
    kinesis.streams[1].push(event([2], continuation=2))
    assert sequence_numbers(await finish(pending, clock)) == ["2"]


async def test_a_connection_lost_while_the_caller_was_busy_is_resumed_quietly() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([1], continuation=1))
    await finish(pending, clock)
    await clock.advance(40.0)  # busy, but less than renew_after
    kinesis.streams[0].push(ConnectionResetError("peer gone"))
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 2)
    kinesis.streams[1].push(event([2], continuation=2))
    assert sequence_numbers(await finish(pending, clock)) == ["2"]
    assert kinesis.positions[1]["SequenceNumber"] == "1"


async def test_a_stream_ended_by_the_service_is_followed_by_a_new_subscription() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([1], continuation=1), END)
    await finish(pending, clock)
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 2)
    kinesis.streams[1].push(event([2, 3], continuation=3))
    assert sequence_numbers(await finish(pending, clock)) == ["2", "3"]
    assert fetcher.renewals == 0
    assert fetcher.subscriptions == 2


# --- failures --------------------------------------------------------------------------------


async def test_resource_in_use_is_retried_after_a_pause() -> None:
    fetcher, kinesis, clock = make()
    kinesis.subscribe_errors = [aws_error("ResourceInUseException")]
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    assert len(kinesis.subscribe_calls) == 2
    # ... and the same answer sent as the stream's first message (kinesis-local's way).
    kinesis.streams[0].push(aws_error("ResourceInUseException", in_stream=True))
    await wait_for_subscription(kinesis, clock, 2)
    assert kinesis.streams[0].closed
    kinesis.streams[1].push(event([1], continuation=1))
    assert sequence_numbers(await finish(pending, clock)) == ["1"]
    # Paced: never two subscription calls within a second.
    assert len(kinesis.subscribe_calls) == 3


async def test_resource_in_use_is_waited_out_however_long_it_lasts() -> None:
    fetcher, kinesis, clock = make()
    kinesis.subscribe_errors = [aws_error("ResourceInUseException")] * 40
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([1], continuation=1))
    assert sequence_numbers(await finish(pending, clock)) == ["1"]
    assert len(kinesis.subscribe_calls) == 41


async def test_access_denied_is_retried_for_denied_for_seconds() -> None:
    fetcher, kinesis, clock = make(replace(QUICK, denied_for=20.0))
    kinesis.subscribe_errors = [aws_error("AccessDeniedException")] * 1_000
    with pytest.raises(AccessDeniedError):
        await finish(anext(fetcher), clock)
    assert 20.0 <= clock.monotonic() <= 25.0
    assert len(kinesis.subscribe_calls) > 5


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("ResourceNotFoundException", ResourceNotFoundError),
        ("AccessDeniedException", AccessDeniedError),
    ],
)
@pytest.mark.parametrize("in_stream", [False, True])
async def test_non_retryable_errors_are_raised_at_once(
    code: str, error: type[Exception], in_stream: bool
) -> None:
    fetcher, kinesis, clock = make()
    if in_stream:
        pending = asyncio.ensure_future(anext(fetcher))
        await wait_for_subscription(kinesis, clock, 1)
        kinesis.streams[0].push(aws_error(code, in_stream=True))
    else:
        kinesis.subscribe_errors = [aws_error(code)]
        pending = asyncio.ensure_future(anext(fetcher))
    await settle()
    assert pending.done()
    with pytest.raises(error) as caught:
        pending.result()
    assert caught.value.shard_id == SHARD  # type: ignore[attr-defined]
    assert caught.value.stream == "orders"  # type: ignore[attr-defined]
    assert len(kinesis.subscribe_calls) == 1
    assert all(stream.closed for stream in kinesis.streams)


async def test_silence_means_a_dead_connection_and_a_new_subscription_each_time() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    await clock.advance(10.0)  # event_timeout without a heartbeat
    await wait_for_subscription(kinesis, clock, 2)
    assert kinesis.streams[0].closed
    kinesis.streams[1].push(event([1], continuation=1))
    assert sequence_numbers(await finish(pending, clock)) == ["1"]
    # A server that never says anything: subscribed again and again, never given up.
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 6)  # more than any fixed retry count allowed
    assert not pending.done()
    assert all(stream.closed for stream in kinesis.streams[:-1])
    kinesis.streams[-1].push(event([2], continuation=2))
    assert sequence_numbers(await finish(pending, clock)) == ["2"]


async def test_streams_that_end_without_events_are_retried_after_growing_pauses() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    for count in range(1, 11):
        await wait_for_subscription(kinesis, clock, count)
        kinesis.streams[-1].push(END)
    started = clock.monotonic()
    await wait_for_subscription(kinesis, clock, 11)
    kinesis.streams[-1].push(event([1], continuation=1))
    assert sequence_numbers(await finish(pending, clock)) == ["1"]
    assert clock.monotonic() > started  # backed off, not a hot loop


async def test_cancelling_a_read_drops_the_subscription_and_keeps_the_position() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([1], continuation=1))
    await finish(pending, clock)
    pending = asyncio.ensure_future(anext(fetcher))
    await settle()
    pending.cancel()
    await settle()
    assert kinesis.streams[0].closed
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 2)
    assert kinesis.positions[1]["SequenceNumber"] == "1"
    kinesis.streams[1].push(event([2], continuation=2))
    assert sequence_numbers(await finish(pending, clock)) == ["2"]


async def test_aclose_releases_the_connection_and_stops_iteration() -> None:
    fetcher, kinesis, clock = make()
    async with fetcher:
        pending = asyncio.ensure_future(anext(fetcher))
        await wait_for_subscription(kinesis, clock, 1)
        kinesis.streams[0].push(event([1], continuation=1))
        await finish(pending, clock)
    assert kinesis.streams[0].closed
    assert await anext(fetcher, None) is None
    assert not fetcher.ended
    assert fetcher.resume_position == StartPosition.after_sequence_number("1")


async def test_other_event_types_are_skipped() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push({"SomethingNew": {}}, event([3], continuation=3))
    assert sequence_numbers(await finish(pending, clock)) == ["3"]


# --- shard end -------------------------------------------------------------------------------


async def test_an_event_without_continuation_ends_the_shard_with_its_children() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(
        event([8], continuation=8),
        event([9], continuation=None, children=["shardId-000000000001", "shardId-000000000002"]),
    )
    await finish(pending, clock)
    last = await finish(anext(fetcher), clock)
    assert last.shard_ended
    assert last.caught_up
    assert sequence_numbers(last) == ["9"]
    assert [c.shard_id for c in last.child_shards] == [
        "shardId-000000000001",
        "shardId-000000000002",
    ]
    assert last.child_shards[0].parent_shard_ids == (SHARD,)
    assert fetcher.ended
    assert fetcher.last_sequence_number == "9"
    assert kinesis.streams[0].closed
    assert await anext(fetcher, None) is None
    assert len(kinesis.subscribe_calls) == 1


async def test_the_closed_shard_check_ends_a_shard_the_stream_never_ends() -> None:
    settings = FanOut(renew_after=60.0, event_timeout=10.0, read_timeout=20.0)
    fetcher, kinesis, clock = make(settings, closed_shard_check=3.0)
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event([4], continuation=4), event(continuation=4))
    await finish(pending, clock)
    # Open shard: GetRecords has a next iterator; the empty event is handed out as is.
    assert not (await finish(anext(fetcher), clock)).shard_ended
    assert kinesis.iterator_calls[-1]["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER"
    assert kinesis.iterator_calls[-1]["StartingSequenceNumber"] == "4"
    assert kinesis.iterator_calls[-1]["StreamName"] == "orders"
    kinesis.get_records_answer = {
        "Records": [],
        "ChildShards": [{"ShardId": "shardId-000000000003", "ParentShards": [SHARD]}],
    }
    kinesis.streams[0].push(event(continuation=4))
    assert not (await finish(anext(fetcher), clock)).shard_ended  # checked < 3 s ago
    assert len(kinesis.iterator_calls) == 1
    await clock.advance(3.0)
    kinesis.streams[0].push(event(continuation=4))
    last = await finish(anext(fetcher), clock)
    assert last.shard_ended
    assert fetcher.ended
    assert [c.shard_id for c in last.child_shards] == ["shardId-000000000003"]
    assert kinesis.streams[0].closed


async def test_without_the_check_no_get_records_call_is_made() -> None:
    fetcher, kinesis, clock = make()
    pending = asyncio.ensure_future(anext(fetcher))
    await wait_for_subscription(kinesis, clock, 1)
    kinesis.streams[0].push(event(continuation=4))
    assert (await finish(pending, clock)).caught_up
    assert kinesis.iterator_calls == []


# --- settings --------------------------------------------------------------------------------


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="renew_after"):
        FanOut(renew_after=300.0)
    with pytest.raises(ValueError, match="event_timeout"):
        FanOut(event_timeout=5.0)
    with pytest.raises(ValueError, match="read_timeout"):
        FanOut(read_timeout=2.0)
    with pytest.raises(ValueError, match="closed_shard_check"):
        make(closed_shard_check=0.0)
    with pytest.raises(ValueError, match="consumer_name"):
        FanOut(consumer_name="")
    assert FanOut().renew_after == 270.0
