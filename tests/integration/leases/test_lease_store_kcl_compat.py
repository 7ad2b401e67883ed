"""KCL compatibility of the DynamoDB lease store, checked on raw items (moto's server).

No KCL worker can run here (Maven Central is unreachable), so compatibility is judged against
the item shapes KCL 2.x and 3.x document and write (see shardflow.leases.model):
(a) what shardflow writes, read back raw with boto3: exactly the KCL attribute names and
DynamoDB types, never an empty leaseOwner, always the attributes KCL 2.5.8 requires;
(b) tables as KCL 2.x / 3.x fleets leave them, hand-built, read correctly, and whatever
shardflow does not own survives its writes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shardflow.leases import Lease
from shardflow.leases.model import ATTRIBUTE_TYPES
from shardflow.leases.store import LeaseStoreBase
from shardflow.records import SHARD_END, ExtendedSequenceNumber
from shardflow.shards import HashKeyRange
from support.lease_backends import DynamoBackend

REQUIRED = {"leaseKey", "leaseCounter", "ownerSwitchesSinceCheckpoint", "checkpoint"}
SEQ = "49590338271490256608559692538361571095921575989136588898"
MULTI = "123456789012:orders:1700000000"


@pytest.fixture
async def backend(moto_url: str) -> AsyncIterator[DynamoBackend]:
    async with DynamoBackend(moto_url) as backend:
        yield backend


@pytest.fixture
async def store(backend: DynamoBackend) -> LeaseStoreBase:
    store = await backend.store()
    await store.ensure_table()
    return store


def assert_kcl_shape(item: dict[str, Any] | None) -> None:
    """Every attribute has its KCL name and type; the ones KCL requires are there."""
    assert item is not None
    assert item.keys() >= REQUIRED
    for name, value in item.items():
        assert name in ATTRIBUTE_TYPES, f"unexpected attribute {name}"
        assert list(value) == [ATTRIBUTE_TYPES[name]], f"{name} stored as {list(value)}"
    assert item.get("leaseOwner") != {"S": ""}
    for numeric in ("leaseCounter", "ownerSwitchesSinceCheckpoint"):
        int(item[numeric]["N"])


async def test_the_table_is_keyed_and_billed_as_kcl_creates_it(backend: DynamoBackend) -> None:
    store = await backend.store()
    await store.ensure_table()
    table = backend.raw.describe_table(TableName=backend.table_name)["Table"]
    assert table["KeySchema"] == [{"AttributeName": "leaseKey", "KeyType": "HASH"}]
    assert table["AttributeDefinitions"] == [{"AttributeName": "leaseKey", "AttributeType": "S"}]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert table["TableStatus"] == "ACTIVE"


async def test_every_write_leaves_a_kcl_shaped_item(
    backend: DynamoBackend, store: LeaseStoreBase
) -> None:
    key = "shardId-000000000004"
    raw = backend.get_raw

    lease = await store.create_if_absent(
        Lease.new(
            key,
            parent_shard_ids=["shardId-000000000001", "shardId-000000000002"],
            hash_range=HashKeyRange(0, 2**127),
        )
    )
    item = raw(key)
    assert_kcl_shape(item)
    assert item is not None
    assert "leaseOwner" not in item, "a free lease has no leaseOwner at all"
    assert item["parentShardId"]["SS"]
    assert item["checkpoint"] == {"S": "TRIM_HORIZON"}
    assert item["checkpointSubSequenceNumber"] == {"N": "0"}
    assert item["startingHashKey"] == {"S": "0"}
    assert item["endingHashKey"] == {"S": str(2**127)}

    lease = await store.take(lease, "worker-1")
    assert_kcl_shape(raw(key))
    lease = await store.renew(lease, "worker-1", throughput_kbps=17.25)
    assert_kcl_shape(raw(key))
    lease = await store.prepare_checkpoint(
        lease, "worker-1", ExtendedSequenceNumber(SEQ, 3), pending_state=b"\x01\x02"
    )
    item = raw(key)
    assert_kcl_shape(item)
    assert item is not None
    assert item["pendingCheckpoint"] == {"S": SEQ}
    assert item["pendingCheckpointSubSequenceNumber"] == {"N": "3"}
    assert item["pendingCheckpointState"] == {"B": b"\x01\x02"}
    lease = await store.checkpoint(lease, "worker-1", ExtendedSequenceNumber(SEQ, 4))
    item = raw(key)
    assert_kcl_shape(item)
    assert item is not None
    assert item["checkpoint"] == {"S": SEQ}
    assert item["checkpointSubSequenceNumber"] == {"N": "4"}
    assert not item.keys() & {"pendingCheckpoint", "pendingCheckpointState"}
    lease = await store.handoff(lease, "worker-1", "worker-2")
    assert raw(key)["checkpointOwner"] == {"S": "worker-1"}  # type: ignore[index]
    lease = await store.complete_handoff(lease, "worker-1")
    lease = await store.checkpoint(lease, "worker-2", ExtendedSequenceNumber(SHARD_END))
    lease = await store.update_children(lease, ["shardId-000000000005"])
    item = raw(key)
    assert_kcl_shape(item)
    assert item is not None
    assert item["checkpoint"] == {"S": "SHARD_END"}
    assert item["childShardIds"] == {"SS": ["shardId-000000000005"]}
    assert "checkpointOwner" not in item
    lease = await store.release(lease, "worker-2")
    item = raw(key)
    assert_kcl_shape(item)
    assert item is not None
    assert "leaseOwner" not in item
    assert int(item["leaseCounter"]["N"]) == lease.lease_counter


async def test_multi_stream_items_carry_stream_and_shard(
    backend: DynamoBackend, store: LeaseStoreBase
) -> None:
    lease = await store.create_if_absent(Lease.new("shardId-000000000000", stream=MULTI))
    item = backend.get_raw(f"{MULTI}:shardId-000000000000")
    assert_kcl_shape(item)
    assert item is not None
    assert item["streamName"] == {"S": MULTI}
    assert item["shardId"] == {"S": "shardId-000000000000"}
    assert await store.get(lease.lease_key) == lease


# --- tables KCL fleets leave behind ----------------------------------------------------------


def kcl2_items() -> list[dict[str, Any]]:
    """A KCL 2.x single-stream table after a merge of shards 0 and 1 into 2, hand-built."""
    return [
        {  # parent, ended: checkpointed SHARD_END and recorded its child
            "leaseKey": {"S": "shardId-000000000000"},
            "leaseOwner": {"S": "host-a:4b1c"},
            "leaseCounter": {"N": "1207"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "checkpoint": {"S": "SHARD_END"},
            "checkpointSubSequenceNumber": {"N": "0"},
            "childShardIds": {"SS": ["shardId-000000000002"]},
            "startingHashKey": {"S": "0"},
            "endingHashKey": {"S": "170141183460469231731687303715884105727"},
        },
        {  # the other parent, free (no leaseOwner at all), with a prepared checkpoint
            "leaseKey": {"S": "shardId-000000000001"},
            "leaseCounter": {"N": "88"},
            "ownerSwitchesSinceCheckpoint": {"N": "2"},
            "checkpoint": {"S": SEQ},
            "checkpointSubSequenceNumber": {"N": "11"},
            "pendingCheckpoint": {"S": SEQ[:-1] + "9"},
            "pendingCheckpointSubSequenceNumber": {"N": "0"},
            "pendingCheckpointState": {"B": b"app-state"},
            "startingHashKey": {"S": "170141183460469231731687303715884105728"},
            "endingHashKey": {"S": "340282366920938463463374607431768211455"},
        },
        {  # the child: two parents, not started (no checkpointSubSequenceNumber either)
            "leaseKey": {"S": "shardId-000000000002"},
            "leaseCounter": {"N": "0"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "checkpoint": {"S": "TRIM_HORIZON"},
            "parentShardId": {"SS": ["shardId-000000000000", "shardId-000000000001"]},
        },
    ]


def kcl3_items() -> list[dict[str, Any]]:
    """KCL 3.x items: a handoff in flight, throughput, a multi-stream lease, other entities."""
    return [
        {
            "leaseKey": {"S": "shardId-000000000003"},
            "leaseOwner": {"S": "worker-b"},
            "checkpointOwner": {"S": "worker-a"},
            "leaseCounter": {"N": "51"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "checkpoint": {"S": SEQ},
            "checkpointSubSequenceNumber": {"N": "0"},
            "throughputKBps": {"N": "812.125"},
            "entityType": {"S": "LEASE"},
            "startingHashKey": {"S": "0"},
            "endingHashKey": {"S": "99"},
        },
        {
            "leaseKey": {"S": f"{MULTI}:shardId-000000000007"},
            "leaseOwner": {"S": "worker-a"},
            "leaseCounter": {"N": "9"},
            "ownerSwitchesSinceCheckpoint": {"N": "1"},
            "checkpoint": {"S": "LATEST"},
            "checkpointSubSequenceNumber": {"N": "0"},
            "streamName": {"S": MULTI},
            "shardId": {"S": "shardId-000000000007"},
            "someFutureAttribute": {"M": {"version": {"N": "4"}}},
        },
        # KCL 3.5 keeps coordinator entities in the lease table too: not leases.
        {
            "leaseKey": {"S": "Leader"},
            "entityType": {"S": "LEADER"},
            "leaderOwner": {"S": "worker-a"},
        },
        {
            "leaseKey": {"S": "worker-a"},
            "entityType": {"S": "WORKER_METRIC_STATS"},
            "lastUpdateTime": {"N": "1700000000"},
        },
    ]


@pytest.fixture
async def kcl_table(backend: DynamoBackend) -> LeaseStoreBase:
    """The table as a KCL 3.x fleet creates it (with its owner index), filled with KCL items."""
    backend.raw.create_table(
        TableName=backend.table_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "leaseKey", "AttributeType": "S"},
            {"AttributeName": "leaseOwner", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
        GlobalSecondaryIndexes=[
            {
                "IndexName": "LeaseOwnerToLeaseKeyIndex",
                "KeySchema": [
                    {"AttributeName": "leaseOwner", "KeyType": "HASH"},
                    {"AttributeName": "leaseKey", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )
    for item in kcl2_items() + kcl3_items():
        backend.put_raw(item)
    store = await backend.store(scan_page_size=2)
    status = await store.ensure_table()
    assert not status.created
    return store


async def test_kcl_2_items_read_as_kcl_means_them(kcl_table: LeaseStoreBase) -> None:
    ended = await kcl_table.get("shardId-000000000000")
    assert ended is not None
    assert ended.lease_owner == "host-a:4b1c"
    assert ended.lease_counter == 1207
    assert ended.checkpoint == ExtendedSequenceNumber(SHARD_END)
    assert ended.child_shard_ids == {"shardId-000000000002"}
    assert ended.hash_range == HashKeyRange(0, 2**127 - 1)

    free = await kcl_table.get("shardId-000000000001")
    assert free is not None
    assert free.is_free
    assert free.owner_switches_since_checkpoint == 2
    assert free.checkpoint == ExtendedSequenceNumber(SEQ, 11)
    assert free.pending_checkpoint == ExtendedSequenceNumber(SEQ[:-1] + "9", 0)
    assert free.pending_checkpoint_state == b"app-state"

    child = await kcl_table.get("shardId-000000000002")
    assert child is not None
    assert child.parent_shard_ids == {"shardId-000000000000", "shardId-000000000001"}
    assert child.checkpoint == ExtendedSequenceNumber("TRIM_HORIZON", 0)
    for lease in (ended, free, child):
        assert lease.extra == {}


async def test_kcl_3_items_read_as_kcl_means_them(kcl_table: LeaseStoreBase) -> None:
    handing_off = await kcl_table.get("shardId-000000000003")
    assert handing_off is not None
    assert (handing_off.lease_owner, handing_off.checkpoint_owner) == ("worker-b", "worker-a")
    assert handing_off.actual_owner == "worker-a"
    assert handing_off.throughput_kbps == 812.125
    assert handing_off.extra == {"entityType": {"S": "LEASE"}}

    multi = await kcl_table.get(f"{MULTI}:shardId-000000000007")
    assert multi is not None
    assert multi.is_multi_stream
    assert (multi.stream_name, multi.shard_id) == (MULTI, "shardId-000000000007")
    assert multi.extra == {"someFutureAttribute": {"M": {"version": {"N": "4"}}}}

    assert await kcl_table.get("Leader") is None
    assert await kcl_table.get("worker-a") is None


async def test_the_listing_holds_exactly_the_leases(kcl_table: LeaseStoreBase) -> None:
    listed = await kcl_table.list_leases()  # several Scan pages of 2 items
    assert [lease.lease_key for lease in listed] == sorted(
        [
            "shardId-000000000000",
            "shardId-000000000001",
            "shardId-000000000002",
            "shardId-000000000003",
            f"{MULTI}:shardId-000000000007",
        ]
    )


def _unowned(item: dict[str, Any] | None, owned: set[str]) -> dict[str, Any]:
    assert item is not None
    return {name: value for name, value in item.items() if name not in owned}


async def test_what_shardflow_does_not_own_survives_its_writes(
    backend: DynamoBackend, kcl_table: LeaseStoreBase
) -> None:
    store = kcl_table
    key3 = "shardId-000000000003"
    multi_key = f"{MULTI}:shardId-000000000007"
    before3, before_multi = backend.get_raw(key3), backend.get_raw(multi_key)

    # The KCL worker-a finishes the handoff KCL's leader began, then shardflow's worker works.
    lease = await store.get(key3)
    assert lease is not None
    lease = await store.renew(lease, "worker-a")
    lease = await store.checkpoint(lease, "worker-a", ExtendedSequenceNumber(SEQ, 1))
    lease = await store.complete_handoff(lease, "worker-a")
    lease = await store.take(lease, "sf-worker")
    lease = await store.renew(lease, "sf-worker")
    await store.release(lease, "sf-worker")
    owned = {
        "leaseOwner",
        "checkpointOwner",
        "leaseCounter",
        "checkpoint",
        "checkpointSubSequenceNumber",
        "ownerSwitchesSinceCheckpoint",
        "pendingCheckpoint",
        "pendingCheckpointSubSequenceNumber",
        "pendingCheckpointState",
    }
    assert _unowned(backend.get_raw(key3), owned) == _unowned(before3, owned)
    assert _unowned(backend.get_raw(key3), set())["throughputKBps"] == {"N": "812.125"}

    multi = await store.get(multi_key)
    assert multi is not None
    multi = await store.take(multi, "sf-worker")
    multi = await store.checkpoint(multi, "sf-worker", ExtendedSequenceNumber(SEQ))
    await store.update_children(multi, ["shardId-000000000008"])
    after_multi = backend.get_raw(multi_key)
    assert _unowned(after_multi, owned | {"childShardIds"}) == _unowned(before_multi, owned)
    assert after_multi is not None
    assert after_multi["someFutureAttribute"] == {"M": {"version": {"N": "4"}}}
    assert after_multi["streamName"] == {"S": MULTI}

    # Other entities stay exactly as KCL wrote them.
    assert backend.get_raw("Leader") == kcl3_items()[2]
    assert backend.get_raw("worker-a") == kcl3_items()[3]


async def test_a_kcl_2_child_is_taken_and_checkpointed(
    backend: DynamoBackend, kcl_table: LeaseStoreBase
) -> None:
    child = await kcl_table.get("shardId-000000000002")
    assert child is not None
    taken = await kcl_table.take(child, "sf-worker")
    done = await kcl_table.checkpoint(taken, "sf-worker", ExtendedSequenceNumber(SEQ, 0))
    item = backend.get_raw("shardId-000000000002")
    assert_kcl_shape(item)
    assert item is not None
    assert item["parentShardId"] == {"SS": ["shardId-000000000000", "shardId-000000000001"]}
    assert item["checkpointSubSequenceNumber"] == {"N": "0"}
    assert done.lease_counter == 2
