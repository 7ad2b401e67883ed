"""The connection options of source and sink: the stream ARN, its region, the role."""

from __future__ import annotations

import pytest

from shardflow.aws.settings import AssumeRole
from shardflow.errors import SparkOptionError
from shardflow.spark.connection import stream_connection

ARN = "arn:aws:kinesis:eu-west-1:222222222222:stream/orders"
ROLE = "arn:aws:iam::222222222222:role/reader"


def test_role_options_become_the_role_of_the_stream() -> None:
    connection = stream_connection(
        {
            "streamARN": ARN,
            "roleArn": ROLE,
            "rolesessionname": "nightly",  # Spark lower-cases keys
            "externalId": "e-1",
            "roleDurationSeconds": "1800",
        }
    )
    role = AssumeRole(ROLE, session_name="nightly", external_id="e-1", duration_seconds=1800)
    assert connection.role == role
    settings = connection.aws_settings()
    assert settings.role == role
    assert settings.region == "eu-west-1"  # from the ARN


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"streamName": "s", "externalId": "e"}, "externalId"),
        ({"streamName": "s", "roleArn": "reader"}, "roleArn"),
        ({"streamName": "s", "roleArn": ROLE, "roleDurationSeconds": "60"}, "roleDurationSeconds"),
        ({"streamName": "s", "roleArn": ROLE, "roleDurationSeconds": "x"}, "roleDurationSeconds"),
        ({"streamARN": "arn:aws:kinesis:eu-west-1:1:stream/s"}, "streamARN"),
        ({"streamARN": ARN, "region": "us-east-1"}, "streamARN"),
    ],
)
def test_a_bad_combination_names_its_option(options: dict[str, str], option: str) -> None:
    with pytest.raises(SparkOptionError) as raised:
        stream_connection(options)
    assert raised.value.option == option
