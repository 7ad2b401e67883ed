"""first_of: the one race helper (events, futures, coroutines, a timeout)."""

from __future__ import annotations

import asyncio

from shardflow.waits import first_of


async def test_returns_when_an_event_is_set() -> None:
    stop, lost = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, stop.set)
    await asyncio.wait_for(first_of(stop, lost), 1.0)
    assert not lost.is_set()


async def test_a_future_passed_in_is_left_running() -> None:
    stop = asyncio.Event()
    work = asyncio.ensure_future(asyncio.sleep(10))
    asyncio.get_running_loop().call_later(0.01, stop.set)
    await first_of(work, stop)
    assert not work.done()
    work.cancel()


async def forever(cancelled: asyncio.Event) -> None:
    """Sleeps until cancelled, then says so."""
    try:
        await asyncio.sleep(10)
    finally:
        cancelled.set()


async def test_a_coroutine_counts_and_is_cancelled_when_it_loses() -> None:
    cancelled = asyncio.Event()
    await first_of(forever(cancelled), asyncio.sleep(0.01))
    await asyncio.wait_for(cancelled.wait(), 1.0)


async def test_returns_at_once_when_something_is_over_already() -> None:
    done = asyncio.Event()
    done.set()
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    finished.set_result(None)
    await asyncio.wait_for(first_of(done, asyncio.sleep(10)), 0.5)
    await asyncio.wait_for(first_of(finished, asyncio.Event()), 0.5)


async def test_timeout_ends_the_wait() -> None:
    never = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await first_of(never, timeout=0.02)
    assert loop.time() - started >= 0.015
    assert not never.is_set()


async def test_cancelling_the_waiter_cancels_what_it_started() -> None:
    cancelled = asyncio.Event()
    waiter = asyncio.ensure_future(first_of(forever(cancelled), asyncio.Event()))
    await asyncio.sleep(0.01)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    await asyncio.wait_for(cancelled.wait(), 1.0)
