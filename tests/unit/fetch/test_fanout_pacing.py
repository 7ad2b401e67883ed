"""The subscription pacer: a process-wide start rate with a burst, and 1 s per consumer-shard."""

from __future__ import annotations

import asyncio

import pytest

from shardflow.clock import ManualClock
from shardflow.fetch.pacing import SubscriptionPacer, shared_pacer

CONSUMER = "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/c:1"


async def start_times(
    clock: ManualClock, pacer: SubscriptionPacer, keys: list[str], *, horizon: float = 60.0
) -> dict[int, float]:
    """Acquire for every key (in order, all at once); the time each one was let through."""
    started: dict[int, float] = {}

    async def one(index: int, shard_id: str) -> None:
        await pacer.acquire(CONSUMER, shard_id)
        started[index] = clock.monotonic()

    tasks = [asyncio.create_task(one(i, key)) for i, key in enumerate(keys)]
    await asyncio.sleep(0)
    steps = 0
    while not all(t.done() for t in tasks):
        steps += 1
        assert steps * 0.05 <= horizon, "pacer never let every caller through"
        await clock.advance(0.05)
    await asyncio.gather(*tasks)
    return started


async def test_a_burst_starts_at_once_then_the_rest_at_the_steady_rate() -> None:
    clock = ManualClock(start=0.0)
    pacer = SubscriptionPacer(starts_per_second=4, burst=3, clock=clock)
    started = await start_times(clock, pacer, [f"shard-{i}" for i in range(7)])
    times = [started[i] for i in range(7)]
    assert times[:3] == [0.0, 0.0, 0.0]
    assert times[3:] == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=0.051)


async def test_no_window_of_one_second_holds_more_than_rate_plus_burst() -> None:
    clock = ManualClock(start=0.0)
    pacer = SubscriptionPacer(starts_per_second=5, burst=2, clock=clock)
    started = sorted((await start_times(clock, pacer, [f"s{i}" for i in range(20)])).values())
    most = max(sum(1 for t in started if s <= t < s + 1.0) for s in started)
    assert most <= 5 + 2  # at most the burst plus one second's worth at the steady rate


async def test_one_shard_is_subscribed_at_most_once_per_min_interval() -> None:
    clock = ManualClock(start=0.0)
    pacer = SubscriptionPacer(starts_per_second=100, burst=100, min_interval=1.0, clock=clock)
    started = await start_times(clock, pacer, ["shard-a", "shard-a", "shard-b", "shard-a"])
    assert started[2] == 0.0  # another shard does not wait for shard-a
    a_times = sorted(started[i] for i in (0, 1, 3))
    assert a_times == pytest.approx([0.0, 1.0, 2.0], abs=0.051)


async def test_a_shard_subscribed_long_ago_starts_at_once() -> None:
    clock = ManualClock(start=0.0)
    pacer = SubscriptionPacer(clock=clock)
    await pacer.acquire(CONSUMER, "shard-a")
    await clock.advance(5.0)
    assert pacer.delay(CONSUMER, "shard-a") == 0.0
    started = await start_times(clock, pacer, ["shard-a"])
    assert started[0] == 5.0


async def test_delay_reports_the_wait_without_reserving() -> None:
    clock = ManualClock(start=0.0)
    pacer = SubscriptionPacer(clock=clock, min_interval=2.0)
    await pacer.acquire(CONSUMER, "shard-a")
    assert pacer.delay(CONSUMER, "shard-a") == pytest.approx(2.0)
    assert pacer.delay(CONSUMER, "shard-a") == pytest.approx(2.0)
    assert pacer.delay(CONSUMER, "shard-b") == 0.0
    # Different consumers of one shard are separate subscriptions.
    assert pacer.delay(CONSUMER + "x", "shard-a") == 0.0


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="min_interval"):
        SubscriptionPacer(min_interval=0.5)
    with pytest.raises(ValueError, match="starts_per_second"):
        SubscriptionPacer(starts_per_second=0)
    with pytest.raises(ValueError, match="burst"):
        SubscriptionPacer(burst=0)


def test_the_shared_pacer_is_one_instance() -> None:
    assert shared_pacer() is shared_pacer()
