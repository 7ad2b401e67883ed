"""Shard sync: which leases to create for a stream's shards, and in lineage order."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.leases import InMemoryLeaseStore, Lease
from shardflow.leases.keys import StreamIdentifier
from shardflow.leases.shard_sync import (
    LeasePlan,
    child_leases,
    create_in_order,
    lineage_depths,
    plan_leases,
    resolve_stream_identifier,
    sync_stream,
)
from shardflow.positions import StartPosition
from shardflow.records import AT_TIMESTAMP, LATEST, TRIM_HORIZON, ExtendedSequenceNumber
from shardflow.shards import ChildShard, HashKeyRange, ShardInfo
from support.coordinator_fakes import FakeKinesis, shard, sid

TRIM = StartPosition.trim_horizon()
LATEST_POS = StartPosition.latest()
AT_TS = StartPosition.at_timestamp(datetime(2024, 5, 1, tzinfo=UTC))


# 0 split into 1 and 2; 1 and 2 merged into 3; 4 untouched.
RESHARDED = [
    shard(0, closed=True),
    shard(1, 0, closed=True),
    shard(2, 0, closed=True),
    shard(3, 1, 2),
    shard(4),
]


def checkpoints(plan: LeasePlan) -> dict[str, str]:
    return {lease.shard_id: lease.checkpoint.sequence_number for lease in plan.leases}


def generations(plan: LeasePlan) -> list[list[str]]:
    return [sorted(lease.shard_id for lease in generation) for generation in plan.generations]


def test_a_new_table_from_trim_horizon_leases_every_shard_parents_first() -> None:
    plan = plan_leases(RESHARDED, set(), initial=TRIM)
    assert generations(plan) == [[sid(0), sid(4)], [sid(1), sid(2)], [sid(3)]]
    assert set(checkpoints(plan).values()) == {TRIM_HORIZON}
    merged = next(lease for lease in plan.leases if lease.shard_id == sid(3))
    assert merged.parent_shard_ids == {sid(1), sid(2)}
    assert merged.hash_range == HashKeyRange(30, 39)
    assert merged.lease_owner is None
    assert merged.lease_counter == 0


def test_a_new_table_at_timestamp_gives_every_lease_that_position() -> None:
    plan = plan_leases(RESHARDED, set(), initial=AT_TS)
    assert len(plan.leases) == 5
    assert set(checkpoints(plan).values()) == {AT_TIMESTAMP}


def test_a_new_table_from_latest_leases_open_shards_only() -> None:
    plan = plan_leases(RESHARDED, set(), initial=LATEST_POS)
    assert checkpoints(plan) == {sid(3): LATEST, sid(4): LATEST}


def test_a_child_of_a_leased_shard_continues_from_trim_horizon() -> None:
    # Started with LATEST on 0 and 4; 0 has since split and its children merged.
    plan = plan_leases(RESHARDED, {sid(0), sid(4)}, initial=LATEST_POS)
    assert checkpoints(plan) == {sid(1): TRIM_HORIZON, sid(2): TRIM_HORIZON, sid(3): TRIM_HORIZON}
    assert generations(plan) == [[sid(1), sid(2)], [sid(3)]]


def test_shards_with_leased_descendants_are_finished_and_get_none() -> None:
    # The leases of 0, 1 and 2 were cleaned up after 3 started.
    assert plan_leases(RESHARDED, {sid(3), sid(4)}, initial=TRIM).leases == []


def test_a_missing_sibling_of_a_finished_lineage_is_read_from_its_start() -> None:
    # 0 split into 1 and 2; 1 is leased (so 0 is finished); 2 was missed: it continues
    # 0's lineage instead of starting at LATEST.
    split = [shard(0, closed=True), shard(1, 0), shard(2, 0), shard(4)]
    plan = plan_leases(split, {sid(1), sid(4)}, initial=LATEST_POS)
    assert checkpoints(plan) == {sid(2): TRIM_HORIZON}


def test_a_new_shard_without_leased_ancestors_follows_the_initial_position() -> None:
    listing = [shard(0), shard(1), shard(2, closed=True)]
    assert checkpoints(plan_leases(listing, {sid(0)}, initial=LATEST_POS)) == {sid(1): LATEST}
    assert checkpoints(plan_leases(listing, {sid(0)}, initial=TRIM)) == {
        sid(1): TRIM_HORIZON,
        sid(2): TRIM_HORIZON,
    }


def test_multi_stream_leases_are_keyed_by_the_stream_identifier() -> None:
    identifier = "123456789012:orders:1700000000"
    plan = plan_leases([shard(0)], set(), initial=TRIM, stream_identifier=identifier)
    (lease,) = plan.leases
    assert lease.lease_key == f"{identifier}:{sid(0)}"
    assert lease.stream_name == identifier
    assert lease.shard_id == sid(0)


def test_lineage_depth_of_a_long_chain_needs_no_recursion() -> None:
    chain = [shard(0, closed=True)] + [shard(i, i - 1, closed=True) for i in range(1, 3000)]
    depths = lineage_depths(reversed(chain))
    assert depths[sid(2999)] == 2999


@st.composite
def lineages(draw: st.DrawFn) -> list[ShardInfo]:
    """Random reshard histories: each shard's parents (0-2) are earlier shards; some parents
    are gone from the listing (trimmed), as after retention passes."""
    count = draw(st.integers(1, 30))
    shards = []
    for i in range(count):
        parents = draw(st.lists(st.integers(0, i - 1), max_size=2, unique=True)) if i else []
        closed = draw(st.booleans())
        shards.append(shard(i, *parents, closed=closed))
    trimmed = draw(st.sets(st.integers(0, count - 1), max_size=count // 3))
    return [s for i, s in enumerate(shards) if i not in trimmed]


@settings(max_examples=200, deadline=None)
@given(listing=lineages(), leased_fraction=st.floats(0, 1), seed=st.integers(0, 1000))
def test_planned_parents_always_come_in_an_earlier_generation(
    listing: list[ShardInfo], leased_fraction: float, seed: int
) -> None:
    leased = {
        s.shard_id for i, s in enumerate(listing) if (i * 7919 + seed) % 100 < leased_fraction * 100
    }
    for initial in (TRIM, LATEST_POS, AT_TS):
        plan = plan_leases(listing, leased, initial=initial)
        generation_of = {
            lease.shard_id: index
            for index, generation in enumerate(plan.generations)
            for lease in generation
        }
        assert not set(generation_of) & leased, "existing leases are never planned again"
        for lease in plan.leases:
            for parent in lease.parent_shard_ids:
                if parent in generation_of:
                    assert generation_of[parent] < generation_of[lease.shard_id]
        if not leased and initial != LATEST_POS:
            assert set(generation_of) == {s.shard_id for s in listing}, "a new table: all"


class RecordingStore(InMemoryLeaseStore):
    """Remembers the order in which leases were created."""

    def __init__(self) -> None:
        super().__init__("app", create_table=True)
        self.created: list[str] = []

    async def create_if_absent(self, lease: Lease) -> Lease:
        result = await super().create_if_absent(lease)
        self.created.append(lease.shard_id)
        return result


async def test_leases_are_created_in_lineage_order_with_bounded_concurrency() -> None:
    store = RecordingStore()
    await store.create_if_absent(Lease.new(sid(4)))  # already there: left alone
    store.created.clear()
    plan = plan_leases(RESHARDED, set(), initial=TRIM)
    created = await create_in_order(store, plan, concurrency=2)
    assert sorted(lease.shard_id for lease in created) == [sid(i) for i in range(4)]
    order = store.created
    assert order.index(sid(0)) < order.index(sid(1)) < order.index(sid(3))
    assert order.index(sid(2)) < order.index(sid(3))
    stored = {lease.shard_id: lease for lease in await store.list_leases()}
    assert stored[sid(3)].parent_shard_ids == {sid(1), sid(2)}


def test_child_leases_start_at_trim_horizon_with_their_parents() -> None:
    children = [ChildShard(sid(7), (sid(5), sid(6)), HashKeyRange(0, 5))]
    (lease,) = child_leases(children, None)
    assert lease.lease_key == sid(7)
    assert lease.checkpoint == ExtendedSequenceNumber(TRIM_HORIZON)
    assert lease.parent_shard_ids == {sid(5), sid(6)}
    assert lease.hash_range == HashKeyRange(0, 5)


async def test_sync_stream_fills_only_the_gaps() -> None:
    store = InMemoryLeaseStore("app", create_table=True)
    kinesis = FakeKinesis(RESHARDED)
    first = await sync_stream(store, kinesis, "s", [], initial=TRIM)
    assert len(first) == 5
    again = await sync_stream(store, kinesis, "s", await store.list_leases(), initial=TRIM)
    assert again == []


async def test_the_stream_identifier_comes_from_the_stream_summary() -> None:
    identifier = await resolve_stream_identifier(FakeKinesis([]), "orders")
    assert identifier == StreamIdentifier("123456789012", "orders", 1704164645)


def test_initial_positions_relative_to_a_record_are_refused() -> None:
    with pytest.raises(ValueError, match="initial position"):
        plan_leases([shard(0)], set(), initial=StartPosition.at_sequence_number("5"))
