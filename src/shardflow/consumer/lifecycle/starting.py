"""Start-up calls that outlast a brownout: retried until ``ConsumerSettings.start_timeout``.

Each AWS call retries a handful of times on its own (seconds). A worker restarted while
Kinesis answers most calls with 500s (a brownout lasting tens of seconds) ran out of those
retries on its first DescribeStreamSummary and exited: a crash-looping pod at exactly the
moment the fleet needs it. At start nothing is held yet, so waiting costs nothing but time;
only errors that may pass are retried (a wrong stream name or missing permission fails at
once), and past the deadline :class:`~shardflow.errors.StartTimeoutError` says so, the last
error as its cause.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from shardflow.backoff import Backoff
from shardflow.clock import Clock
from shardflow.errors import AwsError, StartTimeoutError

T = TypeVar("T")
log = logging.getLogger("shardflow.consumer")

START_BACKOFF: Final = Backoff(base=0.5, cap=5.0, max_attempts=None)
"""Pauses between rounds of a start-up call (each round retries on its own first)."""


async def until_started(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    give_up_after: float,
    clock: Clock,
    backoff: Backoff = START_BACKOFF,
    rng: random.Random | None = None,
) -> T:
    """``call()`` until it succeeds; a retryable :class:`AwsError` is tried again until
    ``give_up_after`` seconds have passed (then :class:`StartTimeoutError`), any other error
    raises at once. ``what`` names the step in logs and the error."""
    deadline = clock.monotonic() + give_up_after
    rounds = 0
    while True:
        try:
            return await call()
        except AwsError as error:
            if not error.retryable:
                raise
            rounds += 1
            left = deadline - clock.monotonic()
            if left <= 0:
                raise StartTimeoutError(
                    f"{what} kept failing for start_timeout={give_up_after:g}s "
                    f"({rounds} rounds of retries): {error}",
                    timeout=give_up_after,
                ) from error
            pause = min(backoff.delay(rounds - 1, rng), left)
            log.warning(
                "%s failed (%s); trying again in %.1fs, for up to %.0fs more",
                what,
                error,
                pause,
                left,
            )
            await clock.sleep(pause)
