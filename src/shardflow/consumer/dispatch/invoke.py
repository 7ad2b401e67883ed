"""One record through the user's handler, retried: each attempt is one call of the
:mod:`~shardflow.consumer.invocation` layer (sync in a thread pool or async on the loop; every
failure a :class:`~shardflow.errors.HandlerError` naming the record), as in shard-ordered
delivery.

A handler call holds a slot of the worker-wide limit while it runs; the pause before a retry
does not.

With an idempotency guard each call is claim -> handler -> complete, and a failed handler
releases its claim (see :class:`~shardflow.consumer.dispatch.settings.Idempotency`). A claim
that cannot be settled on the spot (a sync handler's thread outliving a cancelled wait, a
completion refused by a brownout) is settled in the background
(:mod:`~shardflow.consumer.dispatch.claims`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

from shardflow.backoff import Backoff
from shardflow.clock import Clock
from shardflow.consumer.dispatch.claims import ClaimSettler
from shardflow.consumer.dispatch.contracts import WorkerLimit
from shardflow.consumer.dispatch.settings import Idempotency
from shardflow.consumer.invocation import Invoker, handler_error
from shardflow.consumer.running import RunningCalls
from shardflow.errors import AwsError, ClaimInProgressError, HandlerError
from shardflow.idempotency.guard import Claim, ClaimOutcome, IdempotencyGuard
from shardflow.records import Record

R = TypeVar("R", bound=Record)

RecordHandler = Callable[[R], Awaitable[None] | None]
"""Handles one record; a plain function runs in a thread pool, an ``async def`` on the loop."""

GoOn = Callable[[], bool]
"""Asked before each retry and right before each handler call: False once the dispatcher stops
or the shard's lease is gone (the record is then abandoned, unhandled)."""

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


class _GuardUnavailable(Exception):
    """The idempotency guard could not be asked for a claim for a reason that passes."""


class _NoLongerOurs(Exception):
    """Right before the handler call, ``go_on()`` said no: the record is not run."""


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
        calls: RunningCalls | None = None,
    ) -> None:
        self._invoke: Invoker[R] = Invoker(handler, executor)
        self._calls = calls
        self._retry = retry
        self._clock = clock
        self._limit = worker_limit
        self._rng = rng
        self._idempotency = idempotency
        self._settler = (
            None if idempotency is None else ClaimSettler(idempotency.guard, clock=clock)
        )

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
                ran = await self._guarded_call(record, go_on)
            except _NoLongerOurs:
                return Attempts(calls - 1, last, abandoned=True)
            except (ClaimInProgressError, _GuardUnavailable):
                # Another worker holds the record's claim: it is handling it, or it died and
                # the claim runs out after its TTL. Or the guard's table answers 5xx or
                # throttles (a DynamoDB brownout). Neither is this record's failure, so no
                # attempt is spent (it would end in the dead letters unhandled); wait and ask
                # again while the shard is still ours.
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

    async def _guarded_call(self, record: R, go_on: GoOn) -> bool:
        """One attempt; False when the guard knew the record as handled (no call made)."""
        idempotency = self._idempotency
        if idempotency is None:
            await self._call_once(record, go_on)
            return True
        guard = idempotency.guard
        try:
            claim = await guard.claim(idempotency.key(record))
        except AwsError as exc:
            if not exc.retryable:
                raise
            log.debug("idempotency guard unavailable, the record waits: %s", exc)
            raise _GuardUnavailable from exc
        if claim.outcome is ClaimOutcome.DONE:
            return False
        if claim.outcome is ClaimOutcome.IN_PROGRESS:
            raise ClaimInProgressError(claim.key)
        settler = self._settler
        assert settler is not None
        if self._invoke.is_async:
            try:
                await self._call_once(record, go_on)
            except BaseException:
                # Cancelled or failed, the handler has ended: free the record for a retry.
                await self._release_quietly(guard, claim)
                raise
        else:
            # The call in a task of its own, shielded: cancelling this wait does not stop the
            # handler's thread, so the claim must stay until the thread ends (releasing now
            # would let another worker run the record at the same time), and then be settled
            # by the thread's outcome (left to its TTL, the record would run again after it
            # although the handler finished).
            call = asyncio.ensure_future(self._call_once(record, go_on))
            try:
                await asyncio.shield(call)
            except asyncio.CancelledError:
                log.info("idempotency claim %r kept: its handler thread runs on", claim.key)
                settler.after(call, claim)
                raise
            except Exception:
                await self._release_quietly(guard, claim)
                raise
        # The record was handled: whatever happens to this wait, the mark must follow (left
        # unmarked, a redelivery after the claim's TTL would handle the record again).
        try:
            await guard.complete(claim)
        except asyncio.CancelledError:
            settler.complete(claim)  # the lease was lost or the consumer stops meanwhile
            raise
        except Exception as exc:
            log.warning("completing idempotency claim %r failed, retried: %s", claim.key, exc)
            settler.complete(claim)  # the record is acknowledged now, marked later
        return True

    async def _release_quietly(self, guard: IdempotencyGuard, claim: Claim) -> None:
        """Give the claim back; one the table refuses now is given back in the background
        (left alone, the shard's next owner would wait out its TTL)."""
        settler = self._settler
        assert settler is not None
        try:
            await guard.release(claim)
        except asyncio.CancelledError:
            settler.release(claim)
            raise
        except Exception as exc:
            log.warning("releasing idempotency claim %r failed, retried: %s", claim.key, exc)
            settler.release(claim)

    async def _call_once(self, record: R, go_on: GoOn) -> None:
        limit = self._limit
        if limit is not None:
            await limit.acquire()
        try:
            # Asked again after every wait (the claim, a slot): the lease may have lapsed
            # meanwhile, e.g. while the process was frozen; a record may not start then.
            if not go_on():
                raise _NoLongerOurs
            await self._invoke(record, self._calls)
        finally:
            if limit is not None:
                limit.release()
