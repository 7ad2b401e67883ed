"""``shardflow produce``: lines from stdin or a file into a stream, one record per line."""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, BinaryIO

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from shardflow.aws.redaction import redact
from shardflow.cli.aws_options import (
    EndpointUrl,
    ExternalId,
    Profile,
    Region,
    RoleArn,
    RoleSessionName,
    aws_settings,
    fail,
    stderr,
    stream_role,
)
from shardflow.cli.failures import failure_message
from shardflow.errors import (
    InvalidPartitionKeyError,
    ShardflowError,
)
from shardflow.producer import ProducerSettings, PutResult, SyncProducer


class LineKeyError(InvalidPartitionKeyError):
    """A line has no usable value in the ``--key-field`` field (or is not a JSON object)."""


@dataclass
class Tally:
    """Outcomes counted as results arrive (on the producer's thread) and lines are read."""

    read: int = 0
    delivered: int = 0
    failures: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def fail(self, error: BaseException) -> None:
        code = getattr(error, "code", "") or ""
        key = (type(error).__name__, str(code))
        with self.lock:
            self.failures[key] += 1
            self.examples.setdefault(key, redact(str(error)))

    def on_result(self, future: concurrent.futures.Future[PutResult]) -> None:
        error = future.exception()
        if error is None:
            with self.lock:
                self.delivered += 1
        else:
            self.fail(error)


class KeyChooser:
    """Picks each line's partition key: a fixed value, a JSON field, or a random UUID."""

    def __init__(self, key: str | None, key_field: str | None) -> None:
        self._key = key
        self._field = key_field

    def __call__(self, line: bytes, number: int) -> str:
        if self._key is not None:
            return self._key
        if self._field is None:
            return uuid.uuid4().hex
        try:
            document = json.loads(line)
        except ValueError:
            raise LineKeyError(f"line {number} is not JSON") from None
        if not isinstance(document, dict) or self._field not in document:
            raise LineKeyError(f"line {number} has no field {self._field!r}")
        value = document[self._field]
        if value is None or isinstance(value, dict | list):
            raise LineKeyError(f"line {number}: field {self._field!r} is not a scalar")
        return value if isinstance(value, str) else json.dumps(value)


def produce(
    stream: Annotated[str, typer.Argument(help="Stream name or ARN.", show_default=False)],
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-i",
            exists=True,
            dir_okay=False,
            readable=True,
            help="Read lines from this file instead of stdin.",
            show_default=False,
        ),
    ] = None,
    key_field: Annotated[
        str | None,
        typer.Option(
            "--key-field",
            help="Lines are JSON objects; use this field's value as the partition key.",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", help="The same partition key for every line.", show_default=False),
    ] = None,
    random_key: Annotated[
        bool,
        typer.Option("--random-key", help="A random partition key per line (the default)."),
    ] = False,
    aggregate: Annotated[
        bool, typer.Option("--aggregate", help="Pack records into KPL aggregated records.")
    ] = False,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
    role_arn: RoleArn = None,
    external_id: ExternalId = None,
    role_session_name: RoleSessionName = None,
) -> None:
    """Write each line (without its line break; empty lines are skipped) as one record."""
    if sum((key_field is not None, key is not None, random_key)) > 1:
        raise typer.BadParameter("choose one of --key-field, --key and --random-key")
    choose_key = KeyChooser(key, key_field)
    settings = ProducerSettings(aggregate=aggregate)
    role = stream_role(role_arn, external_id, role_session_name)
    aws = aws_settings(endpoint_url, region, profile, role=role, streams=[stream])
    try:
        producer = SyncProducer(stream, settings=settings, aws=aws)
        producer.start()
    except ShardflowError as exc:
        fail(failure_message(exc))
    tally = Tally()
    started = time.monotonic()
    interrupted = False
    try:
        if file is None:
            _send_lines(producer, sys.stdin.buffer, None, choose_key, tally)
        else:
            with file.open("rb") as source:
                _send_lines(producer, source, file.stat().st_size, choose_key, tally)
    except KeyboardInterrupt:
        interrupted = True
        stderr.print("interrupted: delivering the records read so far")
    finally:
        producer.close()
    _print_summary(stream, tally, time.monotonic() - started)
    if interrupted:
        raise typer.Exit(130)
    if tally.failed:
        raise typer.Exit(1)


def _send_lines(
    producer: SyncProducer,
    source: BinaryIO,
    total_bytes: int | None,
    choose_key: KeyChooser,
    tally: Tally,
) -> None:
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=False,
    )
    with progress:
        task = progress.add_task("", total=total_bytes)
        consumed = 0
        last_update = 0.0
        for number, raw in enumerate(source, start=1):
            consumed += len(raw)
            line = raw.rstrip(b"\r\n")
            if not line:
                continue
            tally.read += 1
            try:
                future = producer.put(line, choose_key(line, number))
            except ShardflowError as exc:  # an invalid key or record: counted, not sent
                tally.fail(exc)
            else:
                future.add_done_callback(tally.on_result)
            now = time.monotonic()
            if now - last_update >= 0.1:
                last_update = now
                progress.update(task, completed=consumed, description=_status(tally))
        producer.flush()
        progress.update(task, completed=consumed, description=_status(tally))


def _status(tally: Tally) -> str:
    return f"read {tally.read:,}  delivered {tally.delivered:,}  failed {tally.failed:,}"


def _print_summary(stream: str, tally: Tally, seconds: float) -> None:
    rate = tally.delivered / seconds if seconds > 0 else 0.0
    stderr.print(
        f"{tally.delivered:,} records delivered to {escape(stream)} in {seconds:.1f}s "
        f"({rate:,.0f} records/s); {tally.failed:,} failed"
    )
    if not tally.failures:
        return
    table = Table(title="failures", title_justify="left")
    table.add_column("records", justify="right")
    table.add_column("error")
    table.add_column("code")
    table.add_column("example")
    for (error, code), count in tally.failures.most_common():
        table.add_row(f"{count:,}", error, code, escape(tally.examples[(error, code)]))
    stderr.print(table)
