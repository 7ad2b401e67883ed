"""The retry loop every AWS call goes through (pauses per :class:`~shardflow.backoff.Backoff`)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shardflow.aws.classify import classify
from shardflow.backoff import Backoff
from shardflow.errors import ExpiredIteratorError

T = TypeVar("T")
log = logging.getLogger("shardflow.aws")


DEFAULT_BACKOFF = Backoff()


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    operation: str,
    backoff: Backoff = DEFAULT_BACKOFF,
    stream: str | None = None,
    shard_id: str | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> T:
    """Run ``call`` until it succeeds, retrying retryable failures with backoff.

    Every failure is raised as a classified :class:`AwsError` (the original is its ``__cause__``);
    non-retryable ones at once, retryable ones after ``backoff.max_attempts`` attempts. An
    :class:`ExpiredIteratorError` is raised at once too: repeating a call with the same expired
    iterator or token cannot succeed, the caller must get a new one.
    """
    attempt = 0
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = classify(exc, operation=operation, stream=stream, shard_id=shard_id)
            attempt += 1
            if (
                not error.retryable
                or isinstance(error, ExpiredIteratorError)
                or not backoff.allows(attempt)
            ):
                if error is exc:
                    raise  # already typed: keep its own cause and traceback
                raise error from exc
            pause = backoff.delay(attempt - 1, rng)
            log.debug("%s failed (%s), retry %d in %.3fs", operation, error.code, attempt, pause)
            await sleep(pause)
