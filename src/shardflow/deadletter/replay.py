"""Reading dead letters back and putting their records on a stream again.

A source is a JSON-lines file (``file:PATH``) or a DLQ stream (``stream:NAME``). Replay puts
each selected letter's original data, partition key and explicit hash key on the target stream
through the producer, with key order preserved: records of one key arrive in the order of the
source (file order; for a stream, its per-key order, which the DLQ kept).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Final, Literal

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.deadletter.journal import ReplayJournal
from shardflow.deadletter.jsonl import MalformedCallback, parse_letter, read_json_lines
from shardflow.deadletter.model import DeadLetter
from shardflow.errors import MalformedDeadLetterError, ProducerClosedError, ShardflowError
from shardflow.producer import Producer, ProducerSettings, PutResult
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
    source: DeadLetterSource,
    *,
    aws: AwsSettings | None = None,
    on_malformed: MalformedCallback | None = None,
) -> AsyncIterator[DeadLetter]:
    """Every letter of ``source`` in source order (a stream: read until caught up, shards
    interleaved, each in order). A bad letter raises MalformedDeadLetterError naming it, or,
    with ``on_malformed``, is handed to it and skipped."""
    if source.kind == "file":
        for letter in read_json_lines(source.location, on_malformed=on_malformed):
            yield letter
        return
    records = read_stream(source.location, aws=aws)
    async with contextlib.aclosing(records):
        async for record in records:
            where = (
                f"stream {source.location} shard {record.shard_id} "
                f"record {record.sequence_number}/{record.sub_sequence_number}"
            )
            parsed = parse_letter(record.data, where, on_malformed)
            if parsed is not None:
                yield parsed


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
    """What a replay did, counted letter by letter.

    ``read``: letters read from the source (readable ones); ``selected``: of those, the ones
    the filter took; ``replayed``: put on the target now; ``already_replayed``: skipped because
    an earlier run (the journal) or an earlier letter of this run put the same record (origin)
    on the target; ``malformed``: letters that could not be read, skipped; ``refused``: letters
    whose record the producer refused (too large, bad key), skipped; ``failed``: records the
    producer could not deliver (a re-run tries them again). ``errors`` holds the first few
    messages of every kind.
    """

    target: str
    dry_run: bool
    read: int = 0
    selected: int = 0
    replayed: int = 0
    already_replayed: int = 0
    malformed: int = 0
    refused: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing failed, was refused or could not be read."""
        return self.failed == 0 and self.refused == 0 and self.malformed == 0

    def note(self, message: str) -> None:
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(message)

    def malformed_letter(self, error: MalformedDeadLetterError) -> None:
        """Count and note a letter that could not be read (an ``on_malformed`` callback)."""
        self.malformed += 1
        self.note(str(error))


ProgressCallback = Callable[[ReplaySummary], None]


async def replay(
    letters: AsyncIterator[DeadLetter] | Iterable[DeadLetter],
    target: str,
    *,
    letter_filter: LetterFilter | None = None,
    dry_run: bool = False,
    aws: AwsSettings | None = None,
    clients: ClientFactory | None = None,
    settings: ProducerSettings | None = None,
    journal: ReplayJournal | None = None,
    summary: ReplaySummary | None = None,
    on_progress: ProgressCallback | None = None,
    progress_every: int = 1000,
) -> ReplaySummary:
    """Put the records of the selected ``letters`` back on ``target``, in order.

    With ``dry_run`` nothing is written (no connection is made): the summary tells what would
    be. A letter whose record the producer refuses is skipped and counted; records the producer
    could not deliver are counted in ``failed``; the rest go on. With ``journal`` (open) each
    record put is noted there, and letters it already holds for ``target`` are skipped, so the
    replay can be run again after a stop or failure without duplicating records. A record
    dead-lettered twice (same origin) is put once. Pass ``summary`` to have malformed letters
    counted in it (``read_letters(..., on_malformed=summary.malformed_letter)``);
    ``on_progress`` is called with the summary every ``progress_every`` letters read.
    """
    letter_filter = letter_filter or LetterFilter()
    summary = summary or ReplaySummary(target=target, dry_run=dry_run)
    seen: set[str] = set()

    def fresh(letter: DeadLetter) -> bool:
        summary.read += 1
        if on_progress is not None and summary.read % progress_every == 0:
            on_progress(summary)
        if not letter_filter.matches(letter):
            return False
        summary.selected += 1
        if letter.origin in seen or (journal is not None and journal.replayed(target, letter)):
            summary.already_replayed += 1
            return False
        seen.add(letter.origin)
        return True

    if dry_run:
        async for letter in _aiter(letters):
            fresh(letter)
        return summary
    producer = Producer(target, settings=settings or REPLAY_PRODUCER, aws=aws, clients=clients)
    async with producer:
        futures: list[asyncio.Future[PutResult]] = []
        async for letter in _aiter(letters):
            if not fresh(letter):
                continue
            try:
                future = await producer.put(
                    letter.data, letter.partition_key, letter.explicit_hash_key
                )
            except ProducerClosedError:
                raise
            except ShardflowError as exc:  # too large, a bad key: this letter only
                summary.refused += 1
                summary.note(f"{letter.origin}: {exc}")
                continue
            if journal is not None:
                future.add_done_callback(partial(_journal, journal, target, letter))
            futures.append(future)
        results = await asyncio.gather(*futures, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            summary.failed += 1
            summary.note(str(result))
        else:
            summary.replayed += 1
    if on_progress is not None:
        on_progress(summary)
    return summary


def _journal(
    journal: ReplayJournal, target: str, letter: DeadLetter, done: asyncio.Future[PutResult]
) -> None:
    if not done.cancelled() and done.exception() is None:
        journal.record(target, letter)


async def _aiter(
    letters: AsyncIterator[DeadLetter] | Iterable[DeadLetter],
) -> AsyncIterator[DeadLetter]:
    if isinstance(letters, AsyncIterator):
        async for letter in letters:
            yield letter
    else:
        for letter in letters:
            yield letter
