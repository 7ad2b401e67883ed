"""The two-owners check of bench/simulate.py (its ``Ledger``) on planted write histories.

A worker whose lease is taken may process until ``failover_time - safety_margin`` after the
last write of its own that moved the lease's counter (a renewal, a checkpoint, its take): the
only writes that move its deadline (``OwnedLease``) and the only ones a taker's take,
conditional on the counter it saw, proves it saw. A write that leaves the counter alone (a
decline of a handoff request) proves that the holder was alive, but moves neither its
deadline nor anyone's expiry clock. The default run (c71ae2b) counted 2 two owners in its
brownout from exactly that: the owner declined the taker's request, its renewals then failed,
and the taker took the lease once it had expired.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from shardflow.leases import InMemoryLeaseTables, Lease
from shardflow.leases.memory import InMemoryLeaseStore
from support.bench import load_bench

simulate = load_bench("simulate")

KEY = "shardId-000000000001"
USABLE = 9.0  # failover_time 10 s, safety margin 1 s (the simulation's settings)


class Fleet:
    """Two workers' stores on one in-memory table, every write judged by a Ledger at the
    simulated moment ``now``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.tables = InMemoryLeaseTables()
        self.sim: Any = SimpleNamespace(
            tally=simulate.Tally(),
            store_owner={},
            clock=SimpleNamespace(monotonic=lambda: self.now),
            usable_time=USABLE,
            shard_created=lambda lease: None,
            shard_finished=lambda key: None,
        )
        self.ledger = simulate.Ledger(self.sim)
        self.tables.watch(self.ledger.seen)
        self.a = self._store("worker-a")
        self.b = self._store("worker-b")

    def _store(self, worker: str) -> InMemoryLeaseStore:
        store = InMemoryLeaseStore(simulate.APPLICATION, tables=self.tables, create_table=True)
        self.sim.store_owner[id(store)] = worker
        return store

    def at(self, moment: float, write: Callable[[], Any]) -> Lease:
        self.now = moment
        lease: Lease = asyncio.run(write())
        return lease

    @property
    def two_owners(self) -> list[dict[str, Any]]:
        cases: list[dict[str, Any]] = self.sim.tally.two_owners
        return cases


def _held_by_a(fleet: Fleet) -> Lease:
    created = fleet.at(0.0, lambda: fleet.a.create_if_absent(Lease(KEY)))
    return fleet.at(0.0, lambda: fleet.a.take(created, "worker-a"))


def test_a_take_after_a_decline_but_past_the_last_renewal_deadline_is_not_two_owners() -> None:
    fleet = Fleet()
    held = _held_by_a(fleet)
    renewed = fleet.at(1.0, lambda: fleet.a.renew(held, "worker-a"))  # a's deadline: 1 + 9
    asked = fleet.at(2.0, lambda: fleet.b.request_handoff(renewed, "worker-b"))
    declined = fleet.at(6.0, lambda: fleet.a.decline_handoff(asked, "worker-a"))
    assert declined.lease_counter == renewed.lease_counter  # the decline moved no counter
    # b saw the counter of the renewal at 1.0 unchanged for failover_time: expired, taken.
    taken = fleet.at(11.5, lambda: fleet.b.take(declined, "worker-b"))
    assert taken.lease_owner == "worker-b"
    # a stopped at 10.0 (renewal sent at 1.0 + 9): no overlap. The old rule counted the
    # decline (6.0 + 9 = 15.0 > 11.5) and reported two owners, 3.5 s of "overlap".
    assert fleet.two_owners == []


def test_a_take_before_the_last_renewal_deadline_is_two_owners() -> None:
    fleet = Fleet()
    held = _held_by_a(fleet)
    renewed = fleet.at(1.0, lambda: fleet.a.renew(held, "worker-a"))
    asked = fleet.at(2.0, lambda: fleet.b.request_handoff(renewed, "worker-b"))
    declined = fleet.at(3.0, lambda: fleet.a.decline_handoff(asked, "worker-a"))
    again = fleet.at(6.0, lambda: fleet.a.renew(declined, "worker-a"))  # a's deadline: 15.0
    # A taker that read the lease after the renewal at 6.0 and took it too soon.
    fleet.at(11.5, lambda: fleet.b.take(again, "worker-b"))
    assert [(case["from"], case["to"], case["overlap"]) for case in fleet.two_owners] == [
        ("worker-a", "worker-b", 3.5)
    ]


def test_a_heartbeat_registered_again_keeps_no_lease_but_a_beat_does() -> None:
    # A worker whose heartbeat was fenced registers a new one; that extends no lease it held
    # (only beats of an established heartbeat do). A take after the lease's own deadline is
    # then no overlap, however soon after the registration it lands.
    fleet = Fleet()
    held = _held_by_a(fleet)
    renewed = fleet.at(1.0, lambda: fleet.a.renew(held, "worker-a"))  # a's deadline: 10.0
    fleet.at(10.5, lambda: fleet.a.register_heartbeat("worker-a", None))
    taken = fleet.at(10.7, lambda: fleet.b.take(renewed, "worker-b"))
    assert fleet.two_owners == []
    # A beat that landed keeps every lease its worker holds: a take 0.2 s after it is early.
    beat = fleet.at(11.0, lambda: fleet.b.register_heartbeat("worker-b", None))
    fleet.at(12.0, lambda: fleet.b.beat(beat))
    fleet.at(12.2, lambda: fleet.a.take(taken, "worker-a"))
    assert [(case["from"], case["to"]) for case in fleet.two_owners] == [("worker-b", "worker-a")]
