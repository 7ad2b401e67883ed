"""Registered stream consumers for enhanced fan-out: register or reuse, wait, deregister.

An application registers one consumer per stream (up to 20 per stream) and subscribes to
every shard through it. Registering is idempotent here: a consumer of the same name that
exists already is reused (Kinesis answers ResourceInUseException), one being deleted is waited
out and registered again, and the call returns only once the consumer is ACTIVE.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Final

from shardflow.aws.classify import classify
from shardflow.aws.kinesis import describe_stream_summary
from shardflow.backoff import Backoff
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.errors import AwsError, ResourceInUseError, ResourceNotFoundError

log = logging.getLogger("shardflow.fetch")

ACTIVE: Final = "ACTIVE"
CREATING: Final = "CREATING"
DELETING: Final = "DELETING"

DEFAULT_REGISTRATION_TIMEOUT = 120.0
"""Seconds to wait for a consumer to become ACTIVE (or to be gone) before giving up."""

# Throttling (RegisterStreamConsumer: 5 calls/s per account; DescribeStreamConsumer: 20/s)
# and transient failures are retried this often; ResourceInUse is an answer, not a failure.
_CALL_BACKOFF = Backoff(base=0.2, cap=3.0, max_attempts=8)
# Status polls start fast (emulators are quick) and slow down to spare the account's limits.
_FIRST_POLL = 0.1
_MAX_POLL = 2.0


@dataclass(frozen=True, slots=True)
class StreamConsumer:
    """A consumer registered with a stream, as DescribeStreamConsumer describes it."""

    name: str
    arn: str
    stream_arn: str
    status: str
    created_at: datetime | None = None

    @property
    def is_active(self) -> bool:
        return self.status == ACTIVE

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], *, stream_arn: str = "") -> StreamConsumer:
        """From RegisterStreamConsumer's ``Consumer`` or DescribeStreamConsumer's description."""
        return cls(
            name=raw["ConsumerName"],
            arn=raw["ConsumerARN"],
            stream_arn=raw.get("StreamARN", stream_arn),
            status=raw["ConsumerStatus"],
            created_at=raw.get("ConsumerCreationTimestamp"),
        )


async def stream_arn_of(kinesis: Any, stream: str) -> str:
    """The ARN of a stream given by name or ARN (raises ResourceNotFoundError if it is absent)."""
    if stream.startswith("arn:"):
        return stream
    summary = await describe_stream_summary(kinesis, stream)
    arn: str = summary["StreamARN"]
    return arn


async def describe_consumer(
    kinesis: Any,
    *,
    consumer_arn: str | None = None,
    stream_arn: str = "",
    name: str = "",
    clock: Clock = SYSTEM_CLOCK,
) -> StreamConsumer:
    """One consumer by ARN, or by stream ARN and name; ResourceNotFoundError if it is absent."""
    params = (
        {"ConsumerARN": consumer_arn}
        if consumer_arn
        else {"StreamARN": stream_arn, "ConsumerName": name}
    )
    answer = await _call(
        "DescribeStreamConsumer",
        lambda: kinesis.describe_stream_consumer(**params),
        stream_arn,
        clock,
    )
    return StreamConsumer.from_api(answer["ConsumerDescription"], stream_arn=stream_arn)


async def register_consumer(
    kinesis: Any,
    stream: str,
    name: str,
    *,
    max_wait: float = DEFAULT_REGISTRATION_TIMEOUT,
    clock: Clock = SYSTEM_CLOCK,
) -> StreamConsumer:
    """The ACTIVE consumer ``name`` of ``stream`` (name or ARN), registered if it does not exist.

    Reuses an existing consumer of that name; waits while it is being created, and if it is
    being deleted, waits until it is gone and registers it anew. Raises ResourceNotFoundError
    for a missing stream, ThrottledError when the stream has its 20 consumers already (after
    retries), and ResourceInUseError if the consumer is not ACTIVE within ``max_wait`` seconds.
    """
    stream_arn = await stream_arn_of(kinesis, stream)
    deadline = clock.monotonic() + max_wait
    poll = _Poll(clock, deadline, f"consumer {name} of {stream_arn}")
    while True:
        try:
            answer = await _call(
                "RegisterStreamConsumer",
                lambda: kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=name),
                stream_arn,
                clock,
            )
            consumer = StreamConsumer.from_api(answer["Consumer"], stream_arn=stream_arn)
            log.info("registered consumer %s (%s)", name, consumer.arn)
            break
        except ResourceInUseError:
            existing = await _existing(kinesis, stream_arn, name, clock)
        if existing is not None and existing.status != DELETING:
            consumer = existing
            log.info("reusing consumer %s (%s, %s)", name, consumer.arn, consumer.status)
            break
        # Being deleted, or the stream itself is busy (updating): ask again shortly.
        await poll.wait("to be registered")
    while not consumer.is_active:
        await poll.wait("to become ACTIVE")
        consumer = await describe_consumer(
            kinesis, consumer_arn=consumer.arn, stream_arn=stream_arn, clock=clock
        )
    return consumer


async def deregister_consumer(
    kinesis: Any,
    consumer: StreamConsumer,
    *,
    wait: bool = True,
    max_wait: float = DEFAULT_REGISTRATION_TIMEOUT,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Deregister ``consumer`` (its subscriptions end); with ``wait``, until it is gone.

    A consumer that is already gone is fine. One still being created is waited for first.
    """
    deadline = clock.monotonic() + max_wait
    poll = _Poll(clock, deadline, f"consumer {consumer.name} ({consumer.arn})")
    while True:
        try:
            await _call(
                "DeregisterStreamConsumer",
                lambda: kinesis.deregister_stream_consumer(ConsumerARN=consumer.arn),
                consumer.stream_arn,
                clock,
            )
            log.info("deregistered consumer %s (%s)", consumer.name, consumer.arn)
            break
        except ResourceNotFoundError:
            return
        except ResourceInUseError:
            await poll.wait("to finish being created or deleted")
    while wait:
        try:
            await describe_consumer(
                kinesis, consumer_arn=consumer.arn, stream_arn=consumer.stream_arn, clock=clock
            )
        except ResourceNotFoundError:
            return
        await poll.wait("to be gone")


class ConsumerRegistration:
    """``async with ConsumerRegistration(kinesis, stream, name) as consumer:`` — registered (or
    reused) on entry; deregistered on exit only if ``deregister_on_exit`` (other workers of the
    same application usually share the consumer and keep using it)."""

    def __init__(
        self,
        kinesis: Any,
        stream: str,
        name: str,
        *,
        deregister_on_exit: bool = False,
        max_wait: float = DEFAULT_REGISTRATION_TIMEOUT,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._kinesis = kinesis
        self.stream = stream
        self.name = name
        self.deregister_on_exit = deregister_on_exit
        self._max_wait = max_wait
        self._clock = clock
        self.consumer: StreamConsumer | None = None

    async def __aenter__(self) -> StreamConsumer:
        self.consumer = await register_consumer(
            self._kinesis, self.stream, self.name, max_wait=self._max_wait, clock=self._clock
        )
        return self.consumer

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.deregister_on_exit and self.consumer is not None:
            await deregister_consumer(
                self._kinesis, self.consumer, wait=False, max_wait=self._max_wait, clock=self._clock
            )


# --- helpers ---------------------------------------------------------------------------------


async def _existing(
    kinesis: Any, stream_arn: str, name: str, clock: Clock
) -> StreamConsumer | None:
    try:
        return await describe_consumer(kinesis, stream_arn=stream_arn, name=name, clock=clock)
    except ResourceNotFoundError:
        return None


class _Poll:
    """Growing pauses between status checks, up to a deadline (then ResourceInUseError)."""

    def __init__(self, clock: Clock, deadline: float, what: str) -> None:
        self._clock = clock
        self._deadline = deadline
        self._what = what
        self._pause = _FIRST_POLL

    async def wait(self, purpose: str) -> None:
        remaining = self._deadline - self._clock.monotonic()
        if remaining <= 0:
            raise ResourceInUseError(f"gave up waiting for {self._what} {purpose}", code="Timeout")
        await self._clock.sleep(min(self._pause, remaining))
        self._pause = min(self._pause * 2, _MAX_POLL)


async def _call(
    operation: str, call: Callable[[], Awaitable[dict[str, Any]]], stream: str, clock: Clock
) -> dict[str, Any]:
    """``call``, retrying throttling and transient failures; other failures raised typed at once
    (ResourceInUse included: for these operations it says something about the consumer)."""
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            error: AwsError = classify(exc, operation=operation, stream=stream or None)
            retry = error.retryable and not isinstance(error, ResourceInUseError)
            attempt += 1
            if not retry or not _CALL_BACKOFF.allows(attempt):
                if error is exc:
                    raise
                raise error from exc
        await clock.sleep(_CALL_BACKOFF.delay(attempt - 1))
