from __future__ import annotations

import pytest

from shardflow.fetch.limiter import CallRateLimiter
from support.clocks import SteppingClock


def most_calls_in_any_window(starts: list[float], window: float) -> int:
    return max(sum(1 for t in starts if s <= t < s + window) for s in starts)


async def test_back_to_back_calls_never_exceed_the_limit_in_any_window() -> None:
    clock = SteppingClock(start=100.0)
    limiter = CallRateLimiter(5, clock=clock)
    starts = []
    for _ in range(23):
        await limiter.acquire()
        starts.append(clock.now)
    assert most_calls_in_any_window(starts, 1.0) == 5
    # ... and makes them as fast as the limit allows: 23 calls take 4 full windows.
    assert starts[-1] - starts[0] == pytest.approx(4.0)


async def test_an_idle_limiter_lets_calls_through_at_once() -> None:
    clock = SteppingClock(start=100.0)
    limiter = CallRateLimiter(5, clock=clock)
    for _ in range(5):
        await limiter.acquire()
    clock.now += 3.0
    for _ in range(5):
        await limiter.acquire()
    assert clock.slept == []


async def test_spaced_calls_wait_only_for_the_oldest_to_leave_the_window() -> None:
    clock = SteppingClock(start=100.0)
    limiter = CallRateLimiter(2, period=1.0, clock=clock)
    await limiter.acquire()  # t=100.0
    clock.now += 0.7
    await limiter.acquire()  # t=100.7
    await limiter.acquire()  # must wait until 101.0
    assert clock.slept == [pytest.approx(0.3)]
    assert clock.now == pytest.approx(101.0)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_calls"):
        CallRateLimiter(0)
    with pytest.raises(ValueError, match="period"):
        CallRateLimiter(1, period=0)
