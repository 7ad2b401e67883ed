"""A clock for fetcher and registration tests whose sleeps pass instantly."""

from __future__ import annotations


class SteppingClock:
    """A clock whose sleeps pass instantly, moving time forward by the time slept.

    Implements :class:`shardflow.clock.Clock` (wall time equals monotonic time); ``slept``
    lists every sleep asked for, in order.
    """

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(0.0, seconds)
