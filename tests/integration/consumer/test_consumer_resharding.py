"""Resharding while consuming: Kinesis on kinesis-local (which ends closed shards and reports
ChildShards), leases on moto's DynamoDB, both over HTTP.

Records carry their key and their rank within that key (``k3:7``), so losses, repeats and
order breaks show per key. Streams stay tiny: kinesis-local slows down as a stream fills.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import list_shards, wait_for_active
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.events import CheckpointWritten, DiagnosticEvent, ShardStarted
from shardflow.fetch import Polling
from shardflow.leases import DynamoDBLeaseStore
from shardflow.leases.settings import LeaseSettings
from support.streams import create_stream, kinesis_at, merge_children, put, split_in_half
from support.waiting import until

LIMIT = 60.0
KEYS = 12

SETTINGS = ConsumerSettings(
    leases=LeaseSettings(
        failover_time=3.0,
        renew_interval=0.5,
        take_interval=0.3,
        shard_sync_interval=1.0,
        parent_poll_interval=0.1,
    ),
    fetch=Polling(idle_time=0.1),
    checkpoint=CheckpointSettings(every_n=10, interval=0.5),
    drain_timeout=2.0,
)


class Written:
    """What the test wrote, key by key, in order."""

    def __init__(self) -> None:
        self.ranks: dict[str, int] = defaultdict(int)
        self.count = 0

    def next_items(self) -> list[tuple[str, bytes]]:
        """One record per key, each the next rank of its key."""
        batch = []
        for k in range(KEYS):
            key = f"k{k}"
            batch.append((key, f"{key}:{self.ranks[key]}".encode()))
            self.ranks[key] += 1
        self.count += len(batch)
        return batch


@asynccontextmanager
async def consuming(
    kinesis_url: str, moto_url: str, stream: str, handler: Callable[[ConsumedRecord[bytes]], Any]
) -> AsyncIterator[tuple[Consumer, list[DiagnosticEvent], DynamoDBLeaseStore]]:
    app = f"app-{stream}"
    events: list[DiagnosticEvent] = []
    async with AsyncExitStack() as stack:
        dynamodb = await stack.enter_async_context(
            ClientFactory(AwsSettings(endpoint_url=moto_url)).dynamodb()
        )
        store = DynamoDBLeaseStore(dynamodb, app)
        consumer = Consumer(
            stream,
            app,
            settings=SETTINGS,
            aws=AwsSettings(endpoint_url=kinesis_url),
            lease_store=store,
            on_event=events.append,
        )
        run = asyncio.create_task(consumer.consume(handler))
        try:
            yield consumer, events, store
        finally:
            await consumer.close()
            await run


async def test_split_merge_and_update_shard_count_while_consuming(
    kinesis_local_url: str, moto_url: str, stream_name: str
) -> None:
    seen: dict[str, list[int]] = defaultdict(list)
    handled_by_shard: dict[str, int] = defaultdict(int)

    def handle(record: ConsumedRecord[bytes]) -> None:
        key, rank = record.data.decode().split(":")
        seen[key].append(int(rank))
        handled_by_shard[record.shard_id] += 1

    written = Written()
    async with kinesis_at(kinesis_local_url) as kinesis:
        await create_stream(kinesis, stream_name, 2)

        async def write(rounds: int) -> None:
            for _ in range(rounds):
                await put(kinesis, stream_name, written.next_items())

        async with consuming(kinesis_local_url, moto_url, stream_name, handle) as (
            _,
            events,
            store,
        ):
            await write(3)
            first = (await list_shards(kinesis, stream_name))[0]
            await split_in_half(kinesis, stream_name, first)
            await write(3)
            await merge_children(kinesis, stream_name, first.shard_id)
            await write(3)
            await kinesis.update_shard_count(
                StreamName=stream_name, TargetShardCount=4, ScalingType="UNIFORM_SCALING"
            )
            await wait_for_active(kinesis, stream_name)
            await write(3)

            started = time.monotonic()
            await until(lambda: sum(len(r) for r in seen.values()) >= written.count, LIMIT)
            await asyncio.sleep(0.5)  # a repeat would show up by now
            drained_in = time.monotonic() - started
            shards = await list_shards(kinesis, stream_name)
            leases = {lease.shard_id: lease for lease in await store.list_leases()}

    # Nothing lost, nothing repeated, every key in the order it was written.
    assert dict(seen) == {key: list(range(rank)) for key, rank in written.ranks.items()}
    closed = [s for s in shards if not s.is_open]
    assert len(closed) >= 4  # the split parent, both merged shards, and those of the rescale
    # Every closed shard was read to its end and checkpointed SHARD_END (or its lease was
    # cleaned up once its children started, as KCL does).
    for shard in closed:
        lease = leases.get(shard.shard_id)
        assert lease is None or lease.checkpoint.sequence_number == "SHARD_END", shard.shard_id
    # Parents before children: a child started only after every parent wrote SHARD_END.
    ended = {
        e.shard_id: i
        for i, e in enumerate(events)
        if isinstance(e, CheckpointWritten) and e.position.sequence_number == "SHARD_END"
    }
    starts = {e.shard_id: i for i, e in enumerate(events) if isinstance(e, ShardStarted)}
    assert set(ended) == {s.shard_id for s in closed}
    for shard in shards:
        for parent in shard.parent_ids:
            assert ended[parent] < starts[shard.shard_id], (parent, shard.shard_id)
    assert set(starts) == {s.shard_id for s in shards}  # every shard was processed
    assert drained_in < LIMIT
