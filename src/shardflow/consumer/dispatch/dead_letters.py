"""A dead-letter destination as the dispatcher's sink: failed records become stored letters.

:class:`DestinationSink` turns each finally failed record into a
:class:`~shardflow.deadletter.DeadLetter` (the record, its origin — stream, shard, sequence
and sub-sequence numbers — and the error) and writes it to a
:class:`~shardflow.deadletter.DeadLetterDestination` (a JSON-lines file, a Kinesis stream, or
any other implementation). It returns only once the destination vouched for the letter; a
failed write raises, and the dispatcher then stops the shard without acknowledging the record,
so it is never checkpointed past, never silently skipped.
"""

from __future__ import annotations

from typing import Any

from shardflow.consumer.dispatch.contracts import DeadLetterSink
from shardflow.consumer.dispatch.settings import DispatchSettings, KeyFunction
from shardflow.deadletter.destination import DeadLetterDestination
from shardflow.deadletter.model import DeadLetter
from shardflow.errors import HandlerError, KeyBlockedError
from shardflow.records import Record


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
