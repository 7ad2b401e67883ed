"""Intake unpacks a piece at a time: the loop gets turns, a full buffer stops the unpacking."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shardflow.aggregation import aggregate
from shardflow.consumer.reading.reader import FetcherFactory, PrefetchBuffer, ShardReader
from shardflow.fetch.batch import FetchedBatch
from shardflow.positions import StartPosition
from shardflow.read import intake as intake_module
from shardflow.read.intake import RecordIntake, resume_filter
from shardflow.records import TRIM_HORIZON, ExtendedSequenceNumber, Record
from support.waiting import until

SUB_RECORDS = 20_000


def big_aggregate(sequence: int) -> Record:
    (built,) = aggregate([(f"key-{i % 50}", b"x", None) for i in range(SUB_RECORDS)])
    return Record(
        data=built.data,
        partition_key=built.partition_key,
        sequence_number=str(10**20 + sequence),
        shard_id="shardId-000000000000",
    )


def intake() -> RecordIntake:
    return RecordIntake(
        plan=resume_filter(ExtendedSequenceNumber(TRIM_HORIZON), None),
        hash_range=None,
        shard_id="shardId-000000000000",
    )


def one_batch(records: list[Record]) -> FetcherFactory:
    async def fetch(start: StartPosition) -> AsyncIterator[FetchedBatch]:
        yield FetchedBatch("shardId-000000000000", records, millis_behind_latest=0)
        await asyncio.Event().wait()  # caught up, nothing more for now

    return fetch


async def test_the_loop_gets_a_turn_between_pieces_of_one_large_aggregate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake_module, "SLICE_SECONDS", 0.0)  # a turn after every step
    turns = 0
    done = False

    async def count_turns() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    await asyncio.sleep(0)
    made = 0
    async for piece in intake().pieces([big_aggregate(1)]):
        made += len(piece)
    done = True
    await counter
    assert made == SUB_RECORDS
    # Checking and making 20,000 user records 256 at a time: well over 100 steps, each a turn.
    assert turns >= 2 * SUB_RECORDS // intake_module.PIECE_RECORDS


async def test_a_full_prefetch_buffer_stops_the_unpacking() -> None:
    shaping = intake()
    buffer = PrefetchBuffer(max_records=100, max_bytes=1 << 20)
    reader = ShardReader(
        one_batch([big_aggregate(1), big_aggregate(2)]),
        shaping,
        buffer,
        stream="s",
    )
    reader.start(StartPosition.trim_horizon())
    try:
        await until(lambda: buffer.records_in_use >= 100, 10.0)
        await asyncio.sleep(0.2)  # the reader would go on now if it were not held back
        # The buffer's 100 and at most the rest of one piece: no chunk is made to wait for room.
        assert shaping.counts.user_records <= 100 + intake_module.PIECE_RECORDS
        taken = await buffer.get()
        assert taken is not None
        await buffer.release(taken)
        await until(lambda: buffer.records_in_use >= 100, 10.0)
        assert shaping.counts.user_records <= 150 + intake_module.PIECE_RECORDS
    finally:
        await reader.stop()


async def test_no_more_user_records_exist_than_the_prefetch_bound_allows() -> None:
    """The next chunk is begun only once the buffer has room for it: a full buffer leaves
    no finished chunk waiting for room, only the rest of the piece in the making."""
    shaping = intake()
    buffer = PrefetchBuffer(max_records=2_000, max_bytes=1 << 20)
    reader = ShardReader(one_batch([big_aggregate(1)]), shaping, buffer, stream="s")
    reader.start(StartPosition.trim_horizon())
    released = 0
    try:
        for _ in range(5):
            await until(lambda: buffer.records_in_use >= 2_000, 10.0)
            await asyncio.sleep(0.1)  # the reader would go on now if it were not held back
            # Made and not yet handled: the buffer's 2,000 and at most the rest of one piece
            # (the chunk waiting for room made it 3,000 before).
            assert shaping.counts.user_records - released <= 2_000 + intake_module.PIECE_RECORDS
            taken = await buffer.get()
            assert taken is not None
            await buffer.release(taken)
            released += taken.records
    finally:
        await reader.stop()
