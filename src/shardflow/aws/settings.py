"""Where and how shardflow reaches AWS: one frozen value shared by every component."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardflow.aws.arns import is_arn, parse_stream_arn

if TYPE_CHECKING:
    from botocore.config import Config

DEFAULT_REFRESH_BEFORE = 15 * 60.0
"""botocore's own advisory refresh window for assumed-role credentials (15 minutes)."""


@dataclass(frozen=True, slots=True)
class AssumeRole:
    """A role to assume (STS AssumeRole) for the Kinesis calls of a stream, typically one of
    another account. The credentials are botocore's refreshable ones: fetched on first use and
    fetched again ``refresh_before`` seconds before they expire, by the SDK's own refresh path.
    The calls to STS are made with the standard credentials (or ``AwsSettings.profile``)."""

    role_arn: str
    """The role, ``arn:aws:iam::ACCOUNT:role/NAME``."""
    session_name: str = "shardflow"
    """RoleSessionName: what the other account's CloudTrail shows as the caller."""
    external_id: str | None = None
    """ExternalId, when the role's trust policy asks for one."""
    duration_seconds: int = 3600
    """How long each set of credentials lasts (STS accepts 900 up to the role's maximum)."""
    refresh_before: float | None = None
    """Seconds before expiry at which new credentials are fetched (a call made then fetches
    them); None: 15 minutes, at most a third of ``duration_seconds``."""

    def __post_init__(self) -> None:
        if not self.role_arn.startswith("arn:") or ":role/" not in self.role_arn:
            raise ValueError(
                f"role_arn {self.role_arn!r} is not a role ARN (arn:aws:iam::ACCOUNT:role/NAME)"
            )
        if not 2 <= len(self.session_name) <= 64:
            raise ValueError("session_name must have 2 to 64 characters")
        if self.duration_seconds < 900:
            raise ValueError("duration_seconds must be at least 900 (STS's minimum)")
        if self.refresh_before is not None and not 0 < self.refresh_before < self.duration_seconds:
            raise ValueError("refresh_before must be between 0 and duration_seconds")

    @property
    def refresh_window(self) -> float:
        """Seconds before expiry at which the credentials are refreshed."""
        if self.refresh_before is not None:
            return self.refresh_before
        return min(DEFAULT_REFRESH_BEFORE, self.duration_seconds / 3)


class StreamRoles(Mapping[str, AssumeRole]):
    """An immutable, hashable mapping of stream (name or ARN) to role (settings are hashed)."""

    __slots__ = ("_roles",)

    def __init__(self, roles: Mapping[str, AssumeRole] | None = None) -> None:
        self._roles = dict(roles or {})

    def __getitem__(self, stream: str) -> AssumeRole:
        return self._roles[stream]

    def __iter__(self) -> Iterator[str]:
        return iter(self._roles)

    def __len__(self) -> int:
        return len(self._roles)

    def __hash__(self) -> int:
        return hash(frozenset(self._roles.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return f"StreamRoles({self._roles!r})"


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
    role: AssumeRole | None = None
    """A role assumed for the Kinesis calls of every stream (a stream of another account);
    DynamoDB and CloudWatch (lease table, metrics) keep the standard credentials."""
    stream_roles: Mapping[str, AssumeRole] = field(default_factory=StreamRoles)
    """Roles per stream (keyed by the name or ARN the stream is given by), before ``role``:
    a consumer of streams of several accounts."""
    sdk_max_attempts: int = 1
    """botocore's own attempts per call. Its retries are off by default: shardflow classifies
    every failure itself and retries with jittered backoff, so nothing is retried twice over."""
    botocore_config: Config | None = None
    """botocore options of your own for every client (a ``botocore.config.Config`` or
    aiobotocore's ``AioConfig``), merged over shardflow's: each option it sets wins over
    shardflow's setting of it (the timeouts and pool size above, the SDK's retries, ...), the
    others keep shardflow's. ``parameter_validation=True`` in it validates every call; by
    default the calls shardflow builds itself skip botocore's validation (see
    :mod:`shardflow.aws.validation`). A client shardflow opens for a purpose of its own
    (fan-out subscriptions: their read timeout and pool) keeps that purpose's settings."""

    def __post_init__(self) -> None:
        if not isinstance(self.stream_roles, StreamRoles):
            object.__setattr__(self, "stream_roles", StreamRoles(self.stream_roles))
        for stream in self.stream_roles:
            if is_arn(stream):
                parse_stream_arn(stream)

    def role_for(self, stream: str | None) -> AssumeRole | None:
        """The role for ``stream``'s Kinesis calls: its own (by the name or ARN given, or by
        the name of its ARN), else ``role``; None: the standard credentials."""
        if stream is not None and self.stream_roles:
            found = self.stream_roles.get(stream)
            if found is None and is_arn(stream):
                found = self.stream_roles.get(parse_stream_arn(stream).name)
            if found is not None:
                return found
        return self.role
