"""Stream ARNs, regions from them, roles per stream, and routing calls by stream."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from shardflow.aws.arns import parse_stream_arn, stream_region
from shardflow.aws.routing import StreamRoutedKinesis
from shardflow.aws.settings import AssumeRole, AwsSettings
from shardflow.errors import InvalidStreamArnError, StreamRegionMismatchError

ARN = "arn:aws:kinesis:eu-west-1:222222222222:stream/orders"
ROLE = "arn:aws:iam::222222222222:role/reader"


def test_a_stream_arn_parts() -> None:
    parsed = parse_stream_arn(ARN)
    assert (parsed.partition, parsed.region, parsed.account, parsed.name) == (
        "aws",
        "eu-west-1",
        "222222222222",
        "orders",
    )
    assert str(parsed) == ARN
    assert parse_stream_arn("arn:aws-us-gov:kinesis:us-gov-west-1:123456789012:stream/a.b_c-d")


@pytest.mark.parametrize(
    ("arn", "problem"),
    [
        ("arn:aws:kinesis:eu-west-1:222222222222", "six"),
        ("arn:aws:sqs:eu-west-1:222222222222:stream/orders", "not kinesis"),
        ("arn:aws:kinesis::222222222222:stream/orders", "region"),
        ("arn:aws:kinesis:eu-west-1:2222:stream/orders", "12-digit"),
        ("arn:aws:kinesis:eu-west-1:222222222222:table/orders", "stream/NAME"),
        ("arn:aws:kinesis:eu-west-1:222222222222:stream/orders/consumer/app:1", "consumer"),
        ("arn:aws:kinesis:eu-west-1:222222222222:stream/or ders", "not a valid name"),
        ("arn:foo:kinesis:eu-west-1:222222222222:stream/orders", "partition"),
    ],
)
def test_a_malformed_arn_says_what_is_wrong(arn: str, problem: str) -> None:
    with pytest.raises(InvalidStreamArnError, match=problem) as raised:
        parse_stream_arn(arn)
    assert raised.value.arn == arn


def test_the_region_is_the_arns_unless_configured_and_must_agree() -> None:
    assert stream_region(ARN, None) == "eu-west-1"
    assert stream_region(ARN, "eu-west-1") == "eu-west-1"
    assert stream_region("orders", None) is None
    assert stream_region("orders", "us-east-1") == "us-east-1"
    with pytest.raises(StreamRegionMismatchError, match="us-east-1"):
        stream_region(ARN, "us-east-1")


def test_roles_per_stream_before_the_default_role() -> None:
    default, own = AssumeRole(ROLE), AssumeRole(ROLE, session_name="orders")
    settings = AwsSettings(role=default, stream_roles={ARN: own, "clicks": own})
    assert settings.role_for(ARN) == own
    assert settings.role_for("clicks") == own
    assert settings.role_for("arn:aws:kinesis:eu-west-1:222222222222:stream/clicks") == own
    assert settings.role_for("other") == default
    assert settings.role_for(None) == default
    assert AwsSettings().role_for(ARN) is None
    # Settings are dictionary keys (Spark keeps clients per settings) and cross to executors.
    assert hash(settings) == hash(AwsSettings(role=default, stream_roles={"clicks": own, ARN: own}))
    assert pickle.loads(pickle.dumps(settings)) == settings
    with pytest.raises(InvalidStreamArnError):
        AwsSettings(stream_roles={"arn:aws:kinesis:nowhere": own})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"role_arn": "reader"}, "not a role ARN"),
        ({"role_arn": ROLE, "duration_seconds": 600}, "900"),
        ({"role_arn": ROLE, "session_name": "x"}, "2 to 64"),
        ({"role_arn": ROLE, "refresh_before": 3600.0}, "refresh_before"),
    ],
)
def test_a_bad_role_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AssumeRole(**kwargs)


def test_the_refresh_window_fits_the_duration() -> None:
    assert AssumeRole(ROLE).refresh_window == 900.0  # botocore's 15 minutes
    assert AssumeRole(ROLE, duration_seconds=900).refresh_window == 300.0
    assert AssumeRole(ROLE, refresh_before=60.0).refresh_window == 60.0


class Recorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[str] = []

    async def list_shards(self, **params: Any) -> str:
        self.calls.append("ListShards")
        return self.name

    async def get_records(self, **params: Any) -> str:
        return self.name


async def test_calls_go_to_the_client_of_the_stream_they_name() -> None:
    own, other = Recorder("own"), Recorder("other")
    routed: Any = StreamRoutedKinesis({"clicks": own, ARN: other})
    assert await routed.list_shards(StreamName="clicks") == "own"
    assert await routed.list_shards(StreamARN=ARN) == "other"
    assert await routed.list_shards(ConsumerARN=f"{ARN}/consumer/app:1") == "other"
    # No stream named: the first client (fetchers are handed their stream's own client).
    assert await routed.get_records(ShardIterator="x") == "own"
