"""One record through the user's handler: sync in a thread pool or async on the loop, retried.

A handler call holds a slot of the worker-wide limit while it runs; the pause before a retry
does not. Every failure is wrapped in :class:`~shardflow.errors.HandlerError` naming the record.

With an idempotency guard each call is claim -> handler -> complete, and a failed handler
releases its claim (see :class:`~shardflow.consumer.dispatch.settings.Idempotency`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

from shardflow.backoff import Backoff
from shardflow.clock import Clock
from shardflow.consumer.dispatch.contracts import WorkerLimit
from shardflow.consumer.dispatch.settings import Idempotency
from shardflow.consumer.handlers import is_async_handler
from shardflow.errors import ClaimInProgressError, HandlerError
from shardflow.idempotency.guard import ClaimOutcome
from shardflow.records import Record

R = TypeVar("R", bound=Record)

RecordHandler = Callable[[R], Awaitable[None] | None]
"""Handles one record; a plain function runs in a thread pool, an ``async def`` on the loop."""

GoOn = Callable[[], bool]
"""Asked before each retry: False once the dispatcher stops (the record is then abandoned)."""

log = logging.getLogger("shardflow.consumer.dispatch")


@dataclass(frozen=True, slots=True)
class Attempts:
    """How a record's handler calls ended."""

    calls: int
    """Handler calls made."""
    error: HandlerError | None = None
    """The last failure; None when the last call succeeded."""
    abandoned: bool = False
    """Retries were given up because the dispatcher stopped: the record is not finished."""
    skipped: bool = False
    """The idempotency guard knew the record as handled before: no handler call was made."""

    @property
    def succeeded(self) -> bool:
        return self.error is None and not self.abandoned


def handler_error(error: BaseException, record: Record) -> HandlerError:
    """``error`` as a :class:`HandlerError` naming ``record`` (the original is its cause)."""
    wrapped = HandlerError(
        error,
        stream=record.stream_name,
        shard_id=record.shard_id,
        sequence_number=record.sequence_number,
        sub_sequence_number=record.sub_sequence_number,
    )
    wrapped.__cause__ = error
    return wrapped


class RetryingCall(Generic[R]):
    """Calls the handler for one record until it succeeds or the retry policy is spent."""

    def __init__(
        self,
        handler: RecordHandler[R],
        *,
        retry: Backoff,
        clock: Clock,
        executor: Executor | None = None,
        worker_limit: WorkerLimit | None = None,
        rng: random.Random | None = None,
        idempotency: Idempotency | None = None,
    ) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {handler!r}")
        self._handler = handler
        self._is_async = is_async_handler(handler)
        self._retry = retry
        self._clock = clock
        self._executor = executor
        self._limit = worker_limit
        self._rng = rng
        self._idempotency = idempotency

    async def run(self, record: R, go_on: GoOn) -> Attempts:
        """Handle ``record``; between attempts, pause per the policy and ask ``go_on()``."""
        retry = self._retry
        calls = 0
        waits = 0
        last: HandlerError | None = None
        while retry.allows(calls):
            if calls and not waits:
                await self._clock.sleep(retry.delay(calls - 1, self._rng))
                if not go_on():
                    return Attempts(calls, last, abandoned=True)
            calls += 1
            try:
                ran = await self._guarded_call(record)
            except ClaimInProgressError:
                # Another worker holds the record's claim: it is handling it, or it died and
                # the claim runs out after its TTL. Not this record's failure, so no attempt
                # is spent (it would end in the dead letters unhandled); wait and ask again.
                calls -= 1
                waits += 1
                await self._clock.sleep(retry.delay(waits - 1, self._rng))
                if not go_on():
                    return Attempts(calls, last, abandoned=True)
                continue
            except Exception as exc:
                waits = 0
                last = handler_error(exc, record)
                log.debug("%s (attempt %d of %s)", last, calls, retry.max_attempts or "unbounded")
                continue
            return Attempts(calls, skipped=not ran)
        return Attempts(calls, last)

    async def _guarded_call(self, record: R) -> bool:
        """One attempt; False when the guard knew the record as handled (no call made)."""
        idempotency = self._idempotency
        if idempotency is None:
            await self._call_once(record)
            return True
        guard = idempotency.guard
        claim = await guard.claim(idempotency.key(record))
        if claim.outcome is ClaimOutcome.DONE:
            return False
        if claim.outcome is ClaimOutcome.IN_PROGRESS:
            raise ClaimInProgressError(claim.key)
        try:
            await self._call_once(record)
        except BaseException:
            try:
                await guard.release(claim)
            except Exception:
                # The claim then expires after its TTL; the handler's own error is what counts.
                log.warning("releasing idempotency claim %r failed", claim.key, exc_info=True)
            raise
        try:
            await guard.complete(claim)
        except Exception:
            # The record was handled: acknowledge it. Unmarked, a later redelivery (after the
            # claim expired) handles it again, which at-least-once allows.
            log.warning("completing idempotency claim %r failed", claim.key, exc_info=True)
        return True

    async def _call_once(self, record: R) -> None:
        limit = self._limit
        if limit is not None:
            await limit.acquire()
        try:
            if self._is_async:
                result = self._handler(record)
                if inspect.isawaitable(result):
                    await result
            else:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._executor, self._call_sync, record)
        finally:
            if limit is not None:
                limit.release()

    def _call_sync(self, record: R) -> None:
        result = self._handler(record)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"handler {self._handler!r} returned an awaitable but is not declared "
                "'async def'; declare it async so the dispatcher awaits it on the event loop"
            )
