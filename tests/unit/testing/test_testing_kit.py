"""shardflow.testing: the in-memory Kinesis and running the real consumer against it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from shardflow.consumer import ConsumedRecord
from shardflow.errors import ThrottledError, TransientError
from shardflow.fetch import Polling, PollingFetcher
from shardflow.leases import InMemoryLeaseStore, Lease
from shardflow.positions import StartPosition
from shardflow.records import ExtendedSequenceNumber
from shardflow.shards import HashKeyRange
from shardflow.testing import (
    LeaseTableBrownout,
    MemoryKinesis,
    consume_until_caught_up,
    fast_settings,
    partition_key_in,
)

# --- the in-memory Kinesis ------------------------------------------------------------------


async def test_records_land_on_the_shard_their_hash_key_maps_to() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 4)
    listing = (await kinesis.list_shards(StreamName="s"))["Shards"]
    ranges = {
        s["ShardId"]: HashKeyRange(
            int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"])
        )
        for s in listing
    }
    assert min(r.start for r in ranges.values()) == 0
    assert max(r.end for r in ranges.values()) == 2**128 - 1
    for shard_id, hash_range in ranges.items():
        key = partition_key_in(hash_range)
        placed_shard, _ = kinesis.put("s", b"x", key)
        assert placed_shard == shard_id


async def test_iterators_follow_the_kinesis_positions() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 1)
    (shard_id,) = kinesis.shard_ids("s")
    placed = [kinesis.put("s", f"{i}".encode(), "k")[1] for i in range(5)]

    async def read(**position: Any) -> list[str]:
        iterator = (await kinesis.get_shard_iterator(StreamName="s", ShardId=shard_id, **position))[
            "ShardIterator"
        ]
        answer = await kinesis.get_records(ShardIterator=iterator, Limit=100)
        return [r["SequenceNumber"] for r in answer["Records"]]

    assert await read(ShardIteratorType="TRIM_HORIZON") == placed
    assert await read(ShardIteratorType="LATEST") == []
    assert (
        await read(ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=placed[2])
        == (placed[2:])
    )
    assert (
        await read(ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=placed[2])
        == (placed[3:])
    )
    future = datetime.now(UTC) + timedelta(hours=1)
    assert await read(ShardIteratorType="AT_TIMESTAMP", Timestamp=future) == []


async def test_the_polling_fetcher_reads_it_to_a_split_shards_end() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 1)
    (parent,) = kinesis.shard_ids("s")
    kinesis.put_many("s", [(f"k{i}", b"x") for i in range(7)])
    await kinesis.split_shard(StreamName="s", ShardToSplit=parent, NewStartingHashKey=str(2**127))
    fetcher = PollingFetcher(kinesis, "s", parent, settings=Polling(max_records=3, idle_time=0))
    batches = [batch async for batch in fetcher]
    assert sum(len(b.records) for b in batches) == 7
    assert batches[-1].shard_ended
    assert sorted(c.shard_id for c in batches[-1].child_shards) == kinesis.shard_ids(
        "s", open_only=True
    )


async def test_errors_have_the_service_codes() -> None:
    kinesis = MemoryKinesis()
    with pytest.raises(ClientError) as raised:
        await kinesis.list_shards(StreamName="missing")
    assert raised.value.response["Error"]["Code"] == "ResourceNotFoundException"
    kinesis.create_stream("s", 2)
    first, second = kinesis.shard_ids("s")
    await kinesis.merge_shards(StreamName="s", ShardToMerge=first, AdjacentShardToMerge=second)
    with pytest.raises(ClientError) as raised:
        await kinesis.split_shard(StreamName="s", ShardToSplit=first, NewStartingHashKey="5")
    assert raised.value.response["Error"]["Code"] == "ResourceInUseException"


# --- the consumer against it ----------------------------------------------------------------


async def test_consumes_everything_and_leaves_checkpoints_at_each_shards_last_record() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("orders", 3)
    placed = kinesis.put_many(
        "orders", [(f"customer-{i % 30}", f"{i}".encode()) for i in range(90)]
    )
    seen: list[bytes] = []

    report = await consume_until_caught_up(
        "orders", lambda record: seen.append(record.value), kinesis=kinesis
    )

    assert sorted(seen) == sorted(f"{i}".encode() for i in range(90))
    last: dict[str, str] = {}
    for shard_id, sequence_number in placed:
        last[shard_id] = sequence_number
    assert len(last) == 3
    assert report.checkpoints == {s: ExtendedSequenceNumber(q) for s, q in last.items()}
    assert all(lease.lease_owner is None for lease in report.leases)  # released at stop


async def test_a_second_run_on_the_same_table_continues_after_the_checkpoints() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("orders", 2)
    store = InMemoryLeaseStore("app")
    kinesis.put_many("orders", [(f"k{i}", f"first-{i}".encode()) for i in range(20)])
    first: list[bytes] = []
    await consume_until_caught_up(
        "orders", lambda r: first.append(r.data), kinesis=kinesis, lease_store=store
    )
    kinesis.put_many("orders", [(f"k{i}", f"second-{i}".encode()) for i in range(15)])
    second: list[bytes] = []
    await consume_until_caught_up(
        "orders", lambda r: second.append(r.data), kinesis=kinesis, lease_store=store
    )
    assert len(first) == 20
    assert sorted(second) == sorted(f"second-{i}".encode() for i in range(15))


async def test_batch_handlers_and_deserializers() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 2)
    kinesis.put_many("s", [(f"k{i}", f'{{"n": {i}}}'.encode()) for i in range(30)])
    batches: list[list[Any]] = []

    async def handle(records: list[ConsumedRecord[Any]]) -> None:
        batches.append([r.value["n"] for r in records])

    from shardflow.records import as_json

    await consume_until_caught_up(
        "s", handle, batch=True, kinesis=kinesis, settings=fast_settings(deserializer=as_json)
    )
    assert sorted(n for batch in batches for n in batch) == list(range(30))


async def test_resharding_keeps_per_key_order_and_reads_parents_first() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 2)
    keys = [f"key-{k}" for k in range(12)]
    phase = 0

    def write(rounds: int) -> None:
        nonlocal phase
        for _ in range(rounds):
            kinesis.put_many("s", [(key, f"{key}:{phase}".encode()) for key in keys])
            phase += 1

    write(3)
    first, second = kinesis.shard_ids("s")
    await kinesis.split_shard(StreamName="s", ShardToSplit=first, NewStartingHashKey=str(2**126))
    write(3)
    low, high = [s for s in kinesis.shard_ids("s", open_only=True) if s != second]
    await kinesis.merge_shards(StreamName="s", ShardToMerge=low, AdjacentShardToMerge=high)
    write(3)

    order: dict[str, list[int]] = defaultdict(list)
    shard_seen: list[str] = []

    def handle(record: ConsumedRecord[bytes]) -> None:
        key, number = record.value.decode().split(":")
        order[key].append(int(number))
        shard_seen.append(record.shard_id)

    report = await consume_until_caught_up("s", handle, kinesis=kinesis)

    assert all(order[key] == list(range(9)) for key in keys)  # all, once, in order
    finished = [k for k, c in report.checkpoints.items() if c.sequence_number == "SHARD_END"]
    assert first in finished or first not in report.checkpoints  # done (maybe cleaned up)
    last_of_parent = max(i for i, s in enumerate(shard_seen) if s == first)
    children = {s for s in kinesis.shard_ids("s") if s not in (first, second)}
    first_of_child = min(i for i, s in enumerate(shard_seen) if s in children)
    assert first_of_child > last_of_parent


async def test_several_streams_in_one_consumer_use_multi_stream_lease_keys() -> None:
    kinesis = MemoryKinesis()
    for name in ("a", "b"):
        kinesis.create_stream(name, 2)
        kinesis.put_many(name, [(f"k{i}", f"{name}{i}".encode()) for i in range(10)])
    seen: list[tuple[str, bytes]] = []
    report = await consume_until_caught_up(
        ["a", "b"], lambda r: seen.append((r.stream_name, r.data)), kinesis=kinesis
    )
    assert sorted(seen) == sorted((n, f"{n}{i}".encode()) for n in "ab" for i in range(10))
    assert all(key.count(":") == 3 for key in report.checkpoints)  # account:stream:epoch:shard
    assert {key.split(":")[1] for key in report.checkpoints} == {"a", "b"}


async def test_a_handler_that_never_finishes_times_out() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 1)
    kinesis.put("s", b"x", "k")

    async def stuck(record: ConsumedRecord[bytes]) -> None:
        await asyncio.sleep(3600)

    with pytest.raises(TimeoutError):
        await consume_until_caught_up(
            "s", stuck, kinesis=kinesis, within=0.3, settings=fast_settings(drain_timeout=0.1)
        )


async def test_the_initial_position_applies_to_a_new_application() -> None:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 1)
    kinesis.put("s", b"old", "k")
    seen: list[bytes] = []
    settings = fast_settings(initial_position=StartPosition.latest())
    await consume_until_caught_up(
        "s", lambda r: seen.append(r.data), kinesis=kinesis, settings=settings
    )
    assert seen == []


async def test_a_lease_table_brownout_fails_the_calls_it_is_told_to() -> None:
    brownout = LeaseTableBrownout(seed=3)
    store = InMemoryLeaseStore("app", create_table=True, fault=brownout)
    lease = await store.create_if_absent(Lease.new("shardId-1"))
    brownout.start(1.0, operations={"UpdateItem"})
    assert brownout.active
    with pytest.raises(TransientError) as raised:
        await store.take(lease, "w")
    assert raised.value.code == "InternalServerError"
    assert await store.list_leases() == [lease], "other operations still answer"
    brownout.start(1.0, error="throttled")
    with pytest.raises(ThrottledError):
        await store.list_leases()
    brownout.start(0.5)
    outcomes = []
    for _ in range(200):
        try:
            await store.get("shardId-1")
            outcomes.append(True)
        except TransientError:
            outcomes.append(False)
    assert 60 < outcomes.count(False) < 140, "about half"
    brownout.stop()
    assert not brownout.active
    assert await store.take(lease, "w")
    assert brownout.failed == {"UpdateItem": 1, "Scan": 1, "GetItem": outcomes.count(False)}
    with pytest.raises(ValueError, match="fraction"):
        brownout.start(0.0)
