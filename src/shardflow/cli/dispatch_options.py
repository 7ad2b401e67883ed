"""``shardflow consume`` options for dispatch: ordering mode, bounds, retries, dead letters."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from enum import StrEnum
from typing import Annotated

import typer

from shardflow.aws.settings import AwsSettings
from shardflow.consumer.delivery import DispatchSettings
from shardflow.deadletter import (
    DeadLetterDestination,
    DeadLetterSource,
    JsonLinesDestination,
    KinesisDestination,
)


class Ordering(StrEnum):
    SHARD = "shard"
    KEY = "key"
    UNORDERED = "unordered"


class OnFailure(StrEnum):
    STOP_SHARD = "stop-shard"
    SKIP = "skip"
    BLOCK_KEY = "block-key"


OrderingOption = Annotated[
    Ordering | None,
    typer.Option(
        "--ordering",
        help="Dispatch records per partition key in parallel (key), all in parallel "
        "(unordered) or one at a time (shard), with retries and a failure policy. Default: "
        "one call at a time per shard, no retries.",
        show_default=False,
    ),
]
MaxInFlight = Annotated[
    int,
    typer.Option("--max-in-flight", min=1, help="With dispatch: unfinished records per shard."),
]
Attempts = Annotated[
    int, typer.Option("--attempts", min=1, help="With dispatch: handler calls per record.")
]
OnFailureOption = Annotated[
    OnFailure,
    typer.Option(
        "--on-failure",
        help="With dispatch, after the last attempt: stop the shard, or write the record to "
        "--dead-letters and go on (skip), also with the key's later records (block-key).",
    ),
]
BisectOption = Annotated[
    bool,
    typer.Option(
        "--bisect-on-error",
        help="With --batch: split a failing batch in two, down to the record that fails.",
    ),
]
MaxRecordAgeOption = Annotated[
    float | None,
    typer.Option(
        "--max-record-age",
        min=0.001,
        help="Seconds: older records go to --dead-letters unhandled.",
        show_default=False,
    ),
]
DeadLettersOption = Annotated[
    str | None,
    typer.Option(
        "--dead-letters",
        help="file:PATH (JSON lines) or stream:NAME (a Kinesis stream) for failed records.",
        show_default=False,
        metavar="TARGET",
    ),
]


def dispatch_settings(
    ordering: Ordering | None,
    max_in_flight: int,
    attempts: int,
    on_failure: OnFailure,
    dead_letters: str | None,
    bisect_on_error: bool = False,
    max_record_age: float | None = None,
) -> DispatchSettings | None:
    """The dispatch settings the options ask for; None when none of them does."""
    asked = ordering is not None or bisect_on_error or max_record_age is not None
    if not asked and on_failure is OnFailure.STOP_SHARD and dead_letters is None:
        return None
    if on_failure is not OnFailure.STOP_SHARD and dead_letters is None:
        raise typer.BadParameter(
            f"--on-failure {on_failure.value} needs --dead-letters", param_hint="--on-failure"
        )
    if max_record_age is not None and dead_letters is None:
        raise typer.BadParameter(
            "--max-record-age needs --dead-letters", param_hint="--max-record-age"
        )
    return DispatchSettings(
        ordering=(ordering or Ordering.SHARD).value,
        max_in_flight_per_shard=max_in_flight,
        retry=replace(DispatchSettings().retry, max_attempts=attempts),
        on_failure=on_failure.value,
        bisect_on_error=bisect_on_error,
        max_record_age=max_record_age,
    )


def dead_letter_target(text: str | None) -> DeadLetterSource | None:
    """The parsed ``--dead-letters`` value."""
    if text is None:
        return None
    try:
        return DeadLetterSource.parse(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dead-letters") from None


@contextlib.asynccontextmanager
async def open_dead_letters(
    target: DeadLetterSource | None, aws: AwsSettings
) -> AsyncIterator[DeadLetterDestination | None]:
    """The destination of ``target`` (None: none), closed when the block ends."""
    if target is None:
        yield None
        return
    destination: DeadLetterDestination
    if target.kind == "file":
        destination = JsonLinesDestination(target.location)
    else:
        stream = KinesisDestination(target.location, aws=aws)
        await stream.start()  # a wrong stream name fails now, not at the first failure
        destination = stream
    try:
        yield destination
    finally:
        await destination.close()
