"""Idempotency guards: skip records already handled (e.g. redelivered after a failover).

Public API: :class:`IdempotencyGuard` (claim / complete / release; semantics in
:mod:`shardflow.idempotency.guard`), :class:`Claim`, :class:`ClaimOutcome`,
:func:`handle_once`, key functions :func:`by_position` and :func:`by_user_key`, and two
guards: :class:`InMemoryIdempotencyGuard` (LRU, one process) and
:class:`DynamoDBIdempotencyGuard` (shared table with TTL).
"""

from shardflow.deprecation import renamed
from shardflow.idempotency.dynamodb import DynamoDBIdempotencyGuard
from shardflow.idempotency.guard import (
    Claim,
    ClaimOutcome,
    IdempotencyGuard,
    KeyFunction,
    by_position,
    by_user_key,
    handle_once,
)
from shardflow.idempotency.memory import InMemoryIdempotencyGuard

__all__ = [
    "Claim",
    "ClaimOutcome",
    "DynamoDBIdempotencyGuard",
    "IdempotencyGuard",
    "InMemoryIdempotencyGuard",
    "KeyFunction",
    "by_position",
    "by_user_key",
    "handle_once",
]

__getattr__ = renamed(__name__, {"MemoryIdempotencyGuard": "InMemoryIdempotencyGuard"})
