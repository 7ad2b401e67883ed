"""Clients for a plain-HTTP endpoint (a local emulator) skip TLS set-up; HTTPS ones verify."""

from __future__ import annotations

import pytest

from shardflow.aws import AwsSettings, ClientFactory


@pytest.mark.parametrize(
    ("endpoint", "verified"),
    [
        ("http://127.0.0.1:4567", False),
        ("HTTP://localhost:1", False),
        ("https://kinesis.example", True),
    ],
)
async def test_tls_verification_only_where_there_is_tls(
    endpoint: str, verified: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    factory = ClientFactory(AwsSettings(endpoint_url=endpoint, region="us-east-1"))
    async with factory.kinesis() as kinesis:
        # aiobotocore keeps the setting on the client's HTTP session (no public accessor).
        assert bool(kinesis._endpoint.http_session._verify) is verified
