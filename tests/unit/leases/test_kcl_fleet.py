"""Taking part in a KCL 3.x fleet: the worker-metrics item the KCL leader reads, who counts as a
live KCL worker, and who gets a leaving worker's leases when a stopped KCL worker still looks
live (its metrics item outlives it)."""

from __future__ import annotations

from shardflow.leases.expiry import ExpiryTracker
from shardflow.leases.fleet import SHARDFLOW_MARK, live_kcl_workers, metrics_item
from shardflow.leases.handoffs import successors
from shardflow.leases.model import Lease


def test_the_metrics_item_is_a_kcl_worker_without_platform_metrics() -> None:
    item = metrics_item("sf-1", 1_700_000_000.7)
    # KCL's WorkerMetricStats: wid (key), lut (epoch seconds); empty sts/opr make it a
    # "default" worker, balanced by lease throughput, valid as long as lut is present.
    assert item["wid"] == {"S": "sf-1"}
    assert item["lut"] == {"N": "1700000000"}
    assert item["sts"] == {"M": {}}
    assert item["opr"] == {"M": {}}
    assert SHARDFLOW_MARK in item


def test_live_kcl_workers_are_fresh_items_not_written_by_shardflow() -> None:
    now = 10_000.0
    items = [
        {"wid": {"S": "kcl-fresh"}, "lut": {"N": "9990"}},
        {"wid": {"S": "kcl-stale"}, "lut": {"N": "9900"}},
        metrics_item("shardflow", now),
        {"wid": {"S": "no-time"}},
    ]
    assert live_kcl_workers(items, now, expiry=60) == {"kcl-fresh"}


def lease(key: str, owner: str, counter: int, checkpoint_owner: str | None = None) -> Lease:
    return Lease(key, lease_owner=owner, lease_counter=counter, checkpoint_owner=checkpoint_owner)


def test_a_handover_is_no_proof_of_life_a_renewal_is() -> None:
    tracker = ExpiryTracker(10.0)
    tracker.observe([lease("a", "K1", 1, checkpoint_owner="S1"), lease("b", "K2", 1)], 0.0)
    # S1 completes its handoff to K1 (checkpoint owner cleared, counter bumped); K2 renews.
    tracker.observe([lease("a", "K1", 2), lease("b", "K2", 2)], 1.0)
    assert tracker.renewed_within("K2", 2.0, 5.0)
    assert not tracker.renewed_within("K1", 2.0, 5.0)
    assert not tracker.renewed_within("K2", 7.0, 5.0)


def test_a_leaver_hands_to_workers_seen_renewing_when_there_are_any() -> None:
    leases = [lease("a", "K1", 5), lease("b", "K2", 9), lease("c", "S1", 3)]
    alive = {"K2"}
    picks = successors(
        leases,
        2,
        worker_id="S1",
        is_expired=lambda _: False,
        also={"K1", "K3"},
        seen_alive=alive.__contains__,
    )
    assert picks == ["K2", "K2"]
    # Nobody confirmed: the least loaded candidates, metrics-only KCL workers included.
    fallback = successors(
        leases,
        2,
        worker_id="S1",
        is_expired=lambda _: False,
        also={"K3"},
        seen_alive=set().__contains__,
    )
    assert fallback == ["K3", "K1"]


def test_deferring_to_a_kcl_leader_takes_every_orphan_and_steals_nothing() -> None:
    from shardflow.leases.balance import plan_takes

    leases = [lease(key, "K1", 1) for key in "abcd"] + [lease(key, "K2", 1) for key in "ef"]
    dead = set("abcd")

    def expired(candidate: Lease) -> bool:
        return candidate.lease_key in dead

    greedy = plan_takes(
        leases, worker_id="S1", held=(), is_expired=expired, max_steal=0, orphans_beyond_target=True
    )
    assert sorted(p.lease.lease_key for p in greedy.takes) == ["a", "b", "c", "d"]
    # Without it: up to the target only (ceil(6 leases / 2 live workers) = 3).
    assert len(plan_takes(leases, worker_id="S1", held=(), is_expired=expired).takes) == 3
    capped = plan_takes(
        leases,
        worker_id="S1",
        held=(),
        is_expired=expired,
        max_steal=0,
        max_leases_per_worker=2,
        orphans_beyond_target=True,
    )
    assert len(capped.takes) == 2  # the per-worker cap still holds
    live = plan_takes(leases, worker_id="S1", held=(), is_expired=lambda _: False, max_steal=0)
    assert live.takes == ()
