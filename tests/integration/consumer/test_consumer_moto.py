"""The consumer end to end on moto's server (Kinesis and DynamoDB over HTTP).

Streams are small (hundreds of records) and lease timing is short (failover 2 s, a take cycle
every 0.5 s), so each test takes a few seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from shardflow.aggregation import aggregate
from shardflow.aws import AwsSettings
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.fetch import Polling
from shardflow.leases.settings import LeaseSettings
from shardflow.positions import StartPosition
from support.boto import lease_items
from support.consuming import consuming
from support.streams import create_stream, create_stream_holding, kinesis_at, last_per_shard, put
from support.waiting import until

LIMIT = 30.0

SETTINGS = ConsumerSettings(
    leases=LeaseSettings(
        failover_time=2.0, renew_interval=0.4, take_interval=0.5, safety_margin=0.3
    ),
    fetch=Polling(idle_time=0.1),
    checkpoint=CheckpointSettings(every_n=25, interval=0.5),
    drain_timeout=2.0,
)


def items(count: int, tag: str = "r") -> list[tuple[str, bytes]]:
    return [(f"key-{i % 37}", f"{tag}-{i}".encode()) for i in range(count)]


def consumer_for(moto_url: str, stream: str, app: str, **settings: Any) -> Consumer:
    return Consumer(
        stream, app, settings=replace(SETTINGS, **settings), aws=AwsSettings(endpoint_url=moto_url)
    )


# --- everything, in every handler shape --------------------------------------------------------


def make_handler(kind: str, seen: list[ConsumedRecord[bytes]]) -> tuple[Any, bool]:
    """A handler of the given shape that appends what it gets to ``seen``; (handler, batch)."""
    if kind == "sync-record":

        def sync_record(record: ConsumedRecord[bytes]) -> None:
            seen.append(record)

        return sync_record, False
    if kind == "async-record":

        async def async_record(record: ConsumedRecord[bytes]) -> None:
            await asyncio.sleep(0)
            seen.append(record)

        return async_record, False
    if kind == "sync-batch":

        def sync_batch(records: list[ConsumedRecord[bytes]]) -> None:
            seen.extend(records)

        return sync_batch, True

    async def async_batch(records: list[ConsumedRecord[bytes]]) -> None:
        await asyncio.sleep(0)
        seen.extend(records)

    return async_batch, True


@pytest.mark.parametrize("kind", ["sync-record", "async-record", "sync-batch", "async-batch"])
async def test_consumes_a_four_shard_stream_and_checkpoints_in_kcl_format(
    moto_url: str, stream_name: str, kind: str
) -> None:
    app = f"app-{stream_name}"
    async with kinesis_at(moto_url) as kinesis:
        written = items(300)
        placed = await create_stream_holding(kinesis, stream_name, 4, written)
    seen: list[ConsumedRecord[bytes]] = []
    handler, batch = make_handler(kind, seen)
    async with consuming(consumer_for(moto_url, stream_name, app), handler, batch=batch):
        await until(lambda: len(seen) >= len(written), LIMIT)

    assert sorted(r.data for r in seen) == sorted(d for _, d in written)
    by_shard: dict[str, list[str]] = defaultdict(list)
    for record in seen:
        by_shard[record.shard_id].append(record.sequence_number)
    assert all(seqs == sorted(seqs, key=int) for seqs in by_shard.values())  # shard order
    last = last_per_shard(placed)
    assert len(last) == 4
    table = lease_items(moto_url, app)
    assert set(table) == set(last)  # single-stream: the lease key is the shard id
    for shard_id, item in table.items():
        assert item["checkpoint"] == {"S": last[shard_id]}
        assert item["checkpointSubSequenceNumber"] == {"N": "0"}
        assert item["ownerSwitchesSinceCheckpoint"] == {"N": "0"}
        assert int(item["leaseCounter"]["N"]) >= 2
        assert "leaseOwner" not in item  # released at stop


async def test_a_restart_continues_exactly_after_the_checkpoints(
    moto_url: str, stream_name: str
) -> None:
    app = f"app-{stream_name}"
    async with kinesis_at(moto_url) as kinesis:
        written = items(400)
        placed = await create_stream_holding(kinesis, stream_name, 4, written)

    first: list[ConsumedRecord[bytes]] = []

    async def slow(record: ConsumedRecord[bytes]) -> None:
        first.append(record)
        await asyncio.sleep(0.002)

    crashing = consumer_for(moto_url, stream_name, app, checkpoint=CheckpointSettings(every_n=20))
    run = asyncio.create_task(crashing.consume(slow))
    await until(lambda: len(first) >= 150, LIMIT)
    run.cancel()  # a crash: no final checkpoints
    with pytest.raises(asyncio.CancelledError):
        await run
    checkpoints = {key: item["checkpoint"]["S"] for key, item in lease_items(moto_url, app).items()}
    assert any(c.isdigit() for c in checkpoints.values())  # the crash came after some checkpoints
    # What a restart must handle: exactly the records after each shard's checkpoint.
    expected_second = sorted(
        seq for shard_id, seq in placed if not covered(seq, checkpoints.get(shard_id))
    )

    second: list[ConsumedRecord[bytes]] = []
    restarted = consumer_for(moto_url, stream_name, app)
    async with consuming(restarted, lambda r: second.append(r)):
        await until(lambda: len(second) >= len(expected_second), LIMIT)
        await asyncio.sleep(0.5)  # a record beyond the expected ones would show up by now

    # Nothing lost.
    assert {r.data for r in first} | {r.data for r in second} == {d for _, d in written}
    # The restart began right after each checkpoint, so the only duplicates are records the
    # crashed worker handled but had not checkpointed.
    assert sorted(r.sequence_number for r in second) == expected_second
    # (Per shard: moto numbers each shard's records from 1, so sequence numbers repeat.)
    duplicates = {(r.shard_id, r.sequence_number) for r in first} & {
        (r.shard_id, r.sequence_number) for r in second
    }
    assert len(duplicates) <= len(first) - len(checkpointed(placed, checkpoints))


def covered(sequence_number: str, checkpoint: str | None) -> bool:
    return (
        checkpoint is not None and checkpoint.isdigit() and int(sequence_number) <= int(checkpoint)
    )


def checkpointed(placed: list[tuple[str, str]], checkpoints: dict[str, str]) -> list[str]:
    return [seq for shard_id, seq in placed if covered(seq, checkpoints.get(shard_id))]


# --- where a new application starts ----------------------------------------------------------


async def test_at_timestamp_starts_at_the_moment(moto_url: str, stream_name: str) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream_holding(kinesis, stream_name, 2, items(50, "before"))
        await asyncio.sleep(1.1)  # arrival timestamps have second precision on some emulators
        moment = datetime.now(UTC)
        await asyncio.sleep(0.1)
        after = items(40, "after")
        await put(kinesis, stream_name, after)
    seen: list[bytes] = []
    consumer = consumer_for(
        moto_url,
        stream_name,
        f"app-{stream_name}",
        initial_position=StartPosition.at_timestamp(moment),
    )
    async with consuming(consumer, lambda r: seen.append(r.data)):
        await until(lambda: len(seen) >= len(after), LIMIT)
        await asyncio.sleep(0.5)  # anything older would have come first
    assert sorted(seen) == sorted(d for _, d in after)


async def test_latest_reads_only_what_is_written_after_the_start(
    moto_url: str, stream_name: str
) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream_holding(kinesis, stream_name, 2, items(30, "old"))
        seen: list[bytes] = []
        consumer = consumer_for(
            moto_url, stream_name, f"app-{stream_name}", initial_position=StartPosition.latest()
        )
        async with consuming(consumer, lambda r: seen.append(r.data)):
            # Both shards polled once: their LATEST iterators exist.
            await until(
                lambda: (
                    consumer.running
                    and len(consumer.status().shards) == 2
                    and consumer.status().caught_up
                ),
                LIMIT,
            )
            new = items(20, "new")
            await put(kinesis, stream_name, new)
            await until(lambda: len(seen) >= len(new), LIMIT)
            await asyncio.sleep(0.3)
    assert sorted(seen) == sorted(d for _, d in new)


async def test_time_to_first_record_of_a_new_application_is_short(
    moto_url: str, stream_name: str
) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream_holding(kinesis, stream_name, 2, items(5))
    seen: list[float] = []
    started = time.monotonic()
    consumer = consumer_for(moto_url, stream_name, f"app-{stream_name}")
    async with consuming(consumer, lambda r: seen.append(time.monotonic())):
        await until(lambda: len(seen) >= 5, LIMIT)
    # KCL measured ~95 s here (table creation + a shard-sync wait); leases are taken at start.
    assert seen[0] - started < 10.0


# --- aggregated records ------------------------------------------------------------------------


async def test_aggregates_are_transparent_and_checkpoint_inside_an_aggregate(
    moto_url: str, stream_name: str
) -> None:
    app = f"app-{stream_name}"
    user_records = [(f"user-{i % 9}", f"u{i}".encode(), None) for i in range(150)]
    aggregates = [aggregate(user_records[i : i + 50])[0] for i in range(0, 150, 50)]
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        for built in aggregates:
            await kinesis.put_record(
                StreamName=stream_name, PartitionKey=built.partition_key, Data=built.data
            )

    first: list[ConsumedRecord[bytes]] = []
    stopping = consumer_for(
        moto_url, stream_name, app, checkpoint=CheckpointSettings(every_n=7), drain_timeout=0.1
    )

    def handle(record: ConsumedRecord[bytes]) -> None:
        first.append(record)
        if len(first) <= 60:
            record.ack()  # the rest stays unhandled

    run = asyncio.create_task(stopping.consume(handle, auto_ack=False))
    await until(lambda: len(first) == 150, LIMIT)
    await stopping.stop()
    await run
    first = first[:60]
    (item,) = lease_items(moto_url, app).values()
    stopped_at = first[-1]
    # The final checkpoint names the last handled user record: inside the second aggregate.
    assert item["checkpoint"] == {"S": stopped_at.sequence_number}
    assert item["checkpointSubSequenceNumber"] == {"N": str(stopped_at.sub_sequence_number)}
    assert 0 < stopped_at.sub_sequence_number < 49

    second: list[ConsumedRecord[bytes]] = []
    async with consuming(consumer_for(moto_url, stream_name, app), lambda r: second.append(r)):
        await until(lambda: len(first) + len(second) >= 150, LIMIT)
        await asyncio.sleep(0.5)
    assert [r.data for r in first + second] == [data for _, data, _ in user_records]
    assert all(r.aggregated for r in second)
