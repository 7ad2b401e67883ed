"""Reading dead letters back and putting their records on a stream again.

A source is a JSON-lines file (``file:PATH``) or a DLQ stream (``stream:NAME``). Replay puts
each selected letter's original data, partition key and explicit hash key on the target stream
through the producer, with key order preserved: records of one key arrive in the order of the
source (file order; for a stream, its per-key order, which the DLQ kept).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.deadletter.jsonl import read_json_lines
from shardflow.deadletter.model import DeadLetter
from shardflow.producer import Producer, ProducerSettings
from shardflow.reader import read_stream

REPLAY_PRODUCER: Final = ProducerSettings(preserve_key_order=True)
"""Replayed records of one key must not overtake each other, even across retries."""

MAX_REPORTED_ERRORS: Final = 5


@dataclass(frozen=True, slots=True)
class DeadLetterSource:
    """Where letters are read from: ``kind`` ``file`` (a path) or ``stream`` (a stream name)."""

    kind: Literal["file", "stream"]
    location: str

    @classmethod
    def parse(cls, text: str) -> DeadLetterSource:
        """``file:PATH`` or ``stream:NAME``."""
        kind, sep, location = text.partition(":")
        if not sep or not location or kind not in ("file", "stream"):
            raise ValueError(
                f"not a dead-letter source: {text!r} (expected file:PATH or stream:NAME)"
            )
        return cls("file" if kind == "file" else "stream", location)

    def __str__(self) -> str:
        return f"{self.kind}:{self.location}"


async def read_letters(
    source: DeadLetterSource, *, aws: AwsSettings | None = None
) -> AsyncIterator[DeadLetter]:
    """Every letter of ``source`` in source order (a stream: read until caught up, shards
    interleaved, each in order). A bad letter raises MalformedDeadLetterError naming it."""
    if source.kind == "file":
        for letter in read_json_lines(source.location):
            yield letter
        return
    records = read_stream(source.location, aws=aws)
    async with contextlib.aclosing(records):
        async for record in records:
            yield DeadLetter.from_json(
                record.data,
                where=(
                    f"stream {source.location} shard {record.shard_id} "
                    f"record {record.sequence_number}/{record.sub_sequence_number}"
                ),
            )


@dataclass(frozen=True, slots=True)
class LetterFilter:
    """Which letters to take: failed in ``[since, until)`` and, if ``keys`` is given, with one of
    those partition keys. Naive times are not accepted: say which zone you mean."""

    since: datetime | None = None
    until: datetime | None = None
    keys: frozenset[str] | None = None

    def __post_init__(self) -> None:
        for moment in (self.since, self.until):
            if moment is not None and moment.tzinfo is None:
                raise ValueError("since/until must be aware datetimes (with a time zone)")

    def matches(self, letter: DeadLetter) -> bool:
        if self.since is not None and letter.failed_at < self.since:
            return False
        if self.until is not None and letter.failed_at >= self.until:
            return False
        return self.keys is None or letter.partition_key in self.keys


async def select(
    letters: AsyncIterator[DeadLetter], letter_filter: LetterFilter
) -> AsyncIterator[DeadLetter]:
    """The letters that pass ``letter_filter``, in order."""
    async for letter in letters:
        if letter_filter.matches(letter):
            yield letter


@dataclass(slots=True)
class ReplaySummary:
    """What a replay did. ``errors`` holds the first few failure messages."""

    target: str
    dry_run: bool
    read: int = 0
    selected: int = 0
    replayed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed == 0


async def replay(
    letters: AsyncIterator[DeadLetter] | Iterable[DeadLetter],
    target: str,
    *,
    letter_filter: LetterFilter | None = None,
    dry_run: bool = False,
    aws: AwsSettings | None = None,
    clients: ClientFactory | None = None,
    settings: ProducerSettings | None = None,
) -> ReplaySummary:
    """Put the records of the selected ``letters`` back on ``target``, in order.

    With ``dry_run`` nothing is written (no connection is made): the summary tells what would
    be. Records the producer could not deliver are counted in ``failed``; the rest go on.
    """
    letter_filter = letter_filter or LetterFilter()
    summary = ReplaySummary(target=target, dry_run=dry_run)
    if dry_run:
        async for letter in _aiter(letters):
            summary.read += 1
            if letter_filter.matches(letter):
                summary.selected += 1
        return summary
    producer = Producer(target, settings=settings or REPLAY_PRODUCER, aws=aws, clients=clients)
    async with producer:
        futures = []
        async for letter in _aiter(letters):
            summary.read += 1
            if not letter_filter.matches(letter):
                continue
            summary.selected += 1
            futures.append(
                await producer.put(letter.data, letter.partition_key, letter.explicit_hash_key)
            )
        results = await asyncio.gather(*futures, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            summary.failed += 1
            if len(summary.errors) < MAX_REPORTED_ERRORS:
                summary.errors.append(str(result))
        else:
            summary.replayed += 1
    return summary


async def _aiter(
    letters: AsyncIterator[DeadLetter] | Iterable[DeadLetter],
) -> AsyncIterator[DeadLetter]:
    if isinstance(letters, AsyncIterator):
        async for letter in letters:
            yield letter
    else:
        for letter in letters:
            yield letter
