"""Balance math: which leases a worker takes from one table snapshot (pure, property-tested)."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.leases import Lease
from shardflow.leases.balance import TakePlan, plan_takes, target_for
from shardflow.leases.handoff_request import HANDOFF_REQUEST, HandoffRequest

ME = "me"
PEERS = ("p1", "p2", "p3", "p4", "p5")


@dataclass(frozen=True)
class Table:
    leases: list[Lease]
    expired: frozenset[str]
    held: frozenset[str]
    max_per_worker: int | None
    max_steal: int


@st.composite
def tables(draw: st.DrawFn) -> Table:
    """Random lease tables as one observer sees them: free, expired and live leases of up to
    six workers; this worker holds some of the leases that name it."""
    count = draw(st.integers(0, 40))
    owners = st.sampled_from((None, ME, *PEERS))
    leases: list[Lease] = []
    expired: set[str] = set()
    held: set[str] = set()
    for i in range(count):
        key = f"shardId-{i:012d}"
        owner = draw(owners)
        leases.append(Lease(key, lease_owner=owner, lease_counter=draw(st.integers(0, 9))))
        if owner is not None and draw(st.booleans()):
            expired.add(key)
        if owner == ME and key not in expired and draw(st.integers(0, 3)) > 0:
            held.add(key)
    return Table(
        leases,
        frozenset(expired),
        frozenset(held),
        draw(st.none() | st.integers(1, 12)),
        draw(st.integers(0, 3)),
    )


def plan(table: Table, seed: int = 0) -> TakePlan:
    return plan_takes(
        table.leases,
        worker_id=ME,
        held=table.held,
        is_expired=lambda lease: lease.lease_key in table.expired,
        max_leases_per_worker=table.max_per_worker,
        max_steal=table.max_steal,
        rng=random.Random(seed),
    )


def is_candidate(table: Table, lease: Lease) -> bool:
    """Free or expired, and not already held here."""
    return lease.lease_key not in table.held and (lease.is_free or lease.lease_key in table.expired)


@settings(max_examples=200, deadline=None)
@given(table=tables(), seed=st.integers(0, 2**16))
def test_the_plan_never_exceeds_the_target(table: Table, seed: int) -> None:
    result = plan(table, seed)
    assert result.held + len(result.takes) <= max(result.target, result.held)
    assert len({t.lease.lease_key for t in result.takes}) == len(result.takes)
    assert not {t.lease.lease_key for t in result.takes} & table.held


@settings(max_examples=200, deadline=None)
@given(table=tables(), seed=st.integers(0, 2**16))
def test_the_target_is_ceil_of_leases_per_live_worker(table: Table, seed: int) -> None:
    result = plan(table, seed)
    live = {
        lease.lease_owner
        for lease in table.leases
        if lease.lease_owner is not None
        and lease.lease_key not in table.expired
        and lease.lease_key not in table.held
    } | {ME}
    assert result.live_workers == live
    expected = math.ceil(len(table.leases) / len(live)) if table.leases else 0
    if table.max_per_worker is not None:
        expected = min(expected, table.max_per_worker)
    assert result.target == expected


@settings(max_examples=200, deadline=None)
@given(table=tables(), seed=st.integers(0, 2**16))
def test_free_and_expired_leases_are_taken_first_and_free_before_expired(
    table: Table, seed: int
) -> None:
    result = plan(table, seed)
    candidates = [lease for lease in table.leases if is_candidate(table, lease)]
    need = max(result.target - result.held, 0)
    if not candidates:
        return
    assert all(t.how in ("free", "expired") for t in result.takes), "no steal while any is free"
    assert len(result.takes) == min(need, len(candidates)), "takes as many as it may"
    free = {lease.lease_key for lease in candidates if lease.is_free}
    taken = {t.lease.lease_key for t in result.takes}
    if any(t.how == "expired" for t in result.takes):
        assert free <= taken, "an expired lease is taken only when every free one is"
    for t in result.takes:
        assert t.how == ("free" if t.lease.is_free else "expired")


@settings(max_examples=200, deadline=None)
@given(table=tables(), seed=st.integers(0, 2**16))
def test_a_live_lease_is_only_stolen_from_a_worker_above_target(table: Table, seed: int) -> None:
    result = plan(table, seed)
    stolen = [t for t in result.takes if t.how == "stolen"]
    if not stolen:
        return
    assert len(stolen) <= table.max_steal
    victims = {t.lease.lease_owner for t in stolen}
    assert len(victims) == 1
    (victim,) = victims
    assert victim not in (None, ME)
    for t in stolen:
        assert t.lease.lease_key not in table.expired
        assert not t.lease.is_free
    load = result.loads[victim]
    assert load > result.target
    assert load - len(stolen) >= result.target, "the victim never drops below target"
    assert load == max(result.loads.values()), "only from the most loaded worker"


@settings(max_examples=200, deadline=None)
@given(table=tables(), seed=st.integers(0, 2**16))
def test_every_planned_take_carries_the_lease_as_seen(table: Table, seed: int) -> None:
    # The take is conditional on the counter and owner seen: the plan must not alter them.
    result = plan(table, seed)
    by_key = {lease.lease_key: lease for lease in table.leases}
    for t in result.takes:
        assert by_key[t.lease.lease_key] == t.lease


def test_target_examples() -> None:
    assert target_for(0, 3) == 0
    assert target_for(1, 3) == 1
    assert target_for(8, 3) == 3
    assert target_for(9, 3) == 3
    assert target_for(10, 1) == 10
    assert target_for(10, 1, max_per_worker=4) == 4


def test_a_new_worker_steals_one_from_the_most_loaded_worker() -> None:
    leases = [Lease(f"s{i}", lease_owner="a" if i < 6 else "b", lease_counter=1) for i in range(8)]
    result = plan_takes(leases, worker_id=ME, held=(), is_expired=lambda _: False)
    assert result.target == 3
    assert [t.how for t in result.takes] == ["stolen"]
    assert result.takes[0].lease.lease_owner == "a"


def test_nothing_is_stolen_from_workers_at_target() -> None:
    # 7 leases, 3 workers: target 3; 3/3/1 stays (no worker is above target).
    leases = [Lease(f"s{i}", lease_owner="a" if i < 3 else "b", lease_counter=1) for i in range(6)]
    leases.append(Lease("s6", lease_owner=ME, lease_counter=1))
    result = plan_takes(leases, worker_id=ME, held={"s6"}, is_expired=lambda _: False)
    assert result.target == 3
    assert result.takes == ()


def test_leases_in_a_handoff_are_not_stolen() -> None:
    moving = [
        Lease(f"s{i}", lease_owner="b", checkpoint_owner="a", lease_counter=1) for i in range(4)
    ]
    result = plan_takes(moving, worker_id=ME, held=(), is_expired=lambda _: False, max_steal=4)
    assert result.takes == ()


def test_workers_converge_to_an_even_split() -> None:
    """Two to four workers taking in turns end with every worker within one of the others
    when they are two, and nobody above target in any case."""
    for workers in (["w1", "w2"], ["w1", "w2", "w3"], ["w1", "w2", "w3", "w4"]):
        for count in range(4, 13):
            leases = {f"s{i}": Lease(f"s{i}") for i in range(count)}
            take_in_turns(leases, workers, rounds=4 * count, rng=random.Random(count))
            loads = Counter(lease.lease_owner for lease in leases.values())
            assert None not in loads
            assert max(loads.values()) <= math.ceil(count / len(workers)), (workers, loads)
            if len(workers) == 2:
                assert max(loads.values()) - min(loads[w] for w in workers) <= 1, loads


def test_joiners_at_once_ask_workers_at_target_when_evening_out() -> None:
    """Seen in bench/fleet.py: 64 shards on 8 workers (8 each), 2 workers join at once. Each
    joiner counts only itself among the workers holding nothing: the target is ceil(64 / 9)
    = 8, everyone else is at it, and the joiners held nothing for good. Evening out (planned
    handoff: the steal is a request, answered gracefully) asks the most loaded worker anyway."""
    owners = [f"w{i}" for i in range(8)]
    leases = [Lease(f"s{i}", lease_owner=owners[i % 8], lease_counter=1) for i in range(64)]
    kcl_style = plan_takes(leases, worker_id="j1", held=(), is_expired=lambda _: False)
    assert kcl_style.target == 8
    assert kcl_style.takes == ()
    evened = plan_takes(leases, worker_id="j1", held=(), is_expired=lambda _: False, even_out=True)
    assert [t.how for t in evened.takes] == ["stolen"]


def test_evening_out_ends_within_one_lease_and_stops_there() -> None:
    """8 workers with 8 leases each and 2 joiners, each asking in turn (a request answered at
    once): every worker ends within one lease of every other, and then nobody asks again."""
    workers = [f"w{i}" for i in range(8)] + ["j1", "j2"]
    leases = {f"s{i}": Lease(f"s{i}", lease_owner=workers[i % 8]) for i in range(64)}
    take_in_turns(leases, workers, rounds=40, rng=random.Random(7), even_out=True)
    loads = Counter(lease.lease_owner for lease in leases.values())
    assert max(loads.values()) - min(loads[w] for w in workers) <= 1, loads
    for worker in workers:
        held = {k for k, lease in leases.items() if lease.lease_owner == worker}
        again = plan_takes(
            list(leases.values()),
            worker_id=worker,
            held=held,
            is_expired=lambda _: False,
            even_out=True,
        )
        assert again.takes == (), f"{worker} still asks at {dict(loads)}"


def take_in_turns(
    leases: dict[str, Lease],
    workers: list[str],
    *,
    rounds: int,
    rng: random.Random,
    even_out: bool = False,
) -> None:
    """Each worker plans in turn, ``rounds`` times, and its takes (or answered requests) land
    at once in ``leases``."""
    for _ in range(rounds):
        for worker in workers:
            held = {k for k, lease in leases.items() if lease.lease_owner == worker}
            result = plan_takes(
                list(leases.values()),
                worker_id=worker,
                held=held,
                is_expired=lambda _: False,
                rng=rng,
                even_out=even_out,
            )
            for take in result.takes:
                old = leases[take.lease.lease_key]
                leases[old.lease_key] = replace(
                    old, lease_owner=worker, lease_counter=old.lease_counter + 1
                )


def test_max_takes_bounds_free_and_expired_takes_of_one_cycle() -> None:
    leases = [Lease(lease_key=f"s{i}") for i in range(100)]
    plan = plan_takes(leases, worker_id="w", held=(), is_expired=lambda lease: True, max_takes=32)
    assert plan.target == 100
    assert len(plan.takes) == 32


def test_a_dead_workers_leases_are_shared_beyond_the_target_while_a_joiner_asks() -> None:
    """bench/chaos.py: 4 workers on 16 shards, one killed -9 and restarted 3 s later. The
    replacement asks for a lease at once (a fresh request: it counts as live, the target stays
    4), and it judges expiry from its own first sight of the dead worker's leases. The
    survivors, each at 4, took none of them: the shards waited for the replacement's own
    failover time (11-13.4 s after the kill at failover time 6 s)."""
    owners = ["a", "b", "c", "dead"]
    leases = [Lease(f"s{i:02d}", lease_owner=owners[i % 4], lease_counter=5) for i in range(16)]
    asked = Lease(
        "s00",
        lease_owner="a",
        lease_counter=5,
        extra={HANDOFF_REQUEST: {"S": HandoffRequest("joiner", 5).encode()}},
    )
    leases[0] = asked
    dead = {lease.lease_key for lease in leases if lease.lease_owner == "dead"}
    taken: set[str] = set()
    for worker in ("a", "b", "c"):
        result = plan_takes(
            leases,
            worker_id=worker,
            held={lease.lease_key for lease in leases if lease.lease_owner == worker},
            is_expired=lambda lease: lease.lease_key in dead,
            even_out=True,
            rng=random.Random(worker),
        )
        assert result.target == 4, "the joiner counts: 16 leases over 4 live workers"
        assert "joiner" in result.live_workers
        assert all(t.how == "expired" for t in result.takes)
        assert len(result.takes) == 2, "its part of the 4 orphans over 3 holders"
        taken |= {t.lease.lease_key for t in result.takes}
    assert taken == dead, "between them the survivors take every lease of the dead worker"


def test_beyond_the_target_only_expired_leases_are_taken_never_free_ones() -> None:
    """Free leases stay the target's business (at a fleet's start every lease is free)."""
    leases = [Lease(f"s{i}", lease_owner="a" if i < 5 else "b", lease_counter=1) for i in range(8)]
    leases += [Lease("free"), Lease("gone", lease_owner="dead", lease_counter=1)]
    result = plan_takes(
        leases,
        worker_id="a",
        held={f"s{i}" for i in range(5)},
        is_expired=lambda lease: lease.lease_key == "gone",
        even_out=True,
    )
    assert result.target == 5, "10 leases over a and b"
    assert [t.lease.lease_key for t in result.takes] == ["gone"]


def test_without_handoff_expired_leases_are_taken_up_to_the_target_only() -> None:
    """KCL 2.x's rule where leases move by stealing (an extra move would repeat records)."""
    owners = ["a", "b", "c", "dead"]
    leases = [Lease(f"s{i:02d}", lease_owner=owners[i % 4], lease_counter=5) for i in range(16)]
    leases.append(Lease("s16", lease_owner="d", lease_counter=5))  # a joiner that stole one
    result = plan_takes(
        leases,
        worker_id="a",
        held={lease.lease_key for lease in leases if lease.lease_owner == "a"},
        is_expired=lambda lease: lease.lease_owner == "dead",
    )
    assert result.target == 5
    assert len(result.takes) == 1
