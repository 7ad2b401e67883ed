"""The producer's bounded buffer: backpressure, flush barriers, closing."""

from __future__ import annotations

import asyncio

import pytest

from shardflow.errors import ProducerClosedError
from shardflow.producer.buffer import RecordBuffer


async def test_reserve_counts_records_and_bytes_until_released() -> None:
    buffer = RecordBuffer(max_records=10, max_bytes=1_000)
    epoch = await buffer.reserve(100)
    assert (buffer.records, buffer.nbytes, epoch.pending) == (1, 100, 1)
    buffer.release(epoch, 100)
    assert (buffer.records, buffer.nbytes, epoch.pending) == (0, 0, 0)


async def test_a_full_buffer_makes_reserve_wait_and_admits_in_arrival_order() -> None:
    buffer = RecordBuffer(max_records=2, max_bytes=1_000)
    first = await buffer.reserve(10)
    await buffer.reserve(10)
    assert buffer.try_reserve(10) is None
    order: list[str] = []

    async def put(name: str, size: int) -> None:
        await buffer.reserve(size)
        order.append(name)

    waiting = [asyncio.create_task(put(n, 10)) for n in ("a", "b")]
    await asyncio.sleep(0.01)
    assert order == []
    buffer.release(first, 10)
    buffer.wake()
    await asyncio.sleep(0.01)
    assert order == ["a"]  # only one slot came free
    assert not waiting[1].done()
    waiting[1].cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert buffer.records == 2


async def test_byte_limit_applies_but_an_empty_buffer_takes_any_record() -> None:
    buffer = RecordBuffer(max_records=100, max_bytes=1_000)
    epoch = await buffer.reserve(5_000)  # larger than the limit, but the buffer is empty
    assert buffer.try_reserve(1) is None
    buffer.release(epoch, 5_000)
    buffer.wake()
    assert buffer.try_reserve(900) is not None
    assert buffer.try_reserve(200) is None


async def test_a_cancelled_waiter_leaves_no_capacity_behind() -> None:
    buffer = RecordBuffer(max_records=1, max_bytes=1_000)
    held = await buffer.reserve(10)
    waiter = asyncio.create_task(buffer.reserve(10))
    await asyncio.sleep(0)
    buffer.release(held, 10)
    buffer.wake()  # grants the waiter, which is cancelled before it runs
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert buffer.records == 0
    assert buffer.try_reserve(10) is not None


async def test_flush_waits_for_records_accepted_before_it_only() -> None:
    buffer = RecordBuffer(max_records=100, max_bytes=10_000)
    old = [await buffer.reserve(1) for _ in range(3)]
    flushed = buffer.flush()
    assert buffer.flushing
    newer = await buffer.reserve(1)
    for epoch in old[:2]:
        buffer.release(epoch, 1)
    buffer.wake()
    assert not flushed.done()
    buffer.release(old[2], 1)
    buffer.wake()
    await asyncio.wait_for(flushed, 1)
    assert not buffer.flushing
    assert newer.pending == 1  # the later record is still pending; the flush did not wait


async def test_flush_of_an_empty_buffer_is_done_at_once() -> None:
    buffer = RecordBuffer(max_records=1, max_bytes=1)
    assert buffer.flush().done()


async def test_close_fails_waiting_puts_and_refuses_new_ones() -> None:
    buffer = RecordBuffer(max_records=1, max_bytes=1_000)
    await buffer.reserve(1)
    waiter = asyncio.create_task(buffer.reserve(1))
    await asyncio.sleep(0)
    buffer.close()
    with pytest.raises(ProducerClosedError):
        await waiter
    with pytest.raises(ProducerClosedError):
        buffer.try_reserve(1)
