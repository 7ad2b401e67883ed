"""The delivery engine's shard-ordered runs: a chunk in one go, a failed record retried alone,
then the failure policy; batch handlers retried and dead-lettered whole; manual acks."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from shardflow.backoff import NO_BACKOFF
from shardflow.consumer.delivery import DispatchSettings, ShardDispatcher
from shardflow.errors import HandlerError, RetriesExhaustedError
from shardflow.records import Record
from support.dispatch_kit import MemorySink, ZeroTimeClock, delivered, is_acked, shard_records


def settings(attempts: int, **overrides: object) -> DispatchSettings:
    return DispatchSettings(retry=replace(NO_BACKOFF, max_attempts=attempts), **overrides)  # type: ignore[arg-type]


class Flaky:
    """A handler failing ``times`` calls for each payload in ``bad`` (every call if None)."""

    def __init__(self, bad: dict[str, int | None]) -> None:
        self.bad = bad
        self.calls: list[str] = []
        self.threads: set[int] = set()

    def __call__(self, record: Record) -> None:
        payload = record.data.decode()
        self.calls.append(payload)
        self.threads.add(threading.get_ident())
        left = self.bad.get(payload, 0)
        if left is None or left > 0:
            if left is not None:
                self.bad[payload] = left - 1
            raise ValueError(f"bad {payload}")


async def run(dispatcher: ShardDispatcher[Record], records: list[Record]) -> None:
    await dispatcher.submit_run(records)
    await dispatcher.settled()


@pytest.mark.parametrize("is_async", [False, True])
async def test_a_run_retries_a_failed_record_alone_and_goes_on_in_order(is_async: bool) -> None:
    records = shard_records(["k"] * 6)
    tracker = delivered(records)
    flaky = Flaky({"payload-2": 1})
    handler = flaky
    if is_async:

        async def handler(record: Record) -> None:  # type: ignore[misc]
            flaky(record)

    dispatcher = ShardDispatcher(handler, tracker, settings(2), clock=ZeroTimeClock())
    assert dispatcher.takes_runs
    await run(dispatcher, records)
    payloads = [f"payload-{i}" for i in range(6)]
    assert flaky.calls == payloads[:3] + payloads[2:]
    assert tracker.all_acked
    assert dispatcher.counts.handled == 6


async def test_a_plain_handler_takes_one_thread_hop_per_run_without_failures() -> None:
    records = shard_records(["k"] * 50)
    tracker = delivered(records)
    flaky = Flaky({})
    await run(ShardDispatcher(flaky, tracker, settings(1)), records)
    assert len(flaky.calls) == 50
    assert len(flaky.threads) == 1
    assert tracker.all_acked


async def test_a_record_failing_for_good_is_dead_lettered_and_the_run_goes_on() -> None:
    records = shard_records(["k"] * 5)
    tracker = delivered(records)
    sink = MemorySink()
    dispatcher = ShardDispatcher(
        Flaky({"payload-1": None}),
        tracker,
        settings(3, on_failure="skip"),
        sink=sink,
        clock=ZeroTimeClock(),
    )
    await run(dispatcher, records)
    assert [letter.record for letter in sink.letters] == [records[1]]
    assert sink.letters[0].attempts == 3
    assert tracker.all_acked
    assert dispatcher.counts.handled == 4
    assert dispatcher.counts.dead_lettered == 1


async def test_stop_shard_leaves_the_failed_record_and_the_rest_of_the_run_unacked() -> None:
    records = shard_records(["k"] * 5)
    tracker = delivered(records)
    heard: list[BaseException] = []
    dispatcher = ShardDispatcher(
        Flaky({"payload-2": None}),
        tracker,
        settings(2),
        clock=ZeroTimeClock(),
        on_stop=heard.append,
    )
    await run(dispatcher, records)
    assert [is_acked(tracker, r) for r in records] == [True, True, False, False, False]
    assert isinstance(heard[0], RetriesExhaustedError)
    assert isinstance(heard[0].__cause__, HandlerError)
    assert dispatcher.counts.abandoned == 3


async def test_a_stop_between_records_leaves_the_rest_of_the_run() -> None:
    records = shard_records(["k"] * 10)
    tracker = delivered(records)
    delivering = True

    def handler(record: Record) -> None:
        nonlocal delivering
        if record.data == b"payload-3":
            delivering = False  # the shard is stopping from here on

    dispatcher = ShardDispatcher(handler, tracker, settings(1), may_deliver=lambda: delivering)
    await run(dispatcher, records)
    assert [is_acked(tracker, r) for r in records] == [True] * 4 + [False] * 6


async def test_a_failing_batch_is_retried_whole_then_dead_lettered_record_by_record() -> None:
    records = shard_records(["k"] * 4)
    tracker = delivered(records)
    sink = MemorySink()
    batches: list[list[Record]] = []

    async def handler(batch: list[Record]) -> None:
        batches.append(batch)
        raise ValueError("the database is down")

    dispatcher = ShardDispatcher(
        handler,
        tracker,
        settings(2, on_failure="skip"),
        sink=sink,
        batch=True,
        clock=ZeroTimeClock(),
    )
    await run(dispatcher, records)
    assert batches == [records, records]
    assert [letter.record for letter in sink.letters] == records
    assert all(letter.attempts == 2 for letter in sink.letters)
    assert tracker.all_acked


async def test_manual_acks_leave_acknowledging_to_the_handler() -> None:
    records = shard_records(["k"] * 4)
    tracker = delivered(records)
    handled: list[Record] = []
    dispatcher = ShardDispatcher(handled.append, tracker, settings(1), auto_ack=False)
    await run(dispatcher, records)
    assert handled == records
    assert not any(is_acked(tracker, r) for r in records)
    for record in records:
        tracker.ack(record)
    assert tracker.all_acked


def test_a_batch_handler_refuses_key_ordering_block_key_and_claims() -> None:
    for refused in (
        settings(1, ordering="key"),
        settings(1, on_failure="block-key"),
    ):
        with pytest.raises(ValueError, match="batch handler"):
            refused.check_batch_handler()
    settings(1).check_batch_handler()
