"""The heartbeat lease mode on the in-memory table: one heartbeat per worker keeps its leases,
peers judge expiry by it and fence it before taking, a worker whose heartbeat fails stops
within the bound it has for a lost lease, and the mode switches live both ways."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from shardflow.errors import ShardLeaseLostError, TransientError
from shardflow.events import HeartbeatBeat, LeaseAcquired, LeaseLost
from shardflow.leases import InMemoryLeaseStore, InMemoryLeaseTables, Lease
from shardflow.leases.entities import (
    HEARTBEAT_PREFIX,
    MODE_KEY,
    Heartbeat,
    entity_from_item,
    heartbeat_item,
)
from shardflow.leases.errors import EntityConditionFailedError
from shardflow.leases.expiry import ExpiryTracker
from shardflow.leases.memory import LeaseWriteSeen
from shardflow.leases.model import is_lease_item
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.store import LeaseStoreBase, TableScan
from shardflow.leases.writes import LeaseWrite
from shardflow.records import ExtendedSequenceNumber
from support.coordinator_fakes import run_for, shard, sid, world
from unit.leases.test_coordinator_handoff import complete_handoffs, leave

# Pick-up by polling the table (the in-memory store has a stream, but the fakes give no
# streams client); handoffs on, as by default.
HB = LeaseSettings(pickup="poll", pickup_poll_interval=0.5)


class Writes:
    """Every landed write to the table, by operation and writer."""

    def __init__(self, tables: InMemoryLeaseTables) -> None:
        self.seen: list[tuple[float, LeaseWriteSeen]] = []
        self.stop = tables.watch(self._watch)
        self.now: Callable[[], float] = lambda: 0.0

    def _watch(self, seen: LeaseWriteSeen) -> None:
        if not seen.refused:
            self.seen.append((self.now(), seen))

    def count(self, since: float = 0.0) -> Counter[str]:
        return Counter(seen.write.operation for at, seen in self.seen if at >= since)


class FlakyHeartbeats(InMemoryLeaseStore):
    """Fails this worker's heartbeats while ``failing``, and its lease writes too unless
    ``beats_only`` (its scans get through: it sees the table, the table does not hear it)."""

    failing = False
    beats_only = False

    async def execute_entity(self, write: LeaseWrite) -> Any:
        if self.failing and write.operation == "heartbeat":
            raise TransientError("injected", operation="UpdateItem", code="InternalServerError")
        return await super().execute_entity(write)

    async def execute(self, write: LeaseWrite) -> Any:
        if self.failing and not self.beats_only:
            raise TransientError("injected", operation="UpdateItem", code="InternalServerError")
        return await super().execute(write)


# --- the items ---------------------------------------------------------------------------------


def test_heartbeat_items_are_not_leases_and_round_trip() -> None:
    item = heartbeat_item(Heartbeat("w-1", 7, "w-2"))
    assert item["leaseKey"]["S"] == HEARTBEAT_PREFIX + "w-1"
    assert not is_lease_item(item), "KCL 3.5's rule: an entityType other than LEASE"
    assert entity_from_item(item) == Heartbeat("w-1", 7, "w-2")
    assert entity_from_item({"leaseKey": {"S": "shardId-1"}}) is None


async def test_a_scan_separates_leases_heartbeats_and_the_mode() -> None:
    store = InMemoryLeaseStore("app", create_table=True)
    await store.create_if_absent(Lease.new("shardId-1"))
    beat = await store.register_heartbeat("w-1", None)
    await store.set_lease_mode("heartbeat")
    scan = await store.scan_table()
    assert [lease.lease_key for lease in scan.leases] == ["shardId-1"]
    assert scan.heartbeats == (beat,)
    assert scan.mode == "heartbeat"
    assert [lease.lease_key for lease in await store.list_leases()] == ["shardId-1"]
    await store.set_lease_mode("per-lease")
    assert MODE_KEY not in store.tables.items("app"), "per-lease leaves only leases"
    assert (await store.scan_table()).mode is None


async def test_a_fence_and_a_beat_exclude_each_other() -> None:
    store = InMemoryLeaseStore("app", create_table=True)
    seen = await store.register_heartbeat("a", None)
    beaten = await store.beat(seen)
    assert beaten.counter == seen.counter + 1
    # A peer fencing what it saw before that beat is refused: the worker lives.
    with pytest.raises(EntityConditionFailedError):
        await store.fence_heartbeat(seen, "b")
    fenced = await store.fence_heartbeat(beaten, "b")
    assert fenced.fenced_by == "b"
    # The worker's next beat (in flight at the fence) is refused: it extends nothing.
    with pytest.raises(EntityConditionFailedError) as refused:
        await store.beat(beaten)
    assert entity_from_item(refused.value.current or {}) == fenced
    # Registering again takes the fenced item over, conditional on it.
    again = await store.register_heartbeat("a", fenced)
    assert again.fenced_by is None
    assert again.counter == fenced.counter + 1


# --- expiry ------------------------------------------------------------------------------------


def test_a_lease_expires_only_when_it_and_its_holders_heartbeat_are_both_silent() -> None:
    tracker = ExpiryTracker(10.0)
    lease = Lease(lease_key="s-1", lease_owner="a", lease_counter=3)
    tracker.observe([lease], 0.0)
    tracker.observe_heartbeats([Heartbeat("a", 1)], 0.0)
    for at in (3.0, 6.0, 9.0, 12.0, 15.0):  # the heartbeat beats, the lease stays as it is
        tracker.observe([lease], at)
        tracker.observe_heartbeats([Heartbeat("a", int(at))], at)
        assert not tracker.is_expired(lease, at)
    assert tracker.renewed_within("a", 15.0, 1.0), "a beat is proof of life"
    # The heartbeat stops at 15: expired at 25, not before.
    assert not tracker.is_expired(lease, 24.9)
    assert tracker.expires_at(lease) == 25.0
    assert tracker.next_expiry(15.0, holder_not="b") == 25.0
    assert tracker.is_expired(lease, 25.0)
    # A fenced heartbeat is expired at once (given the lease itself is silent too).
    tracker.observe_heartbeats([Heartbeat("a", 15, "b")], 16.0)
    assert tracker.is_expired(lease, 16.0)
    # Without a heartbeat item the lease is judged on its own counter, as in per-lease mode.
    tracker.observe([lease], 16.0)
    tracker.observe_heartbeats([], 16.0)
    assert tracker.heartbeat_of("a") is None
    assert tracker.is_expired(lease, 16.0)


def test_a_lease_written_lately_is_not_expired_though_its_holders_heartbeat_is() -> None:
    tracker = ExpiryTracker(10.0)
    lease = Lease(lease_key="s-1", lease_owner="a", lease_counter=3)
    tracker.observe([lease], 0.0)
    tracker.observe_heartbeats([Heartbeat("a", 1)], 0.0)
    checkpointed = Lease(lease_key="s-1", lease_owner="a", lease_counter=4)
    tracker.observe([checkpointed], 8.0)
    assert not tracker.is_expired(checkpointed, 12.0), "its checkpoint at 8 keeps it to 18"
    assert tracker.is_expired(checkpointed, 18.0)


def test_a_heartbeat_whose_worker_is_seen_writing_lapses_a_failover_time_after_its_writes() -> None:
    # Only its beats fail: its renewals one by one land. Fenced at failover_time, every lease
    # it had not renewed in the stretch moved (bench/simulate.py's brownout, 10,000 x 100:
    # 88 leases taken as expired from workers that were alive). Now its heartbeat lapses a
    # failover time after its last write seen, at the latest twice failover_time after its
    # last beat; a worker that writes nothing (a crash) lapses at failover_time as before.
    tracker = ExpiryTracker(10.0)
    idle = Lease(lease_key="s-1", lease_owner="a", lease_counter=3)
    renewed = Lease(lease_key="s-2", lease_owner="a", lease_counter=5)
    crashed = Lease(lease_key="s-3", lease_owner="c", lease_counter=1)
    tracker.observe([idle, renewed, crashed], 0.0)
    tracker.observe_heartbeats([Heartbeat("a", 1), Heartbeat("c", 1)], 0.0)
    tracker.observe_heartbeats([Heartbeat("a", 2), Heartbeat("c", 2)], 1.0)
    # a's beats fail from 1.0 on; it renews s-2 one by one at 6.0.
    renewed = Lease(lease_key="s-2", lease_owner="a", lease_counter=6)
    tracker.observe([renewed], 6.0, complete=False)
    assert tracker.heartbeat_lapsed("c", 11.0), "c wrote nothing since its beat at 1.0"
    assert tracker.is_expired(crashed, 11.0)
    assert not tracker.heartbeat_lapsed("a", 11.0)
    assert not tracker.is_expired(idle, 11.0)
    assert tracker.expires_at(idle) == 16.0
    assert tracker.next_expiry(11.0, holder_not="b") == 16.0
    assert tracker.is_expired(idle, 16.0)
    # Writing every 5 s while its beats fail: lapsed at twice failover_time after its beat.
    for at in (11.0, 16.0):
        renewed = Lease(lease_key="s-2", lease_owner="a", lease_counter=renewed.lease_counter + 1)
        tracker.observe([renewed], at, complete=False)
    assert not tracker.heartbeat_lapsed("a", 20.9)
    assert tracker.heartbeat_lapsed("a", 21.0)
    assert tracker.is_expired(idle, 21.0)
    assert not tracker.is_expired(renewed, 21.0), "renewed at 16: its own counter keeps it"


# --- the coordinator ---------------------------------------------------------------------------


async def _in_heartbeat_mode(w: Any, *workers: Any) -> None:
    """Set the table's mode and run until every worker's heartbeat stands in for renewals."""
    await w.store().set_lease_mode("heartbeat")
    for _ in range(400):
        if all(worker.lease_mode == "heartbeat" for worker in workers):
            return
        await run_for(0.5, w.clock)
    raise AssertionError("the heartbeat mode was never established")


async def test_without_a_mode_item_nothing_changes() -> None:
    async with world() as w:
        writes = Writes(w.tables)
        writes.now = w.clock.monotonic
        a = await w.start("a", settings=HB)
        await run_for(30.0, w.clock, step=0.5)
        assert a.lease_mode == "per-lease"
        assert a.table_lease_mode == "per-lease"
        assert not any(key.startswith("_shardflow") for key in w.tables.items("app"))
        assert writes.count()["renew"] >= 4 * 8, "each lease renewed on its own"


async def test_an_idle_fleet_writes_heartbeats_not_renewals() -> None:
    async with world([shard(i) for i in range(8)]) as w:
        writes = Writes(w.tables)
        writes.now = w.clock.monotonic
        a = await w.start("a", settings=HB)
        b = await w.start("b", settings=HB)
        await run_for(25.0, w.clock, step=0.5)  # balanced (the joiner asks for leases)
        await _in_heartbeat_mode(w, a, b)
        start = w.clock.monotonic()
        await run_for(60.0, w.clock, step=0.5)
        counted = writes.count(since=start)
        assert counted["renew"] == 0, counted
        # Two workers, one beat each per renew interval (3.3 s): ~36 in 60 s.
        assert 30 <= counted["heartbeat"] <= 40, counted
        assert sum(counted.values()) == counted["heartbeat"], counted
        assert len(a.owned()) + len(b.owned()) == 8
        assert all(owned.valid() for owned in [*a.owned().values(), *b.owned().values()])


async def test_every_beat_is_an_event_with_its_lateness_and_the_leases_it_kept() -> None:
    async with world([shard(i) for i in range(4)]) as w:
        flaky = FlakyHeartbeats("app", tables=w.tables)
        a = await w.start("a", settings=HB, store=flaky)
        await _in_heartbeat_mode(w, a)
        start = w.clock.monotonic()
        await run_for(HB.renew_every * 6, w.clock, step=0.1)
        beats = [(at, e) for at, e in w.recorders["a"].times(HeartbeatBeat) if at > start]
        assert 5 <= len(beats) <= 7, beats
        assert all(e.outcome == "written" and e.leases == 4 for _, e in beats), beats
        # On a fixed rate: due one renew interval after the previous beat was sent.
        assert all(e.late < 0.15 for _, e in beats), beats
        assert [e.counter for _, e in beats] == list(
            range(beats[0][1].counter, beats[0][1].counter + len(beats))
        )
        for (at0, _), (at1, _) in itertools.pairwise(beats):
            assert abs(at1 - at0 - HB.renew_every) < 0.15
        # Beats that get no answer say so and extend nothing; the next written one keeps all.
        flaky.failing = flaky.beats_only = True
        failed_from = w.clock.monotonic()
        await run_for(HB.renew_every * 2, w.clock, step=0.1)
        flaky.failing = False
        await run_for(HB.renew_every * 2, w.clock, step=0.1)
        after = [e for at, e in w.recorders["a"].times(HeartbeatBeat) if at > failed_from]
        outcomes = [e.outcome for e in after]
        assert "failed" in outcomes, outcomes
        assert outcomes[-1] == "written", outcomes
        assert all(e.leases == 0 for e in after if e.outcome == "failed")
        assert after[-1].leases == 4
        assert not w.recorders["a"].of(LeaseLost)


async def test_a_failed_beat_is_tried_again_within_a_second_not_a_renew_interval_later() -> None:
    # One item keeps every lease of the worker, and peers fence it once it has not changed
    # for failover_time: beating once an interval, three failed writes in a row cost a
    # worker every lease it had not renewed one by one (one worker in eight per failover
    # time when half the calls fail: bench/simulate.py's brownout, 1,000 x 20: 26-71 leases
    # moved, medians of 5 seeds). A failed beat is now tried again after 0.5-1 s, the pause
    # doubling to half the interval, never sooner than 0.5 s.
    async with world([shard(i) for i in range(4)]) as w:
        flaky = FlakyHeartbeats("app", tables=w.tables)
        a = await w.start("a", settings=HB, store=flaky)
        await _in_heartbeat_mode(w, a)
        await run_for(HB.renew_every, w.clock, step=0.05)
        flaky.failing = flaky.beats_only = True
        failing_from = w.clock.monotonic()
        await run_for(HB.failover_time, w.clock, step=0.05)
        flaky.failing = False
        await run_for(HB.renew_every, w.clock, step=0.05)
        beats = [(at, e) for at, e in w.recorders["a"].times(HeartbeatBeat) if at >= failing_from]
        failed = [at for at, e in beats if e.outcome == "failed"]
        # Sent once the write failed: at + its duration (0 here) is when it was sent.
        assert len(failed) >= 5, failed  # 2-3 beating once an interval
        gaps = [later - earlier for earlier, later in itertools.pairwise(failed)]
        assert 0.5 - 0.06 <= gaps[0] <= 1.0 + 0.06, gaps
        assert all(0.5 - 0.06 <= gap <= HB.renew_every / 2 + 0.06 for gap in gaps), gaps
        # The first beat that gets through keeps every lease; none was lost meanwhile (the
        # leases were renewed one by one while the beats failed).
        written = [e for at, e in beats if e.outcome == "written" and at > failed[-1]]
        assert written, beats
        assert written[0].leases == 4, beats
        assert not w.recorders["a"].of(LeaseLost)
        # Then on the interval again.
        after = [at for at, e in beats if e.outcome == "written" and at > failed[-1]]
        if len(after) >= 2:
            assert abs(after[1] - after[0] - HB.renew_every) < 0.1, after


async def test_a_heartbeat_brownout_stops_the_worker_before_a_peer_takes_its_leases() -> None:
    async with world([shard(i) for i in range(4)]) as w:
        writes = Writes(w.tables)
        writes.now = w.clock.monotonic
        flaky = FlakyHeartbeats("app", tables=w.tables)
        a = await w.start("a", settings=HB, store=flaky)
        await _in_heartbeat_mode(w, a)
        await w.start("b", settings=HB)
        await run_for(HB.renew_every * 2, w.clock, step=0.1)  # beats keep a's leases now
        held = dict(a.owned())
        assert len(held) == 4
        # Beats of a fail from now on; every other call of a (scans, lease writes) works.
        flaky.failing = True
        failed_at = w.clock.monotonic()
        await run_for(HB.failover_time * 2 + 2.0, w.clock, step=0.1)

        lost_at: dict[str, float] = {}
        for at, e in w.recorders["a"].times(LeaseLost):
            lost_at.setdefault(e.lease_key, at)
        taken = {
            e.lease_key: at
            for at, e in w.recorders["b"].times(LeaseAcquired)
            if e.previous_owner == "a"
        }
        assert set(held) <= set(lost_at)
        for key in held:
            # The bound of a lost lease: failover - safety margin after the last write that
            # kept it: the last beat (before the brownout) or a's last write of the lease
            # (a handoff b asked for, say).
            kept = max(
                [failed_at]
                + [
                    at
                    for at, seen in writes.seen
                    if seen.store is flaky and seen.write.lease_key == key and at <= lost_at[key]
                ]
            )
            assert lost_at[key] <= kept + HB.usable_time + 0.2
            assert not held[key].valid()
        assert taken, "b took a's leases"
        for key, at in taken.items():
            assert lost_at[key] < at, f"{key}: taken while a could still use it"
        fenced = {hb.worker_id: hb for hb in (await w.store().scan_table()).heartbeats}
        assert "a" not in fenced or fenced["a"].fenced_by in (None, "b")
        with pytest.raises(ShardLeaseLostError):
            await held[next(iter(held))].writer.write(ExtendedSequenceNumber("100"))


async def test_a_brownout_of_heartbeats_alone_falls_back_to_renewals_and_keeps_the_shards() -> None:
    async with world([shard(i) for i in range(4)]) as w:
        flaky = FlakyHeartbeats("app", tables=w.tables)
        a = await w.start("a", settings=HB, store=flaky)
        await _in_heartbeat_mode(w, a)
        await w.start("b", settings=HB)
        held = dict(a.owned())
        flaky.failing = flaky.beats_only = True
        await run_for(HB.failover_time * 3, w.clock, step=0.2)
        assert not w.recorders["a"].of(LeaseLost)
        assert all(owned.valid() for owned in held.values())
        assert a.lease_mode == "per-lease", "renewing lease by lease while beats fail"
        flaky.failing = False
        await run_for(HB.renew_every * 2, w.clock, step=0.2)
        assert str(a.lease_mode) == "heartbeat"


async def test_a_frozen_worker_is_fenced_and_its_late_beat_extends_nothing() -> None:
    async with world([shard(i) for i in range(2)]) as w:
        a = await w.start("a", settings=HB)
        await _in_heartbeat_mode(w, a)
        held = dict(a.owned())
        keeper = a._keeper
        assert keeper is not None
        assert keeper.heartbeat is not None
        frozen = keeper.heartbeat
        # a freezes (SIGSTOP): nothing of it runs. Emulated by stopping its loops without
        # releasing, keeping the heartbeat it last wrote.
        for task in a._tasks:
            task.cancel()
        b = await w.start("b", settings=HB)
        await run_for(HB.failover_time + HB.take_every + 2.0, w.clock, step=0.2)
        assert set(b.owned()) == set(held), "b took them once a's heartbeat had lapsed"
        beats = {hb.worker_id: hb for hb in (await w.store().scan_table()).heartbeats}
        assert "a" not in beats or beats["a"].fenced_by == "b"
        # a wakes up and its beat, written as it last knew the heartbeat, is refused.
        keeper.heartbeat = frozen
        for owned in held.values():
            deadline = owned.deadline
            await keeper.round()
            assert owned.deadline == deadline
            assert not owned.valid()


async def test_the_mode_switches_live_both_ways_without_losing_a_lease() -> None:
    async with world([shard(i) for i in range(6)]) as w:
        writes = Writes(w.tables)
        writes.now = w.clock.monotonic
        a = await w.start("a", settings=HB)
        b = await w.start("b", settings=HB)
        await run_for(25.0, w.clock, step=0.5)
        await _in_heartbeat_mode(w, a, b)
        start = w.clock.monotonic()
        await run_for(20.0, w.clock, step=0.5)
        assert writes.count(since=start)["renew"] == 0
        # Back to per-lease: renewals resume at once, the heartbeat items go.
        await w.store().set_lease_mode("per-lease")
        back = w.clock.monotonic()
        await run_for(HB.failover_time + 15.0, w.clock, step=0.5)
        assert a.lease_mode == b.lease_mode == "per-lease"
        counted = writes.count(since=back + HB.renew_every + 1.0)
        assert counted["renew"] >= 6 * 3, counted
        assert counted["heartbeat"] == 0, counted
        assert not any(key.startswith("_shardflow") for key in w.tables.items("app"))
        assert not w.recorders["a"].of(LeaseLost)
        assert not w.recorders["b"].of(LeaseLost)
        assert len(a.owned()) + len(b.owned()) == 6


class OlderShardflow(InMemoryLeaseStore):
    """A worker of a version without the heartbeat mode (or a KCL 2.x worker, as far as
    expiry goes): it keeps no heartbeat and its scans show none."""

    execute_entity = LeaseStoreBase.execute_entity  # type: ignore[assignment]

    async def scan_table(self) -> TableScan:
        return TableScan((await super().scan_table()).leases)


async def test_a_worker_without_heartbeat_in_the_fleet_keeps_everyone_on_renewals() -> None:
    async with world([shard(i) for i in range(6)]) as w:
        a = await w.start("a", settings=HB)
        await w.start("old", settings=HB, store=OlderShardflow("app", tables=w.tables))
        await run_for(25.0, w.clock, step=0.5)  # balanced, per-lease
        # Switched while a worker of a version without the heartbeat mode still runs.
        await w.store().set_lease_mode("heartbeat")
        await run_for(HB.take_every * 3, w.clock, step=0.2)
        assert a.table_lease_mode == "heartbeat"
        assert a.lease_mode == "per-lease", "a renews lease by lease: old would take them"
        assert a._keeper is not None
        assert a._keeper.heartbeat is not None, "a keeps its heartbeat all the same"
        assert not [
            e
            for e in w.recorders["old"].of(LeaseAcquired)
            if e.how == "expired" and e.previous_owner == "a"
        ], "the old worker never found a lease of a live worker expired"
        assert not w.recorders["a"].of(LeaseLost)


async def test_a_request_of_a_worker_whose_heartbeat_lapsed_is_not_answered() -> None:
    async with world([shard(i) for i in range(4)]) as w:
        a = await w.start("a", settings=HB)
        await _in_heartbeat_mode(w, a)
        store = w.store()
        # A joiner asked for a lease, then died: its heartbeat was fenced. The lease's counter
        # stands still in the heartbeat mode, so the request looks fresh by its counter.
        ghost = await store.register_heartbeat("ghost", None)
        await store.fence_heartbeat(ghost, "a")
        lease = (await w.leases())[sid(0)]
        await store.request_handoff(lease, "ghost")
        await run_for(HB.renew_every * 2, w.clock, step=0.1)
        assert (await w.leases())[sid(0)].lease_owner == "a", "not handed to a dead worker"
        assert sid(0) in a.owned()
        # A live requester is answered as before.
        live = await store.register_heartbeat("b", None)
        for _ in range(3):
            await run_for(HB.renew_every, w.clock, step=0.1)
            live = await store.beat(live)
        await store.request_handoff((await w.leases())[sid(1)], "b")
        await run_for(2.0, w.clock, step=0.1)
        assert (await w.leases())[sid(1)].lease_owner == "b"


class Calls:
    """Counts a store's calls by operation (the in-memory store's ``fault`` hook)."""

    def __init__(self) -> None:
        self.counted: Counter[str] = Counter()

    def __call__(self, operation: str) -> None:
        self.counted[operation] += 1


async def test_an_idle_heartbeat_fleet_scans_once_a_renew_interval_not_every_poll() -> None:
    async with world([shard(i) for i in range(8)]) as w:
        calls = {name: Calls() for name in ("a", "b")}
        a = await w.start("a", settings=HB, store=w.store(fault=calls["a"]))
        b = await w.start("b", settings=HB, store=w.store(fault=calls["b"]))
        await run_for(25.0, w.clock, step=0.5)
        await _in_heartbeat_mode(w, a, b)
        await run_for(HB.renew_every * 2, w.clock, step=0.5)  # the marker's base is read
        for counted in calls.values():
            counted.counted.clear()
        await run_for(60.0, w.clock, step=0.5)
        for name, counted in calls.items():
            # Polls every 0.5 s: 120 a minute. Scans: pick-up's safety net every renew
            # interval (~18) and the take cycle every 20 s (3); before the change marker,
            # all 120 polls scanned.
            assert counted.counted["Scan"] <= 25, (name, counted.counted)
            assert counted.counted["BatchGetItem"] >= 100, (name, counted.counted)
        assert len(a.owned()) + len(b.owned()) == 8


async def test_a_holder_learns_within_a_poll_that_its_lease_was_taken() -> None:
    async with world([shard(i) for i in range(8)]) as w:
        a = await w.start("a", settings=HB)
        store_b = w.store()
        b = await w.start("b", settings=HB, store=store_b)
        await run_for(25.0, w.clock, step=0.5)
        await _in_heartbeat_mode(w, a, b)
        await run_for(HB.renew_every * 2, w.clock, step=0.5)
        owned = next(iter(a.owned().values()))
        # Taken from under a (a steal): a renews nothing in this mode, so only pick-up tells
        # it, and until it knows it keeps handling the shard (records handled twice).
        await store_b.take((await w.leases())[owned.lease_key], "b")
        taken = w.clock.monotonic()
        for _ in range(40):
            if owned.lost.is_set():
                break
            await run_for(0.1, w.clock, step=0.1)
        # The take bumped the marker: a's next poll (0.5 s) scanned. Without the bump it
        # waited for the safety-net scan (2.6 s here; up to a renew interval, 3.3 s).
        assert owned.lost.is_set()
        assert w.clock.monotonic() - taken <= 2 * HB.pickup_poll_interval + 0.2


async def test_a_worker_polling_a_table_with_a_stream_scans_every_poll() -> None:
    # Writers of a table with a stream bump no change marker (their readers use the stream),
    # so a worker that polls it anyway cannot rely on the marker.
    async with world([shard(i) for i in range(4)]) as w:
        await w.store().ensure_table(stream_view=True)
        calls = Calls()
        a = await w.start("a", settings=HB, store=w.store(fault=calls))
        await run_for(5.0, w.clock, step=0.5)
        await _in_heartbeat_mode(w, a)
        await run_for(HB.renew_every * 2, w.clock, step=0.5)
        calls.counted.clear()
        await run_for(30.0, w.clock, step=0.5)
        assert calls.counted["Scan"] >= 55, calls.counted  # every 0.5 s poll
        assert calls.counted["BatchGetItem"] == 0, calls.counted


async def test_a_worker_that_leaves_gracefully_keeps_its_peers_on_the_heartbeat() -> None:
    # A leaver checkpoints and says on a lease that it leaves (its own writes to leases it
    # holds), then deletes its heartbeat item once it holds nothing. Its peers saw it write
    # leases within the failover time and then saw no heartbeat for it: they took it for a
    # worker without the heartbeat mode and renewed every lease one by one for a failover
    # time after each leave (bench/fleet.py at 128 shards: through a whole rolling restart,
    # the fleet renewed lease by lease and scanned on every poll).
    async with world([shard(i) for i in range(9)]) as w:
        writes = Writes(w.tables)
        writes.now = w.clock.monotonic
        a = await w.start("a", settings=HB)
        b = await w.start("b", settings=HB)
        c = await w.start("c", settings=HB)
        helpers = [complete_handoffs(worker) for worker in (a, b, c)]
        await run_for(25.0, w.clock, step=0.5)
        await _in_heartbeat_mode(w, a, b, c)
        await run_for(HB.renew_every * 2, w.clock, step=0.5)
        assert len(c.owned()) >= 2
        await leave(w, c)
        await run_for(1.0, w.clock, step=0.1)
        await c.stop(release=True)
        assert c._keeper is not None
        assert c._keeper.heartbeat is None, "c deleted its heartbeat"
        left = w.clock.monotonic()
        per_lease: list[tuple[float, str]] = []
        while w.clock.monotonic() - left < HB.failover_time * 2:
            await run_for(0.1, w.clock, step=0.1)
            per_lease += [
                (w.clock.monotonic(), x.worker_id) for x in (a, b) if x.lease_mode != "heartbeat"
            ]
        for helper in helpers:
            helper.cancel()
        assert not per_lease, f"a peer fell back to renewals lease by lease: {per_lease[:3]}"
        renewals = [
            seen.write.operation
            for at, seen in writes.seen
            if at > left and seen.write.operation == "renew"
        ]
        assert not renewals, f"{len(renewals)} renewals after c left"
        assert len(a.owned()) + len(b.owned()) == 9
