from __future__ import annotations

import asyncio

from shardflow.clock import ManualClock


async def test_manual_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = ManualClock(start=0.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    tasks = [asyncio.create_task(sleeper("late", 5)), asyncio.create_task(sleeper("early", 2))]
    await asyncio.sleep(0)
    await clock.advance(1)
    assert woke == []
    await clock.advance(3)
    assert woke == [("early", 2.0)]
    await clock.advance(10)
    assert woke == [("early", 2.0), ("late", 5.0)]
    assert clock.monotonic() == 14.0
    await asyncio.gather(*tasks)
