"""The enhanced fan-out fetcher: batches of one shard pushed by SubscribeToShard.

One subscription is an HTTP response that streams events for at most five minutes: records
as they arrive, and an empty event about every five seconds while there are none. The fetcher
subscribes at its start position, hands out each event as a :class:`FetchedBatch`, and
subscribes again after the last event's ``ContinuationSequenceNumber`` (AFTER_SEQUENCE_NUMBER)
before the service ends the subscription, and after failures.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from shardflow.aws.classify import classify
from shardflow.aws.clients import ClientFactory
from shardflow.aws.kinesis import stream_name_of
from shardflow.aws.persistence import DEFAULT_DENIED_FOR, Patience, Persistence
from shardflow.backoff import Backoff
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.errors import AwsError, ResourceInUseError, ThrottledError, TransientError
from shardflow.events import (
    SILENT,
    FetchThrottled,
    RenewalReason,
    ShardEmitter,
    SubscriptionRenewed,
)
from shardflow.fetch.batch import FetchedBatch, batch_from_kinesis
from shardflow.fetch.eventstream import tolerate_missing_initial_response
from shardflow.fetch.pacing import SubscriptionPacer, shared_pacer
from shardflow.fetch.shard_end import shard_end_at
from shardflow.fetch.subscription import Lapse, Subscription, starting_position
from shardflow.positions import StartPosition
from shardflow.records import RecordBuilder, build_record

log = logging.getLogger("shardflow.fetch")

SUBSCRIPTION_LIFETIME = 300.0
"""Kinesis ends every SubscribeToShard subscription after five minutes."""

HEARTBEAT_INTERVAL = 5.0
"""Kinesis sends an event at least this often on a subscription, records or not."""

_LAPSE_REASONS: dict[Lapse, RenewalReason] = {
    Lapse.RENEW: "renew_due",
    Lapse.CLOSED: "closed",
    Lapse.SILENT: "silent",
}


@dataclass(frozen=True, slots=True)
class FanOut:
    """Fetch by enhanced fan-out (SubscribeToShard), with its settings.

    Pass it as ``ConsumerSettings(fetch=FanOut(...))``: the consumer registers the stream
    consumer ``consumer_name`` at start. A :class:`FanOutFetcher` uses the subscription
    settings only (it is handed the registered consumer's ARN). Failures that may pass are
    retried for as long as the fetcher is used (its owner stops it when the lease is lost),
    never a fixed number of times (see :mod:`shardflow.aws.persistence`); backoffs count
    consecutive failures since the last event received, and only their ``base`` and ``cap``
    matter.
    """

    consumer_name: str | None = None
    """The registered stream consumer (default: the consumer's application name)."""
    deregister_on_stop: bool = False
    """Deregister the stream consumer when the consumer stops (default: keep it for the next
    run; registering takes seconds and counts against a per-stream limit)."""
    renew_after: float = 270.0
    """A subscription this old is replaced by a new one at the next read (the service would
    end it at five minutes)."""
    event_timeout: float = 30.0
    """While waiting for an event, this much silence (no records and no heartbeat) means the
    connection is dead: subscribe again. Must exceed the 5 s heartbeat."""
    read_timeout: float = 60.0
    """The HTTP read timeout :func:`fanout_client` gives the client. Must exceed the 5 s
    heartbeat."""
    in_use_backoff: Backoff = field(
        default_factory=lambda: Backoff(base=0.5, cap=5.0, max_attempts=None)
    )
    """Pauses after ResourceInUse, the answer while the previous subscription of the
    consumer-shard is still active (within ~5 s of it)."""
    throttle_backoff: Backoff = field(
        default_factory=lambda: Backoff(base=0.5, cap=10.0, max_attempts=None)
    )
    """Pauses after LimitExceeded."""
    error_backoff: Backoff = field(
        default_factory=lambda: Backoff(base=0.2, cap=5.0, max_attempts=None)
    )
    """Pauses after 5xx, network failures, silent or empty subscriptions."""
    denied_for: float = DEFAULT_DENIED_FOR
    """How long access denied (or expired credentials) is retried before it is raised; a
    missing stream or consumer is raised at once."""

    def __post_init__(self) -> None:
        if self.consumer_name is not None and not self.consumer_name:
            raise ValueError("consumer_name must not be empty (None: the application name)")
        if not 0 < self.renew_after < SUBSCRIPTION_LIFETIME:
            raise ValueError(f"renew_after must be within 0..{SUBSCRIPTION_LIFETIME:.0f}s")
        for name in ("event_timeout", "read_timeout"):
            if getattr(self, name) <= HEARTBEAT_INTERVAL:
                raise ValueError(f"{name} must exceed the {HEARTBEAT_INTERVAL:.0f}s heartbeat")
        if self.denied_for < 0:
            raise ValueError("denied_for must not be negative")


def fanout_client(
    factory: ClientFactory,
    settings: FanOut | None = None,
    *,
    shards: int = 0,
    stream: str | None = None,
) -> AbstractAsyncContextManager[Any]:
    """A Kinesis client fit for subscriptions: ``async with fanout_client(factory) as kinesis``.

    Its read timeout outlasts the gap between events, and its connection pool holds one
    connection per subscribed shard (``shards``) besides those for other calls: a subscription
    keeps its connection for minutes, and a pool that is too small would stall new ones.
    ``stream``: the stream it subscribes to (its region and role, see ``ClientFactory.client``).
    """
    read_timeout = (settings or FanOut()).read_timeout
    pool = max(factory.settings.max_pool_connections, shards + 16)
    client: AbstractAsyncContextManager[Any] = factory.kinesis(
        stream=stream, read_timeout=read_timeout, max_pool_connections=pool
    )
    return client


class FanOutFetcher:
    """An async iterator of :class:`FetchedBatch` for one shard, by enhanced fan-out.

    Each SubscribeToShardEvent becomes one batch (records not deaggregated, heartbeats as
    empty batches with ``millis_behind_latest``); the event that ends a closed shard gives the
    last batch, with ``shard_ended=True`` and its ``child_shards``, and iteration stops.

    Nothing is read ahead: the next event is read from the connection only when asked for.
    While the caller is busy, the connection's buffers fill up and the service is held back
    by flow control; a slow caller is never a reason to fail. Its subscription may have been
    ended meanwhile, or be older than ``renew_after``: either way the fetcher subscribes again
    after the last event handed out, and nothing is lost or repeated.

    Subscriptions start through ``pacer`` (shared by the process unless given). Non-retryable
    failures (ResourceNotFound, AccessDenied, InvalidArgument) are raised typed; others are
    retried with backoff. Call :meth:`aclose` (or use ``async with``) to release the connection
    when stopping before the shard's end. One reader per fetcher.

    ``events`` (the shard's emitter) hears of every throttled SubscribeToShard that is retried
    (:class:`~shardflow.events.FetchThrottled`, with its delay) and of every subscription that
    took over from an earlier one (:class:`~shardflow.events.SubscriptionRenewed`: where it
    resumed and why the earlier one ended), once it delivered its first event.

    ``consumer_arn`` is the ARN of a registered consumer (see
    :func:`~shardflow.fetch.registration.register_consumer`); ``kinesis`` an
    aiobotocore client, best made with :func:`fanout_client`.

    ``closed_shard_check`` is for emulators whose subscriptions never end a closed shard
    (kinesis-local sends neither the final event nor ChildShards): when set, an empty event
    at the tip triggers, at most every so many seconds, a GetRecords probe at the
    continuation; a probe that finds the shard's end ends it as Kinesis would. Leave it None
    for Kinesis.
    """

    def __init__(
        self,
        kinesis: Any,
        stream: str,
        shard_id: str,
        start: StartPosition | None = None,
        settings: FanOut | None = None,
        *,
        consumer_arn: str,
        pacer: SubscriptionPacer | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        events: ShardEmitter = SILENT,
        closed_shard_check: float | None = None,
        build: RecordBuilder = build_record,
    ) -> None:
        self._build = build
        if closed_shard_check is not None and closed_shard_check <= 0:
            raise ValueError("closed_shard_check must be positive")
        self._closed_shard_check = closed_shard_check
        self._kinesis = kinesis
        self.stream = stream
        self.shard_id = shard_id
        self.consumer_arn = consumer_arn
        self.start = start or StartPosition.trim_horizon()
        self.settings = settings or FanOut()
        self._stream_name = stream_name_of(stream)
        self._pacer = pacer or (
            shared_pacer() if clock is SYSTEM_CLOCK else SubscriptionPacer(clock=clock)
        )
        self._clock = clock
        self._rng = rng
        self._events = events
        tolerate_missing_initial_response(kinesis)
        self._subscription: Subscription | None = None
        self._subscribed_at = self.start
        self._last_working_ended: RenewalReason | None = None
        self._continuation: str | None = None
        self._last_delivered: str | None = None
        self._ended = False
        self._closed = False
        self._failures: dict[str, int] = {}
        self._persistence = Persistence(
            Patience(denied_for=self.settings.denied_for), clock=clock, rng=rng
        )
        self._returned_at: float | None = None
        self._last_check = float("-inf")
        self.subscriptions = 0
        """SubscribeToShard calls that returned an event stream."""
        self.renewals = 0
        """Subscriptions replaced because they reached ``renew_after``."""

    # --- position --------------------------------------------------------------------------

    @property
    def last_sequence_number(self) -> str | None:
        """Sequence number of the last record handed out, if any."""
        return self._last_delivered

    @property
    def continuation_sequence_number(self) -> str | None:
        """ContinuationSequenceNumber of the last event handed out, if any."""
        return self._continuation

    @property
    def resume_position(self) -> StartPosition:
        """Where reading would start again: after the last event handed out (its continuation
        sequence number, which moves on even through stretches without records)."""
        if self._continuation is not None:
            return StartPosition.after_sequence_number(self._continuation)
        return self.start

    @property
    def ended(self) -> bool:
        """True once the shard-end batch has been handed out."""
        return self._ended

    # --- iteration -------------------------------------------------------------------------

    def __aiter__(self) -> FanOutFetcher:
        return self

    async def __anext__(self) -> FetchedBatch:
        if self._ended or self._closed:
            raise StopAsyncIteration
        called = self._clock.monotonic()
        while True:
            if self._subscription is None:
                self._subscription = await self._subscribe()
            subscription = self._subscription
            try:
                outcome = await subscription.next_event(
                    self._clock,
                    renew_at=subscription.started + self.settings.renew_after,
                    event_timeout=self.settings.event_timeout,
                )
            except asyncio.CancelledError:
                # The event iterator was interrupted mid-read: unusable.
                self._drop_because(subscription, "interrupted")
                raise
            if isinstance(outcome, Lapse):
                await self._after_lapse(subscription, outcome)
                continue
            if isinstance(outcome, Exception):
                self._drop_because(subscription, "failed")
                await self._after_failure(outcome, called)
                continue
            self._failures.clear()
            self._persistence.succeeded()
            if subscription.received == 1:
                self._report_renewal()
            if "SubscribeToShardEvent" not in outcome:
                log.debug(
                    "ignoring an event of another type on %s: %s", self.shard_id, list(outcome)
                )
                continue
            batch = await self._hand_out(outcome["SubscribeToShardEvent"])
            self._returned_at = self._clock.monotonic()
            return batch

    async def aclose(self) -> None:
        """End the current subscription and stop iterating (the position is kept)."""
        self._closed = True
        self._drop()

    async def __aenter__(self) -> FanOutFetcher:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- subscriptions ---------------------------------------------------------------------

    async def _subscribe(self) -> Subscription:
        """A new subscription at the resume position, paced and retried."""
        while True:
            await self._pacer.acquire(self.consumer_arn, self.shard_id)
            position = self.resume_position
            try:
                answer = await self._kinesis.subscribe_to_shard(
                    ConsumerARN=self.consumer_arn,
                    ShardId=self.shard_id,
                    StartingPosition=starting_position(position),
                )
            except Exception as exc:
                await self._back_off(exc)
                continue
            self.subscriptions += 1
            self._subscribed_at = position
            log.debug("subscribed to %s at %s", self.shard_id, position)
            return Subscription(answer["EventStream"], self._clock.monotonic())

    def _drop_because(self, subscription: Subscription, reason: RenewalReason) -> None:
        self._drop()
        if subscription.received:
            self._last_working_ended = reason

    def _report_renewal(self) -> None:
        """The current subscription delivered its first event: if one delivered before it,
        this one renewed it. (Counted only now: kinesis-local refuses a subscription inside its
        stream, and a refused subscription is no renewal.)"""
        if self._last_working_ended is not None:
            self._events.emit(
                SubscriptionRenewed,
                consumer_name=consumer_name_of(self.consumer_arn),
                position=str(self._subscribed_at),
                reason=self._last_working_ended,
            )

    async def _after_lapse(self, subscription: Subscription, lapse: Lapse) -> None:
        self._drop_because(subscription, _LAPSE_REASONS[lapse])
        if lapse is Lapse.RENEW:
            self.renewals += 1
            log.debug("renewing the subscription to %s at %s", self.shard_id, self.resume_position)
            return
        if lapse is Lapse.CLOSED and subscription.received:
            log.debug(
                "subscription to %s ended; resubscribing at %s", self.shard_id, self.resume_position
            )
            return
        # Silence, or a stream that ended without a single event: a failure, so that a server
        # that keeps doing it is eventually reported rather than retried forever.
        await self._back_off(
            TransientError(
                f"subscription {lapse.value}",
                operation="SubscribeToShard",
                code="SubscriptionLapsed",
                stream=self.stream,
                shard_id=self.shard_id,
            )
        )

    async def _after_failure(self, exc: Exception, called: float) -> None:
        if (
            self._returned_at is not None
            and called - self._returned_at > self.settings.event_timeout
        ):
            # The caller was busy for a long time: the service may have ended the subscription
            # meanwhile. Expected, not alarming: read again from the last event handed out.
            log.info(
                "subscription to %s was lost while the caller was busy for %.0fs (%s); "
                "resubscribing at %s",
                self.shard_id,
                called - self._returned_at,
                type(exc).__name__,
                self.resume_position,
            )
        await self._back_off(exc)

    async def _back_off(self, exc: Exception) -> None:
        """Sleep before the next subscription attempt, or raise the failure typed if waiting
        cannot fix it."""
        error = classify(
            exc, operation="SubscribeToShard", stream=self.stream, shard_id=self.shard_id
        )
        try:
            self._persistence.judge(error)  # the delays are per kind here
        except AwsError:
            self._raise(error, exc)
        kind, backoff = self._policy(error)
        attempt = self._failures.get(kind, 0)
        self._failures[kind] = attempt + 1
        pause = backoff.delay(attempt, self._rng)
        log.debug(
            "subscription to %s failed (%s); retry in %.3fs", self.shard_id, error.code, pause
        )
        if kind == "throttled":
            self._events.emit(FetchThrottled, operation="SubscribeToShard", delay=pause)
        await self._clock.sleep(pause)

    def _policy(self, error: AwsError) -> tuple[str, Backoff]:
        if isinstance(error, ResourceInUseError):
            return "in_use", self.settings.in_use_backoff
        if isinstance(error, ThrottledError):
            return "throttled", self.settings.throttle_backoff
        return "error", self.settings.error_backoff

    def _raise(self, error: AwsError, exc: Exception) -> None:
        self._drop()
        if error is exc:
            raise error
        raise error from exc

    def _drop(self) -> None:
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    # --- events ----------------------------------------------------------------------------

    async def _hand_out(self, body: Mapping[str, Any]) -> FetchedBatch:
        continuation = body.get("ContinuationSequenceNumber")
        batch = batch_from_kinesis(
            body,
            shard_id=self.shard_id,
            stream_name=self._stream_name,
            # Only the event after a closed shard's last record lacks a continuation.
            shard_ended=continuation is None,
            build=self._build,
        )
        if batch.records:
            self._last_delivered = batch.last_sequence_number
        if continuation is not None:
            self._continuation = continuation
            if batch.caught_up and self._check_due():
                batch = await self._check_shard_end(batch)
        if batch.shard_ended:
            self._ended = True
            self._drop()
        return batch

    def _check_due(self) -> bool:
        interval = self._closed_shard_check
        if interval is None or self._clock.monotonic() - self._last_check < interval:
            return False
        self._last_check = self._clock.monotonic()
        return True

    async def _check_shard_end(self, batch: FetchedBatch) -> FetchedBatch:
        """``batch`` as the shard's last one if GetRecords finds the shard ended right here."""
        children = await shard_end_at(
            self._kinesis, self.stream, self.shard_id, self.resume_position
        )
        if children is None:
            return batch
        log.info(
            "shard %s ended (found by GetRecords); children %s",
            self.shard_id,
            [c.shard_id for c in children],
        )
        return FetchedBatch(
            shard_id=self.shard_id,
            records=batch.records,
            millis_behind_latest=batch.millis_behind_latest,
            shard_ended=True,
            child_shards=children,
        )


def consumer_name_of(consumer_arn: str) -> str:
    """The stream consumer's name in its ARN (``...:stream/NAME/consumer/CONSUMER:EPOCH``)."""
    _, _, tail = consumer_arn.rpartition("/consumer/")
    name, _, _ = tail.rpartition(":")
    return name or tail
