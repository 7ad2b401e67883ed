"""What a user sees when a handler fails or a record goes to the dead letters (issue 14, 3)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.consumer.delivery.dead_letters import ObservedSink
from shardflow.leases import InMemoryLeaseStore
from shardflow.records import Record
from shardflow.testing import InMemoryDeadLetters, fast_settings
from support.dispatch_kit import MemorySink, ZeroTimeClock, dispatch_consumer, stream_of


async def _until(condition: object, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_failing_handler_is_logged_once_with_its_traceback_and_what_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kinesis = stream_of([("k", b"bad")])
    consumer = Consumer(
        "s", "app", settings=fast_settings(), kinesis=kinesis, lease_store=InMemoryLeaseStore("app")
    )

    async def handle(record: ConsumedRecord[bytes]) -> None:
        raise ValueError("cannot bill this order")

    caplog.set_level(logging.DEBUG, logger="shardflow")
    run = asyncio.create_task(consumer.consume(handle))
    await _until(lambda: any(r.exc_info for r in caplog.records))
    await consumer.close()
    await run
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    (failure,) = errors  # once
    assert failure.exc_info is not None
    text = caplog.text
    assert "cannot bill this order" in text
    assert f'{__file__}", line' in text  # the handler's file and line
    message = failure.getMessage()
    assert "parked" in message
    assert "restarts" in message  # what happens next
    assert "--on-error stop-consumer" in message  # and how to choose otherwise
    assert "--on-failure skip" in message


async def test_every_dead_letter_is_counted_and_logged_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kinesis = stream_of([(f"k{i}", f"bad-{i}".encode()) for i in range(5)])
    consumer = dispatch_consumer(kinesis, on_failure="skip")
    sink = InMemoryDeadLetters()

    async def handle(record: ConsumedRecord[bytes]) -> None:
        raise ValueError(f"refused {record.data!r}")

    caplog.set_level(logging.WARNING, logger="shardflow.consumer.deadletters")
    run = asyncio.create_task(consumer.consume(handle, dead_letters=sink))
    await _until(lambda: len(sink.letters) == 5)
    await consumer.close()
    await run
    assert consumer.metrics().streams["s"].dead_letters == 5
    (line,) = caplog.records  # five letters within the interval: one line
    assert "went to the dead letters after 2 handler call(s): ValueError: refused" in (
        line.getMessage()
    )


async def test_the_dead_letter_lines_in_between_are_summed_up_in_the_next() -> None:
    clock = ZeroTimeClock()
    counted: list[str] = []
    sink = ObservedSink(MemorySink(), counted.append, interval=10.0, clock=clock)
    record = Record(b"x", "k", "1", shard_id="shardId-0", stream_name="s")
    logger = logging.getLogger("shardflow.consumer.deadletters")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        for _ in range(3):
            await sink.dead_letter(record, ValueError("no"), 1)
        clock.monotonic = lambda: 11.0  # type: ignore[method-assign]
        await sink.dead_letter(record, ValueError("no"), 1)
    finally:
        logger.removeHandler(handler)
    assert counted == ["s"] * 4
    assert len(seen) == 2
    assert seen[1].endswith("(2 more since the last such line)")
