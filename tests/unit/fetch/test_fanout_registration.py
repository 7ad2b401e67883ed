"""Consumer registration paths the emulator cannot show (slow creation, deletion in progress),
against a small fake of the consumer API and a stepping clock."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from shardflow.errors import ResourceInUseError, ResourceNotFoundError, ThrottledError
from shardflow.fetch.registration import (
    StreamConsumer,
    deregister_consumer,
    describe_consumer,
    register_consumer,
)
from support.clocks import SteppingClock

STREAM_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"


def aws_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "Op")


class FakeConsumers:
    """One stream's consumers; each describe call moves a consumer one status step along."""

    def __init__(self, clock: SteppingClock) -> None:
        self.clock = clock
        self.status: dict[str, str] = {}
        self.steps: dict[str, list[str]] = {}
        self.calls: list[str] = []
        self.register_errors: list[Exception] = []

    def _describe(self, name: str) -> dict[str, Any]:
        return {
            "ConsumerName": name,
            "ConsumerARN": f"{STREAM_ARN}/consumer/{name}:1",
            "ConsumerStatus": self.status[name],
            "StreamARN": STREAM_ARN,
        }

    async def register_stream_consumer(self, StreamARN: str, ConsumerName: str) -> dict[str, Any]:
        self.calls.append("register")
        if self.register_errors:
            raise self.register_errors.pop(0)
        if ConsumerName in self.status:
            raise aws_error("ResourceInUseException")
        self.status[ConsumerName] = "CREATING"
        self.steps[ConsumerName] = ["CREATING", "ACTIVE"]
        return {"Consumer": self._describe(ConsumerName)}

    async def describe_stream_consumer(self, **params: Any) -> dict[str, Any]:
        self.calls.append("describe")
        name = params.get("ConsumerName") or params["ConsumerARN"].split("/consumer/")[1][:-2]
        if name not in self.status:
            raise aws_error("ResourceNotFoundException")
        steps = self.steps.get(name) or []
        if steps:
            following = steps.pop(0)
            if following == "GONE":
                del self.status[name]
                raise aws_error("ResourceNotFoundException")
            self.status[name] = following
        return {"ConsumerDescription": self._describe(name)}

    async def deregister_stream_consumer(self, ConsumerARN: str) -> dict[str, Any]:
        self.calls.append("deregister")
        name = ConsumerARN.split("/consumer/")[1][:-2]
        if name not in self.status:
            raise aws_error("ResourceNotFoundException")
        self.status[name] = "DELETING"
        self.steps[name] = ["DELETING", "GONE"]
        return {}


async def test_a_new_consumer_is_waited_for_until_active() -> None:
    clock = SteppingClock(start=0.0)
    fake = FakeConsumers(clock)
    consumer = await register_consumer(fake, STREAM_ARN, "app", clock=clock)
    assert consumer.is_active
    assert consumer.arn == f"{STREAM_ARN}/consumer/app:1"
    assert fake.calls == ["register", "describe", "describe"]


async def test_an_existing_consumer_is_reused() -> None:
    clock = SteppingClock(start=0.0)
    fake = FakeConsumers(clock)
    fake.status["app"] = "ACTIVE"
    consumer = await register_consumer(fake, STREAM_ARN, "app", clock=clock)
    assert consumer.is_active
    assert fake.calls == ["register", "describe"]


async def test_a_consumer_being_deleted_is_registered_again_once_gone() -> None:
    clock = SteppingClock(start=0.0)
    fake = FakeConsumers(clock)
    fake.status["app"] = "DELETING"
    fake.steps["app"] = ["DELETING", "GONE"]
    consumer = await register_consumer(fake, STREAM_ARN, "app", clock=clock)
    assert consumer.is_active
    assert fake.calls.count("register") == 3  # in use, in use (deleting), then created anew
    assert clock.now > 0


async def test_throttled_registration_is_retried_then_raised() -> None:
    clock = SteppingClock(start=0.0)
    fake = FakeConsumers(clock)
    fake.register_errors = [aws_error("LimitExceededException")]
    assert (await register_consumer(fake, STREAM_ARN, "app", clock=clock)).is_active
    fake.register_errors = [aws_error("LimitExceededException")] * 20
    with pytest.raises(ThrottledError):
        await register_consumer(fake, STREAM_ARN, "other", clock=clock)


async def test_a_consumer_that_never_becomes_active_is_given_up() -> None:
    clock = SteppingClock(start=0.0)
    fake = FakeConsumers(clock)
    fake.status["app"] = "CREATING"
    fake.steps["app"] = ["CREATING"] * 1000
    with pytest.raises(ResourceInUseError, match="to become ACTIVE"):
        await register_consumer(fake, STREAM_ARN, "app", max_wait=10.0, clock=clock)
    assert 10.0 <= clock.now < 13.0


async def test_deregistering_waits_until_gone_and_tolerates_absence() -> None:
    clock = SteppingClock(start=0.0)
    fake = FakeConsumers(clock)
    fake.status["app"] = "ACTIVE"
    consumer = StreamConsumer("app", f"{STREAM_ARN}/consumer/app:1", STREAM_ARN, "ACTIVE")
    await deregister_consumer(fake, consumer, clock=clock)
    assert "app" not in fake.status
    await deregister_consumer(fake, consumer, clock=clock)  # already gone
    with pytest.raises(ResourceNotFoundError):
        await describe_consumer(fake, consumer_arn=consumer.arn, clock=clock)
