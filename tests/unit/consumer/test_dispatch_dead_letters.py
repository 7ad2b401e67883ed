"""Dead-letter destinations as the consumer's sink: letters stored, failed writes never skipped."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shardflow.consumer import Consumer
from shardflow.consumer.delivery import DestinationSink
from shardflow.deadletter import DeadLetter, JsonLinesDestination, read_json_lines
from shardflow.errors import DeadLetteringFailedError, DeadLetterWriteError, KeyBlockedError
from shardflow.leases import InMemoryLeaseStore
from shardflow.records import ExtendedSequenceNumber
from support.dispatch_kit import (
    dispatch_consumer,
    failing_on,
    shard_records,
    stream_of,
)
from unit.consumer.test_shard_worker_kit import eventually


class RefusingDestination:
    """A destination whose every write fails, as a full disk or an unreachable stream would."""

    def __init__(self) -> None:
        self.attempted: list[DeadLetter] = []

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        self.attempted.extend(letters)
        raise DeadLetterWriteError("nowhere", len(letters), "disk full")

    async def close(self) -> None:
        pass


def letters_in(path: Path) -> list[DeadLetter]:
    return list(read_json_lines(path)) if path.exists() else []


async def run_until(consumer: Consumer, handle: Any, done: Any, **options: Any) -> None:
    run = asyncio.create_task(consumer.consume(handle, **options))
    await eventually(done)
    await consumer.close()
    await asyncio.wait_for(run, 5)


async def test_skip_writes_letters_with_record_origin_and_error_to_a_json_lines_file(
    tmp_path: Path,
) -> None:
    kinesis = stream_of([(f"k{i % 3}", f"{i}".encode()) for i in range(9)])
    store = InMemoryLeaseStore("app")
    destination = JsonLinesDestination(tmp_path / "dlq" / "letters.jsonl")
    handled: list[bytes] = []

    handle = failing_on(b"4", ValueError, "bad amount", handled)

    consumer = dispatch_consumer(kinesis, store, ordering="key", on_failure="skip")
    letters_path = destination.path
    await run_until(
        consumer,
        handle,
        lambda: len(handled) == 8 and letters_path.exists() and letters_path.stat().st_size > 0,
        dead_letters=destination,
    )
    await destination.close()
    (letter,) = list(read_json_lines(letters_path))
    (shard,) = kinesis.shard_ids("s")
    sequence = kinesis.records("s", shard)[4][0]
    assert (letter.data, letter.partition_key) == (b"4", "k1")
    assert (letter.stream, letter.shard_id, letter.sequence_number) == ("s", shard, sequence)
    assert letter.sub_sequence_number == 0
    assert (letter.error_type, letter.error_message) == ("ValueError", "bad amount")
    assert letter.attempts == 2
    assert letter.blocked_key is None  # skip holds no key up
    (lease,) = await store.list_leases()
    assert lease.checkpoint == ExtendedSequenceNumber(kinesis.records("s", shard)[-1][0])


async def test_block_key_letters_name_the_blocked_key_and_the_blocking_record(
    tmp_path: Path,
) -> None:
    kinesis = stream_of([("a", b"0"), ("b", b"1"), ("a", b"2"), ("b", b"3"), ("a", b"4")])
    destination = JsonLinesDestination(tmp_path / "letters.jsonl")
    handled: list[bytes] = []

    handle = failing_on(b"0", RuntimeError, "downstream refused", handled)

    consumer = dispatch_consumer(kinesis, ordering="key", on_failure="block-key")
    await run_until(
        consumer,
        handle,
        lambda: handled == [b"1", b"3"] and len(letters_in(destination.path)) == 3,
        dead_letters=destination,
    )
    await destination.close()
    letters = list(read_json_lines(destination.path))
    assert [letter.data for letter in letters] == [b"0", b"2", b"4"]  # key a, in order
    assert {letter.blocked_key for letter in letters} == {"a"}
    assert [letter.error_type for letter in letters] == [
        "RuntimeError",
        "KeyBlockedError",
        "KeyBlockedError",
    ]
    assert [letter.attempts for letter in letters] == [2, 0, 0]


async def test_a_failed_dead_letter_write_stops_the_shard_before_the_record() -> None:
    kinesis = stream_of([("k", f"{i}".encode()) for i in range(6)])
    store = InMemoryLeaseStore("app")
    destination = RefusingDestination()
    errors: list[BaseException] = []
    handled: list[bytes] = []

    handle = failing_on(b"2", ValueError, "poison", handled)

    consumer = dispatch_consumer(
        kinesis,
        store,
        on_error=lambda stream, shard, error: errors.append(error),
        ordering="shard",
        on_failure="skip",
    )
    await run_until(consumer, handle, lambda: bool(errors), dead_letters=destination)
    (error,) = errors
    assert isinstance(error, DeadLetteringFailedError)
    assert isinstance(error.__cause__, DeadLetterWriteError)
    assert [letter.data for letter in destination.attempted] == [b"2"]
    assert handled == [b"0", b"1"]  # nothing after the record that could not be stored
    (lease,) = await store.list_leases()
    # Not skipped: the checkpoint stays before the record, so a restart reads it again.
    assert lease.checkpoint == ExtendedSequenceNumber(kinesis.records("s", lease.shard_id)[1][0])


async def test_destination_sink_takes_the_key_from_a_blocked_record_error(tmp_path: Path) -> None:
    destination = JsonLinesDestination(tmp_path / "l.jsonl")
    sink = DestinationSink(destination)
    record = shard_records(["customer-9"])[0]
    await sink.dead_letter(record, KeyBlockedError("customer-9", blocked_by="1/0"), 0)
    await destination.close()
    (letter,) = list(read_json_lines(destination.path))
    assert letter.blocked_key == "customer-9"
    assert letter.origin.endswith(f"{record.sequence_number}.0")


def test_destination_sink_refuses_what_is_not_a_destination() -> None:
    with pytest.raises(TypeError, match="not a dead-letter destination"):
        DestinationSink(object())  # type: ignore[arg-type]


async def test_release_key_lets_later_records_of_a_blocked_key_be_handled_again(
    tmp_path: Path,
) -> None:
    kinesis = stream_of([("a", b"0"), ("b", b"1"), ("a", b"2")])
    destination = JsonLinesDestination(tmp_path / "letters.jsonl")
    handled: list[bytes] = []

    handle = failing_on(b"0", RuntimeError, "downstream refused", handled)

    consumer = dispatch_consumer(kinesis, ordering="key", on_failure="block-key")
    assert consumer.release_key("a") == 0  # not running: nothing is blocked
    run = asyncio.create_task(consumer.consume(handle, dead_letters=destination))
    await eventually(lambda: len(letters_in(destination.path)) == 2)
    (shard,) = kinesis.shard_ids("s")
    assert consumer.blocked_keys() == {("s", shard): frozenset({"a"})}
    # From another thread (an admin endpoint, say), as from the loop.
    assert await asyncio.to_thread(consumer.release_key, "a", stream="s") == 1
    assert consumer.blocked_keys() == {}
    assert consumer.release_key("a") == 0
    kinesis.put_many("s", [("a", b"3")])
    await eventually(lambda: handled == [b"1", b"3"])
    await consumer.close()
    await asyncio.wait_for(run, 5)
    await destination.close()
    assert [letter.data for letter in read_json_lines(destination.path)] == [b"0", b"2"]
