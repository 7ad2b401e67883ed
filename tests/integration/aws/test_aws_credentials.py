"""Credentials never show in shardflow's errors or logs, whatever goes wrong.

The client takes a distinctive fake key pair from a temporary credentials file. Failures of
every class are provoked against moto (directly, or injected by the fault proxy, including a
server that echoes the credentials in its error message) and every error text and every
shardflow log line at DEBUG level is searched for the key id and the secret.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from shardflow.aws import AwsSettings, Backoff, ClientFactory, redact, retrying
from shardflow.aws.kinesis import list_shards
from shardflow.aws.redaction import MASK
from shardflow.errors import (
    AccessDeniedError,
    AwsError,
    ConditionFailedError,
    ExpiredIteratorError,
    InvalidArgumentError,
    ResourceInUseError,
    ResourceNotFoundError,
    ThrottledError,
    TransientError,
)
from shardflow.testing.faults import THROTTLED, Delay, Drop, ErrorResponse, FaultProxy

BUDGET = Backoff(base=0.001, cap=0.005, max_attempts=3)


@pytest.fixture
def fake_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    # Shaped unlike AWS key ids, so only the factory's registration can mask them.
    key_id = f"SFKEY{uuid.uuid4().hex[:14].upper()}"
    secret = f"sf/Fake+Secret{uuid.uuid4().hex}"
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {key_id}\naws_secret_access_key = {secret}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    return key_id, secret


async def test_credentials_never_appear_in_errors_or_logs(
    fake_credentials: tuple[str, str],
    moto_url: str,
    stream_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key_id, secret = fake_credentials
    caplog.set_level(logging.DEBUG, logger="shardflow")
    boto3.client("kinesis", endpoint_url=moto_url).create_stream(
        StreamName=stream_name, ShardCount=1
    )
    table = f"{stream_name}-leases"
    boto3.client("dynamodb", endpoint_url=moto_url).create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )

    errors: list[AwsError] = []
    with FaultProxy(moto_url) as proxy:
        factory = ClientFactory(AwsSettings(endpoint_url=proxy.url, read_timeout=0.2))
        async with factory.kinesis() as kinesis, factory.dynamodb() as dynamodb:

            async def expect(
                error_type: type[AwsError], call: Callable[[], Awaitable[Any]], operation: str
            ) -> None:
                with pytest.raises(error_type) as caught:
                    await retrying(call, operation=operation, stream=stream_name, backoff=BUDGET)
                errors.append(caught.value)

            def put() -> Awaitable[Any]:
                return kinesis.put_record(StreamName=stream_name, Data=b"x", PartitionKey="k")

            echo = (
                f"The request signature we calculated does not match. Credential={key_id}/"
                f"20240101/us-east-1/kinesis/aws4_request, secret {secret}, key {key_id}"
            )
            for fault, error_type in [
                (ErrorResponse(THROTTLED), ThrottledError),
                (ErrorResponse("InternalFailure"), TransientError),
                (ErrorResponse("ServiceUnavailable"), TransientError),
                (ErrorResponse("AccessDeniedException"), AccessDeniedError),
                (ErrorResponse("InvalidSignatureException", message=echo), AccessDeniedError),
                (ErrorResponse("SomeUnknownCode", message=echo), AwsError),
                (Drop(), TransientError),
                (Drop(reset=True), TransientError),
                (Delay(0.5), TransientError),
            ]:
                rule = proxy.add(fault, operation="PutRecord")
                await expect(error_type, put, "PutRecord")
                proxy.remove(rule)

            iterator = (
                await kinesis.get_shard_iterator(
                    StreamName=stream_name,
                    ShardId="shardId-000000000000",
                    ShardIteratorType="TRIM_HORIZON",
                )
            )["ShardIterator"]
            proxy.add(ErrorResponse("ExpiredIteratorException"), operation="GetRecords")
            await expect(
                ExpiredIteratorError,
                lambda: kinesis.get_records(ShardIterator=iterator),
                "GetRecords",
            )
            # Real answers of moto.
            await expect(
                ResourceNotFoundError,
                lambda: kinesis.describe_stream_summary(StreamName=f"{stream_name}-missing"),
                "DescribeStreamSummary",
            )
            await expect(
                ResourceInUseError,
                lambda: kinesis.create_stream(StreamName=stream_name, ShardCount=1),
                "CreateStream",
            )
            await expect(
                InvalidArgumentError,
                lambda: kinesis.put_record(StreamName=stream_name, Data=b"x"),
                "PutRecord",
            )
            item = {"leaseKey": {"S": "shardId-000000000000"}}
            await dynamodb.put_item(TableName=table, Item=item)
            await expect(
                ConditionFailedError,
                lambda: dynamodb.put_item(
                    TableName=table, Item=item, ConditionExpression="attribute_not_exists(leaseKey)"
                ),
                "PutItem",
            )
            with pytest.raises(ResourceNotFoundError) as listing:
                await list_shards(kinesis, f"{stream_name}-missing")
            errors.append(listing.value)
        await proxy.idle()

    async with ClientFactory(AwsSettings(endpoint_url="http://127.0.0.1:9")).kinesis() as nowhere:
        await expect_unreachable(nowhere, errors)

    # The key pair was really in use, and every class of failure was seen.
    assert redact(f"{key_id} {secret}") == f"{MASK} {MASK}"
    assert len(errors) == 16
    logged = caplog.text
    assert "retry" in logged  # the retry loop did log at DEBUG
    for error in errors:
        for text in (str(error), repr(error), error.args[0]):
            assert key_id not in text
            assert secret not in text
    assert key_id not in logged
    assert secret not in logged


async def expect_unreachable(kinesis: Any, errors: list[AwsError]) -> None:
    with pytest.raises(TransientError) as caught:
        await retrying(kinesis.list_streams, operation="ListStreams", backoff=BUDGET)
    assert caught.value.code == "EndpointConnectionError"
    errors.append(caught.value)
