"""Expiry as one observer judges it: counters unchanged for failover_time on its own clock."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.leases import Lease
from shardflow.leases.entities import Heartbeat
from shardflow.leases.expiry import ExpiryTracker
from shardflow.leases.handoff_request import LEAVING
from shardflow.records import SHARD_END, ExtendedSequenceNumber

HELD = Lease("shardId-000000000001", lease_owner="a", lease_counter=5)


def test_a_free_lease_is_expired_at_once() -> None:
    tracker = ExpiryTracker(10.0)
    free = Lease("shardId-000000000002")
    assert tracker.is_expired(free, now=0.0)
    tracker.observe([free], now=0.0)
    assert tracker.is_expired(free, now=0.0)


def test_a_lease_never_seen_is_not_expired() -> None:
    assert not ExpiryTracker(10.0).is_expired(HELD, now=1e9)


def test_a_held_lease_expires_failover_after_it_was_first_seen_unchanged() -> None:
    tracker = ExpiryTracker(10.0)
    tracker.observe([HELD], now=100.0)
    tracker.observe([HELD], now=105.0)  # same counter: the clock keeps running from 100
    assert not tracker.is_expired(HELD, now=109.9)
    assert tracker.is_expired(HELD, now=110.0)
    assert tracker.expires_at(HELD) == 110.0


def test_a_changed_counter_restarts_the_clock() -> None:
    tracker = ExpiryTracker(10.0)
    tracker.observe([HELD], now=100.0)
    renewed = replace(HELD, lease_counter=6)
    tracker.observe([renewed], now=108.0)
    assert not tracker.is_expired(renewed, now=117.9)
    assert tracker.is_expired(renewed, now=118.0)
    # A view with the old counter is never judged by the new sighting.
    assert not tracker.is_expired(HELD, now=1e9)


def test_a_handoff_without_counter_change_restarts_the_clock() -> None:
    tracker = ExpiryTracker(10.0)
    tracker.observe([HELD], now=100.0)
    handed = replace(HELD, lease_owner="b", checkpoint_owner="a")
    tracker.observe([handed], now=109.0)
    assert not tracker.is_expired(handed, now=118.0)
    assert tracker.is_expired(handed, now=119.0)


def test_leases_missing_from_a_full_scan_are_forgotten() -> None:
    tracker = ExpiryTracker(10.0)
    tracker.observe([HELD], now=0.0)
    tracker.observe([], now=1.0, complete=False)
    assert len(tracker) == 1
    tracker.observe([], now=2.0)
    assert len(tracker) == 0
    tracker.observe([HELD], now=50.0)  # seen anew: a fresh failover time
    assert not tracker.is_expired(HELD, now=59.0)


def test_failover_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ExpiryTracker(0)


@settings(max_examples=200, deadline=None)
@given(
    offset=st.floats(-1e9, 1e9, allow_nan=False),
    scans=st.lists(st.tuples(st.floats(0.01, 5.0), st.booleans()), min_size=1, max_size=30),
)
def test_only_the_observers_own_elapsed_time_matters(
    offset: float, scans: list[tuple[float, bool]]
) -> None:
    """Whatever the observer's clock reads (``offset``), a lease is expired exactly when at
    least failover_time passed, on that clock, since its current counter was first seen."""
    tracker = ExpiryTracker(10.0)
    lease = HELD
    now = offset
    first_seen = now
    tracker.observe([lease], now)
    for gap, renewed in scans:
        now += gap
        if renewed:
            lease = replace(lease, lease_counter=lease.lease_counter + 1)
            first_seen = now
        tracker.observe([lease], now)
        assert tracker.is_expired(lease, now) == (now - first_seen >= 10.0)


def test_workers_seen_writing_long_ago_are_forgotten() -> None:
    # A long-lived process sees a new worker id in every rolling restart: 500 deploys of 2
    # workers, each renewing its one lease for a while and leaving. Only the recent ones stay.
    tracker = ExpiryTracker(10.0)
    now = 0.0
    for deploy in range(500):
        for n in range(2):
            lease = Lease(f"shardId-{n:012d}", lease_owner=f"w-{deploy}-{n}", lease_counter=1)
            tracker.observe([lease], now=now)
            tracker.observe([replace(lease, lease_counter=2)], now=now + 3.0)
        now += 30.0
    # Only reads, as in the per-lease mode (nothing asks for lease keepers without heartbeat).
    assert tracker.writers_remembered <= 4
    assert tracker.seen_writing(now, 10.0) == set()
    # What is recent is still known.
    fresh = Lease("shardId-000000000009", lease_owner="fresh", lease_counter=1)
    tracker.observe([fresh], now=now)
    tracker.observe([replace(fresh, lease_counter=2)], now=now + 1.0)
    assert tracker.renewed_within("fresh", now + 5.0, 10.0)
    assert tracker.seen_writing(now + 5.0, 10.0) == {"fresh"}


def test_the_fleet_that_stays_leaves_out_leavers_and_deleted_heartbeats() -> None:
    # The workers a take cycle balances over beyond the holders of live leases: those seen
    # writing within a failover time, less those known to leave. A worker that said on a
    # lease that it leaves, and one whose heartbeat was deleted with no lease write since (a
    # graceful leaver deletes it once it holds nothing), are gone; one that deleted its
    # heartbeat and renews on (back to the per-lease mode) stays.
    tracker = ExpiryTracker(10.0)
    leases = [
        Lease(f"shardId-{n:012d}", lease_owner=owner, lease_counter=1)
        for n, owner in enumerate(("stays", "says-it-leaves", "per-lease-again"))
    ]
    tracker.observe(leases, now=0.0)
    tracker.observe_heartbeats(
        [Heartbeat("gone", 1), Heartbeat("per-lease-again", 1)], now=0.0, complete=False
    )
    word = {LEAVING: {"S": "2:says-it-leaves"}}
    tracker.observe(
        [replace(leases[0], lease_counter=2), replace(leases[1], lease_counter=2, extra=word)],
        now=1.0,
        complete=False,
    )
    tracker.observe_heartbeats(
        [Heartbeat("gone", 2), Heartbeat("per-lease-again", 2)], now=1.0, complete=False
    )
    assert tracker.seen_writing(2.0, 10.0) == {"stays", "says-it-leaves", "gone", "per-lease-again"}
    tracker.forget_heartbeat("gone", 2.0)
    tracker.forget_heartbeat("per-lease-again", 2.0)
    tracker.observe([replace(leases[2], lease_counter=2)], now=3.0, complete=False)  # renews
    assert tracker.staying(4.0, 10.0) == {"stays", "per-lease-again"}
    # Seen through the stream's renewals too (only a counter moved).
    fresh = ExpiryTracker(10.0)
    fresh.observe([leases[1]], now=0.0)
    fresh.renewed([replace(leases[1], lease_counter=2, extra=word)], now=1.0)
    assert fresh.seen_writing(2.0, 10.0) == {"says-it-leaves"}
    assert fresh.staying(2.0, 10.0) == set()


def test_a_worker_seen_releasing_a_live_shards_lease_no_longer_stays() -> None:
    # A worker stopping without handoffs releases what it holds: counted as staying for a
    # failover time after its last renewal, its peers (at their share with it counted) left
    # its released leases free that long. A release of a finished shard's lease (every worker
    # at a split) is not a leave; and a write after a release counts again.
    tracker = ExpiryTracker(10.0)
    live = Lease("shardId-000000000000", lease_owner="stops", lease_counter=1)
    ended = Lease("shardId-000000000001", lease_owner="splits", lease_counter=1)
    tracker.observe([live, ended], now=0.0)
    tracker.observe(
        [replace(live, lease_counter=2), replace(ended, lease_counter=2)], now=1.0, complete=False
    )
    finished = ExtendedSequenceNumber(SHARD_END)
    tracker.observe(
        [
            replace(live, lease_owner=None, lease_counter=3),
            replace(ended, lease_owner=None, lease_counter=3, checkpoint=finished),
        ],
        now=2.0,
        complete=False,
    )
    assert tracker.seen_writing(3.0, 10.0) == {"stops", "splits"}
    assert tracker.staying(3.0, 10.0) == {"splits"}
    back = replace(live, lease_owner="stops", lease_counter=4)
    tracker.observe([back], now=4.0, complete=False)  # took a lease again
    assert tracker.staying(5.0, 10.0) == {"splits", "stops"}
