"""The polling fetcher's timing and recovery, against a tiny in-memory shard and a stepping clock."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from shardflow.backoff import Backoff
from shardflow.errors import (
    AccessDeniedError,
    ResourceNotFoundError,
)
from shardflow.fetch import FetchedBatch, Polling, PollingFetcher
from shardflow.positions import StartPosition
from support.clocks import SteppingClock

ARRIVAL = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def aws_error(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} happened"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "GetRecords",
    )


class FakeShard:
    """Just enough of a Kinesis client for one shard: iterators are positions in a list."""

    def __init__(
        self,
        clock: SteppingClock,
        records: int = 0,
        *,
        closed: bool = False,
        lag_reported: bool = True,
        call_duration: float = 0.0,
    ) -> None:
        self.clock = clock
        self.call_duration = call_duration  # how long each GetRecords call takes
        self.data = [f"payload-{i + 1}".encode() for i in range(records)]
        self.closed = closed
        self.lag_reported = lag_reported  # kinesalite always says 0
        self.faults: list[Exception] = []  # raised by the next GetRecords calls, in order
        self.iterator_requests: list[dict[str, Any]] = []
        self.call_times: list[float] = []

    async def get_shard_iterator(self, **params: Any) -> dict[str, Any]:
        self.iterator_requests.append(params)
        kind = params["ShardIteratorType"]
        if kind in ("TRIM_HORIZON", "AT_TIMESTAMP"):
            position = 0
        elif kind == "LATEST":
            position = len(self.data)
        elif kind == "AT_SEQUENCE_NUMBER":
            position = int(params["StartingSequenceNumber"]) - 1
        else:
            position = int(params["StartingSequenceNumber"])
        return {"ShardIterator": f"iterator-{position}"}

    async def get_records(
        self, *, ShardIterator: str, Limit: int, StreamARN: str | None = None
    ) -> dict[str, Any]:
        # A stream given by ARN is named by it in GetRecords too (another account's stream).
        assert StreamARN is None or StreamARN.startswith("arn:aws:kinesis:")
        self.call_times.append(self.clock.now)
        self.clock.now += self.call_duration
        if self.faults:
            raise self.faults.pop(0)
        position = int(ShardIterator.rsplit("-", 1)[1])
        chunk = self.data[position : position + Limit]
        after = position + len(chunk)
        remaining = len(self.data) - after
        response: dict[str, Any] = {
            "Records": [
                {
                    "Data": data,
                    "PartitionKey": f"key-{position + i + 1}",
                    "SequenceNumber": str(position + i + 1),
                    "ApproximateArrivalTimestamp": ARRIVAL,
                }
                for i, data in enumerate(chunk)
            ],
            "MillisBehindLatest": 250 * remaining if self.lag_reported else 0,
        }
        if self.closed and remaining == 0:
            response["ChildShards"] = [
                {
                    "ShardId": "shardId-000000000001",
                    "ParentShards": ["shardId-000000000000"],
                    "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "99"},
                }
            ]
        else:
            response["NextShardIterator"] = f"iterator-{after}"
        return response


def fetcher_for(
    shard: FakeShard,
    *,
    start: StartPosition | None = None,
    seed: int = 7,
    **settings: Any,
) -> PollingFetcher:
    return PollingFetcher(
        shard,
        "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
        "shardId-000000000000",
        start,
        Polling(**settings),
        clock=shard.clock,
        rng=random.Random(seed),
    )


def sequence_numbers(batches: list[FetchedBatch]) -> list[int]:
    return [int(r.sequence_number) for b in batches for r in b.records]


def most_calls_in_any_second(times: list[float]) -> int:
    return max(sum(1 for t in times if s <= t < s + 1.0) for s in times)


# --- polling pace ----------------------------------------------------------------------------


async def test_polls_again_at_once_while_behind_then_waits_the_idle_interval() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=25)
    fetcher = fetcher_for(shard, max_records=10, idle_time=1.0)
    batches = [await anext(fetcher) for _ in range(5)]

    assert sequence_numbers(batches) == list(range(1, 26))
    assert [len(b.records) for b in batches] == [10, 10, 5, 0, 0]
    t0 = shard.call_times[0]
    # Two batches left lag behind them: the next calls follow at once. The third caught up.
    assert shard.call_times == [t0, t0, t0, t0 + 1.0, t0 + 2.0]


async def test_a_full_batch_means_behind_even_when_lag_is_reported_as_zero() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=20, lag_reported=False)
    fetcher = fetcher_for(shard, max_records=10, idle_time=3.0)
    batches = [await anext(fetcher) for _ in range(4)]

    assert sequence_numbers(batches) == list(range(1, 21))
    t0 = shard.call_times[0]
    assert shard.call_times == [t0, t0, t0, t0 + 3.0]
    assert batches[2].caught_up
    assert not batches[1].caught_up


@pytest.mark.parametrize("idle_time", [0.2, 1.0, 2.5, 7.0])
async def test_idle_interval_is_the_exact_time_between_calls_of_a_caught_up_shard(
    idle_time: float,
) -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, call_duration=0.05)
    fetcher = fetcher_for(shard, idle_time=idle_time)
    for _ in range(6):
        batch = await anext(fetcher)
        assert batch.caught_up
        clock.now += 0.01  # the caller's own work between pulls is part of the interval
    gaps = [b - a for a, b in zip(shard.call_times, shard.call_times[1:], strict=False)]
    assert gaps == [pytest.approx(idle_time)] * 5


async def test_an_empty_shard_backs_off_to_max_idle_time_and_records_reset_it() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=1)
    fetcher = fetcher_for(shard, idle_time=1.0, max_idle_time=6.0)
    assert sequence_numbers([await anext(fetcher)]) == [1]
    for _ in range(6):
        assert not (await anext(fetcher)).records
    gaps = [b - a for a, b in zip(shard.call_times, shard.call_times[1:], strict=False)]
    # After records: idle_time; then doubling after each empty answer, capped.
    assert gaps == [pytest.approx(g) for g in (1.0, 1.0, 2.0, 4.0, 6.0, 6.0)]
    shard.data.append(b"late")
    assert sequence_numbers([await anext(fetcher)]) == [2]
    assert shard.call_times[-1] - shard.call_times[-2] == pytest.approx(6.0), "within the cap"
    await anext(fetcher)
    assert shard.call_times[-1] - shard.call_times[-2] == pytest.approx(1.0), "reset by records"


def test_max_idle_time_below_idle_time_is_refused() -> None:
    with pytest.raises(ValueError, match="max_idle_time"):
        Polling(idle_time=2.0, max_idle_time=1.0)


async def test_a_slow_caller_pays_no_extra_idle_wait() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock)
    fetcher = fetcher_for(shard, idle_time=1.0)
    await anext(fetcher)
    clock.now += 4.0  # the caller took longer than the idle interval
    await anext(fetcher)
    assert clock.slept == []
    assert shard.call_times[1] - shard.call_times[0] == pytest.approx(4.0)


async def test_new_records_are_seen_at_the_next_idle_poll() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=2)
    fetcher = fetcher_for(shard, idle_time=1.0)
    assert sequence_numbers([await anext(fetcher)]) == [1, 2]
    shard.data.append(b"late")
    assert sequence_numbers([await anext(fetcher)]) == [3]


async def test_a_shard_far_behind_is_read_at_no_more_than_five_calls_per_second() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=60)
    fetcher = fetcher_for(shard, max_records=1, idle_time=0.0)
    batches = [await anext(fetcher) for _ in range(60)]
    assert sequence_numbers(batches) == list(range(1, 61))
    assert most_calls_in_any_second(shard.call_times) == 5
    # ... and no slower than that: 60 calls take 11 full seconds after the first.
    assert shard.call_times[-1] - shard.call_times[0] == pytest.approx(11.0)


async def test_a_lower_call_limit_is_honoured() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=10)
    fetcher = fetcher_for(shard, max_records=1, idle_time=0.0, max_calls_per_second=2)
    for _ in range(10):
        await anext(fetcher)
    assert most_calls_in_any_second(shard.call_times) == 2


async def test_nothing_is_read_ahead_of_the_caller() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=50)
    fetcher = fetcher_for(shard, max_records=5)
    await anext(fetcher)
    assert len(shard.call_times) == 1
    assert fetcher.get_records_calls == 1


# --- failures --------------------------------------------------------------------------------


async def test_throttling_is_retried_after_full_jitter_waits() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=3)
    shard.faults = [aws_error("ProvisionedThroughputExceededException")] * 4
    backoff = Backoff(base=0.5, cap=10.0, max_attempts=6)
    fetcher = fetcher_for(shard, throttle_backoff=backoff, seed=11)

    batch = await anext(fetcher)

    assert sequence_numbers([batch]) == [1, 2, 3]
    same_draws = random.Random(11)
    assert clock.slept == [backoff.delay(n, same_draws) for n in range(4)]
    for n, pause in enumerate(clock.slept):
        assert 0.0 <= pause <= 0.5 * 2**n
    assert len(set(clock.slept)) == 4  # jittered, not a fixed ladder


@pytest.mark.parametrize(
    ("code", "status", "cap"),
    [("ProvisionedThroughputExceededException", 400, 4.0), ("InternalFailure", 500, 2.0)],
)
async def test_failures_that_may_pass_are_retried_without_end_at_capped_delays(
    code: str, status: int, cap: float
) -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=3)
    shard.faults = [aws_error(code, status)] * 500  # ~15 minutes of brownout at the cap
    fetcher = fetcher_for(
        shard,
        throttle_backoff=Backoff(base=0.5, cap=4.0, max_attempts=3),
        error_backoff=Backoff(base=0.1, cap=2.0, max_attempts=3),
    )

    assert sequence_numbers([await anext(fetcher)]) == [1, 2, 3]
    assert len(shard.call_times) == 501
    assert max(clock.slept) <= cap
    assert sum(clock.slept) > 100 * cap  # it really waited, near the cap, all along


async def test_transient_failures_are_retried_with_the_error_backoff() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=2)
    shard.faults = [aws_error("InternalFailure", 500), aws_error("ServiceUnavailable", 503)]
    fetcher = fetcher_for(shard, error_backoff=Backoff(base=0.1, cap=1.0, max_attempts=5))

    assert sequence_numbers([await anext(fetcher)]) == [1, 2]
    assert len(clock.slept) == 2
    assert 0.0 <= clock.slept[0] <= 0.1
    assert 0.0 <= clock.slept[1] <= 0.2


async def test_success_resets_the_count_of_consecutive_failures() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=4)
    fetcher = fetcher_for(shard, max_records=1, throttle_backoff=Backoff(max_attempts=3))
    for _ in range(4):
        shard.faults = [aws_error("ThrottlingException")] * 2  # just under the limit each time
        await anext(fetcher)
    assert fetcher.last_sequence_number == "4"


async def test_a_missing_stream_is_raised_at_once() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=2)
    shard.faults = [aws_error("ResourceNotFoundException")]
    fetcher = fetcher_for(shard)
    with pytest.raises(ResourceNotFoundError):
        await anext(fetcher)
    assert len(shard.call_times) == 1
    assert clock.slept == []


@pytest.mark.parametrize("code", ["AccessDeniedException", "ExpiredTokenException"])
async def test_access_denied_is_retried_for_denied_for_seconds_then_raised(code: str) -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=2)
    shard.faults = [aws_error(code)] * 1_000
    fetcher = fetcher_for(shard, denied_for=30.0, error_backoff=Backoff(base=0.1, cap=2.0))
    with pytest.raises(AccessDeniedError):
        await anext(fetcher)
    assert 30.0 <= sum(clock.slept) <= 32.0
    assert len(shard.call_times) > 10


async def test_credentials_refreshed_within_denied_for_go_on_reading() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=2)
    shard.faults = [aws_error("ExpiredTokenException")] * 5
    fetcher = fetcher_for(shard, denied_for=60.0)
    assert sequence_numbers([await anext(fetcher)]) == [1, 2]


async def test_an_expired_iterator_is_renewed_after_the_last_delivered_record() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=8)
    fetcher = fetcher_for(shard, max_records=3)
    first = await anext(fetcher)
    shard.faults = [aws_error("ExpiredIteratorException")]
    rest = [await anext(fetcher) for _ in range(2)]

    assert sequence_numbers([first, *rest]) == list(range(1, 9))  # nothing lost or repeated
    assert shard.iterator_requests[-1]["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER"
    assert shard.iterator_requests[-1]["StartingSequenceNumber"] == "3"
    assert shard.iterator_requests[-1]["StreamARN"].endswith("stream/orders")


async def test_an_iterator_expired_before_any_delivery_restarts_at_the_start_position() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=5)
    shard.faults = [aws_error("ExpiredIteratorException")]
    fetcher = fetcher_for(shard, start=StartPosition.at_sequence_number("2"))

    assert sequence_numbers([await anext(fetcher)]) == [2, 3, 4, 5]
    assert [r["ShardIteratorType"] for r in shard.iterator_requests] == ["AT_SEQUENCE_NUMBER"] * 2
    assert {r["StartingSequenceNumber"] for r in shard.iterator_requests} == {"2"}


async def test_an_iterator_that_keeps_expiring_is_renewed_after_pauses() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=5)
    shard.faults = [aws_error("ExpiredIteratorException")] * 10
    fetcher = fetcher_for(shard, max_iterator_renewals=2)
    assert sequence_numbers([await anext(fetcher)]) == [1, 2, 3, 4, 5]
    assert len(shard.iterator_requests) == 11
    assert len(clock.slept) >= 8  # the first two renewals at once, the others after a pause


async def test_get_shard_iterator_failures_are_retried_too() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=2)
    failures = [aws_error("InternalFailure", 500)] * 50
    original = shard.get_shard_iterator

    async def flaky(**params: Any) -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return await original(**params)

    shard.get_shard_iterator = flaky  # type: ignore[method-assign]
    fetcher = fetcher_for(shard)
    assert sequence_numbers([await anext(fetcher)]) == [1, 2]
    assert len(clock.slept) == 50


# --- shard end and records -------------------------------------------------------------------


async def test_shard_end_yields_a_last_batch_with_children_then_stops() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=7, closed=True)
    fetcher = fetcher_for(shard, max_records=3)
    batches = [batch async for batch in fetcher]

    assert sequence_numbers(batches) == list(range(1, 8))
    assert [b.shard_ended for b in batches] == [False, False, True]
    last = batches[-1]
    assert not last.has_next_iterator
    assert last.caught_up
    assert [c.shard_id for c in last.child_shards] == ["shardId-000000000001"]
    assert last.child_shards[0].parent_shard_ids == ("shardId-000000000000",)
    assert last.child_shards[0].hash_range is not None
    assert last.child_shards[0].hash_range.end == 99
    calls = len(shard.call_times)
    with pytest.raises(StopAsyncIteration):
        await anext(fetcher)
    assert len(shard.call_times) == calls
    assert fetcher.ended


async def test_records_carry_their_shard_stream_and_arrival() -> None:
    clock = SteppingClock()
    shard = FakeShard(clock, records=1)
    batch = await anext(fetcher_for(shard))
    record = batch.records[0]
    assert record.data == b"payload-1"
    assert record.partition_key == "key-1"
    assert record.sequence_number == "1"
    assert record.shard_id == "shardId-000000000000"
    assert record.stream_name == "orders"
    assert record.approximate_arrival_timestamp == ARRIVAL
    assert not record.aggregated


def test_caught_up_needs_an_empty_batch_without_lag_or_the_shard_end() -> None:
    empty = FetchedBatch("s", [], millis_behind_latest=0)
    assert empty.caught_up
    assert FetchedBatch("s", [], millis_behind_latest=None).caught_up
    assert not FetchedBatch("s", [], millis_behind_latest=1200).caught_up
    assert FetchedBatch("s", [], millis_behind_latest=1200, shard_ended=True).caught_up


@pytest.mark.parametrize(
    "bad",
    [
        {"max_records": 0},
        {"max_records": 10_001},
        {"idle_time": -1.0},
        {"max_calls_per_second": 6},
        {"max_calls_per_second": 0},
        {"max_iterator_renewals": -1},
    ],
)
def test_settings_outside_kinesis_limits_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        Polling(**bad)
