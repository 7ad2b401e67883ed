"""Where and how shardflow reaches AWS: one frozen value shared by every component."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AwsSettings:
    """Connection settings. ``None`` means "resolve the standard AWS way".

    Region, credentials and endpoints come from the usual chain (environment, shared config and
    credentials files, profile, container/instance roles) unless given here. ``endpoint_url``
    overrides every service; otherwise botocore honours ``AWS_ENDPOINT_URL`` and the
    service-specific ``AWS_ENDPOINT_URL_KINESIS`` / ``AWS_ENDPOINT_URL_DYNAMODB`` / ... variables.
    """

    region: str | None = None
    """The AWS region (None: from the environment or config files)."""
    profile: str | None = None
    """A named profile of the shared config and credentials files."""
    endpoint_url: str | None = None
    """One endpoint for every service (a local stack, say); None: AWS's, or the
    ``AWS_ENDPOINT_URL*`` variables."""
    connect_timeout: float = 5.0
    """Seconds to open a connection."""
    read_timeout: float = 30.0
    """Seconds to wait for a response: long enough for a GetRecords of 10 MiB on a slow link
    (SubscribeToShard streams set their own)."""
    max_pool_connections: int = 64
    """HTTP connections one client keeps, shared by the shards it serves."""
    sdk_max_attempts: int = 1
    """botocore's own attempts per call. Its retries are off by default: shardflow classifies
    every failure itself and retries with jittered backoff, so nothing is retried twice over."""
