"""Retrying while a lease is held: every failure that may pass is waited out, indefinitely.

A shard worker must not stop over a brownout: 5xx answers, throttling storms, timeouts,
dropped connections and credentials being refreshed all pass, and the lease (renewed
separately) bounds how long one worker keeps trying: when it is lost, the worker is cancelled.
So :class:`Persistence` never counts attempts. It gives up only on what waiting cannot fix:

- the resource is gone (:class:`~shardflow.errors.ResourceNotFoundError`: the stream was
  deleted) or the request is refused as invalid: at once;
- access is denied (missing permissions, revoked or expired credentials that are not being
  refreshed): once denials have lasted ``denied_for`` seconds without a success in between,
  so that an IAM change that takes effect in a minute, or a token refreshed late, passes.

Delays are full-jitter exponential, capped by the backoff's ``cap``; its ``max_attempts`` is
not used.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final

from shardflow.backoff import Backoff
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.errors import (
    AccessDeniedError,
    AwsError,
    ResourceInUseError,
    ThrottledError,
)

DEFAULT_DENIED_FOR: Final = 300.0


@dataclass(frozen=True, slots=True)
class Patience:
    """The backoffs of :class:`Persistence`; ``denied_for`` is the patience for access denied."""

    throttle_backoff: Backoff = field(
        default_factory=lambda: Backoff(base=0.5, cap=10.0, max_attempts=None)
    )
    error_backoff: Backoff = field(
        default_factory=lambda: Backoff(base=0.1, cap=5.0, max_attempts=None)
    )
    denied_for: float = DEFAULT_DENIED_FOR

    def __post_init__(self) -> None:
        if self.denied_for < 0:
            raise ValueError("denied_for must not be negative")


def gives_way(error: AwsError) -> bool:
    """Whether waiting may fix ``error`` (access denied only for a while: see the module)."""
    return error.retryable or isinstance(error, AccessDeniedError | ResourceInUseError)


class Persistence:
    """Consecutive failures of one kind of call, and how long to wait before the next try.

    Call :meth:`pause` with each failure (it raises the failure once retrying cannot help) and
    :meth:`succeeded` after each success.
    """

    def __init__(
        self,
        policy: Patience | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy or Patience()
        self._clock = clock
        self._rng = rng
        self._failures = 0
        self._denied_since: float | None = None

    @property
    def failures(self) -> int:
        """Failures since the last success."""
        return self._failures

    def succeeded(self) -> None:
        self._failures = 0
        self._denied_since = None

    def judge(self, error: AwsError) -> None:
        """Count ``error`` as one more failure; raise it if trying again cannot help."""
        if not gives_way(error):
            raise error
        if isinstance(error, AccessDeniedError):
            now = self._clock.monotonic()
            if self._denied_since is None:
                self._denied_since = now
            if now - self._denied_since >= self.policy.denied_for:
                raise error
        else:
            self._denied_since = None
        self._failures += 1

    def pause(self, error: AwsError) -> float:
        """:meth:`judge` ``error``, then the seconds to wait before trying again."""
        self.judge(error)
        backoff = (
            self.policy.throttle_backoff
            if isinstance(error, ThrottledError)
            else self.policy.error_backoff
        )
        return backoff.delay(self._failures - 1, self._rng)
