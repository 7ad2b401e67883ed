"""A batch handed out by ``session.batches`` is not kept alive by the consumer once its reader
asks for the next one: none of the layers between the fetch and the reader (the reader's
chunks, the delivery, the session) may still name it while the next is awaited. Before, each
of them did, and a shard held a whole handled batch beyond its prefetch bound, the last one
of a drain until the shard's next record (the multilang daemon's memory: issue 23)."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import replace
from typing import Any

from shardflow.aws import OpenClients
from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.fetch import Polling
from shardflow.leases import InMemoryLeaseStore
from shardflow.testing import fast_settings
from support.dispatch_kit import stream_of

RECORDS = 5_000
"""One batch: more than the acknowledgement tracker's compaction threshold (4,096 slots), so
that the records this test sees alive are not the tracker's (it lets acknowledged records go
at once since mlmem3; it kept up to 4,096 of them before)."""


def alive(sequence_numbers: set[str]) -> int:
    """Delivered records with these sequence numbers that are still alive."""
    gc.collect()
    return sum(
        1
        for thing in gc.get_objects()
        if isinstance(thing, ConsumedRecord) and thing.sequence_number in sequence_numbers
    )


async def test_a_handled_batch_is_let_go_while_the_next_one_is_awaited() -> None:
    kinesis = stream_of([(f"k{i}", f"{i}".encode()) for i in range(RECORDS)])
    base = fast_settings()
    assert isinstance(base.fetch, Polling)
    consumer = Consumer(
        "s",
        "app",
        settings=replace(base, fetch=replace(base.fetch, max_records=RECORDS)),
        clients=OpenClients(kinesis=kinesis),
        lease_store=InMemoryLeaseStore("app"),
    )
    sessions = consumer.shards()
    waiting: asyncio.Future[Any] | None = None
    session = await asyncio.wait_for(anext(sessions), 10)
    try:
        batch = await asyncio.wait_for(anext(session.batches), 10)
        assert len(batch) == RECORDS  # the whole stream: the next batch never comes
        handed = {record.sequence_number for record in batch}
        await session.checkpointer.checkpoint(batch[-1])
        del batch
        waiting = asyncio.ensure_future(anext(session.batches))
        for _ in range(50):
            await asyncio.sleep(0.01)  # the layers below ask their reader for the next
        assert not waiting.done()
        # The checkpointer may keep the record it wrote; nothing else may keep the batch.
        assert alive(handed) <= 1
    finally:
        if waiting is not None:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        await session.batches.aclose()  # type: ignore[attr-defined]
        consumer.request_stop()
        await sessions.aclose()
