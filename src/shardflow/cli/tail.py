"""``shardflow tail``: records from all shards of a stream, as text or JSON lines."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
from dataclasses import asdict
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import typer

from shardflow.cli.aws_options import (
    EndpointUrl,
    ExternalId,
    Profile,
    Region,
    RoleArn,
    RoleSessionName,
    aws_settings,
    run,
    stream_role,
)
from shardflow.cli.positions import parse_start_position
from shardflow.fetch.polling import Polling
from shardflow.reader import read_stream
from shardflow.records import Record


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def tail(
    stream: Annotated[str, typer.Argument(help="Stream name or ARN.", show_default=False)],
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="trim-horizon, latest or an ISO timestamp (UTC unless it has an offset).",
        ),
    ] = "trim-horizon",
    follow: Annotated[
        bool,
        typer.Option(
            "--follow/--no-follow",
            "-f",
            help="Keep waiting for new records instead of stopping once caught up.",
        ),
    ] = False,
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            help="text: one tab-separated line per record; json: one object per line.",
        ),
    ] = OutputFormat.TEXT,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Stop after this many records.")
    ] = None,
    deaggregate: Annotated[
        bool,
        typer.Option(
            "--deaggregate/--no-deaggregate", help="Unpack KPL aggregated records (default)."
        ),
    ] = True,
    idle_time: Annotated[
        float,
        typer.Option("--idle-time", min=0.0, help="Seconds between polls of a caught-up shard."),
    ] = 1.0,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
    role_arn: RoleArn = None,
    external_id: ExternalId = None,
    role_session_name: RoleSessionName = None,
) -> None:
    """Print records from all shards of a stream (parents before children after resharding)."""
    position = parse_start_position(start)
    render = format_json if output is OutputFormat.JSON else format_text
    role = stream_role(role_arn, external_id, role_session_name)

    async def work() -> None:
        records = read_stream(
            stream,
            aws=aws_settings(endpoint_url, region, profile, role=role, streams=[stream]),
            start=position,
            follow=follow,
            deaggregate=deaggregate,
            # The idle interval matters only while following; without, stop as soon as caught up.
            polling=Polling(idle_time=idle_time if follow else 0.0),
        )
        printed = 0
        async with contextlib.aclosing(records):
            async for record in records:
                sys.stdout.write(render(record) + "\n")
                if follow:
                    sys.stdout.flush()
                printed += 1
                if limit is not None and printed >= limit:
                    break
        sys.stdout.flush()

    try:
        run(work())
    except BrokenPipeError:
        # The reader went away (`| head`): not an error. Keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(0) from None


# --- rendering -------------------------------------------------------------------------------


def payload_text(data: bytes) -> tuple[str, str]:
    """The payload as (text, encoding): UTF-8 when it decodes, else base64."""
    try:
        return data.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _one_line(text: str) -> str:
    # Control characters would break the one-line-per-record layout: show them escaped.
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_text(record: Record) -> str:
    """``shard<TAB>sequence/sub-sequence<TAB>partition key<TAB>payload``."""
    text, encoding = payload_text(record.data)
    payload = _one_line(text) if encoding == "utf8" else f"base64:{text}"
    return "\t".join(
        (
            record.shard_id,
            f"{record.sequence_number}/{record.sub_sequence_number}",
            _one_line(record.partition_key),
            payload,
        )
    )


def format_json(record: Record) -> str:
    """Every field of the record as one JSON object; ``data`` encoded as ``encoding`` says."""
    fields: dict[str, Any] = asdict(record)
    text, encoding = payload_text(record.data)
    fields["data"] = text
    fields["encoding"] = encoding
    arrival = record.approximate_arrival_timestamp
    fields["approximate_arrival_timestamp"] = (
        arrival.isoformat() if isinstance(arrival, datetime) else None
    )
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
