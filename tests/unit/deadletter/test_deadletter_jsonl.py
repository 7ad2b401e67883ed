"""JsonLinesDestination: appended, one letter per line, durable per write; read back in order."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardflow.deadletter import (
    DeadLetter,
    DeadLetterDestination,
    JsonLinesDestination,
    read_json_lines,
)
from shardflow.errors import DeadLetterWriteError, MalformedDeadLetterError
from shardflow.records import Record


def letter(n: int, key: str = "k") -> DeadLetter:
    record = Record(
        data=f"payload-{n}".encode(),
        partition_key=key,
        sequence_number=str(1000 + n),
        shard_id="shardId-000000000000",
        stream_name="orders",
    )
    return DeadLetter.from_failure(
        record, KeyError(n), attempts=2, failed_at=datetime(2025, 1, 1, 0, 0, n, tzinfo=UTC)
    )


async def test_writes_append_one_line_per_letter_in_order(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dlq.jsonl"
    destination = JsonLinesDestination(path)
    assert isinstance(destination, DeadLetterDestination)
    await destination.write([letter(0), letter(1)])
    await destination.write([])
    await destination.write([letter(2)])
    await destination.close()
    # A second destination on the same file appends instead of replacing.
    again = JsonLinesDestination(path)
    await again.write([letter(3)])
    await again.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 4
    assert list(read_json_lines(path)) == [letter(n) for n in range(4)]


async def test_every_write_is_fsynced_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "dlq.jsonl"
    destination = JsonLinesDestination(path)
    await destination.write([letter(0)])
    size_after_first = path.stat().st_size
    await destination.write([letter(1)])
    await destination.close()
    # The file's size at each fsync (directory fsyncs report the directory's size: skipped).
    file_syncs = [s for s in synced if s in (size_after_first, path.stat().st_size)]
    assert file_syncs == [size_after_first, path.stat().st_size]


async def test_concurrent_writes_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "dlq.jsonl"
    destination = JsonLinesDestination(path)
    batches = [[letter(i * 10 + j, key=f"k{i}") for j in range(5)] for i in range(6)]
    await asyncio.gather(*(destination.write(batch) for batch in batches))
    await destination.close()
    read = list(read_json_lines(path))
    assert sorted(read, key=lambda x: x.sequence_number) == sorted(
        [x for b in batches for x in b], key=lambda x: x.sequence_number
    )
    for batch in batches:
        positions = [read.index(x) for x in batch]
        assert positions == list(range(positions[0], positions[0] + 5))


async def test_a_failed_write_raises_the_typed_error_and_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dlq.jsonl"
    destination = JsonLinesDestination(path)
    await destination.write([letter(0)])

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(DeadLetterWriteError, match="No space left") as caught:
        await destination.write([letter(1), letter(2)])
    assert caught.value.count == 2
    assert isinstance(caught.value.__cause__, OSError)
    monkeypatch.undo()
    assert list(read_json_lines(path)) == [letter(0)]
    await destination.write([letter(3)])
    await destination.close()
    assert list(read_json_lines(path)) == [letter(0), letter(3)]


async def test_an_unwritable_path_and_a_closed_destination_fail_typed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DeadLetterWriteError):
        await JsonLinesDestination(blocker / "dlq.jsonl").write([letter(0)])
    destination = JsonLinesDestination(tmp_path / "dlq.jsonl")
    await destination.close()
    with pytest.raises(DeadLetterWriteError, match="closed"):
        await destination.write([letter(0)])


def test_reading_names_the_line_of_a_bad_letter(tmp_path: Path) -> None:
    path = tmp_path / "dlq.jsonl"
    path.write_bytes(letter(0).to_bytes() + b"\n\n" + b'{"torn": ')
    reader = read_json_lines(path)
    assert next(reader) == letter(0)
    with pytest.raises(MalformedDeadLetterError, match=r"dlq.jsonl:3"):
        next(reader)
