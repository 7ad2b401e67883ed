"""The reader holds no more than its buffer: the next batch is asked for only once a chunk of
it fits, and a batch's records are let go once their chunks are released, not when the next
GetRecords answers (the multilang daemon's memory: issue 23)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator

from shardflow.consumer.reading.reader import FetcherFactory, PrefetchBuffer, ShardReader
from shardflow.fetch.batch import FetchedBatch
from shardflow.positions import StartPosition
from shardflow.read.intake import RecordIntake, resume_filter
from shardflow.records import TRIM_HORIZON, ExtendedSequenceNumber, Record
from support.waiting import until

SHARD = "shardId-000000000000"


class Records(list[Record]):
    """A batch's record list that can be watched with a weak reference."""


def intake() -> RecordIntake:
    return RecordIntake(
        plan=resume_filter(ExtendedSequenceNumber(TRIM_HORIZON), None),
        hash_range=None,
        shard_id=SHARD,
    )


def batch(first: int, count: int) -> FetchedBatch:
    records = Records(
        Record(data=b"x" * 10, partition_key="k", sequence_number=str(10**20 + n), shard_id=SHARD)
        for n in range(first, first + count)
    )
    return FetchedBatch(SHARD, records, millis_behind_latest=1)


class Fetches:
    """A fetcher of batches of ``size`` records that counts the batches asked for; after
    ``batches`` of them it never answers again (a GetRecords call in flight)."""

    def __init__(self, size: int, batches: int) -> None:
        self.size = size
        self.batches = batches
        self.asked = 0
        self.made: list[weakref.ref[Records]] = []

    def factory(self) -> FetcherFactory:
        async def fetch(start: StartPosition) -> AsyncIterator[FetchedBatch]:
            while True:
                self.asked += 1
                if self.asked > self.batches:
                    await asyncio.Event().wait()
                made = batch(self.asked * self.size, self.size)
                assert isinstance(made.records, Records)
                self.made.append(weakref.ref(made.records))
                yield made
                del made

        return fetch


async def test_the_next_batch_is_asked_for_only_once_a_chunk_fits() -> None:
    fetches = Fetches(size=2, batches=10)
    buffer = PrefetchBuffer(max_records=4, max_bytes=1 << 20)  # chunks of 2: two batches
    reader = ShardReader(fetches.factory(), intake(), buffer, stream="s")
    reader.start(StartPosition.trim_horizon())
    try:
        await until(lambda: buffer.records_in_use == 4, 5.0)
        for _ in range(20):
            await asyncio.sleep(0)
        # Two batches fill the buffer; a third asked for now would only wait in memory.
        assert fetches.asked == 2
        chunk = await buffer.get()
        assert chunk is not None
        await buffer.release(chunk)
        await until(lambda: fetches.asked == 3, 5.0)
        await until(lambda: buffer.records_in_use == 4, 5.0)
    finally:
        await reader.stop()


async def test_a_batch_is_let_go_once_its_chunks_are_released() -> None:
    fetches = Fetches(size=2, batches=1)  # then the next GetRecords never answers
    buffer = PrefetchBuffer(max_records=4, max_bytes=1 << 20)
    reader = ShardReader(fetches.factory(), intake(), buffer, stream="s")
    reader.start(StartPosition.trim_horizon())
    try:
        await until(lambda: fetches.asked == 2, 5.0)  # the first batch is in, the next in flight
        chunk = await buffer.get()
        assert chunk is not None
        await buffer.release(chunk)
        del chunk
        gc.collect()
        # Nothing but the released chunk needed the batch: the reader must not keep it while
        # it waits for the next answer.
        assert fetches.made[0]() is None
    finally:
        await reader.stop()
