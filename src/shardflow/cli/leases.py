"""``shardflow leases APP``: an application's lease table, with each shard's lag.

The lease table does not record how far behind a worker is (MillisBehindLatest is only seen by
the worker), so the lag is measured from the stream, cheaply: per unfinished shard one
GetShardIterator just after the checkpoint and one GetRecords of at most one record. That
call's MillisBehindLatest is how far the oldest unprocessed record lies behind the tip of the
shard ("caught up" when there is nothing after the checkpoint). Two calls per shard, never more
records than one: safe to run against a busy stream (its read budget is 5 GetRecords calls/s
per shard, shared with the consumers).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shardflow.aws.backoff import retrying
from shardflow.aws.clients import ClientFactory
from shardflow.aws.kinesis import arn_ref, stream_ref, where
from shardflow.aws.settings import AwsSettings
from shardflow.backoff import Backoff
from shardflow.cli.aws_options import EndpointUrl, Profile, Region, aws_settings, run
from shardflow.cli.consume import LeaseEndpointUrl
from shardflow.errors import AwsError, ResourceNotFoundError
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.keys import StreamIdentifier
from shardflow.leases.model import Lease
from shardflow.records import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON

_PROBE_BACKOFF = Backoff(base=0.1, cap=1.0, max_attempts=4)
_PROBES_AT_ONCE = 8


class LeaseModeChoice(StrEnum):
    PER_LEASE = "per-lease"
    HEARTBEAT = "heartbeat"


async def set_mode(application: str, mode: LeaseModeChoice, *, lease_aws: AwsSettings) -> None:
    """Store the application's lease mode in its table (every worker follows it, live)."""
    async with ClientFactory(lease_aws).dynamodb() as dynamodb:
        store = DynamoDBLeaseStore(dynamodb, application)
        await store.set_lease_mode(
            "heartbeat" if mode is LeaseModeChoice.HEARTBEAT else "per-lease"
        )


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class Lag:
    """How far a shard's checkpoint is behind the tip, as one probe found it."""

    millis_behind: int | None
    """MillisBehindLatest of the first record after the checkpoint (None: not measured)."""
    state: str
    """``caught up``, ``behind``, ``done`` (SHARD_END), ``latest`` or the reason it is unknown."""

    def text(self) -> str:
        if self.state == "behind" and self.millis_behind is not None:
            return f"{_duration(self.millis_behind)} behind"
        return self.state


def _duration(millis: int) -> str:
    seconds = millis / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def stream_of(lease: Lease, stream: str | None) -> str | None:
    """The stream a lease belongs to: from a multi-stream lease key, else ``stream``."""
    if lease.stream_name is not None:
        try:
            return StreamIdentifier.parse(lease.stream_name).stream_name
        except ValueError:
            return None
    return stream


async def probe_lag(kinesis: Any, stream: str, lease: Lease) -> Lag:
    """The lag of ``lease``'s shard: one GetShardIterator and one GetRecords(Limit=1)."""
    checkpoint = lease.checkpoint
    sequence_number = checkpoint.sequence_number
    if sequence_number == SHARD_END:
        return Lag(0, "done")
    if sequence_number == LATEST:
        return Lag(None, "latest")
    params: dict[str, Any] = {**stream_ref(stream), "ShardId": lease.shard_id}
    if sequence_number in (TRIM_HORIZON, AT_TIMESTAMP):
        # The AT_TIMESTAMP moment is not stored in the lease: the horizon is an upper bound.
        params["ShardIteratorType"] = "TRIM_HORIZON"
    elif checkpoint.sub_sequence_number > 0:
        # Inside an aggregate: the rest of that record is still to do.
        params |= {
            "ShardIteratorType": "AT_SEQUENCE_NUMBER",
            "StartingSequenceNumber": sequence_number,
        }
    else:
        params |= {
            "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
            "StartingSequenceNumber": sequence_number,
        }
    try:
        iterator = await retrying(
            lambda: kinesis.get_shard_iterator(**params),
            operation="GetShardIterator",
            backoff=_PROBE_BACKOFF,
            stream=stream,
            shard_id=lease.shard_id,
        )
        shard_iterator = iterator.get("ShardIterator")
        if shard_iterator is None:
            return Lag(0, "caught up")
        answer = await retrying(
            lambda: kinesis.get_records(ShardIterator=shard_iterator, Limit=1, **arn_ref(stream)),
            operation="GetRecords",
            backoff=_PROBE_BACKOFF,
            stream=stream,
            shard_id=lease.shard_id,
        )
    except ResourceNotFoundError:
        return Lag(None, "shard gone")
    except AwsError as exc:
        return Lag(None, f"unknown ({exc.code or type(exc).__name__})")
    behind = answer.get("MillisBehindLatest")
    if not answer.get("Records") and not behind:
        return Lag(0, "caught up")
    return Lag(int(behind or 0), "behind")


async def lease_rows(
    application: str,
    *,
    lease_aws: AwsSettings,
    kinesis_aws: AwsSettings,
    stream: str | None,
    with_lag: bool,
) -> list[dict[str, Any]]:
    """One dict per lease, sorted by lease key, with the lag when it can be measured."""
    async with ClientFactory(lease_aws).dynamodb() as dynamodb:
        store = DynamoDBLeaseStore(dynamodb, application)
        try:
            leases = await store.list_leases()
        except ResourceNotFoundError as error:
            raise ResourceNotFoundError(
                f"lease table {application!r} not found in {where(dynamodb)}: "
                "has an application of that name run there?",
                operation=error.operation,
                code=error.code,
            ) from error
        if stream is None and with_lag:
            recorded = await store.recorded_streams()
            stream = recorded[0] if len(recorded) == 1 else None
    lags: dict[str, Lag] = {}
    if with_lag and leases:
        async with ClientFactory(kinesis_aws).kinesis() as kinesis:
            limit = asyncio.Semaphore(_PROBES_AT_ONCE)

            async def measure(lease: Lease) -> None:
                name = stream_of(lease, stream)
                if name is None:
                    lags[lease.lease_key] = Lag(None, "no --stream")
                    return
                async with limit:
                    lags[lease.lease_key] = await probe_lag(kinesis, name, lease)

            await asyncio.gather(*(measure(lease) for lease in leases))
    rows = []
    for lease in leases:
        lag = lags.get(lease.lease_key)
        rows.append(
            {
                "lease_key": lease.lease_key,
                "owner": lease.lease_owner,
                "counter": lease.lease_counter,
                "checkpoint": str(lease.checkpoint),
                "owner_switches": lease.owner_switches_since_checkpoint,
                "parents": sorted(lease.parent_shard_ids),
                "lag": lag.text() if lag is not None else None,
                "millis_behind": lag.millis_behind if lag is not None else None,
            }
        )
    return rows


def leases(
    application: Annotated[
        str, typer.Argument(metavar="APP", help="Application name (the lease table).")
    ],
    stream: Annotated[
        str | None,
        typer.Option(
            "--stream",
            "-s",
            help="The application's stream, to measure lag (multi-stream lease keys name "
            "their streams themselves).",
            show_default=False,
        ),
    ] = None,
    lag: Annotated[
        bool,
        typer.Option(
            "--lag/--no-lag",
            help="Measure each unfinished shard's lag: one GetShardIterator and one "
            "GetRecords(Limit=1) just after its checkpoint; the lag is that record's "
            "MillisBehindLatest (how far the oldest unprocessed record is behind the tip).",
        ),
    ] = True,
    output: Annotated[
        OutputFormat, typer.Option("--format", help="table, or json (one array).")
    ] = OutputFormat.TABLE,
    set_lease_mode: Annotated[
        LeaseModeChoice | None,
        typer.Option(
            "--set-mode",
            help="Switch the application's lease mode (stored in its table; every running "
            "worker follows it within a take interval, no restart): heartbeat (one write per "
            "worker per renew interval, for fleets without KCL workers) or per-lease (every "
            "lease renewed on its own, KCL's way; removes the mode item). Nothing is listed.",
            show_default=False,
        ),
    ] = None,
    endpoint_url: EndpointUrl = None,
    lease_endpoint_url: LeaseEndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Show an application's leases: owner, counter, checkpoint and lag of every shard."""
    if set_lease_mode is not None:
        lease_aws = aws_settings(lease_endpoint_url or endpoint_url, region, profile)
        run(set_mode(application, set_lease_mode, lease_aws=lease_aws))
        typer.echo(f"lease mode of {application}: {set_lease_mode.value}")
        return
    rows = run(
        lease_rows(
            application,
            lease_aws=aws_settings(lease_endpoint_url or endpoint_url, region, profile),
            kinesis_aws=aws_settings(endpoint_url, region, profile),
            stream=stream,
            with_lag=lag,
        )
    )
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(rows, indent=2))
        return
    cells = [
        [row["lease_key"], row["owner"] or "-", str(row["counter"]), row["checkpoint"], row["lag"]]
        for row in rows
    ]
    print_table(f"leases of {application}", _COLUMNS, [[c or "-" for c in r] for r in cells])
    if not rows:
        typer.echo("no leases (has a consumer of this application started yet?)")


_COLUMNS = ("lease key", "owner", "counter", "checkpoint", "lag")


def print_table(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> None:
    """A rich table on a terminal; elsewhere (a pipe, a file) plain columns, one row a line,
    nothing wrapped or cut: shard ids, owners and sequence numbers stay whole for grep/awk."""
    if sys.stdout.isatty():
        table = Table(title=escape(title), title_justify="left")
        for column in columns:
            table.add_column(column, justify="right" if column == "counter" else "left")
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        Console(soft_wrap=True).print(table)
        return
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows, strict=True)]
    for line in (columns, *rows):
        typer.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
