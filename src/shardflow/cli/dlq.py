"""``shardflow dlq``: look at dead letters and put their records back on a stream.

SOURCE is ``file:PATH`` (a JSON-lines file) or ``stream:NAME`` (a dead-letter stream).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shardflow.cli.aws_options import EndpointUrl, Profile, Region, aws_settings, fail, run
from shardflow.cli.tail import payload_text
from shardflow.deadletter import (
    DeadLetter,
    DeadLetterSource,
    LetterFilter,
    ReplayJournal,
    ReplaySummary,
    read_letters,
    replay,
)
from shardflow.deadletter.replay import select

app = typer.Typer(help="Dead letters: show them, replay them onto a stream.", no_args_is_help=True)

PREVIEW_CHARS = 40

SourceArgument = Annotated[
    str, typer.Argument(help="file:PATH or stream:NAME.", show_default=False, metavar="SOURCE")
]
Since = Annotated[
    str | None,
    typer.Option(
        "--since",
        help="Only letters that failed at or after this ISO time (UTC unless it has an offset).",
    ),
]
Until = Annotated[
    str | None, typer.Option("--until", help="Only letters that failed before this ISO time.")
]
Keys = Annotated[
    list[str] | None,
    typer.Option("--key", help="Only letters with this partition key (repeatable)."),
]


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


def _source(text: str) -> DeadLetterSource:
    try:
        return DeadLetterSource.parse(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _moment(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an ISO time", param_hint=option) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _filter(since: str | None, until: str | None, keys: list[str] | None) -> LetterFilter:
    return LetterFilter(
        since=_moment(since, "--since"),
        until=_moment(until, "--until"),
        keys=frozenset(keys) if keys else None,
    )


@app.command("replay")
def replay_command(
    source: SourceArgument,
    to: Annotated[str, typer.Option("--to", help="Stream to put the records on.")],
    since: Since = None,
    until: Until = None,
    key: Keys = None,
    journal: Annotated[
        Path | None,
        typer.Option(
            "--journal",
            help="File noting every record put back, so a re-run skips them (default: "
            "PATH.replayed next to a file source, DLQ-NAME.replayed here for a stream).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be replayed; write nothing.")
    ] = False,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Put the records of dead letters back on a stream: original data and keys, in order.

    Letters that cannot be read or whose record is refused are skipped and reported; records
    already put back by an earlier run (the journal) are skipped, so the command can be run
    again after a stop or a failure without duplicating records.
    """
    letters_from = _source(source)
    letter_filter = _filter(since, until, key)
    aws = aws_settings(endpoint_url, region, profile)
    summary = ReplaySummary(target=to, dry_run=dry_run)
    record = ReplayJournal(journal or _default_journal(letters_from))

    def progress(so_far: ReplaySummary) -> None:
        print(
            f"  read {so_far.read}, selected {so_far.selected}, "
            f"already replayed {so_far.already_replayed}",
            file=sys.stderr,
        )

    with record:
        run(
            replay(
                read_letters(letters_from, aws=aws, on_malformed=summary.malformed_letter),
                to,
                letter_filter=letter_filter,
                dry_run=dry_run,
                aws=aws,
                journal=record,
                summary=summary,
                on_progress=progress,
            )
        )
    verb = "would replay" if summary.dry_run else "replayed"
    done = summary.selected - summary.already_replayed if summary.dry_run else summary.replayed
    print(
        f"{verb} {done} of {summary.read} dead letters from {letters_from} to {to}; "
        f"already replayed {summary.already_replayed}, unreadable {summary.malformed}, "
        f"refused {summary.refused}, failed {summary.failed} (journal {record.path})"
    )
    if not summary.ok:
        for message in summary.errors:
            print(f"  {message}", file=sys.stderr)
        skipped = summary.malformed + summary.refused
        fail(f"{summary.failed} record(s) could not be put on {to}, {skipped} letter(s) skipped")


def _default_journal(source: DeadLetterSource) -> Path:
    if source.kind == "file":
        return Path(f"{source.location}.replayed")
    return Path(f"dlq-{source.location}.replayed")


@app.command("show")
def show_command(
    source: SourceArgument,
    since: Since = None,
    until: Until = None,
    key: Keys = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Show at most this many.")
    ] = None,
    output: Annotated[
        OutputFormat, typer.Option("--format", help="table, or json (one letter per line).")
    ] = OutputFormat.TABLE,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """List dead letters: when and where each record failed, with what error."""
    letters_from = _source(source)
    letter_filter = _filter(since, until, key)
    aws = aws_settings(endpoint_url, region, profile)

    async def collect() -> list[DeadLetter]:
        found: list[DeadLetter] = []
        async for letter in select(read_letters(letters_from, aws=aws), letter_filter):
            found.append(letter)
            if limit is not None and len(found) >= limit:
                break
        return found

    letters = run(collect())
    if output is OutputFormat.JSON:
        for letter in letters:
            print(letter.to_json())
        return
    table = Table(title=f"{len(letters)} dead letter(s) in {escape(str(letters_from))}")
    for column in ("failed at", "origin", "key", "attempts", "error", "data"):
        table.add_column(column, overflow="fold")
    for letter in letters:
        text, encoding = payload_text(letter.data)
        preview = text if encoding == "utf8" else f"base64:{text}"
        if len(preview) > PREVIEW_CHARS:
            preview = preview[: PREVIEW_CHARS - 1] + "…"
        table.add_row(
            letter.failed_at.isoformat(timespec="seconds"),
            escape(
                f"{letter.stream} {letter.shard_id} {letter.sequence_number}/{letter.sub_sequence_number}"
            ),
            escape(letter.partition_key),
            str(letter.attempts),
            escape(f"{letter.error_type}: {letter.error_message}"),
            escape(preview),
        )
    Console(soft_wrap=False, width=max(120, Console().width)).print(table)
