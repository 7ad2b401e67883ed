"""Pacing of SubscribeToShard calls, shared by every fan-out fetcher of a process."""

from __future__ import annotations

import threading

from shardflow.clock import SYSTEM_CLOCK, Clock

SUBSCRIBE_MIN_INTERVAL = 1.0
"""Kinesis allows one SubscribeToShard call per second per consumer and shard."""

# Past this many remembered (consumer, shard) pairs, forget the ones that no longer constrain.
_PRUNE_ABOVE = 1024


class SubscriptionPacer:
    """Spaces out subscription starts: a process-wide rate, and a minimum gap per consumer-shard.

    ``starts_per_second`` and ``burst`` bound how fast a process starts subscriptions overall
    (a token bucket: ``burst`` may start at once, then ``starts_per_second``), so that a worker
    taking many shards at once does not open all their connections in the same instant.
    ``min_interval`` is the least time between two starts for the same consumer and shard (the
    service's limit is one call per second).

    Slots are reserved in call order under a short lock that is never held across a wait, so
    one pacer may serve fetchers on several event loops and threads; time comes from ``clock``.
    """

    def __init__(
        self,
        *,
        starts_per_second: float = 10.0,
        burst: int = 10,
        min_interval: float = SUBSCRIBE_MIN_INTERVAL,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if starts_per_second <= 0:
            raise ValueError("starts_per_second must be positive")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        if min_interval < SUBSCRIBE_MIN_INTERVAL:
            raise ValueError(f"min_interval must be at least {SUBSCRIBE_MIN_INTERVAL}s")
        self.starts_per_second = starts_per_second
        self.burst = burst
        self.min_interval = min_interval
        self.clock = clock
        self._spacing = 1.0 / starts_per_second
        # Generic cell rate algorithm: the theoretical time of the next start at the steady
        # rate; a start is allowed up to (burst - 1) spacings ahead of it.
        self._next_steady = float("-inf")
        self._last_start: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def delay(self, consumer_arn: str, shard_id: str) -> float:
        """Seconds until a subscription for this consumer and shard could start (0: now)."""
        with self._lock:
            now = self.clock.monotonic()
            return max(self._by_rate(now), self._by_shard(consumer_arn, shard_id, now)) - now

    async def acquire(self, consumer_arn: str, shard_id: str) -> None:
        """Wait for this consumer-shard's turn, then count a subscription start."""
        with self._lock:
            now = self.clock.monotonic()
            by_rate = self._by_rate(now)
            start = max(by_rate, self._by_shard(consumer_arn, shard_id, now))
            # Reserve before sleeping: later callers queue behind this slot instead of racing
            # for it. The rate is charged when the rate allows the start, even if the shard's
            # own interval delays it further: one shard waiting out its interval holds up none
            # of the others.
            self._next_steady = max(self._next_steady, by_rate) + self._spacing
            self._last_start[(consumer_arn, shard_id)] = start
            self._prune(now)
        if start > now:
            await self.clock.sleep(start - now)

    def _by_rate(self, now: float) -> float:
        return max(now, self._next_steady - (self.burst - 1) * self._spacing)

    def _by_shard(self, consumer_arn: str, shard_id: str, now: float) -> float:
        last = self._last_start.get((consumer_arn, shard_id))
        return now if last is None else max(now, last + self.min_interval)

    def _prune(self, now: float) -> None:
        if len(self._last_start) <= _PRUNE_ABOVE:
            return
        horizon = now - self.min_interval
        for key in [k for k, started in self._last_start.items() if started < horizon]:
            del self._last_start[key]


_shared: SubscriptionPacer | None = None


def shared_pacer() -> SubscriptionPacer:
    """The process-wide pacer fetchers use when given none (real clock, default limits)."""
    global _shared
    if _shared is None:
        _shared = SubscriptionPacer()
    return _shared
