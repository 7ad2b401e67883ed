"""Settling an idempotency claim once the dispatcher no longer waits for it.

Some cases leave a claim open although the record's handling is over or will end on its own:

- the dispatcher stopped waiting for a sync handler (its lease was lost, the consumer stops):
  cancelling the wait does not stop the handler's thread, so the claim may not be released
  while the thread runs (another worker would run the record at the same time);
- the guard's table refused the completion or the release for a reason that passes (a
  DynamoDB brownout), or the wait for that answer was cancelled (the lease lost meanwhile).

Left open, the claim lasts its TTL: the shard's next owner (often this same worker, once the
lease is back) finds it in progress, waits, and after the TTL runs the record again although
the handler had finished. So the claim is settled in the background as soon as the outcome is
known: completed if the handler returned, released if it raised, passing errors retried with
backoff (:data:`SETTLE_BACKOFF`, about 90 s). A claim that still cannot be settled, or a
handler thread whose wait was itself cancelled (the loop is closing), is left to its TTL.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from shardflow.aws.backoff import retrying
from shardflow.backoff import Backoff
from shardflow.clock import Clock
from shardflow.idempotency.guard import Claim, IdempotencyGuard

log = logging.getLogger("shardflow.consumer.delivery")

SETTLE_BACKOFF: Final = Backoff(base=0.2, cap=2.0, max_attempts=60, jitter="half")
"""About 90 s of retries in all: far above a brownout, far below a claim's usual TTL."""

_settling: set[asyncio.Task[None]] = set()
"""Settlements under way (the loop keeps only weak references to tasks)."""


class ClaimSettler:
    """Completes or releases claims of ``guard`` in the background (see the module text)."""

    def __init__(
        self, guard: IdempotencyGuard, *, clock: Clock, backoff: Backoff = SETTLE_BACKOFF
    ) -> None:
        self._guard = guard
        self._clock = clock
        self._backoff = backoff

    def after(self, call: asyncio.Future[None], claim: Claim) -> None:
        """Settle ``claim`` when ``call`` (a handler call no one waits for) has ended."""

        def ended(done: asyncio.Future[None]) -> None:
            if done.cancelled():
                log.warning("idempotency claim %r left to its TTL: the wait ended", claim.key)
                return
            self._start(claim, release=done.exception() is not None)

        call.add_done_callback(ended)

    def complete(self, claim: Claim) -> None:
        """Complete ``claim`` (its handler returned), retrying until the guard answers."""
        self._start(claim, release=False)

    def release(self, claim: Claim) -> None:
        """Release ``claim`` (its handler failed or never ran), retrying likewise."""
        self._start(claim, release=True)

    def _start(self, claim: Claim, *, release: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._settle(claim, release=release))
        _settling.add(task)
        task.add_done_callback(_settling.discard)

    async def _settle(self, claim: Claim, *, release: bool) -> None:
        guard = self._guard

        async def settle() -> None:
            if release:
                await guard.release(claim)
            else:
                await guard.complete(claim)

        what = "releasing" if release else "completing"
        try:
            await retrying(
                settle, operation=f"{what} claim", backoff=self._backoff, sleep=self._clock.sleep
            )
        except Exception as exc:
            log.warning("%s idempotency claim %r failed for good: %s", what, claim.key, exc)
        else:
            log.info("%s idempotency claim %r done in the background", what, claim.key)
