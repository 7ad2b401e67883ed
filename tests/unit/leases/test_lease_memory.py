"""The in-memory store's own parts: DynamoDB condition/update semantics, table, faults."""

from __future__ import annotations

import random

import pytest
from botocore.exceptions import ClientError

from shardflow.backoff import Backoff
from shardflow.errors import (
    InvalidArgumentError,
    ResourceNotFoundError,
    ThrottledError,
    TransientError,
)
from shardflow.leases import InMemoryLeaseStore, InMemoryLeaseTables, Lease, memory
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.leases.memory import (
    InMemoryLeaseStreams,
    LeaseWriteSeen,
    apply,
    holds,
    item_size,
)
from shardflow.leases.model import Item, lease_from_item
from shardflow.leases.writes import Absent, Add, Equals, Exists, Put, Remove


def test_conditions_judge_like_dynamodb() -> None:
    item: Item = {"n": {"N": "7"}, "s": {"S": "a"}, "ss": {"SS": ["x", "y"]}}
    assert holds(Equals("n", {"N": "7.0"}), item)  # numbers compare as numbers
    assert not holds(Equals("n", {"S": "7"}), item)  # types must match
    assert holds(Equals("ss", {"SS": ["y", "x"]}), item)
    assert not holds(Equals("missing", {"S": "a"}), item)
    assert holds(Absent("missing"), item)
    assert not holds(Absent("s"), item)
    assert holds(Exists("s"), item)
    assert not holds(Exists("missing"), item)
    assert holds(Absent("anything"), None)
    assert not holds(Exists("leaseKey"), None)


def test_updates_change_like_dynamodb() -> None:
    item: Item = {"k": {"S": "key"}, "n": {"N": "7"}, "gone": {"S": "x"}}
    new = apply((Put("s", {"S": "v"}), Remove("gone"), Add("n", 1), Add("fresh", 1)), item)
    assert new == {"k": {"S": "key"}, "n": {"N": "8"}, "s": {"S": "v"}, "fresh": {"N": "1"}}
    assert item["n"] == {"N": "7"}, "the original is untouched"
    with pytest.raises(InvalidArgumentError):
        apply((Add("k", 1),), item)


def test_item_size_counts_names_and_values() -> None:
    assert item_size({"ab": {"S": "xyz"}, "b": {"B": b"12345"}}) == 2 + 3 + 1 + 5


async def test_operations_need_the_table() -> None:
    store = InMemoryLeaseStore("app")
    with pytest.raises(ResourceNotFoundError):
        await store.list_leases()
    status = await store.ensure_table(stream_view=True)
    assert status.created
    assert status.stream_view_type == "NEW_AND_OLD_IMAGES"
    again = await store.ensure_table()
    assert not again.created
    assert again.stream_arn == status.stream_arn


async def test_stores_of_one_backend_share_tables() -> None:
    tables = InMemoryLeaseTables()
    one = InMemoryLeaseStore("app", tables=tables, create_table=True)
    other = InMemoryLeaseStore("app", tables=tables)
    elsewhere = InMemoryLeaseStore("other-app", tables=tables, create_table=True)
    lease = await one.create_if_absent(Lease.new("shardId-1"))
    assert await other.get("shardId-1") == lease
    assert await elsewhere.get("shardId-1") is None
    assert tables.items("app")["shardId-1"]["leaseCounter"] == {"N": "0"}


async def test_faults_are_raised_before_the_call() -> None:
    calls: list[str] = []

    def fault(operation: str) -> None:
        calls.append(operation)
        if operation == "UpdateItem":
            raise ThrottledError("slow down", operation=operation, code="Throttled")

    store = InMemoryLeaseStore("app", create_table=True, fault=fault)
    lease = await store.create_if_absent(Lease.new("shardId-1"))
    with pytest.raises(ThrottledError):
        await store.take(lease, "w")
    assert await store.get("shardId-1") == lease
    assert calls == ["PutItem", "UpdateItem", "GetItem"]


async def test_with_a_backoff_faults_are_retried_as_the_dynamodb_store_retries_them() -> None:
    # bench/simulate.py's brownout: a store that raised every failed call at once lost leases
    # that the DynamoDB store (LEASE_BACKOFF: up to 6 attempts) keeps.
    failures = {"UpdateItem": 5, "GetItem": 99}
    calls: list[str] = []

    def fault(operation: str) -> None:
        calls.append(operation)
        if failures.get(operation, 0) > 0:
            failures[operation] -= 1
            raise TransientError("try again", operation=operation, code="InternalServerError")

    quick = Backoff(base=0.001, cap=0.002, max_attempts=6)
    store = InMemoryLeaseStore(
        "app", create_table=True, fault=fault, backoff=quick, rng=random.Random(1)
    )
    lease = await store.create_if_absent(Lease.new("shardId-1"))
    taken = await store.take(lease, "w")  # five failures, the sixth attempt lands
    assert taken.lease_owner == "w"
    assert calls.count("UpdateItem") == 6
    with pytest.raises(TransientError):  # six failures: the last one reaches the caller
        await store.get("shardId-1")
    assert calls.count("GetItem") == 6
    calls.clear()

    def refuse(operation: str) -> None:
        calls.append(operation)
        raise InvalidArgumentError("bad request", operation=operation, code="ValidationException")

    picky = InMemoryLeaseStore("app", tables=store.tables, fault=refuse, backoff=quick)
    with pytest.raises(InvalidArgumentError):  # not retryable: raised at the first attempt
        await picky.get("shardId-1")
    assert calls == ["GetItem"]


async def test_items_over_400_kb_are_refused() -> None:
    store = InMemoryLeaseStore("app", create_table=True)
    lease = await store.take(await store.create_if_absent(Lease.new("shardId-1")), "w")
    with pytest.raises(InvalidArgumentError, match="size"):
        await store.prepare_checkpoint(
            lease, "w", lease.checkpoint, pending_state=b"x" * 400 * 1024
        )
    assert await store.get("shardId-1") == lease


async def test_raw_items_written_by_others_are_read() -> None:
    tables = InMemoryLeaseTables()
    store = InMemoryLeaseStore("app", tables=tables, create_table=True)
    tables.put_raw(
        "app",
        {
            "leaseKey": {"S": "shardId-1"},
            "leaseCounter": {"N": "4"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "checkpoint": {"S": "LATEST"},
            "extraThing": {"S": "kept"},
        },
    )
    lease = await store.get("shardId-1")
    assert lease is not None
    assert lease.lease_counter == 4
    with pytest.raises(LeaseConditionFailedError) as failed:
        await store.create_if_absent(Lease.new("shardId-1"))
    assert failed.value.current == lease


async def test_watchers_see_every_write_landed_or_refused_with_who_sent_it() -> None:
    tables = InMemoryLeaseTables()
    one = InMemoryLeaseStore("app", tables=tables, create_table=True)
    other = InMemoryLeaseStore("app", tables=tables)
    seen: list[LeaseWriteSeen] = []
    stop = tables.watch(seen.append)
    lease = await one.create_if_absent(Lease.new("shardId-1"))
    taken = await one.take(lease, "w1")
    with pytest.raises(LeaseConditionFailedError):
        await other.take(lease, "w2")  # the counter moved on
    stop()
    await one.renew(taken, "w1")
    assert [(s.store, s.write.operation, s.refused) for s in seen] == [
        (one, "create", False),
        (one, "take", False),
        (other, "take", True),
    ]
    assert seen[1].before == lease
    assert seen[1].after == taken
    assert seen[2].after == seen[2].before == taken
    items, size = tables.size("app")
    assert items == 1
    assert size == item_size(tables.items("app")["shardId-1"])


async def test_leases_are_parsed_once_per_write_and_never_shared_mutable() -> None:
    store = InMemoryLeaseStore("app", create_table=True)
    created = await store.create_if_absent(Lease.new("shardId-1"))
    first, again = await store.list_leases(), await store.list_leases()
    assert first[0] is again[0], "a scan hands out the lease parsed at the write"
    taken = await store.take(created, "w1")
    assert (await store.list_leases())[0] == taken
    assert (await store.get("shardId-1")) is taken


async def test_the_table_stream_reads_as_dynamodb_streams_does() -> None:
    tables = InMemoryLeaseTables()
    store = InMemoryLeaseStore("app", tables=tables)
    status = await store.ensure_table(stream_view=True)
    assert status.stream_arn is not None
    assert status.stream_arn.startswith("arn:aws:dynamodb:")
    streams = InMemoryLeaseStreams(tables)
    (shard,) = (await streams.describe_stream(StreamArn=status.stream_arn))["StreamDescription"][
        "Shards"
    ]
    start = await streams.get_shard_iterator(
        StreamArn=status.stream_arn, ShardId=shard["ShardId"], ShardIteratorType="LATEST"
    )
    lease = await store.create_if_absent(Lease.new("shardId-1"))
    taken = await store.take(lease, "w1")
    await store.delete(taken)
    page = await streams.get_records(ShardIterator=start["ShardIterator"])
    events = [(r["eventName"], r["dynamodb"]["Keys"]["leaseKey"]["S"]) for r in page["Records"]]
    assert events == [("INSERT", "shardId-1"), ("MODIFY", "shardId-1"), ("REMOVE", "shardId-1")]
    image = page["Records"][1]["dynamodb"]["NewImage"]
    assert image["leaseOwner"] == {"S": "w1"}
    assert lease_from_item(image) == taken
    assert "NewImage" not in page["Records"][2]["dynamodb"]
    after = await streams.get_records(ShardIterator=page["NextShardIterator"])
    assert after["Records"] == []
    assert streams.calls == {"DescribeStream": 1, "GetShardIterator": 1, "GetRecords": 2}


async def test_a_stream_reader_too_far_behind_is_told_its_iterator_expired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "STREAM_RECORDS_KEPT", 4)
    tables = InMemoryLeaseTables()
    store = InMemoryLeaseStore("app", tables=tables)
    arn = (await store.ensure_table(stream_view=True)).stream_arn
    assert arn is not None
    streams = InMemoryLeaseStreams(tables)
    old = await streams.get_shard_iterator(StreamArn=arn, ShardId="any", ShardIteratorType="LATEST")
    for i in range(6):
        await store.create_if_absent(Lease.new(f"shardId-{i}"))
    with pytest.raises(ClientError) as raised:
        await streams.get_records(ShardIterator=old["ShardIterator"])
    assert raised.value.response["Error"]["Code"] == "ExpiredIteratorException"
    trimmed = await streams.get_shard_iterator(
        StreamArn=arn, ShardId="any", ShardIteratorType="TRIM_HORIZON"
    )
    page = await streams.get_records(ShardIterator=trimmed["ShardIterator"])
    assert [r["dynamodb"]["Keys"]["leaseKey"]["S"] for r in page["Records"]] == [
        "shardId-3",
        "shardId-4",
        "shardId-5",
    ]
