"""Connection options shared by the source and the sink: which stream, where, in which region.

Spark hands options over as a case-insensitive mapping of strings; these helpers turn the
connection part into shardflow's own values and raise ``SparkOptionError`` naming the option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardflow.aws.settings import AwsSettings
from shardflow.errors import SparkOptionError

CONNECTION_OPTIONS = ("streamName", "streamARN", "region", "endpointUrl")
"""The options :func:`stream_connection` reads, source and sink alike."""


@dataclass(frozen=True, slots=True)
class StreamConnection:
    """Picklable description of how to reach one stream (clients are made lazily on executors)."""

    stream_name: str | None
    stream_arn: str | None
    region: str | None
    endpoint_url: str | None

    @property
    def stream_label(self) -> str:
        """The name (or ARN) to show in messages and in the ``streamName`` column."""
        if self.stream_name:
            return self.stream_name
        assert self.stream_arn is not None
        return self.stream_arn.rsplit("/", 1)[-1]

    def aws_settings(self) -> AwsSettings:
        return AwsSettings(region=self.region, endpoint_url=self.endpoint_url)


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
    if name and arn and arn.rsplit("/", 1)[-1] != name:
        raise SparkOptionError("streamARN", f"names stream {arn!r}, but streamName is {name!r}")
    return StreamConnection(
        stream_name=name or None,
        stream_arn=arn or None,
        region=lookup(options, "region") or None,
        endpoint_url=lookup(options, "endpointUrl") or None,
    )
