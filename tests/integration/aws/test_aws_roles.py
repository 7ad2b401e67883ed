"""A stream of another account, by ARN, through an assumed role: moto's STS hands out the
role's keys, moto's Kinesis serves the other account's streams to them only.

What reaches the server is read off the wire (the SigV4 ``Credential=`` of each request, by a
botocore ``before-send`` hook: observation, the request still goes out).
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import describe_stream_summary
from shardflow.aws.settings import AssumeRole
from shardflow.errors import (
    AssumeRoleError,
    InvalidStreamArnError,
    ResourceNotFoundError,
    StreamRegionMismatchError,
)
from shardflow.local import MotoServer
from support.accounts import OTHER_ACCOUNT, ROLE_ARN, other_account_stream

_CREDENTIAL = re.compile(r"Credential=([^/]+)/")


def access_keys_sent(client: Any) -> list[str]:
    """The access key id of every request ``client`` sends from now on (appended as sent)."""
    sent: list[str] = []

    def observe(request: Any, **_: Any) -> None:
        match = _CREDENTIAL.search(str(request.headers.get("Authorization", "")))
        if match:
            sent.append(match.group(1))

    client.meta.events.register("before-send", observe)
    return sent


async def test_a_stream_of_another_account_is_reached_by_arn_with_the_role(
    moto_url: str, stream_name: str
) -> None:
    other = other_account_stream(moto_url, stream_name)
    plain = ClientFactory(AwsSettings(endpoint_url=moto_url))
    async with plain.kinesis(other.arn) as kinesis:
        # The base credentials are of account 123456789012: the stream is not theirs.
        with pytest.raises(ResourceNotFoundError):
            await describe_stream_summary(kinesis, other.arn)

    role = AssumeRole(ROLE_ARN, session_name="orders-reader")
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url, role=role))
    async with factory.kinesis(other.arn) as kinesis:
        sent = access_keys_sent(kinesis)
        summary = await describe_stream_summary(kinesis, other.arn)
    assert summary["StreamARN"] == other.arn
    # Keys of a role STS issued (ASIA...), not the base key "testing".
    assert sent
    assert all(key.startswith("ASIA") for key in sent)


async def test_credentials_are_refreshed_before_they_expire_by_botocore(
    moto_url: str, stream_name: str
) -> None:
    other = other_account_stream(moto_url, stream_name)
    # 900 s credentials (STS's minimum) refreshed 899.5 s before expiry: half a second after
    # they are issued, the next call is in botocore's advisory window and fetches new ones.
    role = AssumeRole(ROLE_ARN, duration_seconds=900, refresh_before=899.5)
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url, role=role))
    async with factory.kinesis(other.arn) as kinesis:
        sent = access_keys_sent(kinesis)
        await describe_stream_summary(kinesis, other.arn)
        await asyncio.sleep(0.7)
        await describe_stream_summary(kinesis, other.arn)
        await describe_stream_summary(kinesis, other.arn)
    assert len(sent) == 3
    first, second, third = sent
    assert second != first, "no new credentials after the refresh window began"
    assert all(key.startswith("ASIA") for key in sent)
    # The new credentials are outside the window again: no AssumeRole on every call.
    assert third == second


async def test_default_window_keeps_the_credentials(moto_url: str, stream_name: str) -> None:
    other = other_account_stream(moto_url, stream_name)
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url, role=AssumeRole(ROLE_ARN)))
    async with factory.kinesis(other.arn) as kinesis:
        sent = access_keys_sent(kinesis)
        for _ in range(3):
            await describe_stream_summary(kinesis, other.arn)
    assert len(set(sent)) == 1


async def test_the_region_comes_from_the_arn_unless_one_is_set(
    moto_url: str, stream_name: str
) -> None:
    other = other_account_stream(moto_url, stream_name, region="eu-west-1")
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url, role=AssumeRole(ROLE_ARN)))
    async with factory.kinesis(other.arn) as kinesis:
        assert kinesis.meta.region_name == "eu-west-1"
        assert (await describe_stream_summary(kinesis, other.arn))["StreamARN"] == other.arn

    pinned = ClientFactory(AwsSettings(endpoint_url=moto_url, region="us-east-1"))
    with pytest.raises(StreamRegionMismatchError) as mismatch:
        async with pinned.kinesis(other.arn):
            pass
    assert (mismatch.value.arn_region, mismatch.value.configured) == ("eu-west-1", "us-east-1")

    with pytest.raises(InvalidStreamArnError, match="consumer"):
        async with factory.kinesis(other.arn + "/consumer/app:1"):
            pass


@pytest.fixture
def guarded_moto(tmp_path: Any) -> Iterator[tuple[str, dict[str, str]]]:
    """A moto server of its own that enforces IAM, with a user allowed nothing: its keys."""
    with MotoServer(log_dir=tmp_path) as server:
        url = server.endpoint_url
        iam = boto3.client("iam", endpoint_url=url)
        iam.create_user(UserName="nobody")
        key = iam.create_access_key(UserName="nobody")["AccessKey"]
        # From here on every call is authorized by IAM (the body: calls still let through).
        request = urllib.request.Request(
            f"{url}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200
        yield (
            url,
            {
                "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            },
        )


async def test_a_refused_role_is_a_typed_error_naming_the_role(
    guarded_moto: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, keys = guarded_moto
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    arn = f"arn:aws:kinesis:us-east-1:{OTHER_ACCOUNT}:stream/orders"
    factory = ClientFactory(AwsSettings(endpoint_url=url, role=AssumeRole(ROLE_ARN)))
    with pytest.raises(AssumeRoleError) as refused:
        async with factory.kinesis(arn):
            pass
    error = refused.value
    assert error.role_arn == ROLE_ARN
    assert error.code == "AccessDenied"
    assert ROLE_ARN in str(error)
    assert "trust policy" in str(error)
