"""Lambda-style failure controls (issue 24 item 4): bisect a failing batch, partial batch failure
reporting, maximum record age, maximum attempts; per-key order as the modes keep it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from shardflow.backoff import NO_BACKOFF
from shardflow.clock import ManualClock
from shardflow.consumer.delivery import DispatchSettings, ShardDispatcher
from shardflow.errors import BatchResultError, HandlerError, RecordExpiredError
from shardflow.records import Record
from support.dispatch_kit import MemorySink, ZeroTimeClock, delivered, is_acked, shard_records


def settings(attempts: int, **overrides: Any) -> DispatchSettings:
    return DispatchSettings(retry=replace(NO_BACKOFF, max_attempts=attempts), **overrides)


async def run_batch(dispatcher: ShardDispatcher[Record], records: list[Record]) -> None:
    await dispatcher.submit_run(records)
    await dispatcher.settled()


def numbers(records: list[Record]) -> list[int]:
    return [int(r.data.decode().split("-")[1]) for r in records]


async def test_bisect_isolates_the_poison_record_and_handles_the_rest_once() -> None:
    records = shard_records(["k"] * 8)
    tracker = delivered(records)
    sink = MemorySink()
    handled: list[int] = []
    calls: list[list[int]] = []

    async def handle(batch: list[Record]) -> None:
        calls.append(numbers(batch))
        if 5 in numbers(batch):
            raise ValueError("poison")
        handled.extend(numbers(batch))

    dispatcher = ShardDispatcher(
        handle,
        tracker,
        settings(1, on_failure="skip", bisect_on_error=True),
        sink=sink,
        batch=True,
        clock=ZeroTimeClock(),
    )
    await run_batch(dispatcher, records)
    assert [letter.record for letter in sink.letters] == [records[5]]
    assert sorted(handled) == [0, 1, 2, 3, 4, 6, 7]  # each handled once
    assert len(calls) == 1 + 2 + 2 + 2  # log2(8) levels down to the poison
    assert tracker.all_acked


async def test_without_bisect_a_failing_batch_goes_to_the_dead_letters_whole() -> None:
    records = shard_records(["k"] * 4)
    tracker = delivered(records)
    sink = MemorySink()

    async def handle(batch: list[Record]) -> None:
        raise ValueError("poison")

    dispatcher = ShardDispatcher(
        handle, tracker, settings(2, on_failure="skip"), sink=sink, batch=True,
        clock=ZeroTimeClock(),
    )  # fmt: skip
    await run_batch(dispatcher, records)
    assert [letter.record for letter in sink.letters] == records
    assert all(letter.attempts == 2 for letter in sink.letters)


async def test_a_partial_failure_acknowledges_what_came_before_and_retries_from_there() -> None:
    records = shard_records(["k"] * 6)
    tracker = delivered(records)
    calls: list[list[int]] = []

    async def handle(batch: list[Record]) -> list[Record]:
        calls.append(numbers(batch))
        if len(calls) == 1:
            assert [is_acked(tracker, r) for r in records] == [False] * 6
            return [batch[3]]  # 3 failed: 0-2 are done
        assert [is_acked(tracker, r) for r in records] == [True] * 3 + [False] * 3
        return []

    dispatcher = ShardDispatcher(handle, tracker, settings(3), batch=True, clock=ZeroTimeClock())
    await run_batch(dispatcher, records)
    assert calls == [[0, 1, 2, 3, 4, 5], [3, 4, 5]]
    assert tracker.all_acked
    assert dispatcher.counts.handled == 6


async def test_records_still_reported_failed_after_the_last_attempt_are_dead_lettered() -> None:
    records = shard_records(["k"] * 5)
    tracker = delivered(records)
    sink = MemorySink()

    def handle(batch: list[Record]) -> list[Any]:
        # Positions name records as well as the records themselves.
        return [r.position for r in batch if r.data in (b"payload-2", b"payload-4")]

    dispatcher = ShardDispatcher(
        handle, tracker, settings(2, on_failure="skip"), sink=sink, batch=True,
        clock=ZeroTimeClock(),
    )  # fmt: skip
    await run_batch(dispatcher, records)
    assert [letter.record for letter in sink.letters] == [records[2], records[4]]
    assert all(isinstance(letter.error, HandlerError) for letter in sink.letters)
    assert tracker.all_acked
    assert dispatcher.counts.handled == 3
    assert dispatcher.counts.dead_lettered == 2


async def test_a_partial_failure_under_stop_shard_stops_before_the_first_failed_record() -> None:
    records = shard_records(["k"] * 5)
    tracker = delivered(records)
    heard: list[BaseException] = []

    async def handle(batch: list[Record]) -> list[Record]:
        return [r for r in batch if r.data == b"payload-2"]

    dispatcher = ShardDispatcher(
        handle, tracker, settings(2), batch=True, clock=ZeroTimeClock(), on_stop=heard.append
    )
    await run_batch(dispatcher, records)
    assert [is_acked(tracker, r) for r in records] == [True, True, False, False, False]
    assert heard


async def test_a_batch_handler_returning_something_else_fails_the_batch() -> None:
    records = shard_records(["k"] * 3)
    tracker = delivered(records)
    sink = MemorySink()

    async def handle(batch: list[Record]) -> str:
        return "ok"

    dispatcher = ShardDispatcher(
        handle, tracker, settings(1, on_failure="skip"), sink=sink, batch=True
    )
    await run_batch(dispatcher, records)
    assert len(sink.letters) == 3
    assert isinstance(sink.letters[0].error.__cause__, BatchResultError)


@pytest.mark.parametrize("mode", ["batch", "run", "key"])
async def test_records_older_than_max_record_age_go_to_the_dead_letters_unhandled(
    mode: str,
) -> None:
    clock = ManualClock()
    now = datetime.fromtimestamp(clock.wall(), UTC)
    ages = [120, 10, 90, 5]  # seconds since arrival
    records = [
        replace(record, approximate_arrival_timestamp=now.fromtimestamp(clock.wall() - age, UTC))
        for record, age in zip(shard_records(["a", "b", "a", "b"]), ages, strict=True)
    ]
    tracker = delivered(records)
    sink = MemorySink()
    handled: list[Record] = []

    async def one(record: Record) -> None:
        handled.append(record)

    async def many(batch: list[Record]) -> None:
        handled.extend(batch)

    ordering = "key" if mode == "key" else "shard"
    dispatcher = ShardDispatcher(
        many if mode == "batch" else one,
        tracker,
        settings(1, ordering=ordering, max_record_age=60.0),
        sink=sink,
        batch=mode == "batch",
        clock=clock,
    )
    if mode == "key":
        for record in records:
            await dispatcher.submit(record)
        await dispatcher.drain()
    else:
        await run_batch(dispatcher, records)
    assert sorted(numbers(handled)) == [1, 3]
    assert sorted(numbers([letter.record for letter in sink.letters])) == [0, 2]
    assert all(isinstance(letter.error, RecordExpiredError) for letter in sink.letters)
    assert all(letter.attempts == 0 for letter in sink.letters)
    assert dispatcher.counts.expired == 2
    assert tracker.all_acked


def test_max_record_age_needs_a_dead_letter_destination() -> None:
    assert settings(1, max_record_age=60.0).needs_dead_letters
    with pytest.raises(ValueError, match="max_record_age"):
        settings(1, max_record_age=0)


async def test_bisect_through_the_consumer_with_dead_letters() -> None:
    from shardflow.aws import OpenClients
    from shardflow.consumer import Consumer
    from shardflow.leases import InMemoryLeaseStore
    from shardflow.testing import InMemoryDeadLetters, fast_settings
    from support.dispatch_kit import stream_of
    from unit.consumer.test_shard_worker_kit import eventually

    kinesis = stream_of([(f"k{i}", f"{i}".encode()) for i in range(16)])
    letters = InMemoryDeadLetters()
    handled: list[bytes] = []

    async def handle(batch: list[Any]) -> None:
        if any(record.data == b"11" for record in batch):
            raise ValueError("eleven")
        handled.extend(record.data for record in batch)

    dispatch = settings(1, on_failure="skip", bisect_on_error=True)
    consumer = Consumer(
        "s",
        "app",
        settings=fast_settings(dispatch=dispatch),
        clients=OpenClients(kinesis=kinesis),
        lease_store=InMemoryLeaseStore("app"),
    )
    run = asyncio.create_task(consumer.consume(handle, batch=True, dead_letters=letters))
    await eventually(lambda: len(handled) == 15 and len(letters.letters) == 1)
    await consumer.close()
    await asyncio.wait_for(run, 5)
    assert sorted(handled) == sorted(f"{i}".encode() for i in range(16) if i != 11)
    assert letters.letters[0].data == b"11"
