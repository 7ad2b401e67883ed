"""A sliding-window limit on how often a call is made (GetRecords: 5 calls/s per shard)."""

from __future__ import annotations

from collections import deque

from shardflow.clock import SYSTEM_CLOCK, Clock


class CallRateLimiter:
    """Admits at most ``max_calls`` calls in any window of ``period`` seconds.

    A sliding window rather than a token bucket refilled at a steady rate: it never lets a
    burst exceed the service's per-second limit, yet lets a fetcher that was idle make its
    next calls at once.
    """

    def __init__(self, max_calls: int, period: float = 1.0, *, clock: Clock = SYSTEM_CLOCK) -> None:
        if max_calls < 1:
            raise ValueError("max_calls must be at least 1")
        if period <= 0:
            raise ValueError("period must be positive")
        self.max_calls = max_calls
        self.period = period
        self._clock = clock
        self._starts: deque[float] = deque(maxlen=max_calls)

    def delay(self) -> float:
        """Seconds to wait before the next call is allowed (0 if allowed now)."""
        if len(self._starts) < self.max_calls:
            return 0.0
        return max(0.0, self._starts[0] + self.period - self._clock.monotonic())

    async def acquire(self) -> None:
        """Wait until a call is allowed, then count one call as started now."""
        # Bounded: each sleep lasts until the oldest call leaves the window.
        while (wait := self.delay()) > 0:
            await self._clock.sleep(wait)
        self._starts.append(self._clock.monotonic())
