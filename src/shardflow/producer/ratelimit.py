"""Per-shard pacing: token buckets for records and bytes whose rate adapts to throttling (AIMD).

Time is passed in explicitly (``now``, seconds on any monotonic clock), so tests drive it by
hand and the producer uses its event loop's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# Kinesis' write limits per shard.
SHARD_RECORDS_PER_SECOND: Final = 1000
SHARD_BYTES_PER_SECOND: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RateSettings:
    """Per-shard pacing: two token buckets (records, bytes) whose rate adapts to throttling.

    On a ProvisionedThroughputExceeded for a shard its rate is multiplied by ``decrease``
    (not below ``floor`` of the maximum); while that shard's writes succeed it climbs back by
    ``recovery_per_second`` of the maximum each second (AIMD, as TCP does for congestion).
    ``burst_seconds`` of the current rate may be sent at once after an idle spell.
    """

    records_per_second: float = SHARD_RECORDS_PER_SECOND
    bytes_per_second: float = SHARD_BYTES_PER_SECOND
    burst_seconds: float = 0.5
    decrease: float = 0.5
    recovery_per_second: float = 0.2
    floor: float = 0.05

    def __post_init__(self) -> None:
        _positive("records_per_second", self.records_per_second)
        _positive("bytes_per_second", self.bytes_per_second)
        _positive("burst_seconds", self.burst_seconds)
        _positive("recovery_per_second", self.recovery_per_second)
        if not 0 < self.decrease < 1:
            raise ValueError(f"decrease must be between 0 and 1, got {self.decrease}")
        if not 0 < self.floor <= 1:
            raise ValueError(f"floor must be in (0, 1], got {self.floor}")


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity`` saved up; the balance may go negative.

    A negative balance is debt: a record larger than what is saved up may be sent when the
    bucket is full, and the bucket then refills through the debt before anything else goes.
    """

    __slots__ = ("capacity", "rate", "tokens", "updated")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.updated = now

    def refill(self, now: float) -> float:
        """Bring the balance up to ``now``; returns it."""
        elapsed = now - self.updated
        if elapsed > 0:
            self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
            self.updated = now
        return self.tokens

    def take(self, amount: float) -> None:
        self.tokens -= amount

    def seconds_until(self, amount: float, now: float) -> float:
        """Time until ``amount`` may be taken (capped at the capacity: a full bucket admits all)."""
        missing = min(amount, self.capacity) - self.refill(now)
        return missing / self.rate if missing > 0 else 0.0

    def set_rate(self, rate: float, capacity: float, now: float) -> None:
        self.refill(now)
        self.rate = rate
        self.capacity = capacity
        self.tokens = min(self.tokens, capacity)


class ShardRateLimiter:
    """The write budget of one shard: records/s and bytes/s, lowered on throttling.

    ``fraction`` is the share of the configured maximum currently allowed. A throttle
    multiplies it by ``settings.decrease`` (once per burst of throttles: throttles of requests
    sent before the last decrease are the same event) and empties the buckets; successes raise
    it by ``settings.recovery_per_second`` per second elapsed, up to 1.
    """

    __slots__ = ("_bytes", "_last_decrease", "_last_increase", "_records", "fraction", "settings")

    def __init__(self, settings: RateSettings, now: float) -> None:
        self.settings = settings
        self.fraction = 1.0
        self._records = TokenBucket(*self._rate_and_capacity(settings.records_per_second, 1), now)
        self._bytes = TokenBucket(*self._rate_and_capacity(settings.bytes_per_second, 1), now)
        self._last_decrease = float("-inf")
        self._last_increase = now

    @property
    def records_per_second(self) -> float:
        return self._records.rate

    @property
    def bytes_per_second(self) -> float:
        return self._bytes.rate

    def allowance(self, now: float) -> tuple[int, float, bool]:
        """Records and bytes that may be sent now, and whether the byte bucket is full.

        A full byte bucket admits one record even if it is larger than the bucket.
        """
        records = self._records.refill(now)
        nbytes = self._bytes.refill(now)
        return (int(records) if records >= 1 else 0), nbytes, nbytes >= self._bytes.capacity

    def consume(self, records: int, nbytes: int) -> None:
        """Charge a request's records and bytes (call after :meth:`allowance` at the same time)."""
        self._records.take(records)
        self._bytes.take(nbytes)

    def seconds_until(self, records: int, nbytes: int, now: float) -> float:
        """Time until ``records`` records of ``nbytes`` bytes in all may be sent.

        Each amount is capped at its bucket's capacity: a full bucket admits anything.
        """
        return max(
            self._records.seconds_until(records, now), self._bytes.seconds_until(nbytes, now)
        )

    def on_throttled(self, sent_at: float, now: float) -> bool:
        """Lower the rate after a throttle of a request sent at ``sent_at``; True if lowered."""
        self._records.tokens = min(self._records.refill(now), 0.0)
        self._bytes.tokens = min(self._bytes.refill(now), 0.0)
        if sent_at < self._last_decrease:
            return False  # already answered this throttling event
        self.fraction = max(self.settings.floor, self.fraction * self.settings.decrease)
        self._last_decrease = now
        self._last_increase = now
        self._apply(now)
        return True

    def on_success(self, now: float) -> None:
        """Let the rate climb back after a successful write."""
        elapsed = now - self._last_increase
        self._last_increase = now
        if self.fraction >= 1.0 or elapsed <= 0:
            return
        self.fraction = min(1.0, self.fraction + self.settings.recovery_per_second * elapsed)
        self._apply(now)

    def _apply(self, now: float) -> None:
        s = self.settings
        self._records.set_rate(*self._rate_and_capacity(s.records_per_second, self.fraction), now)
        self._bytes.set_rate(*self._rate_and_capacity(s.bytes_per_second, self.fraction), now)

    def _rate_and_capacity(self, maximum: float, fraction: float) -> tuple[float, float]:
        rate = maximum * fraction
        # Never below one record: a bucket that can never hold a whole record would stall.
        return rate, max(rate * self.settings.burst_seconds, 1.0)
