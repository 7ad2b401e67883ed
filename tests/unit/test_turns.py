"""Bulk work on the event loop is rationed loop-wide: one slice per turn of the loop."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from shardflow.aggregation import AggregateBuilder
from shardflow.read.intake import RecordIntake, resume_filter
from shardflow.records import TRIM_HORIZON, ExtendedSequenceNumber, Record
from shardflow.turns import SLICE_SECONDS, Turns


class LoopTurns:
    """Numbers the turns of the running loop: a callback that schedules itself with
    ``call_soon`` runs exactly once per turn."""

    def __init__(self) -> None:
        self.turn = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.turn += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


async def test_many_bulk_tasks_get_one_slice_per_turn_of_the_loop() -> None:
    turns = LoopTurns()
    slices: Counter[int] = Counter()

    async def bulk() -> None:
        mine = Turns(every=0.0)  # every take is a turn
        for _ in range(50):
            await mine.take()
            slices[turns.turn] += 1

    await asyncio.gather(*(bulk() for _ in range(16)))
    turns.stop()
    assert sum(slices.values()) == 16 * 50
    # With a plain sleep(0) every task would run a slice in the same turn (16 per turn).
    assert max(slices.values()) == 1


async def test_a_timer_waits_for_at_most_a_slice_or_two_while_many_tasks_unpack() -> None:
    """Eight shards unpack a full-size aggregate (~87,000 user records) each; a 5 ms timer,
    as a lease renewal's, fires a slice or two late, not a slice of every task late."""
    builder = AggregateBuilder()
    while builder.try_add("k", b"data", "0"):
        pass
    built = builder.build()

    async def unpack(shard: int) -> int:
        intake = RecordIntake(
            plan=resume_filter(ExtendedSequenceNumber(TRIM_HORIZON), None),
            hash_range=None,
            shard_id=f"shardId-{shard:012d}",
        )
        record = Record(built.data, built.partition_key, str(10**20 + shard))
        made = 0
        async for piece in intake.pieces([record]):
            made += len(piece)
        return made

    late: list[float] = []
    done = False

    async def timer() -> None:
        while not done:
            asked = time.perf_counter()
            await asyncio.sleep(0.005)
            late.append(time.perf_counter() - asked - 0.005)

    ticking = asyncio.create_task(timer())
    made = await asyncio.gather(*(unpack(shard) for shard in range(8)))
    done = True
    await ticking
    assert made == [built.count] * 8
    assert len(late) > 20
    # Opening an aggregate (MD5 and protobuf parse of 1 MiB) is one step of ~10 ms, so some
    # waits are longer; with the eight tasks yielding by sleep(0) the timer waited a slice of
    # each of them in every turn: a median of 40 ms and more on two cores.
    late.sort()
    median = late[len(late) // 2]
    assert median < 10 * SLICE_SECONDS, (
        f"median {median * 1000:.1f} ms, max {late[-1] * 1000:.1f} ms"
    )
