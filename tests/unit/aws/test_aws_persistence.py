"""Persistence: what passes is retried without end, what cannot pass is raised."""

from __future__ import annotations

import random

import pytest

from shardflow.aws.backoff import Backoff
from shardflow.aws.persistence import Patience, Persistence
from shardflow.errors import (
    AccessDeniedError,
    AwsError,
    ExpiredIteratorError,
    InvalidArgumentError,
    ResourceInUseError,
    ResourceNotFoundError,
    ThrottledError,
    TransientError,
)
from support.clocks import SteppingClock

PASSING = [TransientError, ThrottledError, ExpiredIteratorError, ResourceInUseError]


@pytest.mark.parametrize("error_type", PASSING)
def test_errors_that_pass_are_retried_forever_with_capped_delays(
    error_type: type[AwsError],
) -> None:
    policy = Patience(
        throttle_backoff=Backoff(base=0.5, cap=4.0), error_backoff=Backoff(base=0.1, cap=2.0)
    )
    persistence = Persistence(policy, clock=SteppingClock(), rng=random.Random(1))
    delays = [persistence.pause(error_type("boom")) for _ in range(10_000)]
    cap = 4.0 if error_type is ThrottledError else 2.0
    assert max(delays) <= cap
    assert max(delays[-100:]) > cap / 2  # still backing off near the cap, not giving up
    assert persistence.failures == 10_000


@pytest.mark.parametrize("error_type", [ResourceNotFoundError, InvalidArgumentError, AwsError])
def test_errors_that_cannot_pass_are_raised_at_once(error_type: type[AwsError]) -> None:
    error = error_type("gone")
    with pytest.raises(error_type) as raised:
        Persistence(clock=SteppingClock()).pause(error)
    assert raised.value is error


def test_access_denied_is_retried_for_denied_for_seconds_then_raised() -> None:
    clock = SteppingClock()
    persistence = Persistence(Patience(denied_for=60.0), clock=clock)
    denied = AccessDeniedError("ExpiredTokenException")
    persistence.pause(denied)
    clock.now += 59.0
    persistence.pause(denied)
    clock.now += 1.0
    with pytest.raises(AccessDeniedError):
        persistence.pause(denied)


def test_a_success_or_another_error_restarts_the_patience_for_access_denied() -> None:
    clock = SteppingClock()
    persistence = Persistence(Patience(denied_for=60.0), clock=clock)
    denied = AccessDeniedError("denied")
    persistence.pause(denied)
    clock.now += 50.0
    persistence.succeeded()
    persistence.pause(denied)
    clock.now += 50.0
    persistence.pause(TransientError("500"))
    persistence.pause(denied)
    clock.now += 50.0
    persistence.pause(denied)
    assert persistence.failures == 4


def test_a_success_restarts_the_backoff() -> None:
    persistence = Persistence(
        Patience(error_backoff=Backoff(base=1.0, cap=100.0)), rng=random.Random(3)
    )
    for _ in range(6):
        persistence.pause(TransientError("500"))
    persistence.succeeded()
    assert persistence.failures == 0
    assert persistence.pause(TransientError("500")) <= 1.0
