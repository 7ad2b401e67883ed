"""Dead letters kept in a list: a :class:`~shardflow.deadletter.DeadLetterDestination` for tests."""

from __future__ import annotations

from collections.abc import Sequence

from shardflow.deadletter.model import DeadLetter
from shardflow.errors import DeadLetterWriteError


class InMemoryDeadLetters:
    """Stores every letter written in :attr:`letters`, in order; after :meth:`close` (or with
    ``refuse=True``) a write fails as a real destination's would, with DeadLetterWriteError."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.letters: list[DeadLetter] = []
        self.refuse = refuse
        self.closed = False

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        if self.closed or self.refuse:
            reason = "closed" if self.closed else "refusing writes"
            raise DeadLetterWriteError("in-memory dead letters", len(letters), reason)
        self.letters.extend(letters)

    async def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"InMemoryDeadLetters({len(self.letters)} letters)"
