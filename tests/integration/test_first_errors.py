"""Mistakes of a first hour name their fix (issue 14, 5), against moto's server."""

from __future__ import annotations

import subprocess
import sys

import boto3
import pytest

from shardflow import AwsSettings, Consumer, ResourceNotFoundError
from shardflow.aws import ClientFactory
from shardflow.errors import MissingRegionError, UnknownRegionError

SHARDFLOW = [sys.executable, "-m", "shardflow"]


async def test_a_consumer_on_a_missing_stream_names_it_and_leaves_nothing(
    moto_url: str, stream_name: str
) -> None:
    consumer = Consumer(stream_name, f"{stream_name}-app", aws=AwsSettings(endpoint_url=moto_url))
    with pytest.raises(ResourceNotFoundError) as raised:
        await consumer.consume(lambda record: None)
    assert f"stream {stream_name!r} not found in region us-east-1" in str(raised.value)
    tables = boto3.client("dynamodb", endpoint_url=moto_url).list_tables()["TableNames"]
    assert f"{stream_name}-app" not in tables


async def test_no_region_is_a_typed_error_naming_the_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(MissingRegionError, match=r"AWS_REGION.*AWS_DEFAULT_REGION"):
        async with ClientFactory().kinesis():
            pass


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SHARDFLOW, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_cli_mistakes_are_one_line_and_debug_shows_the_traceback(moto_url: str) -> None:
    missing = _cli("leases", "no-such-app", "--endpoint-url", moto_url)
    assert missing.returncode == 1
    assert "lease table 'no-such-app' not found in region us-east-1" in missing.stderr
    assert "Traceback" not in missing.stderr
    debug = _cli("--debug", "leases", "no-such-app", "--endpoint-url", moto_url)
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr


def test_cli_on_a_stopped_local_stack_suggests_its_status() -> None:
    refused = _cli("stream", "list", "--endpoint-url", "http://127.0.0.1:9")
    assert refused.returncode == 1
    assert "shardflow local status" in refused.stderr


async def test_a_region_typo_against_the_local_stack_is_a_typed_error_naming_it(
    moto_url: str,
) -> None:
    # moto's server answers every call in a region it does not know with a 500 HTML page.
    aws = AwsSettings(region="us-est-1", endpoint_url=moto_url)
    async with ClientFactory(aws).kinesis() as kinesis:
        with pytest.raises(UnknownRegionError) as raised:
            await kinesis.list_streams()
    error = raised.value
    assert (error.region, error.retryable) == ("us-est-1", False)
    assert error.closest == ("us-east-1", "us-west-1")
    assert "region 'us-est-1'" in str(error)
    assert "did you mean us-east-1 or us-west-1?" in str(error)
    assert "<html" not in str(error).lower()
    async with ClientFactory(AwsSettings(endpoint_url=moto_url)).kinesis() as kinesis:
        await kinesis.list_streams()  # a known region: nothing changes


def test_cli_region_typo_names_the_region_not_an_html_page(moto_url: str) -> None:
    done = _cli("stream", "list", "--region", "eu-wst-1", "--endpoint-url", moto_url)
    assert done.returncode == 1
    assert "region 'eu-wst-1'" in done.stderr
    assert "did you mean eu-west-1?" in done.stderr
    assert "<html" not in done.stderr.lower()
    assert len(done.stderr.strip().splitlines()) == 1
