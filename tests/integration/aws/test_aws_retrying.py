"""`retrying` against moto through the fault proxy: recovery, attempt budget, fail-fast errors."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from shardflow.aws import AwsSettings, Backoff, ClientFactory, retrying
from shardflow.errors import (
    AccessDeniedError,
    ResourceNotFoundError,
    ThrottledError,
    TransientError,
)
from shardflow.testing.faults import THROTTLED, Delay, Drop, ErrorResponse, FaultProxy
from support.boto import make_stream, stored_records

FAST = Backoff(base=0.01, cap=0.05, max_attempts=5)


@pytest.fixture
def stream(moto_url: str, stream_name: str) -> str:
    make_stream(moto_url, stream_name, 1)
    return stream_name


@pytest.fixture
def proxy(moto_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url, seed=11) as proxy:
        yield proxy


@pytest.fixture
async def kinesis(proxy: FaultProxy) -> AsyncIterator[Any]:
    # A short read timeout so that injected delays turn into client read timeouts quickly.
    factory = ClientFactory(AwsSettings(endpoint_url=proxy.url, read_timeout=0.25))
    async with factory.kinesis() as client:
        yield client


def _records_in(moto_url: str, stream: str) -> list[bytes]:
    return [r["Data"] for _, r in stored_records(moto_url, stream)]


async def _put(kinesis: Any, stream: str, data: bytes, backoff: Backoff = FAST) -> Any:
    return await retrying(
        lambda: kinesis.put_record(StreamName=stream, Data=data, PartitionKey="k"),
        operation="PutRecord",
        stream=stream,
        backoff=backoff,
        rng=random.Random(5),
    )


@pytest.mark.parametrize(
    "fault",
    [
        ErrorResponse(THROTTLED),
        ErrorResponse("LimitExceededException"),
        ErrorResponse("InternalFailure"),
        ErrorResponse("ServiceUnavailable"),
        Drop(),
        Drop(reset=True),
        Delay(0.6),  # longer than read_timeout; the client gives up and nothing is written
    ],
    ids=lambda f: f"{type(f).__name__}-{getattr(f, 'code', '')}{getattr(f, 'reset', '')}",
)
async def test_recovers_from_transient_faults(
    fault: Any, proxy: FaultProxy, kinesis: Any, stream: str, moto_url: str
) -> None:
    rule = proxy.add(fault, operation="PutRecord", times=3)
    written = await _put(kinesis, stream, b"payload")
    assert written["SequenceNumber"]
    assert proxy.injected_count(rule) == 3
    assert proxy.forwarded("PutRecord") == 1
    # None of the faults forwarded the request: exactly one record is in the stream.
    assert _records_in(moto_url, stream) == [b"payload"]


async def test_read_timeouts_are_injected_as_timeouts(proxy: FaultProxy, kinesis: Any) -> None:
    proxy.add(Delay(0.6), operation="ListStreams", times=1)
    with pytest.raises(TransientError) as caught:
        await retrying(
            kinesis.list_streams, operation="ListStreams", backoff=Backoff(max_attempts=1)
        )
    assert caught.value.code == "ReadTimeoutError"
    await proxy.idle()
    [injection] = proxy.injected(kind="delay")
    assert injection.client_gone
    assert not injection.forwarded


@pytest.mark.parametrize(
    ("fault", "error_type", "code"),
    [
        (ErrorResponse(THROTTLED), ThrottledError, THROTTLED),
        (ErrorResponse("InternalFailure"), TransientError, "InternalFailure"),
        (Drop(), TransientError, "ConnectionClosedError"),
    ],
)
async def test_raises_the_typed_error_after_the_attempt_budget(
    fault: Any,
    error_type: type[Exception],
    code: str,
    proxy: FaultProxy,
    kinesis: Any,
    stream: str,
) -> None:
    rule = proxy.add(fault, operation="PutRecord")
    budget = Backoff(base=0.001, cap=0.005, max_attempts=4)
    with pytest.raises(error_type) as caught:
        await _put(kinesis, stream, b"never", backoff=budget)
    assert proxy.injected_count(rule) == 4
    assert getattr(caught.value, "code", None) == code
    assert stream in str(caught.value)


async def test_a_wrong_stream_name_fails_at_once_with_the_name(
    proxy: FaultProxy, kinesis: Any
) -> None:
    missing = "no-such-stream-here"
    with pytest.raises(ResourceNotFoundError) as caught:
        await retrying(
            lambda: kinesis.describe_stream_summary(StreamName=missing),
            operation="DescribeStreamSummary",
            stream=missing,
            backoff=FAST,
        )
    assert missing in str(caught.value)
    assert caught.value.code == "ResourceNotFoundException"
    assert proxy.forwarded("DescribeStreamSummary") == 1


async def test_access_denied_fails_at_once(proxy: FaultProxy, kinesis: Any, stream: str) -> None:
    rule = proxy.add(ErrorResponse("AccessDeniedException"), operation="PutRecord")
    with pytest.raises(AccessDeniedError) as caught:
        await _put(kinesis, stream, b"denied")
    assert proxy.injected_count(rule) == 1
    assert stream in str(caught.value)
    assert "not authorized" in str(caught.value)
