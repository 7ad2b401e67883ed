"""The lease store contract, run against DynamoDB (moto's server) and the in-memory store alike.

Each test gets a fresh table; ``workers`` builds one store per simulated worker (on DynamoDB,
each with its own client).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from shardflow.errors import (
    InvalidArgumentError,
    MalformedLeaseError,
    ResourceNotFoundError,
    ShardLeaseLostError,
)
from shardflow.leases import Lease, LeaseStore, LeaseStoreBase
from shardflow.leases.entities import (
    CHANGE_COUNTER,
    MODE_KEY,
    Heartbeat,
    entity_from_item,
    heartbeat_key,
)
from shardflow.leases.errors import EntityConditionFailedError, LeaseConditionFailedError
from shardflow.leases.handoff_request import (
    FRESH_RENEWALS,
    HANDOFF_REQUEST,
    HandoffRequest,
    handoff_request_of,
)
from shardflow.leases.store import TableMarks
from shardflow.local import DynaliteServer
from shardflow.records import SHARD_END, ExtendedSequenceNumber
from shardflow.shards import HashKeyRange
from support.lease_backends import Backend, DynamoBackend, MemoryBackend

KEY = "shardId-000000000000"
SEQ = ExtendedSequenceNumber("49590338271490256608559692538361571095921575989136588898", 2)


@pytest.fixture(scope="module")
def dynalite_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """dynalite, the faster lease table of the benchmarks: the same contract must hold there."""
    with DynaliteServer(log_dir=tmp_path_factory.mktemp("dynalite")) as server:
        yield server.endpoint_url


@pytest.fixture(params=["memory", "dynamodb", "dynalite"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    chosen: Backend
    if request.param == "memory":
        chosen = MemoryBackend()
    elif request.param == "dynalite":
        chosen = DynamoBackend(request.getfixturevalue("dynalite_url"))
    else:
        chosen = DynamoBackend(request.getfixturevalue("moto_url"))
    async with chosen:
        yield chosen


Workers = Callable[..., Awaitable[LeaseStore]]


@pytest.fixture
async def workers(backend: Backend) -> Workers:
    """``await workers()``: a store on the (created) table, as one more worker would have."""
    await (await backend.store()).ensure_table()
    return backend.store


@pytest.fixture
async def store(workers: Workers) -> LeaseStore:
    return await workers()


async def held(store: LeaseStore, owner: str = "a", key: str = KEY) -> Lease:
    return await store.take(await store.create_if_absent(Lease.new(key)), owner)


async def failure(call: Awaitable[Any]) -> LeaseConditionFailedError:
    with pytest.raises(LeaseConditionFailedError) as caught:
        await call
    return caught.value


# --- table, reads, creation ----------------------------------------------------------------------


async def test_ensure_table_creates_once(backend: Backend) -> None:
    store = await backend.store()
    first = await store.ensure_table()
    second = await (await backend.store()).ensure_table()
    assert (first.created, second.created) == (True, False)
    assert first.name == backend.table_name
    assert first.billing_mode == "PAY_PER_REQUEST"
    assert first.stream_arn is None


async def test_calls_on_a_missing_table_fail_as_not_found(backend: Backend) -> None:
    store = await backend.store()
    with pytest.raises(ResourceNotFoundError):
        await store.list_leases()
    with pytest.raises(ResourceNotFoundError):
        await store.create_if_absent(Lease.new(KEY))


async def test_an_empty_table_has_no_leases(store: LeaseStore) -> None:
    assert await store.list_leases() == []
    assert await store.get(KEY) is None


async def test_create_if_absent_writes_once(store: LeaseStore) -> None:
    lease = Lease.new(KEY, parent_shard_ids=["shardId-p"], hash_range=HashKeyRange(0, 99))
    created = await store.create_if_absent(lease)
    assert created == lease
    assert await store.get(KEY) == lease
    again = await failure(store.create_if_absent(Lease.new(KEY)))
    assert again.current == lease
    assert await store.list_leases() == [lease]


async def test_list_leases_returns_every_lease_in_key_order(backend: Backend) -> None:
    store = await backend.store(scan_page_size=3)  # several Scan pages on DynamoDB
    await store.ensure_table()
    keys = [f"shardId-{i:012d}" for i in (7, 1, 11, 3, 9, 0, 5, 10, 2)]
    for key in keys:
        await store.create_if_absent(Lease.new(key))
    listed = await store.list_leases()
    assert [lease.lease_key for lease in listed] == sorted(keys)


# --- renew ---------------------------------------------------------------------------------------


async def test_renew_bumps_the_counter_and_nothing_else(store: LeaseStore) -> None:
    lease = await held(store)
    renewed = await store.renew(lease, "a")
    assert renewed == replace(lease, lease_counter=lease.lease_counter + 1)
    assert await store.get(KEY) == renewed
    rated = await store.renew(renewed, "a", throughput_kbps=125.5)
    assert rated.throughput_kbps == 125.5
    assert rated.lease_counter == renewed.lease_counter + 1


async def test_renew_fails_with_a_stale_counter_or_another_owner(workers: Workers) -> None:
    a, b = await workers(), await workers()
    lease = await held(a)
    await a.renew(lease, "a")
    stale = await failure(a.renew(lease, "a"))
    assert stale.current is not None
    assert stale.current.lease_counter == lease.lease_counter + 1
    assert stale.current_owner == "a"
    not_owner = await failure(
        b.renew(replace(lease, lease_counter=stale.current.lease_counter), "b")
    )
    assert not_owner.current == stale.current


# --- take, release ---------------------------------------------------------------------------------


async def test_take_of_a_free_lease_counts_no_owner_switch(store: LeaseStore) -> None:
    free = await store.create_if_absent(Lease.new(KEY))
    taken = await store.take(free, "a")
    assert (taken.lease_owner, taken.lease_counter) == ("a", 1)
    assert taken.owner_switches_since_checkpoint == 0


async def test_stealing_counts_an_owner_switch_and_the_loser_learns_the_owner(
    workers: Workers,
) -> None:
    a, b = await workers(), await workers()
    lease = await held(a)
    stolen = await b.take(lease, "b")
    assert stolen.lease_owner == "b"
    assert stolen.owner_switches_since_checkpoint == lease.owner_switches_since_checkpoint + 1
    lost = await failure(a.renew(lease, "a"))
    assert lost.current == stolen
    news = lost.as_lease_lost()
    assert isinstance(news, ShardLeaseLostError)
    assert (news.shard_id, news.owner) == (KEY, "b")


async def test_two_takes_from_one_view_have_one_winner(workers: Workers) -> None:
    a, b = await workers(), await workers()
    free = await a.create_if_absent(Lease.new(KEY))
    results = await asyncio.gather(a.take(free, "a"), b.take(free, "b"), return_exceptions=True)
    winners = [r for r in results if isinstance(r, Lease)]
    losers = [r for r in results if isinstance(r, LeaseConditionFailedError)]
    assert len(winners) == 1
    assert len(losers) == 1
    assert losers[0].current == winners[0] == await a.get(KEY)


async def test_release_frees_the_lease_for_anyone(workers: Workers) -> None:
    a, b = await workers(), await workers()
    lease = await held(a)
    released = await a.release(lease, "a")
    assert released.lease_owner is None
    assert released.is_free
    assert released.lease_counter == lease.lease_counter + 1
    taken = await b.take(released, "b")
    assert taken.owner_switches_since_checkpoint == lease.owner_switches_since_checkpoint


async def test_only_the_owner_can_release(workers: Workers) -> None:
    a, b = await workers(), await workers()
    lease = await held(a)
    refused = await failure(b.release(lease, "b"))
    assert refused.current == lease


# --- checkpoints ------------------------------------------------------------------------------------


async def test_checkpoint_records_the_position_and_resets_switches(workers: Workers) -> None:
    a, b = await workers(), await workers()
    lease = await b.take(await held(a), "b")  # one switch
    assert lease.owner_switches_since_checkpoint == 1
    done = await b.checkpoint(lease, "b", SEQ)
    assert done.checkpoint == SEQ
    assert done.owner_switches_since_checkpoint == 0
    assert done.lease_counter == lease.lease_counter + 1
    assert await b.get(KEY) == done
    ended = await b.checkpoint(done, "b", ExtendedSequenceNumber(SHARD_END))
    assert ended.checkpoint == ExtendedSequenceNumber(SHARD_END)


async def test_only_the_holder_can_checkpoint(workers: Workers) -> None:
    a, b = await workers(), await workers()
    lease = await held(a)
    refused = await failure(b.checkpoint(lease, "b", SEQ))
    assert refused.current == lease
    assert refused.current_owner == "a"
    stolen = await b.take(lease, "b")
    late = await failure(a.checkpoint(lease, "a", SEQ))
    assert late.as_lease_lost().owner == "b"
    assert (await a.get(KEY)) == stolen


async def test_prepared_checkpoints_and_their_state(store: LeaseStore) -> None:
    lease = await held(store)
    pending = ExtendedSequenceNumber("5000", 1)
    prepared = await store.prepare_checkpoint(lease, "a", pending, pending_state=b"\x00app\xff")
    assert prepared.pending_checkpoint == pending
    assert prepared.pending_checkpoint_state == b"\x00app\xff"
    assert prepared.checkpoint == lease.checkpoint
    kept = await store.checkpoint(prepared, "a", SEQ, clear_pending=False)
    assert (kept.pending_checkpoint, kept.pending_checkpoint_state) == (pending, b"\x00app\xff")
    both = await store.checkpoint(kept, "a", SEQ, pending=ExtendedSequenceNumber("6000"))
    assert both.pending_checkpoint == ExtendedSequenceNumber("6000")
    assert both.pending_checkpoint_state is None
    cleared = await store.checkpoint(both, "a", pending)
    assert cleared.pending_checkpoint is None
    assert cleared.pending_checkpoint_state is None
    assert await store.get(KEY) == cleared


async def test_completed_state_lives_in_its_own_attribute_with_the_checkpoint(
    workers: Workers,
) -> None:
    a, b = await workers(), await workers()
    lease = await a.prepare_checkpoint(
        await held(a), "a", ExtendedSequenceNumber("5000"), pending_state=b"kcl-app"
    )
    state = b"\x01\x00" + bytes(range(256)) * 4
    written = await a.checkpoint(lease, "a", SEQ, completed_state=state)
    assert (written.checkpoint, written.completed_state) == (SEQ, state)
    # Not a prepared checkpoint: a KCL worker reading the item sees none.
    assert (written.pending_checkpoint, written.pending_checkpoint_state) == (None, None)
    assert written.completed_state_or_legacy == state
    # Renewals, releases and takes leave it alone: the next owner finds it.
    renewed = await a.renew(written, "a")
    released = await a.release(renewed, "a")
    taken = await b.take(released, "b")
    assert taken.completed_state == state
    assert (await b.get(KEY)) == taken
    # A checkpoint without state removes it: state of an older checkpoint means nothing.
    moved = await b.checkpoint(taken, "b", ExtendedSequenceNumber(SEQ.sequence_number, 3))
    assert moved.completed_state is None
    assert (await a.get(KEY)) == moved


async def test_completed_state_of_earlier_versions_is_still_read(store: LeaseStore) -> None:
    lease = await held(store)
    # Earlier shardflow versions: a prepared checkpoint equal to the checkpoint, state as its bytes.
    old = await store.checkpoint(lease, "a", SEQ, pending=SEQ, pending_state=b"\x01old")
    assert old.completed_state is None
    assert old.completed_state_or_legacy == b"\x01old"
    # A prepared checkpoint elsewhere is KCL's two-phase checkpoint, not completed state.
    kcl = await store.checkpoint(old, "a", SEQ, pending=ExtendedSequenceNumber("9" * 20))
    assert kcl.completed_state_or_legacy is None
    # shardflow's next checkpoint writes the new attribute and clears the old form.
    new = await store.checkpoint(kcl, "a", SEQ, completed_state=b"\x01new")
    assert (new.pending_checkpoint, new.completed_state_or_legacy) == (None, b"\x01new")


async def test_items_over_the_dynamodb_limit_are_refused(
    backend: Backend, store: LeaseStore
) -> None:
    lease = await held(store)
    with pytest.raises(InvalidArgumentError):
        await store.prepare_checkpoint(lease, "a", SEQ, pending_state=b"x" * (400 * 1024 + 1))
    after = await store.get(KEY)
    assert after is not None
    assert after.pending_checkpoint_state is None
    if backend.kind == "memory":
        # DynamoDB leaves the item as it was; moto applies the rest of the update (a moto bug).
        assert after == lease


# --- metadata, delete -------------------------------------------------------------------------------


async def test_children_and_hash_range_leave_the_counter_alone(workers: Workers) -> None:
    a, b = await workers(), await workers()
    lease = await held(a)
    with_children = await b.update_children(lease, ["shardId-000000000002", "shardId-000000000003"])
    assert with_children.child_shard_ids == {"shardId-000000000002", "shardId-000000000003"}
    assert with_children.lease_counter == lease.lease_counter
    ranged = await b.update_hash_range(lease, HashKeyRange(5, 2**128 - 1))
    assert ranged.hash_range == HashKeyRange(5, 2**128 - 1)
    renewed = await a.renew(lease, "a")  # the owner's view is still good
    assert renewed.child_shard_ids == with_children.child_shard_ids
    assert renewed.hash_range == ranged.hash_range


async def test_metadata_of_a_deleted_lease_is_not_written(store: LeaseStore) -> None:
    lease = await store.create_if_absent(Lease.new(KEY))
    await store.delete(lease)
    gone = await failure(store.update_children(lease, ["shardId-9"]))
    assert gone.current is None
    assert await store.get(KEY) is None


async def test_delete_only_removes_the_lease_as_seen(store: LeaseStore) -> None:
    lease = await held(store)
    renewed = await store.renew(lease, "a")
    stale = await failure(store.delete(lease))
    assert stale.current == renewed
    await store.delete(renewed)
    assert await store.get(KEY) is None
    assert await store.list_leases() == []
    again = await failure(store.delete(renewed))
    assert again.current is None


# --- graceful handoff (KCL 3.x) -------------------------------------------------------------------


async def test_graceful_handoff_from_start_to_end(workers: Workers) -> None:
    a, b, leader = await workers(), await workers(), await workers()
    lease = await held(a)
    started = await leader.handoff(lease, "a", "b")
    assert (started.lease_owner, started.checkpoint_owner) == ("b", "a")
    assert started.lease_counter == lease.lease_counter, "the owner's renewals must go on"
    assert started.actual_owner == "a"

    # A's renewer, unaware yet, fails and learns of the handoff from the failure itself.
    news = await failure(a.renew(lease, "a"))
    assert news.current == started
    assert news.current_owner == "a"
    renewed = await a.renew(started, "a")
    # B may not act on the lease until A lets go.
    assert (await failure(b.renew(renewed, "b"))).current == renewed
    assert (await failure(b.checkpoint(renewed, "b", SEQ))).current == renewed

    checkpointed = await a.checkpoint(renewed, "a", SEQ)
    done = await a.complete_handoff(checkpointed, "a")
    assert (done.lease_owner, done.checkpoint_owner) == ("b", None)
    assert done.lease_counter == checkpointed.lease_counter + 1
    assert done.checkpoint == SEQ
    assert (await failure(a.renew(checkpointed, "a"))).current_owner == "b"
    assert (await b.renew(done, "b")).lease_owner == "b"


async def test_handoff_needs_the_owner_and_no_handoff_pending(workers: Workers) -> None:
    a, leader = await workers(), await workers()
    lease = await held(a)
    wrong = await failure(leader.handoff(lease, "c", "b"))
    assert wrong.current == lease
    started = await leader.handoff(lease, "a", "b")
    twice = await failure(leader.handoff(lease, "a", "c"))
    assert twice.current == started
    completed_by_other = await failure(
        leader.complete_handoff(replace(started, checkpoint_owner="c"), "c")
    )
    assert completed_by_other.current == started


async def test_a_leaving_next_owner_passes_a_handoff_on(workers: Workers) -> None:
    a, b = await workers(), await workers()
    started = await a.handoff(await held(a), "a", "b")
    passed = await b.redirect_handoff(started, "b", "c")
    assert (passed.lease_owner, passed.checkpoint_owner) == ("c", "a")
    assert passed.lease_counter == started.lease_counter, "a's renewals must go on"
    # a's last write, made for b, is refused once and names the new next owner.
    news = await failure(a.release(started, "a", final_checkpoint=SEQ))
    assert news.current == passed
    done = await a.release(passed, "a", final_checkpoint=SEQ)
    assert (done.lease_owner, done.checkpoint_owner, done.checkpoint) == ("c", None, SEQ)
    # Only while the handoff is under way and still to b.
    assert (await failure(b.redirect_handoff(started, "b", "d"))).current == done


async def test_release_during_a_handoff_passes_the_lease_on(workers: Workers) -> None:
    a, leader = await workers(), await workers()
    started = await leader.handoff(await held(a), "a", "b")
    passed = await a.release(started, "a")
    assert (passed.lease_owner, passed.checkpoint_owner) == ("b", None)
    assert passed.lease_counter == started.lease_counter + 1


async def test_the_last_checkpoint_and_the_handover_are_one_write(workers: Workers) -> None:
    a, b, leader = await workers(), await workers(), await workers()
    started = await leader.handoff(await held(a), "a", "b")
    state = b"\x01\x02completed"
    passed = await a.release(started, "a", final_checkpoint=SEQ, completed_state=state)
    assert (passed.lease_owner, passed.checkpoint_owner) == ("b", None)
    assert (passed.checkpoint, passed.completed_state) == (SEQ, state)
    assert passed.lease_counter == started.lease_counter + 1
    # The next owner holds it at once, from exactly that checkpoint.
    assert (await b.renew(passed, "b")).checkpoint == SEQ
    # A stale copy cannot write a second, different final checkpoint.
    later = ExtendedSequenceNumber(SEQ.sequence_number, SEQ.sub_sequence_number + 1)
    assert (await failure(a.release(started, "a", final_checkpoint=later))).current_owner == "b"


async def test_taking_a_lease_in_handoff_ends_the_handoff(workers: Workers) -> None:
    a, leader, c = await workers(), await workers(), await workers()
    started = await leader.handoff(await held(a), "a", "b")
    forced = await c.take(started, "c")
    assert (forced.lease_owner, forced.checkpoint_owner) == ("c", None)
    assert (await failure(a.renew(started, "a"))).current == forced


async def test_a_handoff_request_is_seen_by_the_owners_next_renewal(workers: Workers) -> None:
    a, joiner = await workers(), await workers()
    lease = await held(a)
    asked = await joiner.request_handoff(lease, "c")
    assert asked.lease_counter == lease.lease_counter, "the owner's renewals must go on"
    assert asked.lease_owner == "a"
    renewed = await a.renew(lease, "a")  # the owner's view is stale: the request is no conflict
    request = handoff_request_of(renewed)
    assert request == HandoffRequest("c", lease.lease_counter)
    assert request.fresh_for(renewed)
    checkpointed = await a.checkpoint(renewed, "a", SEQ)
    assert handoff_request_of(checkpointed) == request, "other writes keep the request"
    started = await a.handoff(checkpointed, "a", "c")
    assert (started.lease_owner, started.checkpoint_owner) == ("c", "a")
    assert handoff_request_of(started) is None, "beginning the handoff answers the request"
    done = await a.release(started, "a")
    assert (done.lease_owner, done.checkpoint_owner, done.checkpoint) == ("c", None, SEQ)


async def test_a_handoff_request_needs_the_owner_seen_and_no_handoff_under_way(
    workers: Workers,
) -> None:
    a, joiner, leader = await workers(), await workers(), await workers()
    lease = await held(a)
    moved = await failure(joiner.request_handoff(replace(lease, lease_owner="z"), "c"))
    assert moved.current == lease
    started = await leader.handoff(lease, "a", "b")
    under_way = await failure(joiner.request_handoff(lease, "c"))
    assert under_way.current == started
    with pytest.raises(ValueError, match="another owner"):
        await joiner.request_handoff(replace(lease, lease_owner=None), "c")


async def test_an_owner_declines_the_request_it_saw_and_only_that_one(workers: Workers) -> None:
    a, joiner, other = await workers(), await workers(), await workers()
    lease = await held(a)
    asked = await joiner.request_handoff(lease, "c")
    declined = await a.decline_handoff(asked, "a")
    assert handoff_request_of(declined) is None
    assert declined.lease_counter == lease.lease_counter, "the owner's renewals must go on"
    again = await joiner.request_handoff(declined, "c")
    newer = await other.request_handoff(again, "d")  # another joiner's, since
    stale = await failure(a.decline_handoff(again, "a"))
    assert handoff_request_of(stale.current) == handoff_request_of(newer)
    with pytest.raises(ValueError, match="no handoff request"):
        await a.decline_handoff(lease, "a")


async def test_a_later_request_replaces_an_earlier_one_and_a_take_clears_it(
    workers: Workers,
) -> None:
    a, c, d = await workers(), await workers(), await workers()
    lease = await held(a)
    await c.request_handoff(lease, "c")
    second = await d.request_handoff(lease, "d")
    assert handoff_request_of(second) == HandoffRequest("d", lease.lease_counter)
    stolen = await c.take(second, "c")
    assert stolen.lease_owner == "c"
    assert handoff_request_of(stolen) is None


def test_a_request_goes_stale_as_the_counter_moves_on() -> None:
    request = HandoffRequest("c", 10)
    assert request.fresh_for(Lease("k", lease_owner="a", lease_counter=10 + FRESH_RENEWALS))
    assert not request.fresh_for(Lease("k", lease_owner="a", lease_counter=11 + FRESH_RENEWALS))
    assert not request.fresh_for(Lease("k", lease_owner="a", lease_counter=9))
    odd = Lease("k", lease_owner="a", extra={HANDOFF_REQUEST: {"S": "not-a-counter:c"}})
    assert handoff_request_of(odd) is None


# --- items other writers made --------------------------------------------------------------------


def _kcl_item(key: str, **attributes: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "leaseKey": {"S": key},
        "leaseCounter": {"N": "5"},
        "ownerSwitchesSinceCheckpoint": {"N": "1"},
        "checkpoint": {"S": "TRIM_HORIZON"},
        "checkpointSubSequenceNumber": {"N": "0"},
    }
    item.update(attributes)
    return item


async def test_unknown_attributes_survive_every_write(backend: Backend, store: LeaseStore) -> None:
    extras: dict[str, Any] = {
        "entityType": {"S": "LEASE"},
        "leaseOwnerSince": {"N": "1700000000000"},
        "futureMap": {"M": {"nested": {"L": [{"S": "x"}, {"N": "2"}]}}},
    }
    backend.put_raw(_kcl_item(KEY, leaseOwner={"S": "kcl-worker"}, **extras))
    lease = await store.get(KEY)
    assert lease is not None
    assert dict(lease.extra) == extras
    lease = await store.take(lease, "a")
    lease = await store.renew(lease, "a", throughput_kbps=3.5)
    lease = await store.prepare_checkpoint(lease, "a", SEQ, pending_state=b"s")
    lease = await store.checkpoint(lease, "a", SEQ)
    lease = await store.update_children(lease, ["shardId-1"])
    lease = await store.update_hash_range(lease, HashKeyRange(0, 1))
    lease = await store.handoff(lease, "a", "b")
    lease = await store.complete_handoff(lease, "a")
    lease = await store.release(lease, "b")
    raw = backend.get_raw(KEY)
    assert raw is not None
    assert {name: raw[name] for name in extras} == extras
    assert dict(lease.extra) == extras


async def test_non_lease_entities_and_broken_items_are_skipped(
    backend: Backend, store: LeaseStore
) -> None:
    backend.put_raw({"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}})
    broken = _kcl_item("shardId-broken")
    del broken["leaseCounter"]
    backend.put_raw(broken)
    good = await store.create_if_absent(Lease.new(KEY))
    assert await store.list_leases() == [good]
    assert await store.get("Leader") is None
    with pytest.raises(MalformedLeaseError, match="leaseCounter"):
        await store.get("shardId-broken")


async def test_a_kcl_handoff_in_progress_stops_a_stale_owner(
    backend: Backend, store: LeaseStore
) -> None:
    # A KCL 3.x leader began a handoff from us ("a") to "b" without bumping the counter.
    backend.put_raw(_kcl_item(KEY, leaseOwner={"S": "b"}, checkpointOwner={"S": "a"}))
    current = await store.get(KEY)
    assert current is not None
    our_stale_view = replace(current, lease_owner="a", checkpoint_owner=None)
    news = await failure(store.renew(our_stale_view, "a"))
    assert news.current == current
    assert news.current.checkpoint_owner == "a"
    assert (await failure(store.checkpoint(our_stale_view, "a", SEQ))).current == current


# --- shardflow's own items: heartbeats and the lease mode ------------------------------------------


async def test_heartbeats_and_the_mode_are_kept_apart_from_leases(workers: Workers) -> None:
    a, b = await workers(), await workers()
    assert isinstance(a, LeaseStoreBase)
    assert isinstance(b, LeaseStoreBase)
    await held(a)
    beat = await a.register_heartbeat("a", None)
    await a.set_lease_mode("heartbeat")
    scan = await b.scan_table()
    assert [lease.lease_key for lease in scan.leases] == [KEY]
    assert scan.heartbeats == (beat,)
    assert scan.mode == "heartbeat"
    assert [lease.lease_key for lease in await b.list_leases()] == [KEY]
    # Registering over an existing item needs it as it is (another process with the same id).
    with pytest.raises(EntityConditionFailedError) as taken:
        await b.register_heartbeat("a", None)
    assert entity_from_item(taken.value.current or {}) == beat
    beaten = await a.beat(beat)
    # A fence on what b saw before that beat is refused and names the heartbeat as it is.
    with pytest.raises(EntityConditionFailedError) as refused:
        await b.fence_heartbeat(beat, "b")
    assert entity_from_item(refused.value.current or {}) == beaten
    fenced = await b.fence_heartbeat(beaten, "b")
    assert fenced == Heartbeat("a", beaten.counter, "b")
    with pytest.raises(EntityConditionFailedError):
        await a.beat(beaten)  # in flight at the fence: refused, extends nothing
    await b.delete_heartbeat(fenced)
    await a.set_lease_mode("per-lease")
    scan = await b.scan_table()
    assert scan.heartbeats == ()
    assert scan.mode is None


# --- the heartbeat mode's change marker ------------------------------------------------------------


async def marker(backend: Backend, *writers: LeaseStoreBase) -> int | None:
    """The table's change marker as stored (None: no mode item), once the bumps the
    ``writers`` owe (sent in the background) have landed."""
    for writer in writers:
        await writer.settle_marks()
    item = backend.get_raw(MODE_KEY)
    if item is None:
        return None
    return int(item.get(CHANGE_COUNTER, {}).get("N", "0"))


async def test_moves_bump_the_change_marker_in_the_heartbeat_mode_only(
    backend: Backend, workers: Workers
) -> None:
    a, b = await workers(), await workers()
    assert isinstance(a, LeaseStoreBase)
    assert isinstance(b, LeaseStoreBase)
    # A table of leases only: no write may create the mode item (KCL 2.x reads every item).
    lease = await held(a)
    await a.release(lease, "a")
    assert await marker(backend, a, b) is None
    await a.set_lease_mode("heartbeat")
    start = await marker(backend, a, b)
    assert start is not None
    # b learns the mode from a read, as a worker does; from then on its moves bump it.
    assert (await b.scan_table()).mode == "heartbeat"
    taken = await b.take(await b.get(KEY) or lease, "b")
    assert await marker(backend, a, b) == start + 1
    # Renewals and ordinary checkpoints are quiet: a busy fleet writes many a second.
    renewed = await b.renew(taken, "b")
    checkpointed = await b.checkpoint(renewed, "b", SEQ)
    assert await marker(backend, a, b) == start + 1
    # A shard's end is not (its children may start), nor is a handoff request.
    ended = await b.checkpoint(checkpointed, "b", ExtendedSequenceNumber(SHARD_END))
    assert await marker(backend, a, b) == start + 2
    await a.request_handoff(ended, "a")
    assert await marker(backend, a, b) == start + 3
    beat = await a.register_heartbeat("a", None)
    assert await marker(backend, a, b) == start + 4
    await a.beat(beat)  # a beat is read by every poll anyway
    assert await marker(backend, a, b) == start + 4
    # Back to per-lease: the mode item goes, and no later write brings it back.
    await a.set_lease_mode("per-lease")
    assert (await b.scan_table()).mode is None
    other = await b.create_if_absent(Lease.new("shardId-000000000001"))
    await b.take(other, "b")
    assert await marker(backend, a, b) is None


async def test_setting_the_mode_again_keeps_counting(backend: Backend, workers: Workers) -> None:
    a = await workers()
    assert isinstance(a, LeaseStoreBase)
    await a.set_lease_mode("heartbeat")
    first = await marker(backend, a)
    await a.set_lease_mode("heartbeat")
    second = await marker(backend, a)
    assert first is not None
    assert second is not None
    assert second > first, "a reader must see the mode item change"


async def test_the_marks_are_the_mode_item_and_the_heartbeats_asked_for(workers: Workers) -> None:
    a, b = await workers(), await workers()
    assert isinstance(a, LeaseStoreBase)
    assert isinstance(b, LeaseStoreBase)
    assert await b.read_marks([]) == TableMarks(None, 0, ())
    beat_a = await a.register_heartbeat("a", None)
    beat_b = await b.register_heartbeat("b", None)
    await a.set_lease_mode("heartbeat")
    marks = await b.read_marks([beat_a.key, beat_b.key, heartbeat_key("gone")])
    assert marks is not None
    assert marks.mode == "heartbeat"
    assert sorted(marks.heartbeats, key=lambda hb: hb.worker_id) == [beat_a, beat_b]
    beaten = await a.beat(beat_a)
    again = await b.read_marks([beat_a.key])
    assert again is not None
    assert again.heartbeats == (beaten,)
    assert again.changes == marks.changes, "a beat does not move the marker"
