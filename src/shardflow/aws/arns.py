"""Kinesis stream ARNs: ``arn:PARTITION:kinesis:REGION:ACCOUNT:stream/NAME``.

A stream given by ARN is named by it in every Kinesis call (``StreamARN``: the only way to
reach a stream of another account), and its region is the region of the client unless one is
configured, in which case the two must agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardflow.errors import InvalidStreamArnError, StreamRegionMismatchError

# Kinesis' own limits: names of 1-128 of [a-zA-Z0-9_.-], 12-digit account ids.
_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")
_ACCOUNT = re.compile(r"\d{12}")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")


@dataclass(frozen=True, slots=True)
class StreamArn:
    """The parts of a stream ARN (:func:`parse_stream_arn`)."""

    partition: str
    region: str
    account: str
    name: str

    def __str__(self) -> str:
        return f"arn:{self.partition}:kinesis:{self.region}:{self.account}:stream/{self.name}"


def is_arn(stream: str) -> bool:
    """Whether ``stream`` is given as an ARN (anything starting ``arn:``), not a name."""
    return stream.startswith("arn:")


def parse_stream_arn(arn: str) -> StreamArn:
    """The parts of ``arn``; :class:`InvalidStreamArnError` says what is wrong with a bad one
    (a consumer ARN, a missing region or account, another service)."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn":
        raise InvalidStreamArnError(arn, "not six ':'-separated parts starting with arn")
    _, partition, service, region, account, resource = parts
    if not partition.startswith("aws"):
        raise InvalidStreamArnError(arn, f"unknown partition {partition!r}")
    if service != "kinesis":
        raise InvalidStreamArnError(arn, f"service is {service!r}, not kinesis")
    if not _REGION.fullmatch(region):
        raise InvalidStreamArnError(arn, f"region {region!r} is not a region")
    if not _ACCOUNT.fullmatch(account):
        raise InvalidStreamArnError(arn, f"account {account!r} is not a 12-digit account id")
    kind, _, name = resource.partition("/")
    if kind != "stream":
        raise InvalidStreamArnError(arn, f"resource {resource!r} is not stream/NAME")
    if "/" in name:
        raise InvalidStreamArnError(arn, "a stream consumer's ARN, not the stream's")
    if not _NAME.fullmatch(name):
        raise InvalidStreamArnError(arn, f"stream name {name!r} is not a valid name")
    return StreamArn(partition, region, account, name)


def stream_region(stream: str | None, configured: str | None) -> str | None:
    """The region a client of ``stream`` uses: the configured one, else the ARN's (None: a
    stream given by name with no region configured, left to the standard AWS chain). A stream
    ARN of another region than the configured one raises :class:`StreamRegionMismatchError`."""
    if stream is None or not is_arn(stream):
        return configured
    parsed = parse_stream_arn(stream)
    if configured is not None and configured != parsed.region:
        raise StreamRegionMismatchError(stream, arn_region=parsed.region, configured=configured)
    return parsed.region
