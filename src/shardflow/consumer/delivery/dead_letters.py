"""Dead letters as delivery sees them: one sink interface, a destination behind it, every letter observed.

- :class:`DeadLetterSink`: where records go that failed for good (policies ``skip`` and
  ``block-key``); returning means the record is stored and may be checkpointed past.
- :class:`DestinationSink`: a :class:`~shardflow.deadletter.DeadLetterDestination` (JSON lines,
  a Kinesis stream, one's own) as a sink: each failed record becomes a
  :class:`~shardflow.deadletter.DeadLetter` (the record, its origin, the error). A failed write
  raises, and delivery then stops the shard without acknowledging the record: it is never
  checkpointed past, never silently skipped.
- :class:`ObservedSink`: every stored letter counted in the consumer's metrics and logged as a
  WARNING naming the record and the error, at most one line per ``interval`` (the lines in
  between are summed up in the next one, so a burst of failures cannot flood the log).
- :class:`WorkerLimit`: the bound on handler calls across a worker's shards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.delivery.settings import DispatchSettings, KeyFunction
from shardflow.deadletter.destination import DeadLetterDestination
from shardflow.deadletter.model import DeadLetter
from shardflow.errors import HandlerError, KeyBlockedError
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


class DestinationSink:
    """Writes dead letters to ``destination``, one write per record.

    ``blocked_key`` (the ordering-key function of a ``block-key`` policy) fills each letter's
    ``blocked_key``, so that ``shardflow dlq replay --key`` finds a key's letters. The
    destination stays the caller's: this sink never closes it.
    """

    def __init__(
        self, destination: DeadLetterDestination, *, blocked_key: KeyFunction | None = None
    ) -> None:
        if not isinstance(destination, DeadLetterDestination):
            raise TypeError(f"not a dead-letter destination: {destination!r}")
        self.destination = destination
        self._blocked_key = blocked_key

    def __repr__(self) -> str:
        return f"DestinationSink({self.destination!r})"

    async def dead_letter(self, record: Record, error: BaseException, attempts: int) -> None:
        """Store ``record`` as a letter; raises (DeadLetterWriteError) if it may not be stored."""
        letter = DeadLetter.from_failure(
            record,
            _original(error),
            attempts=attempts,
            blocked_key=self._key_blocked(record, error),
        )
        await self.destination.write([letter])

    def _key_blocked(self, record: Record, error: BaseException) -> str | None:
        if isinstance(error, KeyBlockedError):
            return error.key
        if self._blocked_key is None:
            return None
        return self._blocked_key(record)


def _original(error: BaseException) -> BaseException:
    """The handler's own exception (the letter's origin already names the record)."""
    if isinstance(error, HandlerError):
        return error.error
    return error


DeadLetters = DeadLetterSink[Any] | DeadLetterDestination
"""What ``Consumer.consume(dead_letters=...)`` takes: a destination, or a sink of one's own."""


def as_sink(
    dead_letters: DeadLetters | None, settings: DispatchSettings
) -> DeadLetterSink[Any] | None:
    """``dead_letters`` as the dispatcher's sink: destinations are wrapped, sinks kept."""
    if dead_letters is None or not isinstance(dead_letters, DeadLetterDestination):
        return dead_letters
    key = settings.key_function if settings.on_failure == "block-key" else None
    return DestinationSink(dead_letters, blocked_key=key)


log = logging.getLogger("shardflow.consumer.deadletters")

LOG_INTERVAL = 10.0
"""Seconds between two dead-letter log lines at most."""


class ObservedSink:
    """``sink``, with each stored letter counted (``count(stream)``) and logged, rate-limited."""

    def __init__(
        self,
        sink: DeadLetterSink[Any],
        count: Callable[[str], None],
        *,
        interval: float = LOG_INTERVAL,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.sink = sink
        self._count = count
        self._interval = interval
        self._clock = clock
        self._last_logged: float | None = None
        self._unlogged = 0

    def __repr__(self) -> str:
        return f"ObservedSink({self.sink!r})"

    async def dead_letter(self, record: Record, error: BaseException, attempts: int) -> None:
        await self.sink.dead_letter(record, error, attempts)
        self._count(record.stream_name)
        now = self._clock.monotonic()
        if self._last_logged is not None and now - self._last_logged < self._interval:
            self._unlogged += 1
            return
        cause = error.error if isinstance(error, HandlerError) else error
        more = f" ({self._unlogged} more since the last such line)" if self._unlogged else ""
        log.warning(
            "record %s/%s of shard %s (stream %s) went to the dead letters after %d handler "
            "call(s): %s: %s%s",
            record.sequence_number,
            record.sub_sequence_number,
            record.shard_id,
            record.stream_name,
            attempts,
            type(cause).__name__,
            cause,
            more,
        )
        self._last_logged = now
        self._unlogged = 0
