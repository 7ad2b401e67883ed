"""Dead letters on moto's server: a DLQ stream, replay onto a target stream, failures, the CLI."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import wait_for_active
from shardflow.backoff import Backoff
from shardflow.cli import app
from shardflow.deadletter import (
    DeadLetter,
    DeadLetterSource,
    JsonLinesDestination,
    KinesisDestination,
    LetterFilter,
    read_letters,
    replay,
)
from shardflow.errors import DeadLetterWriteError
from shardflow.producer import ProducerSettings
from shardflow.reader import read_all
from shardflow.records import Record
from shardflow.testing.faults import ErrorResponse, FaultProxy

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
KEYS = ["alice", "bob", "carol", "dave"]


def letters(count: int = 24) -> list[DeadLetter]:
    """Letters of four keys, interleaved; payloads say key and rank so order can be checked."""
    made = []
    for n in range(count):
        key = KEYS[n % len(KEYS)]
        record = Record(
            data=f"{key}:{n // len(KEYS)}".encode() + (b"\xff" if n % 5 == 0 else b""),
            partition_key=key,
            explicit_hash_key=None,
            sequence_number=str(10**20 + n),
            shard_id=f"shardId-00000000000{n % 3}",
            stream_name="orders",
            approximate_arrival_timestamp=T0 - timedelta(minutes=1),
        )
        made.append(
            DeadLetter.from_failure(
                record,
                ValueError(f"bad record {n}"),
                attempts=3,
                failed_at=T0 + timedelta(seconds=n),
                blocked_key=key,
            )
        )
    return made


def per_key(items: list[tuple[str, bytes]]) -> dict[str, list[bytes]]:
    grouped: dict[str, list[bytes]] = defaultdict(list)
    for key, data in items:
        grouped[key].append(data)
    return dict(grouped)


async def make_stream(url: str, name: str, shards: int = 3) -> str:
    async with ClientFactory(AwsSettings(endpoint_url=url)).kinesis() as kinesis:
        await kinesis.create_stream(StreamName=name, ShardCount=shards)
        await wait_for_active(kinesis, name)
    return name


async def test_letters_land_on_the_dlq_stream_keyed_and_in_order(
    moto_url: str, stream_name: str
) -> None:
    dlq = await make_stream(moto_url, stream_name)
    aws = AwsSettings(endpoint_url=moto_url)
    destination = KinesisDestination(dlq, aws=aws)
    written = letters()
    await destination.write(written[:10])
    await destination.write(written[10:])
    await destination.close()
    records = await read_all(dlq, aws=aws)
    assert all(r.partition_key == DeadLetter.from_json(r.data).partition_key for r in records)
    assert not any(r.aggregated for r in records)
    read = [x async for x in read_letters(DeadLetterSource("stream", dlq), aws=aws)]
    assert sorted(read, key=lambda x: x.sequence_number) == written
    # Per key, the DLQ holds the letters in the order they were written.
    assert per_key([(x.partition_key, x.data) for x in read]) == per_key(
        [(x.partition_key, x.data) for x in written]
    )


async def test_replay_from_a_file_puts_the_original_records_back_in_order(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    target = await make_stream(moto_url, stream_name)
    path = tmp_path / "dlq.jsonl"
    file = JsonLinesDestination(path)
    written = letters()
    await file.write(written)
    await file.close()
    aws = AwsSettings(endpoint_url=moto_url)
    only = frozenset({"alice", "carol", "dave"})
    summary = await replay(
        read_letters(DeadLetterSource("file", str(path))),
        target,
        letter_filter=LetterFilter(since=T0 + timedelta(seconds=2), keys=only),
        aws=aws,
    )
    expected = [
        x for x in written if x.partition_key in only and x.failed_at >= T0 + timedelta(seconds=2)
    ]
    assert (summary.read, summary.selected, summary.replayed, summary.failed) == (
        24,
        len(expected),
        len(expected),
        0,
    )
    landed = await read_all(target, aws=aws)
    assert per_key([(r.partition_key, r.data) for r in landed]) == per_key(
        [(x.partition_key, x.data) for x in expected]
    )


async def test_replay_from_the_dlq_stream_round_trips(moto_url: str, stream_name: str) -> None:
    aws = AwsSettings(endpoint_url=moto_url)
    dlq = await make_stream(moto_url, stream_name + "-dlq", shards=2)
    target = await make_stream(moto_url, stream_name, shards=4)
    written = letters(16)
    destination = KinesisDestination(dlq, aws=aws)
    await destination.write(written)
    await destination.close()
    summary = await replay(read_letters(DeadLetterSource("stream", dlq), aws=aws), target, aws=aws)
    assert summary.replayed == 16
    assert summary.ok
    landed = await read_all(target, aws=aws)
    assert per_key([(r.partition_key, r.data) for r in landed]) == per_key(
        [(x.partition_key, x.data) for x in written]
    )


async def test_a_failing_dlq_stream_raises_the_typed_error(moto_url: str, stream_name: str) -> None:
    dlq = await make_stream(moto_url, stream_name, shards=1)
    async with FaultProxy(moto_url) as proxy:
        destination = KinesisDestination(
            dlq,
            aws=AwsSettings(endpoint_url=proxy.url),
            settings=ProducerSettings(
                linger=0.0, retry=Backoff(max_attempts=2), preserve_key_order=True
            ),
        )
        await destination.start()
        proxy.add(ErrorResponse("InternalFailure"), operation="PutRecords", stream=dlq)
        with pytest.raises(DeadLetterWriteError, match=f"stream {dlq}") as caught:
            await destination.write(letters(3))
        assert caught.value.count == 3
        await proxy.idle()
        assert proxy.injected(operation="PutRecords")
        proxy.clear()
        # Once the stream answers again, the same letters are written (nothing was checkpointed).
        await destination.write(letters(3))
        await destination.close()
    read = [
        x
        async for x in read_letters(
            DeadLetterSource("stream", dlq), aws=AwsSettings(endpoint_url=moto_url)
        )
    ]
    assert read == letters(3)


async def test_a_missing_stream_and_an_oversized_letter_fail_typed(
    moto_url: str, stream_name: str
) -> None:
    aws = AwsSettings(endpoint_url=moto_url)
    missing = KinesisDestination(stream_name + "-missing", aws=aws)
    with pytest.raises(DeadLetterWriteError, match="missing"):
        await missing.write(letters(1))
    await missing.close()
    dlq = await make_stream(moto_url, stream_name, shards=1)
    destination = KinesisDestination(dlq, aws=aws)
    big = DeadLetter.from_failure(
        Record(data=b"x" * 900_000, partition_key="k", sequence_number="1"),
        ValueError(),
        attempts=1,
    )
    with pytest.raises(DeadLetterWriteError, match="over the record limit"):
        await destination.write([letters(1)[0], big])
    await destination.close()
    assert await read_all(dlq, aws=aws) == []


def test_cli_shows_and_replays(moto_url: str, stream_name: str, tmp_path: Path) -> None:
    # Sync: the commands run their own event loop.
    target = asyncio.run(make_stream(moto_url, stream_name, shards=2))
    path = tmp_path / "dlq.jsonl"
    path.write_bytes(b"".join(x.to_bytes() + b"\n" for x in letters(8)))
    aws = AwsSettings(endpoint_url=moto_url)
    runner = CliRunner()
    shown = runner.invoke(app, ["dlq", "show", f"file:{path}", "--key", "bob"])
    assert shown.exit_code == 0, shown.output
    assert "2 dead letter(s)" in shown.output
    assert "bad record 1" in shown.output
    assert "bad record 5" in shown.output
    assert "alice" not in shown.output
    as_json = runner.invoke(
        app, ["dlq", "show", f"file:{path}", "--format", "json", "--limit", "3"]
    )
    assert [DeadLetter.from_json(line) for line in as_json.output.splitlines()] == letters(3)
    endpoint = ["--endpoint-url", moto_url]
    dry = runner.invoke(
        app, ["dlq", "replay", f"file:{path}", "--to", target, "--dry-run", *endpoint]
    )
    assert dry.exit_code == 0, dry.output
    assert "would replay 8 of 8" in dry.output
    assert asyncio.run(read_all(target, aws=aws)) == []
    until = (T0 + timedelta(seconds=4)).isoformat()
    done = runner.invoke(
        app, ["dlq", "replay", f"file:{path}", "--to", target, "--until", until, *endpoint]
    )
    assert done.exit_code == 0, done.output
    assert "replayed 4 of 8" in done.output
    landed = asyncio.run(read_all(target, aws=aws))
    assert sorted(r.data for r in landed) == sorted(x.data for x in letters(4))
    bad = runner.invoke(app, ["dlq", "replay", "nowhere", "--to", target])
    assert bad.exit_code != 0
    missing = runner.invoke(
        app, ["dlq", "replay", f"file:{path}", "--to", target + "-missing", *endpoint]
    )
    assert missing.exit_code == 1
    assert "error:" in missing.output
