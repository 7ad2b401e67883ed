"""Where dead letters go: the interface every destination implements.

The contract the consumer relies on: a letter counts as dead-lettered only once ``write``
returned. ``write`` raises :class:`~shardflow.errors.DeadLetterWriteError` when it cannot vouch
for every letter it was given; the caller then must not checkpoint past those records (they
will be read again). A failed write may still have stored some of its letters, so a
destination holds each letter at least once, not exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from shardflow.deadletter.model import DeadLetter


@runtime_checkable
class DeadLetterDestination(Protocol):
    """A durable place for dead letters (a JSON-lines file, a Kinesis stream, ...)."""

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Store ``letters`` durably, in order; raise DeadLetterWriteError if any may be lost."""
        ...

    async def close(self) -> None:
        """Release what the destination holds (files, clients); later writes fail."""
        ...
