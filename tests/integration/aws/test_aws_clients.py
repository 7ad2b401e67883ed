"""ClientFactory builds clients from the standard AWS configuration (moto over HTTP).

Two fault proxies in front of the same moto server serve as two distinguishable endpoints:
each counts the requests it forwarded, which shows where a client really went.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from shardflow.aws import AwsSettings, ClientFactory, redact, retrying
from shardflow.aws.redaction import MASK
from shardflow.errors import AccessDeniedError
from shardflow.testing.faults import FaultProxy


@pytest.fixture
def endpoint_a(moto_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url) as proxy:
        yield proxy


@pytest.fixture
def endpoint_b(moto_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url) as proxy:
        yield proxy


async def _list_streams(factory: ClientFactory) -> list[str]:
    async with factory.kinesis() as kinesis:
        names: list[str] = (await kinesis.list_streams())["StreamNames"]
        return names


async def _list_tables(factory: ClientFactory) -> list[str]:
    async with factory.dynamodb() as dynamodb:
        tables: list[str] = (await dynamodb.list_tables())["TableNames"]
        return tables


async def test_endpoint_url_setting_is_used_for_every_service(
    endpoint_a: FaultProxy, endpoint_b: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The setting wins over the environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_b.url)
    factory = ClientFactory(AwsSettings(endpoint_url=endpoint_a.url))
    await _list_streams(factory)
    await _list_tables(factory)
    assert endpoint_a.forwarded("ListStreams") == 1
    assert endpoint_a.forwarded("ListTables") == 1
    assert endpoint_b.forwarded("ListStreams") == endpoint_b.forwarded("ListTables") == 0


async def test_aws_endpoint_url_variable_is_honoured(
    endpoint_a: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_a.url)
    factory = ClientFactory(AwsSettings())
    await _list_streams(factory)
    await _list_tables(factory)
    assert endpoint_a.forwarded("ListStreams") == 1
    assert endpoint_a.forwarded("ListTables") == 1


async def test_service_specific_endpoint_variables_win_over_the_general_one(
    endpoint_a: FaultProxy, endpoint_b: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_KINESIS", endpoint_a.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", endpoint_b.url)
    factory = ClientFactory(AwsSettings())
    await _list_streams(factory)
    await _list_tables(factory)
    assert (endpoint_a.forwarded("ListStreams"), endpoint_a.forwarded("ListTables")) == (1, 0)
    assert (endpoint_b.forwarded("ListStreams"), endpoint_b.forwarded("ListTables")) == (0, 1)


async def test_region_setting_selects_the_region(moto_url: str, stream_name: str) -> None:
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url, region="eu-west-3"))
    async with factory.kinesis() as kinesis:
        await kinesis.create_stream(StreamName=stream_name, ShardCount=1)
    # moto keeps regions apart, as AWS does.
    in_region = boto3.client("kinesis", endpoint_url=moto_url, region_name="eu-west-3")
    elsewhere = boto3.client("kinesis", endpoint_url=moto_url, region_name="us-east-1")
    assert stream_name in in_region.list_streams()["StreamNames"]
    assert stream_name not in elsewhere.list_streams()["StreamNames"]


@pytest.fixture
def aws_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A shared config and credentials file with one profile; env credentials removed."""
    values = {
        "profile": "shardflow-test",
        "region": "ap-southeast-2",
        "key_id": f"PROFILEKEY{uuid.uuid4().hex[:10].upper()}",
        "secret": f"profile-secret-{uuid.uuid4().hex}",
    }
    config = tmp_path / "config"
    config.write_text(f"[profile {values['profile']}]\nregion = {values['region']}\n")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[{values['profile']}]\naws_access_key_id = {values['key_id']}\n"
        f"aws_secret_access_key = {values['secret']}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    return values


async def test_profile_supplies_region_and_credentials(
    aws_files: dict[str, str], moto_url: str, stream_name: str
) -> None:
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url, profile=aws_files["profile"]))
    async with factory.kinesis() as kinesis:
        await kinesis.create_stream(StreamName=stream_name, ShardCount=1)
    in_region = boto3.client("kinesis", endpoint_url=moto_url, region_name=aws_files["region"])
    assert stream_name in in_region.list_streams()["StreamNames"]
    # The credentials the client resolved are the profile's: they are now masked everywhere.
    assert redact(aws_files["secret"]) == MASK
    assert redact(aws_files["key_id"]) == MASK


async def test_without_the_profile_there_are_no_credentials(
    aws_files: dict[str, str], moto_url: str
) -> None:
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url, region="us-east-1"))
    async with factory.kinesis() as kinesis:
        with pytest.raises(AccessDeniedError) as caught:
            await retrying(kinesis.list_streams, operation="ListStreams")
    assert caught.value.code == "NoCredentials"


def test_settings_reach_the_client_config() -> None:
    settings = AwsSettings(connect_timeout=1.5, read_timeout=2.5, max_pool_connections=7)
    config = ClientFactory(settings).config()
    assert config.connect_timeout == 1.5
    assert config.read_timeout == 2.5
    assert config.max_pool_connections == 7
    # shardflow retries on its own; the SDK makes one attempt.
    assert config.retries == {"total_max_attempts": 1, "mode": "standard"}
