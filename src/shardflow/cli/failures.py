"""One-line reports of a failed command (no typer, no rich: the lean multilang start uses them)."""

from __future__ import annotations

from botocore.exceptions import BotoCoreError, NoRegionError

from shardflow.aws.classify import classify
from shardflow.aws.clients import NO_REGION
from shardflow.errors import (
    AccessDeniedError,
    MissingCredentialsError,
    ResourceNotFoundError,
    ShardflowError,
)


def failure_message(exc: ShardflowError) -> str:
    """The one-line report of a failed command, with a hint for the usual causes."""
    if isinstance(exc, ResourceNotFoundError):
        return f"{exc} - check the name, the region and the endpoint"
    if isinstance(exc, AccessDeniedError) and not isinstance(exc, MissingCredentialsError):
        return f"{exc} - check the credentials and their permissions"
    return str(exc)


def one_line(exc: BaseException) -> str:
    """What a command prints for an error that ends it (``error: <this>``)."""
    if isinstance(exc, NoRegionError):
        return NO_REGION
    if isinstance(exc, ShardflowError):
        return failure_message(exc)
    if isinstance(exc, BotoCoreError):
        return str(classify(exc, operation=""))
    return str(exc) or "timed out"
