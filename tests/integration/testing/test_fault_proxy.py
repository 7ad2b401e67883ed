"""The fault proxy itself, in front of moto and kinesis-local, spoken to with boto3/aiobotocore."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.testing.faults import (
    INTERNAL_FAILURE,
    THROTTLED,
    Delay,
    Drop,
    ErrorResponse,
    FaultProxy,
    PartialFailure,
)
from support.boto import make_stream, stored_records


def _client(endpoint: str, service: str = "kinesis", read_timeout: float = 5.0) -> Any:
    # One attempt: every fault the proxy injects reaches the test.
    config = Config(retries={"total_max_attempts": 1}, read_timeout=read_timeout)
    return boto3.client(service, endpoint_url=endpoint, config=config)


def _read_all(endpoint: str, stream: str) -> list[bytes]:
    return sorted(r["Data"] for _, r in stored_records(endpoint, stream))


def _entries(count: int) -> list[dict[str, Any]]:
    return [{"Data": f"r{i}".encode(), "PartitionKey": f"key-{i}"} for i in range(count)]


@pytest.fixture
def stream(moto_url: str, stream_name: str) -> str:
    make_stream(moto_url, stream_name, 2)
    return stream_name


@pytest.fixture
def proxy(moto_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url, seed=3) as proxy:
        yield proxy


def test_partial_failure_writes_only_the_entries_reported_written(
    proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    proxy.add(PartialFailure(indices=frozenset({0, 3, 4})), times=1)
    answer = _client(proxy.url).put_records(StreamName=stream, Records=_entries(6))
    codes = [r.get("ErrorCode") for r in answer["Records"]]
    assert codes == [THROTTLED, None, None, THROTTLED, THROTTLED, None]
    assert answer["FailedRecordCount"] == 3
    for result in answer["Records"]:
        if "ErrorCode" in result:
            assert result["ErrorMessage"].startswith("Rate exceeded for shard shardId-")
            assert f"in stream {stream} under account 123456789012" in result["ErrorMessage"]
        else:
            assert result["ShardId"].startswith("shardId-")
            assert result["SequenceNumber"]
    assert _read_all(moto_url, stream) == [b"r1", b"r2", b"r5"]
    [injection] = proxy.injections
    assert (injection.kind, injection.entries, injection.failed_entries, injection.forwarded) == (
        "partial_failure",
        6,
        (0, 3, 4),
        True,
    )


def test_partial_failure_by_fraction_is_repeatable_with_a_seed(moto_url: str, stream: str) -> None:
    chosen = []
    for _ in range(2):
        with FaultProxy(moto_url, seed=99) as proxy:
            proxy.add(PartialFailure(fraction=0.25, code=INTERNAL_FAILURE))
            answer = _client(proxy.url).put_records(StreamName=stream, Records=_entries(20))
            failed = [i for i, r in enumerate(answer["Records"]) if "ErrorCode" in r]
            assert answer["FailedRecordCount"] == len(failed) == 5
            assert {answer["Records"][i]["ErrorCode"] for i in failed} == {INTERNAL_FAILURE}
            assert proxy.injections[0].failed_entries == tuple(failed)
            chosen.append(failed)
    assert chosen[0] == chosen[1]
    assert len(_read_all(moto_url, stream)) == 2 * 15


def test_when_every_entry_fails_nothing_is_forwarded(
    proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    proxy.add(PartialFailure(fraction=1.0), times=1)
    answer = _client(proxy.url).put_records(StreamName=stream, Records=_entries(4))
    assert answer["FailedRecordCount"] == 4
    assert proxy.forwarded("PutRecords") == 0
    assert not proxy.injections[0].forwarded
    assert _read_all(moto_url, stream) == []


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (THROTTLED, 400),
        ("LimitExceededException", 400),
        (INTERNAL_FAILURE, 500),
        ("ServiceUnavailable", 503),
        ("ExpiredIteratorException", 400),
        ("AccessDeniedException", 400),
        ("ResourceNotFoundException", 400),
    ],
)
def test_error_responses_are_genuine(
    code: str, status: int, proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    proxy.add(ErrorResponse(code), operation="PutRecord", times=1)
    with pytest.raises(ClientError) as caught:
        _client(proxy.url).put_record(StreamName=stream, Data=b"x", PartitionKey="k")
    response = caught.value.response
    assert response["Error"]["Code"] == code
    assert response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert response["Error"]["Message"]
    assert response["ResponseMetadata"]["HTTPHeaders"]["content-type"] == (
        "application/x-amz-json-1.1"
    )
    assert _read_all(moto_url, stream) == []  # instead of forwarding


def test_error_after_forwarding_writes_but_reports_failure(
    proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    proxy.add(ErrorResponse(INTERNAL_FAILURE, after_forwarding=True), operation="PutRecord")
    with pytest.raises(ClientError):
        _client(proxy.url).put_record(StreamName=stream, Data=b"ambiguous", PartitionKey="k")
    assert _read_all(moto_url, stream) == [b"ambiguous"]
    assert proxy.injections[0].forwarded


@pytest.mark.parametrize("after_forwarding", [False, True])
def test_dropped_connections(
    after_forwarding: bool, proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    proxy.add(Drop(after_forwarding=after_forwarding), operation="PutRecord", times=1)
    with pytest.raises(ConnectionClosedError):
        _client(proxy.url).put_record(StreamName=stream, Data=b"dropped", PartitionKey="k")
    assert _read_all(moto_url, stream) == ([b"dropped"] if after_forwarding else [])


@pytest.mark.parametrize("after_forwarding", [False, True])
def test_delays_cause_read_timeouts(
    after_forwarding: bool, proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    proxy.add(Delay(0.8, after_forwarding=after_forwarding), operation="PutRecord", times=1)
    with pytest.raises(ReadTimeoutError):
        _client(proxy.url, read_timeout=0.2).put_record(
            StreamName=stream, Data=b"late", PartitionKey="k"
        )
    proxy.wait_idle()
    [injection] = proxy.injections
    assert injection.client_gone
    assert injection.forwarded is after_forwarding
    assert _read_all(moto_url, stream) == ([b"late"] if after_forwarding else [])


def test_a_short_delay_only_slows_the_answer(proxy: FaultProxy, stream: str) -> None:
    proxy.add(Delay(0.3), operation="PutRecord", times=1)
    started = time.monotonic()
    _client(proxy.url).put_record(StreamName=stream, Data=b"slow", PartitionKey="k")
    assert time.monotonic() - started >= 0.3


def test_skip_times_and_probability_bound_the_faults(proxy: FaultProxy, stream: str) -> None:
    client = _client(proxy.url)
    rule = proxy.add(ErrorResponse(THROTTLED), operation="PutRecord", skip=2, times=3)
    outcomes = []
    for _ in range(8):
        try:
            client.put_record(StreamName=stream, Data=b"x", PartitionKey="k")
            outcomes.append("ok")
        except ClientError:
            outcomes.append("throttled")
    assert outcomes == ["ok", "ok", "throttled", "throttled", "throttled", "ok", "ok", "ok"]
    assert proxy.injected_count(rule) == 3

    proxy.clear()
    sometimes = proxy.add(ErrorResponse(THROTTLED), operation="PutRecord", probability=0.5)
    for _ in range(40):
        with contextlib.suppress(ClientError):
            client.put_record(StreamName=stream, Data=b"x", PartitionKey="k")
    assert 8 <= proxy.injected_count(sometimes) <= 32


def test_rules_match_operation_service_and_stream(
    proxy: FaultProxy, stream: str, moto_url: str, stream_name: str
) -> None:
    other = f"{stream_name}-other"
    _client(moto_url).create_stream(StreamName=other, ShardCount=1)
    proxy.add(ErrorResponse(THROTTLED), stream=other)
    kinesis = _client(proxy.url)
    kinesis.put_record(StreamName=stream, Data=b"x", PartitionKey="k")
    kinesis.list_streams()  # names no stream: untouched
    with pytest.raises(ClientError):
        kinesis.describe_stream_summary(StreamName=other)
    # Kinesis rules leave DynamoDB on the same port alone; a DynamoDB rule answers like DynamoDB.
    dynamodb = _client(proxy.url, service="dynamodb")
    dynamodb.list_tables()
    proxy.add(ErrorResponse(THROTTLED), service="DynamoDB", operation="ListTables", times=1)
    with pytest.raises(ClientError) as caught:
        dynamodb.list_tables()
    assert caught.value.response["Error"]["Code"] == THROTTLED
    assert "provisioned throughput" in caught.value.response["Error"]["Message"]
    assert [i.operation for i in proxy.injections] == ["DescribeStreamSummary", "ListTables"]


def test_dynamodb_passes_through_unchanged(proxy: FaultProxy, moto_url: str) -> None:
    table = f"proxy-pass-{time.monotonic_ns()}"
    dynamodb = _client(proxy.url, service="dynamodb")
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    item = {"k": {"S": "one"}, "v": {"B": bytes(range(256))}}
    dynamodb.put_item(TableName=table, Item=item)
    direct = _client(moto_url, service="dynamodb").get_item(TableName=table, Key={"k": item["k"]})
    proxied = dynamodb.get_item(TableName=table, Key={"k": item["k"]})
    assert direct["Item"] == proxied["Item"] == item
    assert proxy.forwarded("GetItem") == 1


def test_latency_holds_requests_of_one_service_and_counts_per_table(
    proxy: FaultProxy, stream: str
) -> None:
    table = f"proxy-latency-{time.monotonic_ns()}"
    dynamodb = _client(proxy.url, service="dynamodb")
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )

    def took(call: Any) -> float:
        began = time.perf_counter()
        call()
        return time.perf_counter() - began

    def get() -> None:
        dynamodb.get_item(TableName=table, Key={"k": {"S": "x"}})

    kinesis = _client(proxy.url)
    proxy.set_latency(0.2, 0.25, service="DynamoDB")
    held = took(get)
    other = took(lambda: kinesis.describe_stream_summary(StreamName=stream))
    proxy.set_latency(0)
    after = took(get)
    assert held >= 0.2
    assert max(other, after) < 0.2
    assert proxy.forwarded_to(table) == 3  # CreateTable and two GetItems
    assert proxy.forwarded_to(stream) == 1
    assert proxy.injections == []  # latency is not a fault
    with pytest.raises(ValueError, match="latency must satisfy"):
        proxy.set_latency(0.3, 0.1)


def test_rules_can_change_from_another_thread_while_running(proxy: FaultProxy, stream: str) -> None:
    client = _client(proxy.url)
    stop = threading.Event()
    errors: list[str] = []

    def hammer() -> None:
        while not stop.is_set():
            try:
                client.put_record(StreamName=stream, Data=b"x", PartitionKey="k")
            except ClientError as exc:
                errors.append(exc.response["Error"]["Code"])

    worker = threading.Thread(target=hammer)
    worker.start()
    try:
        for _ in range(5):
            rule = proxy.add(ErrorResponse(INTERNAL_FAILURE), operation="PutRecord", times=2)
            deadline = time.monotonic() + 5
            while proxy.injected_count(rule) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            proxy.remove(rule)
    finally:
        stop.set()
        worker.join(10)
    assert errors == [INTERNAL_FAILURE] * 10
    assert len(proxy.injections) == 10


async def test_runs_on_the_callers_event_loop(moto_url: str, stream: str) -> None:
    async with FaultProxy(moto_url) as proxy:
        proxy.add(PartialFailure(indices=frozenset({1})), times=1)
        factory = ClientFactory(AwsSettings(endpoint_url=proxy.url))
        async with factory.kinesis() as kinesis:
            answer = await kinesis.put_records(StreamName=stream, Records=_entries(3))
        assert [r.get("ErrorCode") for r in answer["Records"]] == [None, THROTTLED, None]
        assert answer["FailedRecordCount"] == 1
    with pytest.raises(RuntimeError):
        _ = proxy.url  # stopped


async def test_event_streams_are_relayed_chunk_by_chunk(
    kinesis_local_url: str, stream_name: str
) -> None:
    kinesis = _client(kinesis_local_url)
    kinesis.create_stream(StreamName=stream_name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(
        StreamName=stream_name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    arn = kinesis.describe_stream_summary(StreamName=stream_name)["StreamDescriptionSummary"][
        "StreamARN"
    ]
    consumer = kinesis.register_stream_consumer(StreamARN=arn, ConsumerName="proxy-test")
    consumer_arn = consumer["Consumer"]["ConsumerARN"]
    for _ in range(100):
        status = kinesis.describe_stream_consumer(ConsumerARN=consumer_arn)
        if status["ConsumerDescription"]["ConsumerStatus"] == "ACTIVE":
            break
        await asyncio.sleep(0.05)
    kinesis.put_record(StreamName=stream_name, Data=b"through-the-proxy", PartitionKey="k")

    with FaultProxy(kinesis_local_url) as proxy:
        body = json.dumps(
            {
                "ConsumerARN": consumer_arn,
                "ShardId": "shardId-000000000000",
                "StartingPosition": {"Type": "TRIM_HORIZON"},
            }
        ).encode()
        # kinesis-local wants signed requests; botocore signs, aiohttp reads the stream.
        request = AWSRequest(
            "POST",
            proxy.url + "/",
            data=body,
            headers={
                "X-Amz-Target": "Kinesis_20131202.SubscribeToShard",
                "Content-Type": "application/x-amz-json-1.1",
            },
        )
        SigV4Auth(Credentials("testing", "testing"), "kinesis", "us-east-1").add_auth(request)
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.url + "/", data=body, headers=dict(request.headers)) as answer,
        ):
            assert answer.status == 200
            assert answer.headers["Content-Type"] == "application/vnd.amazon.eventstream"
            # The upstream keeps the stream open for minutes: events only arrive here if the
            # proxy relays them as they come instead of waiting for the end.
            received = b""
            while b"SubscribeToShardEvent" not in received:
                received += await asyncio.wait_for(answer.content.readany(), 5)
            assert b"dGhyb3VnaC10aGUtcHJveHk=" in received  # base64 of the record's data
        await proxy.idle()
