"""Creating and finding the lease table on DynamoDB (moto's server), with or without a stream."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest

from shardflow.errors import InvalidArgumentError
from shardflow.leases import DynamoDBLeaseStore, Lease
from support.lease_backends import DynamoBackend


@pytest.fixture
async def backend(moto_url: str) -> AsyncIterator[DynamoBackend]:
    async with DynamoBackend(moto_url) as backend:
        yield backend


async def test_a_table_created_with_a_stream_view(backend: DynamoBackend) -> None:
    store = await backend.store()
    status = await store.ensure_table(stream_view=True)
    table = backend.raw.describe_table(TableName=backend.table_name)["Table"]
    assert status.created
    assert table["StreamSpecification"] == {
        "StreamEnabled": True,
        "StreamViewType": "NEW_AND_OLD_IMAGES",
    }
    assert status.stream_arn == table["LatestStreamArn"]
    assert status.stream_view_type == "NEW_AND_OLD_IMAGES"


async def test_the_stream_is_enabled_on_an_existing_table(backend: DynamoBackend) -> None:
    store = await backend.store()
    plain = await store.ensure_table()
    assert plain.stream_arn is None
    await store.create_if_absent(Lease.new("shardId-000000000000"))
    streamed = await store.ensure_table(stream_view=True)
    assert not streamed.created
    assert streamed.stream_arn is not None
    spec = backend.raw.describe_table(TableName=backend.table_name)["Table"]["StreamSpecification"]
    assert spec["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert [lease.lease_key for lease in await store.list_leases()] == ["shardId-000000000000"]
    # Asking again without a stream leaves the stream alone.
    again = await store.ensure_table()
    assert again.stream_arn == streamed.stream_arn


async def test_a_stream_of_another_view_type_is_reported(backend: DynamoBackend) -> None:
    backend.raw.create_table(
        TableName=backend.table_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"},
    )
    store = await backend.store()
    with pytest.raises(InvalidArgumentError, match="KEYS_ONLY"):
        await store.ensure_table(stream_view=True)
    status = await store.ensure_table()
    assert status.stream_view_type == "KEYS_ONLY"


async def test_a_provisioned_table_made_by_kcl_is_used_as_it_is(backend: DynamoBackend) -> None:
    backend.raw.create_table(
        TableName=backend.table_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        ProvisionedThroughput={"ReadCapacityUnits": 10, "WriteCapacityUnits": 10},
    )
    store = await backend.store()
    status = await store.ensure_table()
    assert not status.created
    assert status.billing_mode == "PROVISIONED"


async def test_workers_starting_together_create_the_table_once(backend: DynamoBackend) -> None:
    stores = [await backend.store() for _ in range(4)]
    statuses = await asyncio.gather(*(store.ensure_table() for store in stores))
    assert sum(status.created for status in statuses) == 1
    tables = backend.raw.list_tables()["TableNames"]
    assert tables.count(backend.table_name) == 1


async def test_connect_opens_and_closes_its_own_client(backend: DynamoBackend) -> None:
    async with DynamoDBLeaseStore.connect(
        backend.factory, backend.table_name, scan_page_size=1
    ) as store:
        status = await store.ensure_table()
        lease = await store.create_if_absent(Lease.new("shardId-000000000000"))
        assert status.created
        assert await store.list_leases() == [lease]


async def test_a_scan_of_an_unchanged_table_leaves_no_young_copies_of_its_items(
    backend: DynamoBackend,
) -> None:
    # Whatever a scan keeps lives until the next one (seconds): kept fresh every scan, 1,000
    # leases' item copies reached the oldest generation each time and set off a full garbage
    # collection about once a minute in an idle 1,000-lease worker (bench/consumer.py).
    store = await backend.store()
    await store.ensure_table()
    for i in range(60):
        await store.create_if_absent(Lease.new(f"shardId-{i:012d}"))
    first = await store.scan_table()
    gc.collect()
    gc.disable()
    try:
        again = await store.scan_table()
        young = [o for o in gc.get_objects(generation=0) if isinstance(o, dict) and "leaseKey" in o]
    finally:
        gc.enable()
    assert [lease.lease_key for lease in again.leases] == [
        lease.lease_key for lease in first.leases
    ]
    assert all(a is b for a, b in zip(first.leases, again.leases, strict=True))
    assert not young, f"{len(young)} item copies kept from the second scan"
    # A changed lease is read again, and kept as read.
    changed = await store.take(again.leases[0], "w1")
    third = await store.scan_table()
    assert third.leases[0] == changed
    assert third.leases[0] is not again.leases[0]
