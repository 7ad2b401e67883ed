"""Lease <-> KCL lease table item: attribute names, DynamoDB types, what KCL requires."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardflow.errors import MalformedLeaseError
from shardflow.leases import Lease
from shardflow.leases.model import (
    ATTRIBUTE_TYPES,
    Item,
    is_lease_item,
    lease_from_item,
    lease_to_item,
)
from shardflow.records import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from shardflow.shards import MAX_HASH_KEY, HashKeyRange

REQUIRED = {
    "leaseKey",
    "leaseCounter",
    "ownerSwitchesSinceCheckpoint",
    "checkpoint",
    "checkpointSubSequenceNumber",
}

worker_ids = st.text(min_size=1, max_size=40)
shard_ids = st.integers(0, 10**6).map(lambda i: f"shardId-{i:012d}")
positions = st.builds(
    ExtendedSequenceNumber,
    st.one_of(
        st.integers(0, 10**56).map(str),
        st.sampled_from([TRIM_HORIZON, LATEST, AT_TIMESTAMP, SHARD_END]),
    ),
    st.integers(0, 10**4),
)
hash_ranges = st.tuples(st.integers(0, MAX_HASH_KEY), st.integers(0, MAX_HASH_KEY)).map(
    lambda pair: HashKeyRange(min(pair), max(pair))
)
extras = st.dictionaries(
    st.text("abcdefghij", min_size=1, max_size=8).map(lambda s: "x" + s),
    st.one_of(
        st.text(max_size=5).map(lambda s: {"S": s}),
        st.integers(-100, 100).map(lambda i: {"N": str(i)}),
        st.booleans().map(lambda b: {"BOOL": b}),
    ),
    max_size=3,
)


@st.composite
def leases(draw: st.DrawFn) -> Lease:
    shard_id = draw(shard_ids)
    stream = draw(st.none() | st.just("123456789012:orders:1700000000"))
    lease = Lease.new(
        shard_id,
        stream=stream,
        parent_shard_ids=draw(st.frozensets(shard_ids, max_size=2)),
        hash_range=draw(st.none() | hash_ranges),
        checkpoint=draw(positions),
    )
    return Lease(
        lease_key=lease.lease_key,
        lease_owner=draw(st.none() | worker_ids),
        lease_counter=draw(st.integers(0, 2**62)),
        owner_switches_since_checkpoint=draw(st.integers(0, 1000)),
        checkpoint=lease.checkpoint,
        pending_checkpoint=draw(st.none() | positions),
        pending_checkpoint_state=draw(st.none() | st.binary(max_size=20)),
        completed_state=draw(st.none() | st.binary(max_size=20)),
        parent_shard_ids=lease.parent_shard_ids,
        child_shard_ids=draw(st.frozensets(shard_ids, max_size=2)),
        hash_range=lease.hash_range,
        checkpoint_owner=draw(st.none() | worker_ids),
        throughput_kbps=draw(st.none() | st.floats(0, 1e12, allow_nan=False, allow_infinity=False)),
        stream_name=lease.stream_name,
        shard_id=lease.shard_id,
        extra=draw(extras),
    )


@given(leases())
def test_items_round_trip(lease: Lease) -> None:
    assert lease_from_item(lease_to_item(lease)) == lease


@given(leases())
def test_items_use_the_kcl_names_and_types(lease: Lease) -> None:
    item = lease_to_item(lease)
    assert item.keys() >= REQUIRED
    for name, value in item.items():
        if name in lease.extra:
            continue
        assert list(value) == [ATTRIBUTE_TYPES[name]], name
    # Absent rather than empty: KCL takes "" for a live worker and rejects empty sets.
    assert item.get("leaseOwner") != {"S": ""}
    assert ("leaseOwner" in item) == (lease.lease_owner is not None)
    for set_name in ("parentShardId", "childShardIds"):
        assert item.get(set_name, {"SS": ["x"]})["SS"]


def test_a_kcl_2_item_reads_as_kcl_means_it() -> None:
    item: Item = {
        "leaseKey": {"S": "shardId-000000000002"},
        "leaseOwner": {"S": "worker-a"},
        "leaseCounter": {"N": "42"},
        "ownerSwitchesSinceCheckpoint": {"N": "3"},
        "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
        "checkpointSubSequenceNumber": {"N": "7"},
        "parentShardId": {"SS": ["shardId-000000000000", "shardId-000000000001"]},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": "170141183460469231731687303715884105727"},
    }
    lease = lease_from_item(item)
    assert lease.lease_owner == "worker-a"
    assert lease.lease_counter == 42
    assert lease.owner_switches_since_checkpoint == 3
    assert lease.checkpoint == ExtendedSequenceNumber(
        "49590338271490256608559692538361571095921575989136588898", 7
    )
    assert lease.parent_shard_ids == {"shardId-000000000000", "shardId-000000000001"}
    assert lease.hash_range == HashKeyRange(0, 2**127 - 1)
    assert lease.extra == {}


def test_optional_attributes_default_as_in_kcl() -> None:
    lease = lease_from_item(
        {
            "leaseKey": {"S": "s"},
            "leaseCounter": {"N": "0"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "checkpoint": {"S": "TRIM_HORIZON"},
            "leaseOwner": {"NULL": True},
        }
    )
    assert lease.lease_owner is None
    assert lease.checkpoint.sub_sequence_number == 0
    assert lease.parent_shard_ids == frozenset()
    assert lease.hash_range is None


def test_kcl_3_attributes_and_unknown_ones() -> None:
    item: Item = {
        "leaseKey": {"S": "123:orders:1700000000:shardId-000000000001"},
        "leaseOwner": {"S": "b"},
        "leaseCounter": {"N": "9"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": "5"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "checkpointOwner": {"S": "a"},
        "throughputKBps": {"N": "12.5"},
        "streamName": {"S": "123:orders:1700000000"},
        "shardId": {"S": "shardId-000000000001"},
        "entityType": {"S": "LEASE"},
        "futureAttribute": {"M": {"k": {"S": "v"}}},
    }
    lease = lease_from_item(item)
    assert lease.checkpoint_owner == "a"
    assert lease.actual_owner == "a"
    assert lease.throughput_kbps == 12.5
    assert lease.stream_name == "123:orders:1700000000"
    assert lease.shard_id == "shardId-000000000001"
    assert dict(lease.extra) == {
        "entityType": {"S": "LEASE"},
        "futureAttribute": {"M": {"k": {"S": "v"}}},
    }
    assert lease_to_item(lease) == item


def test_a_pending_state_stored_as_a_number_is_kept_aside() -> None:
    # KCL's own createLeaseIfNotExists once wrote pendingCheckpointState as N.
    lease = lease_from_item(
        {
            "leaseKey": {"S": "s"},
            "leaseCounter": {"N": "1"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "checkpoint": {"S": "TRIM_HORIZON"},
            "pendingCheckpointState": {"N": "0"},
        }
    )
    assert lease.pending_checkpoint_state is None
    assert lease.extra == {"pendingCheckpointState": {"N": "0"}}


def _item(**changes: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "leaseKey": {"S": "shardId-1"},
        "leaseCounter": {"N": "1"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": "TRIM_HORIZON"},
    }
    for name, value in changes.items():
        if value is None:
            item.pop(name, None)
        else:
            item[name] = value
    return item


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"leaseCounter": None}, "leaseCounter"),
        ({"leaseCounter": {"S": "1"}}, "leaseCounter must be of type N"),
        ({"ownerSwitchesSinceCheckpoint": None}, "ownerSwitchesSinceCheckpoint"),
        ({"checkpoint": None}, "checkpoint"),
        ({"checkpoint": {"N": "5"}}, "checkpoint must be of type S"),
        ({"leaseCounter": {"N": "1.5"}}, "not an integer"),
        ({"startingHashKey": {"S": "x"}, "endingHashKey": {"S": "9"}}, "invalid literal"),
    ],
)
def test_items_kcl_would_choke_on_are_malformed(changes: dict[str, Any], reason: str) -> None:
    with pytest.raises(MalformedLeaseError, match=reason) as caught:
        lease_from_item(_item(**changes))
    assert caught.value.lease_key == "shardId-1"


def test_an_item_without_key_is_malformed() -> None:
    with pytest.raises(MalformedLeaseError, match="leaseKey"):
        lease_from_item(_item(leaseKey=None))


@pytest.mark.parametrize(
    ("entity", "is_lease"),
    [(None, True), ({"S": "LEASE"}, True), ({"S": "LEADER"}, False), ({"S": "STREAM"}, False)],
)
def test_kcl_3_5_entities_are_told_apart(entity: dict[str, str] | None, is_lease: bool) -> None:
    item = _item(entityType=entity)
    assert is_lease_item(item) is is_lease
    if not is_lease:
        with pytest.raises(MalformedLeaseError, match="not a lease"):
            lease_from_item(item)
