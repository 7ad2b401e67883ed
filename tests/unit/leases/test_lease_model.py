"""The Lease value: defaults, derived fields, immutability."""

from __future__ import annotations

import dataclasses

import pytest

from shardflow.leases import Lease
from shardflow.records import LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from shardflow.shards import HashKeyRange


def test_a_new_lease_is_free_at_trim_horizon_like_kcl_creates_it() -> None:
    lease = Lease.new("shardId-000000000003", parent_shard_ids=["shardId-000000000001"])
    assert lease.lease_key == lease.shard_id == "shardId-000000000003"
    assert lease.lease_owner is None
    assert lease.is_free
    assert lease.lease_counter == 0
    assert lease.owner_switches_since_checkpoint == 0
    assert lease.checkpoint == ExtendedSequenceNumber(TRIM_HORIZON)
    assert lease.parent_shard_ids == frozenset({"shardId-000000000001"})
    assert not lease.is_multi_stream


def test_multi_stream_leases_are_keyed_by_stream_and_shard() -> None:
    lease = Lease.new("shardId-000000000001", stream="111122223333:orders:1700000000")
    assert lease.lease_key == "111122223333:orders:1700000000:shardId-000000000001"
    assert lease.shard_id == "shardId-000000000001"
    assert lease.stream_name == "111122223333:orders:1700000000"
    assert lease.is_multi_stream


def test_shard_id_is_derived_from_a_multi_stream_key_when_not_given() -> None:
    lease = Lease("1:s:2:shardId-9", stream_name="1:s:2")
    assert lease.shard_id == "shardId-9"


def test_checkpoint_may_start_elsewhere() -> None:
    assert Lease.new("s", checkpoint=LATEST).checkpoint == ExtendedSequenceNumber(LATEST)
    end = ExtendedSequenceNumber(SHARD_END)
    assert Lease.new("s", checkpoint=end).checkpoint is end


def test_actual_owner_is_the_checkpoint_owner_during_a_handoff() -> None:
    lease = Lease("s", lease_owner="next", checkpoint_owner="current")
    assert lease.handoff_pending
    assert lease.actual_owner == "current"
    assert lease.held_by("current")
    assert not lease.held_by("next")
    settled = dataclasses.replace(lease, checkpoint_owner=None)
    assert settled.actual_owner == "next"
    assert settled.held_by("next")


def test_leases_are_immutable_and_hashable() -> None:
    lease = Lease("s", extra={"x": {"S": "y"}}, child_shard_ids={"a"})  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        lease.lease_counter = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        lease.extra["z"] = {"S": "w"}  # type: ignore[index]
    assert isinstance(lease.child_shard_ids, frozenset)
    assert hash(lease) == hash(dataclasses.replace(lease))
    assert lease == Lease("s", extra={"x": {"S": "y"}}, child_shard_ids=frozenset({"a"}))
    assert lease != Lease("s", extra={"x": {"S": "other"}}, child_shard_ids=frozenset({"a"}))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lease_key": ""},
        {"lease_key": "s", "lease_counter": -1},
        {"lease_key": "s", "owner_switches_since_checkpoint": -1},
        {"lease_key": "s", "throughput_kbps": float("nan")},
    ],
)
def test_impossible_leases_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"must not|out of range"):
        Lease(**kwargs)  # type: ignore[arg-type]


def test_hash_range_is_kept() -> None:
    lease = Lease.new("s", hash_range=HashKeyRange(0, 2**127))
    assert lease.hash_range == HashKeyRange(0, 2**127)
