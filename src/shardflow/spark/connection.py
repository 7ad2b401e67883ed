"""Connection options shared by the source and the sink: which stream, where, in which region.

Spark hands options over as a case-insensitive mapping of strings; these helpers turn the
connection part into shardflow's own values and raise ``SparkOptionError`` naming the option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardflow.aws.arns import parse_stream_arn, stream_region
from shardflow.aws.settings import AssumeRole, AwsSettings
from shardflow.errors import ConfigurationError, SparkOptionError

CONNECTION_OPTIONS = (
    "streamName",
    "streamARN",
    "region",
    "endpointUrl",
    "roleArn",
    "roleSessionName",
    "externalId",
    "roleDurationSeconds",
)
"""The options :func:`stream_connection` reads, source and sink alike."""


@dataclass(frozen=True, slots=True)
class StreamConnection:
    """Picklable description of how to reach one stream (clients are made lazily on executors)."""

    stream_name: str | None
    stream_arn: str | None
    region: str | None
    endpoint_url: str | None
    role: AssumeRole | None = None
    """The role assumed for the stream's Kinesis calls (``roleArn`` and its options)."""

    @property
    def stream_label(self) -> str:
        """The name (or ARN) to show in messages and in the ``streamName`` column."""
        if self.stream_name:
            return self.stream_name
        assert self.stream_arn is not None
        return self.stream_arn.rsplit("/", 1)[-1]

    def aws_settings(self) -> AwsSettings:
        """Settings of the stream's clients: the ARN's region when no ``region`` is given."""
        return AwsSettings(
            region=stream_region(self.stream_arn, self.region),
            endpoint_url=self.endpoint_url,
            role=self.role,
        )


def lookup(options: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive option lookup (Spark lower-cases keys; users write camelCase)."""
    wanted = name.lower()
    for key, value in options.items():
        if key.lower() == wanted:
            return value
    return None


def stream_connection(options: Mapping[str, str]) -> StreamConnection:
    """Read ``streamName``/``streamARN``, ``region`` and ``endpointUrl`` from Spark options."""
    name = lookup(options, "streamName")
    arn = lookup(options, "streamARN")
    if not name and not arn:
        raise SparkOptionError("streamName", "one of streamName or streamARN is required")
    region = lookup(options, "region") or None
    if arn:
        try:
            parse_stream_arn(arn)
            stream_region(arn, region)
        except ConfigurationError as exc:
            raise SparkOptionError("streamARN", str(exc)) from None
    if name and arn and arn.rsplit("/", 1)[-1] != name:
        raise SparkOptionError("streamARN", f"names stream {arn!r}, but streamName is {name!r}")
    return StreamConnection(
        stream_name=name or None,
        stream_arn=arn or None,
        region=region,
        endpoint_url=lookup(options, "endpointUrl") or None,
        role=_role(options),
    )


def _role(options: Mapping[str, str]) -> AssumeRole | None:
    """``roleArn`` with ``roleSessionName``, ``externalId``, ``roleDurationSeconds``."""
    role_arn = lookup(options, "roleArn")
    if not role_arn:
        for dependent in ("roleSessionName", "externalId", "roleDurationSeconds"):
            if lookup(options, dependent):
                raise SparkOptionError(dependent, "applies to a role: set roleArn too")
        return None
    duration = lookup(options, "roleDurationSeconds")
    try:
        seconds = int(duration) if duration else 3600
    except ValueError:
        raise SparkOptionError("roleDurationSeconds", f"{duration!r} is not a number") from None
    try:
        return AssumeRole(
            role_arn,
            session_name=lookup(options, "roleSessionName") or "shardflow-spark",
            external_id=lookup(options, "externalId") or None,
            duration_seconds=seconds,
        )
    except ValueError as exc:
        option = "roleDurationSeconds" if "duration" in str(exc) else "roleArn"
        if "session_name" in str(exc):
            option = "roleSessionName"
        raise SparkOptionError(option, str(exc)) from None
