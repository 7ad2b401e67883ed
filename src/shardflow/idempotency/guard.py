"""The idempotency guard: skip records already handled, without losing any that were not.

Semantics (claim / complete / release), chosen for at-least-once processing:

- ``claim(key)`` atomically records that a handler is starting on ``key`` and answers
  ``CLAIMED`` (go ahead), ``DONE`` (handled before: skip it, it may be checkpointed) or
  ``IN_PROGRESS`` (another live claim holds it: it is *not* handled yet, so neither skip it
  nor checkpoint past it; try again later).
- ``complete(claim)`` after the handler succeeded: the key is ``DONE`` for ``done_ttl``.
- ``release(claim)`` after the handler failed: the key is free again at once, so a retry (or
  the next owner of the shard) handles it.
- A claim nobody completes or releases (the worker died) expires after ``claim_ttl``; then the
  key can be claimed again. So a key recorded by a failed or vanished handler is never skipped
  forever: only ``complete`` makes a key skippable.

A single ``seen_before(key) -> bool`` would have to record the key before the handler ran; if
the handler then failed, the record would be skipped on every retry: lost. Hence two steps.
The guard narrows duplicates (e.g. after a failover, records between the last checkpoint and
the crash); it cannot rule them out: a handler that finished but crashed before ``complete``
runs again once its claim expires.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar, runtime_checkable

from shardflow.errors import ClaimInProgressError
from shardflow.records import Record

T = TypeVar("T")


class ClaimOutcome(StrEnum):
    CLAIMED = "claimed"
    """The caller now holds the key: handle the record, then complete or release."""
    DONE = "done"
    """The key was handled before: skip the record."""
    IN_PROGRESS = "in_progress"
    """Another live claim holds the key: not handled yet; retry later, do not checkpoint."""


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to ``claim(key)``. ``token`` identifies a CLAIMED claim (None otherwise)."""

    key: str
    outcome: ClaimOutcome
    token: str | None = None

    @property
    def claimed(self) -> bool:
        return self.outcome is ClaimOutcome.CLAIMED


def new_token() -> str:
    """A random claim token: tells this claim from a later one on the same key."""
    return secrets.token_hex(16)


def require_claimed(claim: Claim) -> str:
    """The token of a CLAIMED claim; ValueError for any other outcome (a caller's mistake)."""
    if claim.outcome is not ClaimOutcome.CLAIMED or claim.token is None:
        raise ValueError(f"only a CLAIMED claim can be completed or released, not {claim.outcome}")
    return claim.token


@runtime_checkable
class IdempotencyGuard(Protocol):
    """Remembers which keys were handled. See the module text for the exact semantics."""

    async def claim(self, key: str) -> Claim:
        """Atomically claim ``key`` unless it is done or claimed by someone else."""
        ...

    async def complete(self, claim: Claim) -> None:
        """Mark a CLAIMED key as handled (remembered for the guard's done TTL)."""
        ...

    async def release(self, claim: Claim) -> bool:
        """Drop a CLAIMED claim after a failure; False if it had expired and was taken over."""
        ...

    async def close(self) -> None: ...


async def handle_once(
    guard: IdempotencyGuard, key: str, action: Callable[[], Awaitable[T]]
) -> bool:
    """Run ``action`` unless ``key`` was handled before; True if it ran, False if skipped.

    A failing ``action`` releases the claim and its error propagates (the record is not
    handled). A key claimed elsewhere raises :class:`~shardflow.errors.ClaimInProgressError`.
    """
    claim = await guard.claim(key)
    if claim.outcome is ClaimOutcome.DONE:
        return False
    if claim.outcome is ClaimOutcome.IN_PROGRESS:
        raise ClaimInProgressError(key)
    try:
        await action()
    except BaseException:
        await guard.release(claim)
        raise
    await guard.complete(claim)
    return True


# --- keys ------------------------------------------------------------------------------------

KeyFunction = Callable[[Record], str]
"""How a record is named to the guard."""


def by_position(record: Record) -> str:
    """``stream/shard/sequence/sub-sequence``: the record's place, the same after a failover."""
    return (
        f"{record.stream_name}/{record.shard_id}/{record.sequence_number}/"
        f"{record.sub_sequence_number}"
    )


def by_user_key(function: Callable[[Record], str], *, namespace: str = "") -> KeyFunction:
    """Keys from the record's content (e.g. an event id in the payload), optionally prefixed.

    ``namespace`` keeps keys of different applications sharing one table apart. An empty or
    non-string key raises ValueError: silently sharing one key would skip unrelated records.
    """

    def key_of(record: Record) -> str:
        key = function(record)
        if not isinstance(key, str) or not key:
            raise ValueError(
                f"idempotency key of record {record.sequence_number}/"
                f"{record.sub_sequence_number} of shard {record.shard_id} is {key!r}"
            )
        return f"{namespace}{key}"

    return key_of
