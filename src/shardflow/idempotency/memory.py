"""An in-process idempotency guard: a bounded LRU of keys with optional expiry."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.deprecation import renamed
from shardflow.idempotency.guard import Claim, ClaimOutcome, new_token, require_claimed

DEFAULT_CLAIM_TTL: Final = 300.0
"""Seconds a claim lives without complete/release (a handler slower than this may run twice)."""


@dataclass(slots=True)
class _Entry:
    done: bool
    token: str
    expires_at: float | None  # monotonic seconds; None: never


class InMemoryIdempotencyGuard:
    """Remembers up to ``max_entries`` keys in this process (least recently used go first).

    ``done_ttl`` (None: until evicted) is how long a handled key is remembered; ``claim_ttl``
    how long an open claim holds. Eviction forgets keys: a duplicate older than the LRU's reach
    is handled again (at-least-once is kept, only the de-duplication window shrinks). Being in
    memory, it only covers redeliveries within one process, e.g. a shard that returns to the
    same worker; use the DynamoDB guard across workers. Methods never await: each is atomic
    on the event loop.
    """

    def __init__(
        self,
        max_entries: int = 100_000,
        *,
        done_ttl: float | None = None,
        claim_ttl: float = DEFAULT_CLAIM_TTL,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if claim_ttl <= 0 or (done_ttl is not None and done_ttl <= 0):
            raise ValueError("claim_ttl and done_ttl must be positive")
        self.max_entries = max_entries
        self.done_ttl = done_ttl
        self.claim_ttl = claim_ttl
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at is not None and entry.expires_at <= self._clock.monotonic():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    def _store(self, key: str, entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def claim(self, key: str) -> Claim:
        entry = self._live(key)
        if entry is not None:
            return Claim(key, ClaimOutcome.DONE if entry.done else ClaimOutcome.IN_PROGRESS)
        token = new_token()
        self._store(key, _Entry(False, token, self._clock.monotonic() + self.claim_ttl))
        return Claim(key, ClaimOutcome.CLAIMED, token)

    async def complete(self, claim: Claim) -> None:
        token = require_claimed(claim)
        expires = None if self.done_ttl is None else self._clock.monotonic() + self.done_ttl
        # Unconditional: the handler did finish, whoever claimed the key since.
        self._store(claim.key, _Entry(True, token, expires))

    async def release(self, claim: Claim) -> bool:
        token = require_claimed(claim)
        entry = self._live(claim.key)
        if entry is None or entry.done or entry.token != token:
            return False
        del self._entries[claim.key]
        return True

    async def close(self) -> None:
        self._entries.clear()


__getattr__ = renamed(__name__, {"MemoryIdempotencyGuard": "InMemoryIdempotencyGuard"})
