"""The take cycle's incrementally kept view of the table (LeaseIndex) and expiry schedule
(ExpirySchedule) against a full recomputation: after any sequence of lease writes, removals,
renewals, heartbeats, blind stretches and passing time, the shape a cycle plans from, the
plan itself, the next expiry and the finished leases' children are what a pass over every
lease gives."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.leases import Lease
from shardflow.leases.balance import TableShape, decide, shape_of
from shardflow.leases.entities import Heartbeat
from shardflow.leases.expiry import ExpiryTracker
from shardflow.leases.handoff_request import HANDOFF_REQUEST
from shardflow.leases.lease_index import LeaseIndex, shape_from_index
from shardflow.records import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber

ME = "w0"
WORKERS = ("w0", "w1", "w2", "w3")
KEYS = tuple(f"shardId-{n:012d}" for n in range(10))
FAILOVER = 10.0


def new_index() -> LeaseIndex:
    return LeaseIndex(ours=lambda lease: lease.stream_name is None, key_for=lambda _, s: s)


def lease_of(draw: Any, key: str, counter: int) -> Lease:
    owner = draw(st.sampled_from((None, *WORKERS)))
    handing = owner is not None and draw(st.booleans()) and draw(st.booleans())
    finished = draw(st.integers(0, 5)) == 0
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        requester = draw(st.sampled_from(WORKERS))
        asked = max(counter - draw(st.integers(0, 5)), 0)
        extra[HANDOFF_REQUEST] = {"S": f"{asked}:{requester}"}
    index = KEYS.index(key)
    parents = (
        frozenset(KEYS[p] for p in draw(st.sets(st.integers(0, index - 1), max_size=2)))
        if index
        else frozenset()
    )
    return Lease(
        key,
        lease_owner=owner,
        lease_counter=counter,
        checkpoint=ExtendedSequenceNumber(
            SHARD_END
            if finished
            else draw(
                st.sampled_from(
                    (TRIM_HORIZON, "49590338271490256608559692538361571095921575989136588898")
                )
            )
        ),
        checkpoint_owner=draw(st.sampled_from(WORKERS)) if handing else None,
        parent_shard_ids=parents,
        extra=extra,
    )


@st.composite
def histories(draw: Any) -> list[tuple[str, Any]]:
    steps: list[tuple[str, Any]] = []
    counters: dict[str, int] = {}
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(
            st.sampled_from(("put", "put", "renew", "remove", "wait", "beat", "blind", "scan"))
        )
        key = draw(st.sampled_from(KEYS))
        if kind in ("put", "renew"):
            counters[key] = counters.get(key, 0) + draw(st.integers(0 if kind == "put" else 1, 2))
            steps.append((kind, (lease_of(draw, key, counters[key]), key)))
        elif kind == "remove":
            steps.append(("remove", key))
        elif kind == "wait":
            steps.append(("wait", draw(st.sampled_from((0.5, 3.3, 6.0, 10.0, 12.5)))))
        elif kind == "beat":
            worker = draw(st.sampled_from(WORKERS[1:]))
            steps.append(
                (
                    "beat",
                    Heartbeat(
                        worker, draw(st.integers(0, 6)), draw(st.sampled_from((None, None, ME)))
                    ),
                )
            )
        else:
            steps.append((kind, None))
    return steps


def expect_same_shape(fast: TableShape, full: TableShape) -> None:
    def keys(leases: list[Lease]) -> list[str]:
        return [lease.lease_key for lease in leases]

    assert fast.total == full.total
    assert fast.mine == full.mine
    assert keys(fast.free) == keys(full.free)
    assert keys(fast.expired) == keys(full.expired)
    assert fast.alive_counts == full.alive_counts
    for owner in WORKERS:
        assert keys(fast.alive_of(owner)) == keys(full.alive_of(owner))
    assert fast.requesters == full.requesters


@settings(max_examples=300, deadline=None)
@given(histories(), st.sets(st.sampled_from(KEYS), max_size=4), st.integers(0, 2**32))
def test_the_incremental_view_equals_a_full_recomputation(
    history: list[tuple[str, Any]], held: set[str], seed: int
) -> None:
    tracker = ExpiryTracker(FAILOVER, worker_id=ME)
    index = new_index()
    table: dict[str, Lease] = {}
    now = 0.0
    for kind, arg in history:
        if kind == "put":
            lease, key = arg
            table[key] = lease
            tracker.observe([lease], now, complete=False)
            index.put(lease)
        elif kind == "renew":
            # A renewal as the stream shows one: only the counter moved (when the lease is
            # as last seen; else an ordinary change).
            lease, key = arg
            known = table.get(key)
            if known is not None and known.lease_owner is not None:
                lease = replace(known, lease_counter=lease.lease_counter)
                table[key] = lease
                tracker.renewed([lease], now)
                index.renew(lease)
            else:
                table[key] = lease
                tracker.observe([lease], now, complete=False)
                index.put(lease)
        elif kind == "remove":
            table.pop(arg, None)
            tracker.forget([arg])
            index.remove(arg)
        elif kind == "wait":
            now += arg
        elif kind == "beat":
            tracker.observe_heartbeats([arg], now, complete=False)
        elif kind == "blind":
            tracker.blind(now)
            now += 4.0
            tracker.answered(now)
        else:  # a complete scan: the index starts again from it
            tracker.observe(list(table.values()), now)
            index.refresh(table.values())
        check(tracker, index, table, held, now, seed)


def check(
    tracker: ExpiryTracker,
    index: LeaseIndex,
    table: dict[str, Lease],
    held: set[str],
    now: float,
    seed: int,
) -> None:
    leases = list(table.values())
    active = [lease for lease in leases if lease.checkpoint.sequence_number != SHARD_END]
    for even_out in (False, True):
        fast = shape_from_index(index, tracker, worker_id=ME, held=held, now=now, even_out=even_out)
        full = shape_of(
            active,
            worker_id=ME,
            held=held,
            is_expired=lambda lease: tracker.is_expired(lease, now),
            even_out=even_out,
        )
        expect_same_shape(fast, full)
        options: dict[str, Any] = {
            "worker_id": ME,
            "even_out": even_out,
            "max_steal": 2,
            "max_takes": 3,
        }
        assert decide(fast, rng=random.Random(seed), **options) == decide(
            full, rng=random.Random(seed), **options
        )
    assert tracker.next_expiry(now, holder_not=ME) == tracker.next_expiry_by_scan(
        now, holder_not=ME
    )
    assert index.loads == Counter(lease.lease_owner for lease in leases if lease.lease_owner)
    assert index.free_anywhere == sum(
        1 for lease in leases if lease.is_free and lease.checkpoint.sequence_number != SHARD_END
    )
    assert set(index.finished) == {lease.lease_key for lease in leases} - {
        lease.lease_key for lease in active
    }
    children: dict[str, set[str]] = {}
    for lease in leases:
        for parent in lease.parent_shard_ids:
            children.setdefault(parent, set()).add(lease.lease_key)
    assert {parent: set(kids) for parent, kids in index.children.items()} == children
    handing: dict[str, set[str]] = {}
    for lease in active:
        if lease.checkpoint_owner is not None:
            handing.setdefault(lease.checkpoint_owner, set()).add(lease.lease_key)
    assert {worker: set(keys) for worker, keys in index.handing.items()} == handing
    assert set(index.requested) == {
        lease.lease_key for lease in active if HANDOFF_REQUEST in lease.extra
    }


def test_a_finished_lease_is_looked_at_again_when_a_child_changes() -> None:
    index = new_index()
    parent = Lease("shardId-1", checkpoint=ExtendedSequenceNumber(SHARD_END))
    index.put(parent)
    assert index.take_touched() == ["shardId-1"]
    assert index.take_touched() == []
    index.put(Lease("shardId-2", parent_shard_ids=frozenset({"shardId-1"})))
    assert index.take_touched() == ["shardId-1"]
    index.put(Lease("shardId-3", lease_owner="w1"))  # unrelated
    assert index.take_touched() == []
    index.remove("shardId-2")
    assert index.take_touched() == ["shardId-1"]


def test_expired_candidates_skip_a_holder_whose_heartbeat_lives() -> None:
    tracker = ExpiryTracker(FAILOVER, worker_id=ME)
    leases = [Lease(key, lease_owner="w1", lease_counter=1) for key in KEYS]
    tracker.observe_heartbeats([Heartbeat("w1", 1)], 0.0)
    tracker.observe(leases, 0.0)
    tracker.observe_heartbeats([Heartbeat("w1", 2)], 8.0, complete=False)
    assert tracker.expired_candidates(12.0) == []  # due, but w1's heartbeat beat at 8.0
    assert tracker.next_expiry(12.0, holder_not=ME) == 18.0
    assert len(tracker.expired_candidates(18.0)) == len(KEYS)
    assert all(tracker.is_expired(lease, 18.0) for lease in leases)
