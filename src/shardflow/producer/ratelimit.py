"""Per-shard pacing: token buckets and a one-second window for records and bytes, whose rate
adapts to throttling (AIMD).

Time is passed in explicitly (``now``, seconds on any monotonic clock), so tests drive it by
hand and the producer uses its event loop's clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

# Kinesis' write limits per shard.
SHARD_RECORDS_PER_SECOND: Final = 1000
SHARD_BYTES_PER_SECOND: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RateSettings:
    """Per-shard pacing: records/s and bytes/s, adapting to throttling.

    On a ProvisionedThroughputExceeded for a shard its rate is multiplied by ``decrease``
    (not below ``floor`` of the maximum); while that shard's writes succeed it climbs back by
    ``recovery_per_second`` of the maximum each second (AIMD, as TCP does for congestion).
    ``burst_seconds`` of the current rate may be sent at once after an idle spell; within
    any one second no more than the current rate is sent.
    """

    records_per_second: float = SHARD_RECORDS_PER_SECOND
    bytes_per_second: float = SHARD_BYTES_PER_SECOND
    burst_seconds: float = 0.25
    decrease: float = 0.7
    recovery_per_second: float = 0.1
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


class SecondWindow:
    """What was sent in the last second, as Kinesis counts a shard's writes.

    A token bucket alone lets a burst and the steady rate add up to more than the limit
    within one second; the producer checks both.
    """

    __slots__ = ("nbytes", "records", "sent")

    def __init__(self) -> None:
        self.sent: deque[tuple[float, int, int]] = deque()
        self.records = 0
        self.nbytes = 0

    def prune(self, now: float) -> None:
        sent = self.sent
        horizon = now - 1.0
        while sent and sent[0][0] <= horizon:
            _, records, nbytes = sent.popleft()
            self.records -= records
            self.nbytes -= nbytes

    def add(self, now: float, records: int, nbytes: int) -> None:
        self.sent.append((now, records, nbytes))
        self.records += records
        self.nbytes += nbytes

    def seconds_until_room(
        self, records: float, nbytes: float, max_records: float, max_bytes: float, now: float
    ) -> float:
        """Time until ``records`` and ``nbytes`` more fit under the per-second maxima."""
        self.prune(now)
        excess_records = self.records + records - max_records
        excess_bytes = self.nbytes + nbytes - max_bytes
        if excess_records <= 0 and excess_bytes <= 0:
            return 0.0
        for sent_at, sent_records, sent_bytes in self.sent:
            excess_records -= sent_records
            excess_bytes -= sent_bytes
            if excess_records <= 0 and excess_bytes <= 0:
                return sent_at + 1.0 - now
        return 1.0  # not reached: everything in the window expires within a second


class ShardRateLimiter:
    """The write budget of one shard: records/s and bytes/s, lowered on throttling.

    Two token buckets pace the writes (bursts of at most ``burst_seconds`` of the rate) and
    a one-second window keeps what is sent in any second under the rate, as Kinesis counts.
    ``fraction`` is the share of the configured maximum currently allowed. A throttle
    multiplies it by ``settings.decrease`` (once per burst of throttles: throttles of requests
    sent before the last decrease are the same event) and empties the buckets; successes raise
    it by ``settings.recovery_per_second`` per second elapsed, up to 1.
    """

    __slots__ = (
        "_bytes",
        "_last_decrease",
        "_last_increase",
        "_records",
        "_window",
        "fraction",
        "settings",
    )

    def __init__(self, settings: RateSettings, now: float) -> None:
        self.settings = settings
        self.fraction = 1.0
        self._records = TokenBucket(*self._rate_and_capacity(settings.records_per_second, 1), now)
        self._bytes = TokenBucket(*self._rate_and_capacity(settings.bytes_per_second, 1), now)
        self._window = SecondWindow()
        self._last_decrease = float("-inf")
        self._last_increase = now

    @property
    def records_per_second(self) -> float:
        return self._records.rate

    @property
    def bytes_per_second(self) -> float:
        return self._bytes.rate

    def allowance(self, now: float) -> tuple[int, float, bool]:
        """Records and bytes that may be sent now, and whether the byte budget is untouched.

        An untouched budget (full bucket, nothing sent in the last second) admits one record
        even if it is larger than the budget.
        """
        window = self._window
        window.prune(now)
        records = min(self._records.refill(now), self._records_cap() - window.records)
        nbytes = self._bytes.refill(now)
        full = nbytes >= self._bytes.capacity and window.nbytes == 0
        nbytes = min(nbytes, self._bytes_cap() - window.nbytes)
        return (int(records) if records >= 1 else 0), nbytes, full

    def consume(self, records: int, nbytes: int, now: float) -> None:
        """Charge a request's records and bytes (after :meth:`allowance` at the same time)."""
        self._records.take(records)
        self._bytes.take(nbytes)
        self._window.add(now, records, nbytes)

    def seconds_until(self, records: int, nbytes: int, now: float) -> float:
        """Time until ``records`` records of ``nbytes`` bytes in all may be sent.

        Each amount is capped at what the budget can ever hold: an untouched budget admits
        anything.
        """
        records_cap, bytes_cap = self._records_cap(), self._bytes_cap()
        return max(
            self._records.seconds_until(records, now),
            self._bytes.seconds_until(nbytes, now),
            self._window.seconds_until_room(
                min(records, records_cap), min(nbytes, bytes_cap), records_cap, bytes_cap, now
            ),
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

    def _records_cap(self) -> float:
        return max(self._records.rate, 1.0)  # per second; at least one record

    def _bytes_cap(self) -> float:
        return max(self._bytes.rate, 1.0)

    def _rate_and_capacity(self, maximum: float, fraction: float) -> tuple[float, float]:
        rate = maximum * fraction
        # Never below one record: a bucket that can never hold a whole record would stall.
        return rate, max(rate * self.settings.burst_seconds, 1.0)
