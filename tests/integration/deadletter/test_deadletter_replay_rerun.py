"""Replay you can run again (moto's server): bad letters are skipped and counted, a journal keeps
a re-run from putting any record twice, and dead-letter files are readable by their owner only."""

from __future__ import annotations

import asyncio
import stat
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from integration.deadletter.test_deadletter_kinesis import letters, make_stream
from shardflow.aws import AwsSettings
from shardflow.backoff import Backoff
from shardflow.cli import app
from shardflow.deadletter import (
    DeadLetter,
    DeadLetterSource,
    JsonLinesDestination,
    LetterFilter,
    ReplayJournal,
    ReplaySummary,
    read_letters,
    replay,
)
from shardflow.producer import ProducerSettings
from shardflow.reader import read_all
from shardflow.records import Record
from shardflow.testing.faults import ErrorResponse, FaultProxy


def oversized() -> DeadLetter:
    """A letter the producer refuses: its record is over Kinesis' 1 MiB limit."""
    record = Record(data=b"x" * (1024 * 1024 + 1), partition_key="big", sequence_number="7")
    return DeadLetter.from_failure(record, ValueError("too big"), attempts=1)


def dead_letter_file(path: Path, items: list[DeadLetter | bytes]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.to_bytes()) + b"\n" for x in items))
    return path


async def replay_file(
    path: Path, target: str, aws: AwsSettings, journal: Path, **options: object
) -> ReplaySummary:
    summary = ReplaySummary(target=target, dry_run=False)
    with ReplayJournal(journal) as noted:
        source = read_letters(
            DeadLetterSource("file", str(path)), on_malformed=summary.malformed_letter
        )
        return await replay(source, target, aws=aws, journal=noted, summary=summary, **options)  # type: ignore[arg-type]


def landed_counts(target: str, aws: AwsSettings) -> Counter[bytes]:
    return Counter(r.data for r in asyncio.run(read_all(target, aws=aws)))


async def test_bad_letters_are_skipped_and_counted_and_a_rerun_adds_nothing(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    target = await make_stream(moto_url, stream_name)
    aws = AwsSettings(endpoint_url=moto_url)
    good = letters(12)
    path = dead_letter_file(
        tmp_path / "dlq.jsonl",
        [*good[:5], b'{"not": "a letter"', oversized(), *good[5:], good[3]],  # good[3] twice
    )
    journal = tmp_path / "journal"
    first = await replay_file(path, target, aws, journal)
    assert (first.read, first.selected, first.replayed) == (14, 14, 12)
    assert (first.malformed, first.refused, first.already_replayed, first.failed) == (1, 1, 1, 0)
    assert not first.ok
    assert any(f"{path}:6" in message for message in first.errors)  # the corrupt line, named
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600

    again = await replay_file(path, target, aws, journal)
    assert (again.replayed, again.already_replayed, again.malformed, again.refused) == (0, 13, 1, 1)
    landed = Counter(r.data for r in await read_all(target, aws=aws))
    assert landed == Counter(x.data for x in good)  # each record once, after two runs


async def test_a_replay_stopped_by_failures_resumes_without_duplicates(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    target = await make_stream(moto_url, stream_name)
    good = letters(16)
    path = dead_letter_file(tmp_path / "dlq.jsonl", list(good))
    journal = tmp_path / "journal"
    # A first run that only got some keys through (the rest of the stream was failing).
    first = await replay_file(
        path,
        target,
        AwsSettings(endpoint_url=moto_url),
        journal,
        letter_filter=LetterFilter(keys=frozenset({"alice", "bob"})),
    )
    assert first.replayed == 8
    async with FaultProxy(moto_url) as proxy:
        proxy.add(ErrorResponse("InternalFailure"), operation="PutRecords")
        failing = await replay_file(
            path,
            target,
            AwsSettings(endpoint_url=proxy.url),
            journal,
            settings=ProducerSettings(
                retry=Backoff(base=0.0, cap=0.0, max_attempts=2), preserve_key_order=True
            ),
        )
    assert (failing.replayed, failing.failed, failing.already_replayed) == (0, 8, 8)
    resumed = await replay_file(path, target, AwsSettings(endpoint_url=moto_url), journal)
    assert (resumed.replayed, resumed.already_replayed, resumed.failed) == (8, 8, 0)
    assert resumed.ok
    landed = await read_all(target, aws=AwsSettings(endpoint_url=moto_url))
    assert Counter(r.data for r in landed) == Counter(x.data for x in good)


async def test_dead_letter_files_are_created_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "letters" / "dlq.jsonl"
    destination = JsonLinesDestination(path)
    await destination.write(letters(2))
    await destination.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_cli_reports_counts_and_reruns_without_duplicates(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    target = asyncio.run(make_stream(moto_url, stream_name, shards=2))
    aws = AwsSettings(endpoint_url=moto_url)
    good = letters(6)
    path = dead_letter_file(tmp_path / "dlq.jsonl", [*good[:3], b"garbage", *good[3:]])
    command = ["dlq", "replay", f"file:{path}", "--to", target, "--endpoint-url", moto_url]
    runner = CliRunner()
    first = runner.invoke(app, command)
    assert first.exit_code == 1, first.output  # a letter was skipped: say so in the exit code
    assert "replayed 6 of 6 dead letters" in first.output
    assert "unreadable 1" in first.output
    assert f"{path}:4" in first.output
    again = runner.invoke(app, command)
    assert "replayed 0 of 6 dead letters" in again.output
    assert "already replayed 6" in again.output
    assert Path(f"{path}.replayed").exists()
    assert landed_counts(target, aws) == Counter(x.data for x in good)
