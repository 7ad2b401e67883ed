"""Every dead letter is seen: counted in the consumer's metrics and logged, at a bounded rate.

A record that went to the dead letters was acknowledged and will not be handled again, so the
operator must be able to notice it without reading the destination. :class:`ObservedSink`
wraps whatever sink the dispatcher writes to; once a letter is stored it counts it and logs a
WARNING naming the record and the error, at most one line per ``interval`` (the lines in
between are summed up in the next one, so a burst of failures cannot flood the log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.dispatch.contracts import DeadLetterSink
from shardflow.errors import HandlerError
from shardflow.records import Record

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
