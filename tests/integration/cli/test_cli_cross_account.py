"""``shardflow produce`` and ``shardflow tail`` on a stream of another account, by ARN, with
``--role-arn`` (moto's STS and Kinesis; the records checked with the other account's keys)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from shardflow.cli import app
from support.accounts import ROLE_ARN, other_account_stream, read_all


def test_produce_then_tail_another_accounts_stream(moto_url: str, stream_name: str) -> None:
    other = other_account_stream(moto_url, stream_name, shards=2, region="eu-west-1")
    lines = [json.dumps({"id": i, "user": f"u{i % 3}"}) for i in range(25)]
    role = ["--role-arn", ROLE_ARN, "--role-session-name", "cli-writer", "--external-id", "e-1"]

    produced = CliRunner().invoke(
        app,
        ["produce", other.arn, "--endpoint-url", moto_url, "--key-field", "user", *role],
        input="\n".join(lines) + "\n",
    )
    assert produced.exit_code == 0, produced.output
    assert sorted(d.decode() for _, d in read_all(other.kinesis, stream_name)) == sorted(lines)

    tailed = CliRunner().invoke(
        app, ["tail", other.arn, "--endpoint-url", moto_url, "--format", "json", *role]
    )
    assert tailed.exit_code == 0, tailed.output
    payloads = sorted(json.loads(line)["data"] for line in tailed.stdout.splitlines())
    assert payloads == sorted(lines)


def test_without_the_role_the_stream_is_not_found(moto_url: str, stream_name: str) -> None:
    other = other_account_stream(moto_url, stream_name)
    result = CliRunner().invoke(app, ["tail", other.arn, "--endpoint-url", moto_url])
    assert result.exit_code == 1
    assert "not found" in result.output


def test_a_malformed_arn_or_another_region_is_one_line(moto_url: str) -> None:
    bad = CliRunner().invoke(
        app, ["tail", "arn:aws:kinesis:eu-west-1:1234:stream/s", "--endpoint-url", moto_url]
    )
    assert bad.exit_code == 1
    assert "not a Kinesis stream ARN" in bad.output
    assert "Traceback" not in bad.output
    arn = "arn:aws:kinesis:eu-west-1:222222222222:stream/s"
    other = CliRunner().invoke(
        app, ["tail", arn, "--endpoint-url", moto_url, "--region", "us-east-1"]
    )
    assert other.exit_code == 1
    assert "is in region eu-west-1" in other.output


def test_role_options_without_a_role_are_a_usage_error(moto_url: str) -> None:
    result = CliRunner().invoke(
        app, ["tail", "s", "--endpoint-url", moto_url, "--external-id", "x"]
    )
    assert result.exit_code == 2
    assert "need --role-arn" in result.output
