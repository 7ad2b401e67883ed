"""Backoff bounds and jitter, and the retry loop's decisions (no servers: calls are coroutines)."""

from __future__ import annotations

import random

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from shardflow.aws import Backoff, retrying
from shardflow.errors import (
    AccessDeniedError,
    ExpiredIteratorError,
    ResourceNotFoundError,
    ThrottledError,
    TransientError,
)


def _client_error(code: str, status: int = 400, operation: str = "PutRecords") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} happened"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


@pytest.mark.parametrize("attempt", range(12))
def test_delay_stays_within_the_exponential_ceiling(attempt: int) -> None:
    backoff = Backoff(base=0.05, cap=2.0)
    rng = random.Random(attempt)
    ceiling = min(2.0, 0.05 * 2**attempt)
    delays = [backoff.delay(attempt, rng) for _ in range(500)]
    assert all(0.0 <= d <= ceiling for d in delays)
    # Full jitter: the waits spread over the whole range, not bunched near the ceiling.
    assert min(delays) < ceiling * 0.1
    assert max(delays) > ceiling * 0.9


def test_delay_is_capped_even_for_huge_attempt_numbers() -> None:
    backoff = Backoff(base=1.0, cap=3.0)
    rng = random.Random(1)
    assert all(backoff.delay(10_000, rng) <= 3.0 for _ in range(200))


def test_same_seed_gives_same_delays_and_other_seeds_differ() -> None:
    backoff = Backoff()
    first = [backoff.delay(n, random.Random(42)) for n in range(8)]
    again = [backoff.delay(n, random.Random(42)) for n in range(8)]
    other = [backoff.delay(n, random.Random(43)) for n in range(8)]
    assert first == again
    assert first != other


class _Script:
    """A call that fails with the given exceptions in turn, then returns ``result``."""

    def __init__(self, *failures: BaseException, result: str = "ok") -> None:
        self.failures = list(failures)
        self.calls = 0
        self.result = result

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.result


class _Sleeps:
    def __init__(self) -> None:
        self.pauses: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)


async def test_retryable_failures_are_retried_with_jittered_pauses() -> None:
    call = _Script(
        _client_error("ProvisionedThroughputExceededException"),
        _client_error("InternalFailure", 500),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    )
    sleeps = _Sleeps()
    backoff = Backoff(base=0.1, cap=1.0, max_attempts=5)
    result = await retrying(
        call, operation="PutRecords", backoff=backoff, sleep=sleeps, rng=random.Random(3)
    )
    assert result == "ok"
    assert call.calls == 4
    assert len(sleeps.pauses) == 3
    for attempt, pause in enumerate(sleeps.pauses):
        assert 0.0 <= pause <= min(1.0, 0.1 * 2**attempt)
    # The pauses are the backoff's own draws from the injected generator.
    rng = random.Random(3)
    assert sleeps.pauses == [backoff.delay(n, rng) for n in range(3)]


async def test_gives_up_after_the_attempt_budget_with_the_typed_error() -> None:
    failures = [_client_error("ProvisionedThroughputExceededException") for _ in range(10)]
    call = _Script(*failures)
    sleeps = _Sleeps()
    with pytest.raises(ThrottledError) as caught:
        await retrying(
            call,
            operation="PutRecords",
            stream="orders",
            backoff=Backoff(max_attempts=4),
            sleep=sleeps,
            rng=random.Random(0),
        )
    assert call.calls == 4
    assert len(sleeps.pauses) == 3
    assert caught.value.code == "ProvisionedThroughputExceededException"
    assert caught.value.stream == "orders"
    assert isinstance(caught.value.__cause__, ClientError)


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        ("ResourceNotFoundException", ResourceNotFoundError),
        ("AccessDeniedException", AccessDeniedError),
        # Repeating a call with the same expired iterator can never succeed.
        ("ExpiredIteratorException", ExpiredIteratorError),
    ],
)
async def test_errors_a_retry_cannot_fix_are_raised_at_once(
    code: str, error_type: type[Exception]
) -> None:
    call = _Script(_client_error(code), result="never")
    sleeps = _Sleeps()
    with pytest.raises(error_type) as caught:
        await retrying(call, operation="GetRecords", stream="clicks", sleep=sleeps)
    assert call.calls == 1
    assert sleeps.pauses == []
    assert "clicks" in str(caught.value)


async def test_an_already_typed_error_is_raised_as_it_is() -> None:
    original = TransientError("boom", operation="ListShards")
    call = _Script(*[original] * 3)
    with pytest.raises(TransientError) as caught:
        await retrying(
            call, operation="ListShards", backoff=Backoff(max_attempts=2), sleep=_Sleeps()
        )
    assert caught.value is original
    assert caught.value.__cause__ is not original


async def test_a_single_attempt_budget_means_no_retry() -> None:
    call = _Script(_client_error("InternalFailure", 500))
    with pytest.raises(TransientError):
        await retrying(
            call, operation="PutRecords", backoff=Backoff(max_attempts=1), sleep=_Sleeps()
        )
    assert call.calls == 1
