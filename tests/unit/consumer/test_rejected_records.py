"""A record the deserializer rejects is a failure of that record (issue 22 item 0): it goes where
the failure policy says (dead letter with its raw bytes and the deserializer's error, or the
shard stops), in every ordering mode and in the default one, and the shard goes on after it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.errors import DeserializationError
from shardflow.leases import InMemoryLeaseStore
from shardflow.records import ExtendedSequenceNumber, as_json
from shardflow.testing import InMemoryDeadLetters, consume_until_caught_up, fast_settings
from support.dispatch_kit import dispatching, stream_of
from unit.consumer.test_shard_worker_kit import eventually

POISON = [("k1", b'{"a": 1}'), ("k2", b"not json"), ("k1", b'{"a": 2}'), ("k2", b'{"a": 3}')]


@pytest.mark.parametrize("ordering", ["shard", "key", "unordered"])
async def test_a_rejected_record_is_dead_lettered_and_the_shard_goes_on(ordering: str) -> None:
    kinesis = stream_of(POISON)
    sink = InMemoryDeadLetters()
    handled: list[Any] = []

    async def handle(record: ConsumedRecord[Any]) -> None:
        handled.append(record.value)

    settings = fast_settings(
        deserializer=as_json, dispatch=dispatching(ordering=ordering, on_failure="skip")
    )
    consumer = Consumer(
        "s", "app", settings=settings, kinesis=kinesis, lease_store=InMemoryLeaseStore("app")
    )
    run = asyncio.create_task(consumer.consume(handle, dead_letters=sink))
    await eventually(lambda: len(handled) == 3 and len(sink.letters) == 1)
    status = consumer.status()
    await consumer.close()
    await asyncio.wait_for(run, 5)
    assert sorted(value["a"] for value in handled) == [1, 2, 3]
    (letter,) = sink.letters
    assert letter.data == b"not json"
    assert letter.attempts == 0
    assert letter.error_type == "DeserializationError"
    assert "JSONDecodeError" in letter.error_message
    assert not status.parked


async def test_by_default_a_rejected_record_parks_the_shard_after_the_records_before_it() -> None:
    kinesis = stream_of(POISON)
    handled: list[Any] = []
    errors: list[BaseException] = []

    async def handle(record: ConsumedRecord[Any]) -> None:
        handled.append(record.value)

    report = await consume_until_caught_up(
        "s",
        handle,
        kinesis=kinesis,
        settings=fast_settings(deserializer=as_json),
        on_error=lambda stream, shard, error: errors.append(error),
    )
    (shard,) = kinesis.shard_ids("s")
    assert handled == [{"a": 1}]
    assert set(report.status.parked) == {shard}
    (error,) = errors
    assert isinstance(error, DeserializationError)
    first = kinesis.records("s", shard)[0][0]
    assert report.checkpoints[shard] == ExtendedSequenceNumber(first)


async def test_block_key_blocks_the_key_of_a_rejected_record() -> None:
    kinesis = stream_of(POISON)
    sink = InMemoryDeadLetters()
    handled: list[Any] = []

    async def handle(record: ConsumedRecord[Any]) -> None:
        handled.append(record.value)

    settings = fast_settings(
        deserializer=as_json, dispatch=dispatching(ordering="key", on_failure="block-key")
    )
    consumer = Consumer(
        "s", "app", settings=settings, kinesis=kinesis, lease_store=InMemoryLeaseStore("app")
    )
    run = asyncio.create_task(consumer.consume(handle, dead_letters=sink))
    await eventually(lambda: len(handled) == 2 and len(sink.letters) == 2)
    await consumer.close()
    await asyncio.wait_for(run, 5)
    assert handled == [{"a": 1}, {"a": 2}]
    assert [letter.data for letter in sink.letters] == [b"not json", b'{"a": 3}']
    assert [letter.blocked_key for letter in sink.letters] == ["k2", "k2"]
