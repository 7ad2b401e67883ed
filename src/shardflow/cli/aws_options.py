"""What every command that talks to AWS shares: connection options and one-line error reports."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from botocore.exceptions import BotoCoreError
from rich.console import Console
from rich.markup import escape

from shardflow.aws.redaction import redact
from shardflow.aws.settings import AssumeRole, AwsSettings
from shardflow.cli.failures import one_line
from shardflow.errors import ShardflowError

T = TypeVar("T")

DEBUG = False
"""``shardflow --debug``: failures raise with their traceback instead of one line."""

stderr = Console(stderr=True, highlight=False, soft_wrap=True)

EndpointUrl = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        help="Endpoint URL, e.g. of a local emulator.",
        show_default=False,
    ),
]
Region = Annotated[
    str | None,
    typer.Option(
        "--region", help="AWS region (default: the standard AWS configuration).", show_default=False
    ),
]
Profile = Annotated[
    str | None,
    typer.Option("--profile", help="Profile of the shared AWS config files.", show_default=False),
]


RoleArn = Annotated[
    str | None,
    typer.Option(
        "--role-arn",
        help="A role to assume (STS AssumeRole) for the stream's Kinesis calls, e.g. of a stream "
        "of another account given by --stream ARN; refreshed before it expires.",
        show_default=False,
    ),
]
ExternalId = Annotated[
    str | None,
    typer.Option(
        "--external-id",
        help="The external id the role's trust policy asks for (with --role-arn).",
        show_default=False,
    ),
]
RoleSessionName = Annotated[
    str | None,
    typer.Option(
        "--role-session-name",
        help="The assumed role's session name, as the stream account's CloudTrail shows it "
        "(with --role-arn; default: shardflow-cli).",
        show_default=False,
    ),
]


def aws_settings(
    endpoint_url: str | None,
    region: str | None,
    profile: str | None,
    *,
    role: AssumeRole | None = None,
    streams: tuple[str, ...] | list[str] = (),
) -> AwsSettings:
    """The settings of a command; ``role`` is assumed for ``streams`` (only: a dead-letter
    stream or the lease table stay with the standard credentials)."""
    return AwsSettings(
        region=region,
        profile=profile,
        endpoint_url=endpoint_url,
        stream_roles={stream: role for stream in streams} if role is not None else {},
    )


def stream_role(
    role_arn: str | None, external_id: str | None, session_name: str | None
) -> AssumeRole | None:
    """``--role-arn`` with its ``--external-id`` and ``--role-session-name``; a bad combination
    leaves with a usage error (exit 2)."""
    if role_arn is None:
        if external_id is not None or session_name is not None:
            fail("--external-id and --role-session-name need --role-arn", code=2)
        return None
    try:
        return AssumeRole(
            role_arn, session_name=session_name or "shardflow-cli", external_id=external_id
        )
    except ValueError as exc:
        fail(str(exc), code=2)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and leave with ``code``."""
    stderr.print(f"[bold red]error:[/] {escape(redact(message))}")
    raise typer.Exit(code)


def run(work: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; failures become one line on stderr and a non-zero exit
    (with ``shardflow --debug``: the traceback)."""
    try:
        return asyncio.run(work)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except (ShardflowError, BotoCoreError, TimeoutError) as exc:
        if DEBUG:
            raise
        fail(one_line(exc))
