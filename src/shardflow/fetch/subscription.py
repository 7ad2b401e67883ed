"""One SubscribeToShard subscription: its events, read one at a time against a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from enum import Enum
from typing import Any

from shardflow.clock import Clock
from shardflow.positions import StartPosition
from shardflow.waits import first_of


class Lapse(Enum):
    """Why a subscription is over without an event to hand out."""

    RENEW = "renewal due"
    SILENT = "no event within the event timeout"
    CLOSED = "closed by the service"


class Subscription:
    """The event stream of one SubscribeToShard response, when it started, what it delivered."""

    def __init__(self, stream: Any, started: float) -> None:
        self._stream = stream
        self._events: AsyncIterator[Mapping[str, Any]] = aiter(stream)
        self.started = started
        self.received = 0

    async def next_event(
        self, clock: Clock, *, renew_at: float, event_timeout: float
    ) -> Mapping[str, Any] | Lapse | Exception:
        """The next event; or RENEW once ``renew_at`` (monotonic) comes, SILENT after
        ``event_timeout`` seconds without one, CLOSED when the stream ends; or the failure
        that ended the stream. Nothing is read beyond the one event returned.

        After anything but an event the subscription is unusable: close it.
        """
        now = clock.monotonic()
        if renew_at <= now:
            return Lapse.RENEW
        renewal_first = renew_at <= now + event_timeout
        read = asyncio.ensure_future(anext(self._events))
        try:
            await first_of(read, clock.sleep(min(renew_at, now + event_timeout) - now))
        finally:
            if not read.done():
                read.cancel()
        if not read.done():
            await asyncio.wait((read,))  # let the cancellation land (an event may win the race)
        if read.cancelled():
            return Lapse.RENEW if renewal_first else Lapse.SILENT
        error = read.exception()
        if isinstance(error, StopAsyncIteration):
            return Lapse.CLOSED
        if isinstance(error, Exception):
            return error
        if error is not None:  # a BaseException such as KeyboardInterrupt
            raise error
        self.received += 1
        event: Mapping[str, Any] = read.result()
        return event

    def close(self) -> None:
        """Close the HTTP response (and its connection); a read in progress fails or ends."""
        close = getattr(self._stream, "close", None)
        if callable(close):
            close()


def starting_position(position: StartPosition) -> dict[str, Any]:
    """SubscribeToShard's ``StartingPosition`` for a start position."""
    params = position.iterator_params()
    starting: dict[str, Any] = {"Type": params["ShardIteratorType"]}
    if "StartingSequenceNumber" in params:
        starting["SequenceNumber"] = params["StartingSequenceNumber"]
    if "Timestamp" in params:
        starting["Timestamp"] = params["Timestamp"]
    return starting
