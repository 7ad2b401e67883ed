"""How a failed call is tried again: how often, and how long to pause before each retry.

One value, :class:`Backoff`, serves every retry in shardflow: AWS calls (throttling, 5xx),
fetchers, the producer's PutRecords retries and the consumer's handler retries.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final, Literal, get_args

Jitter = Literal["full", "half", "none"]
"""How a pause is drawn below its ceiling: ``"full"`` uniformly from zero to the ceiling,
``"half"`` uniformly from its upper half, ``"none"`` the ceiling itself."""

_JITTERS: Final = frozenset(get_args(Jitter))


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter, and a bound on attempts.

    The pause after failed attempt ``n`` (0-based) has the ceiling
    ``min(cap, base * multiplier**n)`` and is drawn below it per ``jitter``, so that many
    callers failing together (a throttled shard, a database restart) do not retry in
    lock-step.
    """

    base: float = 0.05
    """Ceiling of the first pause, in seconds."""
    cap: float = 5.0
    """Ceiling of every pause, in seconds."""
    max_attempts: int | None = 8
    """Attempts in all, the first call included, before the failure is final; None: no bound
    of its own (the caller bounds retries otherwise, e.g. by a deadline)."""
    multiplier: float = 2.0
    """Factor between the ceilings of two successive pauses (at least 1)."""
    jitter: Jitter = "full"
    """How each pause is drawn below its ceiling (see :data:`Jitter`)."""

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError("backoff pauses must not be negative")
        if self.multiplier < 1:
            raise ValueError(f"backoff multiplier must be at least 1, got {self.multiplier}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.jitter not in _JITTERS:
            raise ValueError(f"jitter must be one of {sorted(_JITTERS)}, got {self.jitter!r}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        ceiling = min(self.cap, self.base * self.multiplier ** min(attempt, 62))
        if self.jitter == "none":
            return ceiling
        low = ceiling / 2 if self.jitter == "half" else 0.0
        return (rng or random).uniform(low, ceiling)

    def allows(self, attempts: int) -> bool:
        """Whether another attempt may follow ``attempts`` attempts made so far."""
        return self.max_attempts is None or attempts < self.max_attempts


NO_BACKOFF: Final = Backoff(base=0.0, cap=0.0, jitter="none")
"""Retry at once (tests, or calls whose failures do not depend on time)."""
