"""Replay without a server: sources, filters, and dry runs that count without writing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shardflow.deadletter import (
    DeadLetter,
    DeadLetterSource,
    JsonLinesDestination,
    LetterFilter,
    read_letters,
    replay,
)
from shardflow.records import Record

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def letter(n: int, key: str) -> DeadLetter:
    record = Record(data=b"%d" % n, partition_key=key, sequence_number=str(n), stream_name="s")
    return DeadLetter.from_failure(
        record, ValueError(n), attempts=1, failed_at=T0 + timedelta(minutes=n)
    )


@pytest.mark.parametrize(
    ("text", "kind", "location"),
    [
        ("file:/tmp/dlq.jsonl", "file", "/tmp/dlq.jsonl"),
        ("file:relative:with:colons", "file", "relative:with:colons"),
        ("stream:orders-dlq", "stream", "orders-dlq"),
    ],
)
def test_sources_parse(text: str, kind: str, location: str) -> None:
    source = DeadLetterSource.parse(text)
    assert (source.kind, source.location) == (kind, location)
    assert str(source) == text


@pytest.mark.parametrize("text", ["orders", "file:", "s3:bucket/key", ":x"])
def test_bad_sources_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="file:PATH or stream:NAME"):
        DeadLetterSource.parse(text)


def test_filters_by_failure_time_window_and_key() -> None:
    letters = [letter(n, key) for n, key in enumerate(["a", "b", "a", "c", "a"])]
    window = LetterFilter(since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=4))
    assert [x.sequence_number for x in letters if window.matches(x)] == ["1", "2", "3"]
    keyed = LetterFilter(keys=frozenset({"a", "c"}), since=T0 + timedelta(minutes=1))
    assert [x.sequence_number for x in letters if keyed.matches(x)] == ["2", "3", "4"]
    assert all(LetterFilter().matches(x) for x in letters)
    with pytest.raises(ValueError, match="aware"):
        LetterFilter(since=datetime(2025, 1, 1))


async def test_file_source_and_dry_run_count_without_connecting(tmp_path: Path) -> None:
    path = tmp_path / "dlq.jsonl"
    destination = JsonLinesDestination(path)
    await destination.write([letter(n, "a" if n % 2 else "b") for n in range(6)])
    await destination.close()
    letters = read_letters(DeadLetterSource.parse(f"file:{path}"))
    # No endpoint exists for this stream: a dry run must not try to reach one.
    summary = await replay(
        letters, "no-such-stream", letter_filter=LetterFilter(keys=frozenset({"a"})), dry_run=True
    )
    assert (summary.read, summary.selected, summary.replayed, summary.failed) == (6, 3, 0, 0)
    assert summary.dry_run
    assert summary.ok
