"""The change marker's bumps: one lands after every write that asked for it, and writes that
finish together share one."""

from __future__ import annotations

import asyncio

from shardflow.leases.marker import ChangeMarker


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class SlowBumps:
    """A bump that takes until the test lets it land; records the order of events."""

    def __init__(self) -> None:
        self.sent = 0
        self.gate = asyncio.Event()
        self.fail = False

    async def __call__(self) -> None:
        self.sent += 1
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("the table went away")


async def test_writes_finishing_together_share_one_bump() -> None:
    bumps = SlowBumps()
    marker = ChangeMarker(bumps)
    waiting = [asyncio.ensure_future(marker.touch()) for _ in range(50)]
    await asyncio.sleep(0)
    bumps.gate.set()
    await asyncio.gather(*waiting)
    assert bumps.sent == 1
    assert marker.bumps == 1


async def test_a_write_finished_during_a_bump_waits_for_the_next_one() -> None:
    bumps = SlowBumps()
    marker = ChangeMarker(bumps)
    first = asyncio.ensure_future(marker.touch())
    await settle()
    assert bumps.sent == 1
    # This write finished after the bump in flight was sent: that bump may land before the
    # write is visible to a reader, so it must not count for it.
    second = asyncio.ensure_future(marker.touch())
    await settle()
    bumps.gate.set()
    await first
    await second
    assert bumps.sent == 2


async def test_a_failed_bump_does_not_fail_the_write() -> None:
    bumps = SlowBumps()
    bumps.fail = True
    bumps.gate.set()
    marker = ChangeMarker(bumps)
    await marker.touch()  # no exception: the write it follows succeeded
    await marker.touch()
    assert bumps.sent == 2


async def test_a_cancelled_writer_leaves_the_bump_to_the_others() -> None:
    bumps = SlowBumps()
    marker = ChangeMarker(bumps)
    cancelled = asyncio.ensure_future(marker.touch())
    other = asyncio.ensure_future(marker.touch())
    await settle()
    cancelled.cancel()
    await settle()
    bumps.gate.set()
    await other
    assert bumps.sent == 1
