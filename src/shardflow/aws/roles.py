"""Assumed-role credentials through botocore's own machinery.

An :class:`~shardflow.aws.settings.AssumeRole` becomes aiobotocore's
``AioAssumeRoleCredentialFetcher`` (the STS call, made with the base session's credentials)
wrapped in ``AioDeferredRefreshableCredentials`` (fetched on first use, refreshed by the SDK
before each request that finds them within the refresh window), served to a session of its own
by a credential provider. Nothing here times or schedules a refresh: botocore does.
"""

from __future__ import annotations

import logging
from typing import Any

from aiobotocore.credentials import (
    AioAssumeRoleCredentialFetcher,
    AioCredentialResolver,
    AioDeferredRefreshableCredentials,
)
from aiobotocore.session import AioSession
from botocore.credentials import CredentialProvider
from botocore.exceptions import ClientError

from shardflow.aws.classify import ACCESS_CODES, classify
from shardflow.aws.redaction import redact, register_secret
from shardflow.aws.settings import AssumeRole
from shardflow.errors import AssumeRoleError

log = logging.getLogger("shardflow.aws")

METHOD = "shardflow-assume-role"
# botocore refreshes in two steps: from the advisory window on, a failed refresh keeps the old
# credentials (logged); within the mandatory window it raises. Same 15:10 ratio as botocore's.
_MANDATORY_SHARE = 2 / 3


class RoleCredentials(AioDeferredRefreshableCredentials):  # type: ignore[misc]
    """Deferred refreshable credentials with the role's refresh window instead of botocore's
    fixed 15/10 minutes (which would refresh on every call for 900-second credentials)."""

    def __init__(self, refresh_using: Any, *, refresh_window: float) -> None:
        super().__init__(refresh_using=refresh_using, method=METHOD)
        self._advisory_refresh_timeout = refresh_window
        self._mandatory_refresh_timeout = refresh_window * _MANDATORY_SHARE


class _RoleProvider(CredentialProvider):  # type: ignore[misc]
    METHOD = METHOD
    CANONICAL_NAME = "ShardflowAssumeRole"

    def __init__(self, credentials: RoleCredentials) -> None:
        super().__init__()
        self._credentials = credentials

    async def load(self) -> RoleCredentials:
        return self._credentials


def role_credentials(
    base: AioSession,
    role: AssumeRole,
    *,
    sts_client_kwargs: dict[str, Any],
    stream: str | None = None,
) -> RoleCredentials:
    """Refreshable credentials of ``role``, fetched with ``base``'s credentials from an STS
    client made with ``sts_client_kwargs`` (region, endpoint, config). A refusal raises
    :class:`AssumeRoleError` naming the role, from whichever call needed the credentials."""
    extra: dict[str, Any] = {
        "RoleSessionName": role.session_name,
        "DurationSeconds": role.duration_seconds,
    }
    if role.external_id is not None:
        extra["ExternalId"] = role.external_id

    def create_sts(service: str, **credentials: Any) -> Any:
        return base.create_client(service, **sts_client_kwargs, **credentials)

    fetcher: Any = None

    async def refresh() -> dict[str, Any]:
        nonlocal fetcher
        if fetcher is None:
            # The base credentials are resolved on the first fetch, inside the event loop.
            fetcher = AioAssumeRoleCredentialFetcher(
                create_sts,
                await base.get_credentials(),
                role.role_arn,
                extra_args=extra,
                # The fetcher keeps the last answer until this close to its expiry: no closer
                # than the refresh window, or a refresh would get the same credentials back.
                expiry_window_seconds=role.refresh_window,
            )
        try:
            fetched: dict[str, Any] = await fetcher.fetch_credentials()
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in ACCESS_CODES:
                message = redact(str(error.get("Message") or code))
                raise AssumeRoleError(role.role_arn, message, code=code, stream=stream) from None
            raise classify(exc, operation="AssumeRole", stream=stream) from exc
        register_secret(fetched["access_key"], fetched["secret_key"], fetched["token"])
        log.debug("assumed role %s (credentials until %s)", role.role_arn, fetched["expiry_time"])
        return fetched

    return RoleCredentials(refresh, refresh_window=role.refresh_window)


def serve_credentials(session: AioSession, credentials: RoleCredentials) -> None:
    """Make ``credentials`` the only ones ``session`` resolves (its clients sign with them)."""
    session.register_component(
        "credential_provider", AioCredentialResolver(providers=[_RoleProvider(credentials)])
    )
