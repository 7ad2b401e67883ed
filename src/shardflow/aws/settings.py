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
    profile: str | None = None
    endpoint_url: str | None = None
    connect_timeout: float = 5.0
    # Long enough for a GetRecords of 10 MiB on a slow link; SubscribeToShard streams set their own.
    read_timeout: float = 30.0
    max_pool_connections: int = 64
    # botocore's own retries are off by default: shardflow classifies every failure itself and
    # retries with jittered backoff (see shardflow.aws.backoff), so nothing is retried twice over.
    sdk_max_attempts: int = 1
