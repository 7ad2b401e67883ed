"""Per-shard pacing: token buckets and AIMD adaption.

The limiter takes the time as an argument, so these tests move time by hand.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import pytest

from shardflow.producer.ratelimit import RateSettings, ShardRateLimiter, TokenBucket

MiB = 1024 * 1024


def test_bucket_starts_full_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=100.0, capacity=50.0, now=0.0)
    assert bucket.refill(0.0) == 50.0
    bucket.take(50)
    assert bucket.refill(0.1) == pytest.approx(10.0)
    assert bucket.refill(10.0) == 50.0  # never above capacity


def test_bucket_debt_is_repaid_before_more_is_allowed() -> None:
    bucket = TokenBucket(rate=10.0, capacity=5.0, now=0.0)
    bucket.take(15)  # a large item sent from a full bucket
    assert bucket.refill(0.0) == -10.0
    assert bucket.seconds_until(1, 0.0) == pytest.approx(1.1)
    # amounts above the capacity only need a full bucket
    assert bucket.seconds_until(100, 0.0) == pytest.approx(1.5)


def test_limiter_allows_a_burst_then_paces_at_the_configured_rate() -> None:
    now = 0.0
    settings = RateSettings(records_per_second=1000, bytes_per_second=MiB, burst_seconds=0.5)
    limiter = ShardRateLimiter(settings, now)
    records, nbytes, full = limiter.allowance(now)
    assert (records, nbytes, full) == (500, MiB / 2, True)

    limiter.consume(500, 1000, now)
    assert limiter.allowance(now)[0] == 0
    assert limiter.seconds_until(100, 100, now) == pytest.approx(0.1)

    sent = [(0.0, 500)]
    for step in range(1, 101):  # ten seconds in 0.1 s steps, sending all that is allowed
        now = step * 0.1
        allowed, _, _ = limiter.allowance(now)
        limiter.consume(allowed, allowed * 10, now)
        sent.append((now, allowed))
    # never more than the rate within one second, and the rate is used in full
    for start, _ in sent:
        assert sum(n for t, n in sent if start <= t < start + 1.0 - 1e-9) <= 1000
    assert sum(n for _, n in sent) == pytest.approx(10 * 1000, abs=600)
    assert sum(n for t, n in sent if t > 2.0) == pytest.approx(8 * 1000, abs=60)


def test_the_one_second_window_stops_a_burst_plus_rate_overshoot() -> None:
    limiter = ShardRateLimiter(RateSettings(records_per_second=100, burst_seconds=0.5), 0.0)
    limiter.consume(50, 50, 0.0)  # the burst
    for step in range(1, 10):  # the rate refills 10 per 0.1 s
        now = step * 0.1
        allowed, _, _ = limiter.allowance(now)
        limiter.consume(allowed, allowed, now)
    # 50 + 9 x 10 = 140 would exceed 100 in the first second: the window held it back
    now = 0.95
    assert limiter.allowance(now)[0] == 0
    assert limiter.seconds_until(10, 10, now) == pytest.approx(0.05)  # when the burst expires
    assert limiter.allowance(1.0)[0] > 0


def test_full_byte_bucket_admits_one_oversized_record() -> None:
    settings = RateSettings(bytes_per_second=1000, burst_seconds=1.0)
    limiter = ShardRateLimiter(settings, 0.0)
    _, nbytes, full = limiter.allowance(0.0)
    assert full
    assert nbytes == 1000
    assert limiter.seconds_until(1, 5000, 0.0) == 0.0  # capped at capacity: the bucket is full
    limiter.consume(1, 5000, 0.0)
    # 4,000 bytes of debt plus 1,000 to refill: five seconds until full again
    assert limiter.seconds_until(1, 5000, 0.0) == pytest.approx(5.0)


def test_throttle_halves_the_rate_and_empties_the_buckets() -> None:
    settings = RateSettings(records_per_second=1000, bytes_per_second=MiB, decrease=0.5)
    limiter = ShardRateLimiter(settings, 0.0)
    assert limiter.on_throttled(sent_at=0.0, now=1.0)
    assert limiter.fraction == 0.5
    assert limiter.records_per_second == 500
    assert limiter.bytes_per_second == MiB / 2
    assert limiter.allowance(1.0)[0] == 0


def test_throttles_of_requests_sent_before_the_decrease_count_once() -> None:
    limiter = ShardRateLimiter(RateSettings(decrease=0.5), 0.0)
    assert limiter.on_throttled(sent_at=0.9, now=1.0)
    # Three more answers to requests that were already in flight: the same event.
    assert not limiter.on_throttled(sent_at=0.95, now=1.01)
    assert not limiter.on_throttled(sent_at=0.99, now=1.02)
    assert limiter.fraction == 0.5
    # A request sent after the decrease that is throttled again lowers it further.
    assert limiter.on_throttled(sent_at=1.5, now=1.6)
    assert limiter.fraction == 0.25


def test_rate_never_drops_below_the_floor() -> None:
    limiter = ShardRateLimiter(RateSettings(decrease=0.5, floor=0.1), 0.0)
    for step in range(20):
        limiter.on_throttled(sent_at=float(step), now=float(step) + 0.5)
    assert limiter.fraction == 0.1
    assert limiter.records_per_second == pytest.approx(100)


def test_successes_recover_the_rate_additively_over_time() -> None:
    settings = RateSettings(records_per_second=1000, decrease=0.5, recovery_per_second=0.2)
    limiter = ShardRateLimiter(settings, 0.0)
    limiter.on_throttled(sent_at=0.0, now=0.0)
    assert limiter.fraction == 0.5
    limiter.on_success(1.0)
    assert limiter.fraction == pytest.approx(0.7)
    limiter.on_success(1.5)
    assert limiter.fraction == pytest.approx(0.8)
    assert limiter.records_per_second == pytest.approx(800)
    limiter.on_success(10.0)
    assert limiter.fraction == 1.0
    assert limiter.records_per_second == 1000


def test_aimd_converges_below_a_hidden_capacity() -> None:
    """Against a shard that throttles above 600 records/s, the pace settles around it."""
    settings = RateSettings(records_per_second=1000, recovery_per_second=0.1, burst_seconds=0.1)
    limiter = ShardRateLimiter(settings, 0.0)
    capacity = 600
    throttles_late = 0
    delivered_late = 0
    for step in range(600):  # 30 s in 50 ms steps
        now = (step + 1) * 0.05
        allowed, _, _ = limiter.allowance(now)
        if not allowed:
            continue
        limiter.consume(allowed, allowed, now)
        if limiter.records_per_second > capacity:
            limiter.on_throttled(sent_at=now, now=now + 0.01)
            throttles_late += step >= 300
        else:
            limiter.on_success(now + 0.01)
            delivered_late += allowed if step >= 300 else 0
    # in the second half the throttles are occasional and most of the capacity is used
    assert throttles_late <= 8
    assert delivered_late / 15 > 0.6 * capacity


@pytest.mark.parametrize(
    "settings",
    [
        {"records_per_second": 0},
        {"bytes_per_second": -1},
        {"decrease": 1.0},
        {"floor": 0.0},
        {"burst_seconds": 0},
    ],
)
def test_invalid_rate_settings_are_rejected(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        RateSettings(**settings)


def shard_with_one_second_window(limit: int) -> Callable[[float, int], bool]:
    """A shard that refuses a write taking more than ``limit`` records into any 1 s window."""
    accepted: deque[tuple[float, int]] = deque()

    def write(now: float, records: int) -> bool:
        while accepted and accepted[0][0] <= now - 1.0:
            accepted.popleft()
        if sum(count for _, count in accepted) + records > limit:
            return False
        accepted.append((now, records))
        return True

    return write


@pytest.mark.parametrize("capacity", [1000, 600], ids=["alone", "sharing-the-shard"])
def test_with_default_settings_throttles_are_rare_and_the_shard_is_well_used(
    capacity: int,
) -> None:
    """A producer with a backlog, one request per 50 ms, for a simulated minute."""
    limiter = ShardRateLimiter(RateSettings(), 0.0)
    write = shard_with_one_second_window(capacity)
    throttles = delivered = 0
    for step in range(1, 1201):
        now = step * 0.05
        allowed, _, _ = limiter.allowance(now)
        if not allowed:
            continue
        limiter.consume(allowed, allowed * 100, now)
        if write(now, allowed):
            delivered += allowed
            limiter.on_success(now + 0.02)
        else:
            throttles += 1
            limiter.on_throttled(sent_at=now, now=now + 0.02)
    assert delivered / 60 > 0.8 * capacity
    # alone: none at all (the producer never exceeds the limit in any second); sharing the
    # shard with writers it does not know of: a throttle every second or two
    assert throttles <= (0 if capacity == 1000 else 45)
