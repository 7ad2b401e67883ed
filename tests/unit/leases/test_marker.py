"""The change marker's bumps: one lands after every write that asked for it, the writer does
not wait for it, and writes that finish together share one."""

from __future__ import annotations

import asyncio

from shardflow.leases.marker import ChangeMarker


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class SlowBumps:
    """A bump that takes until the test lets it land."""

    def __init__(self) -> None:
        self.sent = 0
        self.gate = asyncio.Event()
        self.fail = False

    async def __call__(self) -> None:
        self.sent += 1
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("the table went away")


async def test_writes_finishing_together_share_one_bump_and_nobody_waits_for_it() -> None:
    bumps = SlowBumps()
    marker = ChangeMarker(bumps)
    for _ in range(50):
        marker.note()  # returns at once: the bump goes out in the background
    await settle()
    assert bumps.sent == 1
    bumps.gate.set()
    await marker.settle()
    assert bumps.sent == 1
    assert marker.bumps == 1


async def test_a_write_finished_during_a_bump_gets_the_next_one() -> None:
    bumps = SlowBumps()
    marker = ChangeMarker(bumps)
    marker.note()
    await settle()
    assert bumps.sent == 1
    # This write returned after the bump in flight was sent: that bump may land before the
    # write is visible to a reader, so it must not count for it.
    marker.note()
    await settle()
    assert bumps.sent == 1
    bumps.gate.set()
    await marker.settle()
    assert bumps.sent == 2


async def test_a_failed_bump_is_logged_not_raised() -> None:
    bumps = SlowBumps()
    bumps.fail = True
    bumps.gate.set()
    marker = ChangeMarker(bumps)
    marker.note()
    await marker.settle()
    marker.note()
    await marker.settle()
    assert bumps.sent == 2


async def test_a_cancelled_waiter_leaves_the_bump_to_the_others() -> None:
    bumps = SlowBumps()
    marker = ChangeMarker(bumps)
    marker.note()
    waiting = asyncio.ensure_future(marker.settle())
    other = asyncio.ensure_future(marker.settle())
    await settle()
    waiting.cancel()
    await settle()
    bumps.gate.set()
    await other
    assert bumps.sent == 1


def test_writes_owed_a_bump_when_their_loop_ended_get_one_on_the_next() -> None:
    bumps = SlowBumps()
    marker = ChangeMarker(bumps)

    async def write_and_leave() -> None:
        marker.note()
        await settle()  # the bump is in flight when the loop ends (and is cancelled)

    asyncio.run(write_and_leave())

    async def later() -> None:
        bumps.gate.set()
        await marker.settle()

    asyncio.run(later())
    assert bumps.sent == 2
