"""What the dispatcher needs from around it: a dead-letter sink and a per-worker limit."""

from __future__ import annotations

from typing import Protocol, TypeVar

from shardflow.records import Record

R_contra = TypeVar("R_contra", bound=Record, contravariant=True)


class DeadLetterSink(Protocol[R_contra]):
    """Where records go that failed for good (policies ``skip`` and ``block-key``)."""

    async def dead_letter(self, record: R_contra, error: BaseException, attempts: int) -> None:
        """Store ``record`` durably, or raise.

        ``error`` is why: the last handler failure (a :class:`~shardflow.errors.HandlerError`)
        or a :class:`~shardflow.errors.KeyBlockedError`; ``attempts`` is how many handler calls
        were made (0 for a record of a blocked key). Returning means the record is stored and
        may be checkpointed; raising means it is not.
        """
        ...


class WorkerLimit(Protocol):
    """A bound on handler calls running at once across all shards of a worker.

    :class:`asyncio.Semaphore` is one. The dispatcher holds it for each handler call only (not
    while a record waits for its key's turn or sleeps before a retry).
    """

    async def acquire(self) -> bool: ...

    def release(self) -> None: ...
