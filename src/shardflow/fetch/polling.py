"""The polling fetcher: batches of one shard by GetRecords, pulled one call at a time."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardflow.aws.classify import classify
from shardflow.aws.kinesis import arn_ref, stream_name_of, stream_ref
from shardflow.aws.persistence import DEFAULT_DENIED_FOR, Patience, Persistence
from shardflow.backoff import Backoff
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.errors import AwsError, ExpiredIteratorError, ThrottledError
from shardflow.events import SILENT, FetchThrottled, ShardEmitter
from shardflow.fetch.batch import FetchedBatch, batch_from_kinesis
from shardflow.fetch.limiter import CallRateLimiter
from shardflow.positions import StartPosition
from shardflow.records import RecordBuilder, build_record

log = logging.getLogger("shardflow.fetch")

GET_RECORDS_LIMIT = 10_000
"""The most records one GetRecords call may ask for."""

GET_RECORDS_CALLS_PER_SECOND = 5
"""Kinesis' limit of GetRecords calls per shard and second (shared by all readers of a shard)."""


@dataclass(frozen=True, slots=True)
class Polling:
    """Fetch by polling (GetRecords), with its settings: the default fetch mode.

    Pass it as ``ConsumerSettings(fetch=Polling(...))``, or to a :class:`PollingFetcher`.
    Defaults follow the KCL where a user would compare. Failures that may pass are retried for
    as long as the fetcher is used (its owner stops it when the lease is lost), never a fixed
    number of times: see :mod:`shardflow.aws.persistence`.
    """

    max_records: int = GET_RECORDS_LIMIT
    """Records one GetRecords call asks for at most (a consumer also keeps it within its
    ``prefetch_records``)."""
    idle_time: float = 1.0
    """Seconds between the starts of two GetRecords calls while the shard is caught up (KCL's
    ``idleTimeBetweenReadsInMillis``, default 1.5 s): an idle shard costs exactly
    ``1 / idle_time`` calls per second. While behind, the next call is made at once."""
    max_idle_time: float | None = None
    """Back-off for shards that stay empty: after each GetRecords call that returned no
    record the pause before the next doubles, from ``idle_time`` up to ``max_idle_time``
    seconds; the first call that returns records brings it back to ``idle_time``. A record
    put on a shard that had been idle is then read within ``max_idle_time`` (not
    ``idle_time``). None (the default): every pause is ``idle_time``. For a process holding
    many mostly idle shards: 1,000 shards at ``idle_time`` 10 s are 100 calls a second."""
    max_calls_per_second: int = GET_RECORDS_CALLS_PER_SECOND
    """GetRecords calls per second on one shard at most (Kinesis allows 5, shared by every
    application reading the shard)."""
    throttle_backoff: Backoff = field(
        default_factory=lambda: Backoff(base=0.5, cap=10.0, max_attempts=None)
    )
    """Pauses after throttling (normal: a shard's read budget is shared, so it waits longer);
    only ``base`` and ``cap`` matter (retried while the fetcher is used)."""
    error_backoff: Backoff = field(
        default_factory=lambda: Backoff(base=0.1, cap=5.0, max_attempts=None)
    )
    """Pauses after other failures that may pass (5xx, timeouts, dropped connections); only
    ``base`` and ``cap`` matter."""
    max_iterator_renewals: int = 3
    """ExpiredIterator recoveries made at once, without a successful call in between; further
    ones wait the error backoff first."""
    denied_for: float = DEFAULT_DENIED_FOR
    """How long access denied (or expired credentials) is retried before it is raised; a
    missing stream is raised at once."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_records <= GET_RECORDS_LIMIT:
            raise ValueError(f"max_records must be within 1..{GET_RECORDS_LIMIT}")
        if self.idle_time < 0:
            raise ValueError("idle_time must not be negative")
        if self.max_idle_time is not None and self.max_idle_time < self.idle_time:
            raise ValueError("max_idle_time must not be less than idle_time")
        if not 1 <= self.max_calls_per_second <= GET_RECORDS_CALLS_PER_SECOND:
            raise ValueError(
                f"max_calls_per_second must be within 1..{GET_RECORDS_CALLS_PER_SECOND}"
            )
        if self.max_iterator_renewals < 0:
            raise ValueError("max_iterator_renewals must not be negative")
        if self.denied_for < 0:
            raise ValueError("denied_for must not be negative")

    @property
    def patience(self) -> Patience:
        return Patience(self.throttle_backoff, self.error_backoff, self.denied_for)


class PollingFetcher:
    """An async iterator of :class:`FetchedBatch` for one shard, by GetRecords polling.

    Pull-based: each ``__anext__`` makes (at most) one successful GetRecords call and nothing
    is read ahead, so the caller's pace bounds memory. Waits happen at the start of the next
    pull: the idle interval while caught up and the per-shard call limit. Throttling and
    transient failures are retried with jittered backoff; an expired iterator is replaced by one
    AFTER_SEQUENCE_NUMBER of the last record handed out (or at ``start`` if none was); failures
    that waiting cannot fix are raised as typed :class:`~shardflow.errors.AwsError`. At the shard's end the last
    batch has ``shard_ended=True`` and iteration stops.

    ``events`` (the shard's emitter) hears of every throttled GetRecords call that is retried,
    as a :class:`~shardflow.events.FetchThrottled` with the delay it waits.

    Not safe for concurrent ``__anext__`` calls: one reader per fetcher.
    """

    def __init__(
        self,
        kinesis: Any,
        stream: str,
        shard_id: str,
        start: StartPosition | None = None,
        settings: Polling | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        events: ShardEmitter = SILENT,
        build: RecordBuilder = build_record,
    ) -> None:
        self._kinesis = kinesis
        self._build = build
        self.stream = stream
        self._arn_ref = arn_ref(stream)
        self.shard_id = shard_id
        self.start = start or StartPosition.trim_horizon()
        self.settings = settings or Polling()
        self._stream_name = stream_name_of(stream)
        self._clock = clock
        self._rng = rng
        self._events = events
        self._limiter = CallRateLimiter(self.settings.max_calls_per_second, clock=clock)
        self._persistence = Persistence(self.settings.patience, clock=clock, rng=rng)
        self._iterator: str | None = None
        self._last_delivered: str | None = None
        self._next_call_at: float | None = None
        self._idle_pause = self.settings.idle_time
        """The pause after the next empty answer (grows up to max_idle_time)."""
        self._ended = False
        self.get_records_calls = 0

    @property
    def last_sequence_number(self) -> str | None:
        """Sequence number of the last record handed out, if any."""
        return self._last_delivered

    @property
    def resume_position(self) -> StartPosition:
        """Where reading would start again: just after the last record handed out."""
        if self._last_delivered is not None:
            return StartPosition.after_sequence_number(self._last_delivered)
        return self.start

    @property
    def ended(self) -> bool:
        """True once the shard-end batch has been handed out."""
        return self._ended

    def __aiter__(self) -> PollingFetcher:
        return self

    async def __anext__(self) -> FetchedBatch:
        if self._ended:
            raise StopAsyncIteration
        if self._next_call_at is not None:
            wait = self._next_call_at - self._clock.monotonic()
            if wait > 0:
                await self._clock.sleep(wait)
        response, started = await self._get_records()
        batch = self._batch_from(response)
        behind = bool(batch.millis_behind_latest) or (
            len(batch.records) >= self.settings.max_records
        )
        self._next_call_at = None if behind else started + self._pause_after(batch)
        if batch.records:
            self._last_delivered = batch.last_sequence_number
        if batch.shard_ended:
            self._ended = True
        return batch

    def _pause_after(self, batch: FetchedBatch) -> float:
        """Seconds from this call's start to the next one's while caught up."""
        idle, most = self.settings.idle_time, self.settings.max_idle_time
        if most is None or batch.records:
            self._idle_pause = idle
            return idle
        pause = self._idle_pause
        self._idle_pause = min(max(pause * 2, idle), most)
        return pause

    # --- calls -----------------------------------------------------------------------------

    async def _get_records(self) -> tuple[Mapping[str, Any], float]:
        """One successful GetRecords response and the monotonic time its call started."""
        renewals = 0
        while True:
            if self._iterator is None:
                iterator = await self._new_iterator()
                if iterator is None:
                    # The shard ended before the position asked for: nothing is left to read.
                    return {"Records": [], "NextShardIterator": None}, self._clock.monotonic()
                self._iterator = iterator
            await self._limiter.acquire()
            started = self._clock.monotonic()
            self.get_records_calls += 1
            try:
                response: Mapping[str, Any] = await self._kinesis.get_records(
                    ShardIterator=self._iterator, Limit=self.settings.max_records, **self._arn_ref
                )
                self._persistence.succeeded()
                return response, started
            except Exception as exc:
                # CancelledError is a BaseException and passes through untouched.
                error = classify(
                    exc, operation="GetRecords", stream=self.stream, shard_id=self.shard_id
                )
                error.__cause__ = exc
            if isinstance(error, ExpiredIteratorError):
                log.info(
                    "iterator of %s expired; resuming at %s", self.shard_id, self.resume_position
                )
                self._iterator = None
                renewals += 1
                if renewals <= self.settings.max_iterator_renewals:
                    continue
            await self._back_off(error)

    async def _back_off(self, error: AwsError) -> None:
        """Sleep before the next try, or raise ``error`` if waiting cannot fix it."""
        pause = self._persistence.pause(error)
        level = logging.DEBUG if self._persistence.failures < 3 else logging.WARNING
        log.log(
            level,
            "%s on %s failed %d times in a row (%s); retry in %.3fs",
            error.operation,
            self.shard_id,
            self._persistence.failures,
            error.code,
            pause,
        )
        if isinstance(error, ThrottledError) and error.operation == "GetRecords":
            self._events.emit(FetchThrottled, operation="GetRecords", delay=pause)
        await self._clock.sleep(pause)

    async def _new_iterator(self) -> str | None:
        params = {
            **stream_ref(self.stream),
            "ShardId": self.shard_id,
            **self.resume_position.iterator_params(),
        }
        while True:
            try:
                response = await self._kinesis.get_shard_iterator(**params)
            except Exception as exc:
                error = classify(
                    exc, operation="GetShardIterator", stream=self.stream, shard_id=self.shard_id
                )
                error.__cause__ = exc
                await self._back_off(error)
                continue
            iterator: str | None = response.get("ShardIterator")
            return iterator

    def _batch_from(self, response: Mapping[str, Any]) -> FetchedBatch:
        self._iterator = response.get("NextShardIterator")
        return batch_from_kinesis(
            response,
            shard_id=self.shard_id,
            stream_name=self._stream_name,
            shard_ended=self._iterator is None,
            build=self._build,
        )
