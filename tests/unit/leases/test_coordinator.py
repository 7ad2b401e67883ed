"""The lease coordinator on a ManualClock and the in-memory store: taking, renewing, balancing,
releasing, failover, finished shards, multi-stream."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from shardflow.clock import ManualClock
from shardflow.errors import ShardLeaseLostError
from shardflow.events import (
    LeaseAcquired,
    LeaseLost,
    LeaseReleased,
    LeaseRenewed,
    WorkerJoined,
    WorkerLeft,
)
from shardflow.leases import InMemoryLeaseStore, Lease
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.keys import StreamIdentifier
from shardflow.leases.settings import LeaseSettings, StreamSpec
from shardflow.positions import StartPosition
from shardflow.records import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from support.coordinator_fakes import SETTINGS, World, run_for, settle, shard, sid, world

# --- start ------------------------------------------------------------------------------------


async def test_a_new_application_holds_its_leases_when_start_returns_without_waiting() -> None:
    async with world([shard(0, closed=True), shard(1, 0), shard(2, 0), shard(3)]) as w:
        before = w.clock.monotonic()
        a = await w.start("a")
        assert w.clock.monotonic() == before, "no shard-sync or take-interval wait"
        assert sorted(a.owned()) == [sid(i) for i in range(4)]
        leases = await w.leases()
        assert {lease.lease_owner for lease in leases.values()} == {"a"}
        assert leases[sid(1)].parent_shard_ids == {sid(0)}
        assert all(lease.checkpoint.sequence_number == TRIM_HORIZON for lease in leases.values())
        acquired = [a.acquired.get_nowait() for _ in range(4)]
        assert {owned.lease_key for owned in acquired} == set(a.owned())
        assert all(owned.valid() and owned.stream == "stream" for owned in acquired)
        assert [e.how for e in w.recorders["a"].of(LeaseAcquired)] == ["free"] * 4


async def test_latest_leases_only_the_open_shards() -> None:
    async with world([shard(0, closed=True), shard(1, 0)]) as w:
        a = await w.start("a", initial_position=StartPosition.latest())
        assert list(a.owned()) == [sid(1)]
        assert a.owned()[sid(1)].checkpoint == ExtendedSequenceNumber("LATEST")


async def test_a_worker_joining_an_existing_table_does_not_list_shards_first() -> None:
    async with world() as w:
        await w.start("a")
        calls = w.kinesis.list_calls
        b = w.worker("b")
        await b.start()
        assert w.kinesis.list_calls == calls, "start did not wait for a listing"
        await settle()
        assert w.kinesis.list_calls == calls + 1, "but lists right after, in the background"


# --- renewal ----------------------------------------------------------------------------------


async def test_held_leases_are_renewed_every_renew_interval() -> None:
    async with world() as w:
        a = await w.start("a")
        counters = {key: owned.lease.lease_counter for key, owned in a.owned().items()}
        await run_for(SETTINGS.renew_every + 0.05, w.clock)
        assert {k: o.lease.lease_counter for k, o in a.owned().items()} == {
            k: c + 1 for k, c in counters.items()
        }
        assert len(w.recorders["a"].of(LeaseRenewed)) == 4
        await run_for(SETTINGS.renew_every, w.clock)
        assert len(w.recorders["a"].of(LeaseRenewed)) == 8
        assert all(owned.valid() for owned in a.owned().values())


class InFlightStore(InMemoryLeaseStore):
    """Counts conditional writes in flight at once (each takes a few loop turns)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight = 0
        self.max_in_flight = 0
        self.renews = 0

    async def renew(
        self, lease: Lease, owner: str, *, throughput_kbps: float | None = None
    ) -> Lease:
        self.renews += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            return await super().renew(lease, owner, throughput_kbps=throughput_kbps)
        finally:
            self.in_flight -= 1


async def test_a_thousand_leases_are_renewed_with_bounded_concurrency_and_few_tasks() -> None:
    async with world([shard(i) for i in range(1000)]) as w:
        store = InFlightStore("app", tables=w.tables)
        settings = replace(SETTINGS, renew_concurrency=16)
        a = w.worker("a", store=store, settings=settings)
        await a.start()
        assert len(a.owned()) == 1000
        await settle()
        tasks_before = len(asyncio.all_tasks())
        # (+ the renewal scheduler's wait: a timer and its wake-up, two tasks)
        assert tasks_before <= 16 + 12, "one task per renewal slot, not one per lease"
        await run_for(settings.renew_every + 0.05, w.clock, step=0.05)
        await settle(300)
        assert store.renews == 1000
        assert 1 < store.max_in_flight <= 16
        assert len(asyncio.all_tasks()) <= tasks_before
        assert all(owned.lease.lease_counter == 2 for owned in a.owned().values())


class OneBrokenLease(InMemoryLeaseStore):
    """Renewing shard 0 fails with an error nobody planned for."""

    async def renew(
        self, lease: Lease, owner: str, *, throughput_kbps: float | None = None
    ) -> Lease:
        if lease.shard_id == sid(0):
            raise RuntimeError("unexpected")
        return await super().renew(lease, owner, throughput_kbps=throughput_kbps)


async def test_an_unexpected_renewal_error_of_one_lease_spares_the_others() -> None:
    async with world() as w:
        a = await w.start("a", store=OneBrokenLease("app", tables=w.tables))
        await run_for(SETTINGS.usable_time + 0.5, w.clock, step=0.25)
        assert sorted(a.owned()) == [sid(1), sid(2), sid(3)]
        assert {e.lease_key for e in w.recorders["a"].of(LeaseLost)} == {sid(0)}
        renewed = {e.lease_key for e in w.recorders["a"].of(LeaseRenewed)}
        assert renewed == {sid(1), sid(2), sid(3)}


# --- balancing, release, failover ---------------------------------------------------------------


async def test_two_workers_converge_to_an_even_split() -> None:
    async with world([shard(i) for i in range(6)]) as w:
        a = await w.start("a")
        b = await w.start("b")
        assert len(b.owned()) == 1, "a newcomer steals one lease at start"
        await run_for(3 * SETTINGS.take_every, w.clock, step=0.25)
        assert (len(a.owned()), len(b.owned())) == (3, 3)
        assert await w.owners() == Counter({"a": 3, "b": 3})
        assert [e.peer_id for e in w.recorders["b"].of(WorkerJoined)] == ["a"]


async def test_three_workers_never_exceed_the_target() -> None:
    async with world([shard(i) for i in range(7)]) as w:
        workers = [await w.start(name) for name in ("a", "b", "c")]
        await run_for(5 * SETTINGS.take_every, w.clock, step=0.25)
        counts = sorted(len(c.owned()) for c in workers)
        assert sum(counts) == 7
        assert max(counts) == 3


async def test_max_leases_per_worker_caps_what_one_worker_takes() -> None:
    async with world() as w:
        a = await w.start("a", settings=replace(SETTINGS, max_leases_per_worker=3))
        assert len(a.owned()) == 3
        await run_for(SETTINGS.take_every + 0.5, w.clock, step=0.5)
        assert len(a.owned()) == 3
        assert (await w.owners())[None] == 1


async def test_released_leases_are_taken_by_another_worker_within_one_take_interval() -> None:
    async with world() as w:
        a = await w.start("a")
        b = await w.start("b")
        await a.stop(release=True)
        assert not a.owned()
        assert {e.why for e in w.recorders["a"].of(LeaseReleased)} == {"shutdown"}
        assert (await w.owners())["a"] == 0
        await run_for(SETTINGS.take_every + 0.2, w.clock, step=0.2)
        assert len(b.owned()) == 4
        assert [e.peer_id for e in w.recorders["b"].of(WorkerLeft)] == ["a"]


async def test_a_crashed_workers_leases_are_taken_only_after_its_deadlines() -> None:
    async with world() as w:
        a = await w.start("a")
        b = await w.start("b")
        await run_for(5.0, w.clock)
        crashed_at = w.clock.monotonic()
        deadlines = {key: owned.deadline for key, owned in a.owned().items()}
        await a.stop(release=False)  # renewals stop, leases stay in the table
        # As in KCL: the next scan sees the last renewal, failover later the lease has
        # expired, and the scan after that takes it.
        worst = SETTINGS.take_every + SETTINGS.failover_time + SETTINGS.take_every
        await run_for(worst + 1.0, w.clock, step=0.2)
        assert len(b.owned()) == 4
        takes = {e.lease_key: at for at, e in w.recorders["b"].times(LeaseAcquired)}
        for key, deadline in deadlines.items():
            assert takes[key] > deadline, "never while the old owner may still use it"
            assert takes[key] <= crashed_at + worst + 0.2
        hows = {e.lease_key: e.how for e in w.recorders["b"].of(LeaseAcquired)}
        assert "expired" in {hows[key] for key in deadlines}


async def test_a_restart_with_the_same_worker_id_resumes_its_leases_at_once() -> None:
    async with world() as w:
        first = await w.start("a")
        old = dict(first.owned())
        await first.stop(release=False)  # a crash, or a shutdown that kept the leases
        second = w.worker("a")
        await second.start()
        assert sorted(second.owned()) == sorted(old), "no failover wait for our own leases"
        assert {e.how for e in w.recorders["a"].of(LeaseAcquired)} == {"resumed"}
        with pytest.raises(ShardLeaseLostError):  # the old instance's view is fenced off
            await old[sid(0)].writer.write(ExtendedSequenceNumber("5"))
        await second.owned()[sid(0)].writer.write(ExtendedSequenceNumber("6"))


async def test_expiry_is_judged_on_the_observers_own_clock() -> None:
    async with world() as w:
        a = await w.start("a")
        far_ahead = ManualClock(start=987_654.0, wall_offset=-50_000.0)
        b = w.worker(
            "b", clock=far_ahead, settings=replace(SETTINGS, max_leases_to_steal_at_once=0)
        )
        await b.start()
        assert not b.owned()
        await a.stop(release=False)
        await run_for(SETTINGS.failover_time - 1.0, w.clock, far_ahead, step=0.5)
        assert not b.owned(), "b's clock reads far later, but only elapsed time counts"
        await run_for(SETTINGS.take_every + 1.5, w.clock, far_ahead, step=0.5)
        assert len(b.owned()) == 4


# --- finished shards ---------------------------------------------------------------------------


async def finished_parent(w: World, child_checkpoint: str) -> None:
    """A table where shard 0 ended (SHARD_END, child 1 recorded) and 1 is at ``child_checkpoint``."""
    store = w.store()
    await store.ensure_table()
    parent = await store.create_if_absent(Lease.new(sid(0), checkpoint=SHARD_END))
    await store.update_children(parent, [sid(1)])
    await store.create_if_absent(
        Lease.new(sid(1), parent_shard_ids=[sid(0)], checkpoint=child_checkpoint)
    )


async def test_finished_leases_are_not_taken_and_are_deleted_once_children_started() -> None:
    async with world([shard(0, closed=True), shard(1, 0)]) as w:
        await finished_parent(w, "4567")
        a = await w.start("a")
        assert list(a.owned()) == [sid(1)]
        assert list(await w.leases()) == [sid(1)], "the finished parent's lease was cleaned up"


async def test_finished_leases_stay_while_a_child_has_not_started() -> None:
    async with world([shard(0, closed=True), shard(1, 0)]) as w:
        await finished_parent(w, TRIM_HORIZON)
        a = await w.start("a")
        assert list(a.owned()) == [sid(1)]
        assert sorted(await w.leases()) == [sid(0), sid(1)]


async def test_children_of_a_finished_shard_without_leases_get_them_from_the_shard_sync() -> None:
    async with world([shard(0, closed=True), shard(1, 0), shard(2, 0)]) as w:
        store = w.store()
        await store.ensure_table()
        await store.create_if_absent(Lease.new(sid(0), checkpoint=SHARD_END))
        a = await w.start("a", initial_position=StartPosition.latest())
        assert not a.owned()
        await settle()
        leases = await w.leases()
        assert leases[sid(1)].checkpoint.sequence_number == TRIM_HORIZON, "continues the lineage"
        await run_for(SETTINGS.take_every + 0.5, w.clock, step=0.5)
        assert sorted(a.owned()) == [sid(1), sid(2)]


async def test_children_naming_a_finished_parent_count_as_its_children() -> None:
    # KCL-written parents may lack childShardIds: the children's parentShardId tells.
    async with world([shard(0, closed=True), shard(1, 0)]) as w:
        store = w.store()
        await store.ensure_table()
        await store.create_if_absent(Lease.new(sid(0), checkpoint=SHARD_END))
        await store.create_if_absent(Lease.new(sid(1), parent_shard_ids=[sid(0)]))
        a = await w.start("a")
        await run_for(3 * SETTINGS.take_every, w.clock, step=0.5)
        assert w.kinesis.list_calls == 1, "only the sync at start: nothing is missing"
        assert sorted(await w.leases()) == [sid(0), sid(1)], "kept: the child has not started"
        await a.owned()[sid(1)].writer.write(ExtendedSequenceNumber("777"))
        await run_for(SETTINGS.take_every, w.clock, step=0.5)
        assert sorted(await w.leases()) == [sid(1)]


async def test_a_finished_parent_without_child_leases_asks_for_one_sync_only() -> None:
    async with world([shard(0, closed=True)]) as w:  # its children are not listed yet
        store = w.store()
        await store.ensure_table()
        await store.create_if_absent(Lease.new(sid(0), checkpoint=SHARD_END))
        await w.start("a")
        await run_for(3 * SETTINGS.take_every, w.clock, step=0.5)
        assert w.kinesis.list_calls == 2, "the sync at start and the one asked for"


async def test_shard_ended_creates_child_leases_and_records_them_on_the_parent() -> None:
    async with world([shard(0), shard(5)]) as w:
        a = await w.start("a")
        parent = a.owned()[sid(0)]
        await parent.writer.write(ExtendedSequenceNumber(SHARD_END))
        from shardflow.shards import ChildShard

        children = [
            ChildShard(sid(1), (sid(0),), shard(1).hash_range),
            ChildShard(sid(2), (sid(0),), shard(2).hash_range),
        ]
        await a.shard_ended(parent, children)
        leases = await w.leases()
        assert leases[sid(0)].child_shard_ids == {sid(1), sid(2)}
        assert leases[sid(1)].parent_shard_ids == {sid(0)}
        assert leases[sid(1)].checkpoint.sequence_number == TRIM_HORIZON
        assert leases[sid(2)].hash_range == shard(2).hash_range
        assert parent.valid(), "recording children does not disturb the lease"
        await parent.writer.write(ExtendedSequenceNumber(SHARD_END))


async def test_shard_ended_without_reported_children_reads_them_from_the_listing() -> None:
    async with world([shard(0, closed=True), shard(3, 0), shard(4)]) as w:
        a = await w.start("a", initial_position=StartPosition.latest())
        # LATEST: only 3 and 4 have leases; pretend 4 ended with a child 6 listed later.
        w.kinesis.streams["*"] = [*w.kinesis.shards_of("stream"), shard(6, 4)]
        await a.shard_ended(a.owned()[sid(4)], [])
        leases = await w.leases()
        assert leases[sid(6)].parent_shard_ids == {sid(4)}
        assert leases[sid(4)].child_shard_ids == {sid(6)}


async def test_parents_done_waits_for_every_parent_to_reach_shard_end() -> None:
    async with world([shard(0, closed=True), shard(1, closed=True), shard(2, 0, 1)]) as w:
        a = await w.start("a")
        child = a.owned()[sid(2)]
        assert not await a.parents_done(child)
        await a.owned()[sid(0)].writer.write(ExtendedSequenceNumber(SHARD_END))
        assert not await a.parents_done(child)
        waiter = asyncio.create_task(a.wait_parents_done(child))
        await run_for(SETTINGS.parent_poll_interval, w.clock, step=0.5)
        assert not waiter.done()
        await a.owned()[sid(1)].writer.write(ExtendedSequenceNumber(SHARD_END))
        await run_for(SETTINGS.parent_poll_interval + 0.5, w.clock, step=0.5)
        assert waiter.done()
        assert waiter.result() is True


async def test_a_missing_parent_lease_does_not_block() -> None:
    async with world([shard(7, 3)]) as w:  # parent 3 trimmed from the stream, never leased
        a = await w.start("a")
        assert await a.parents_done(a.owned()[sid(7)])


async def test_waiting_for_parents_ends_when_the_lease_is_lost() -> None:
    async with world([shard(0), shard(2, 0)]) as w:
        a = await w.start("a")
        child = a.owned()[sid(2)]
        waiter = asyncio.create_task(a.wait_parents_done(child))
        await settle()
        child.mark_lost("taken", "b")
        await settle()
        assert waiter.done()
        assert waiter.result() is False


# --- multi-stream ------------------------------------------------------------------------------


async def test_several_streams_use_multi_stream_keys_and_ignore_other_leases() -> None:
    async with world() as w:
        w.kinesis.streams = {"orders": [shard(0), shard(1)], "payments": [shard(0)]}
        store = w.store()
        await store.ensure_table()
        await store.create_if_absent(Lease.new("shardId-000000000099"))  # a single-stream app
        foreign = "123456789012:other:1700000000"
        await store.create_if_absent(Lease.new(sid(0), stream=foreign))
        orders = StreamSpec("orders", StreamIdentifier("123456789012", "orders", 1))
        a = await w.start("a", streams=[orders, "payments"])
        payments_id = "123456789012:payments:1704164645"  # resolved from the stream summary
        assert sorted(a.owned()) == sorted(
            [
                f"123456789012:orders:1:{sid(0)}",
                f"123456789012:orders:1:{sid(1)}",
                f"{payments_id}:{sid(0)}",
            ]
        )
        streams = {
            owned.shard_id: owned.stream for owned in a.owned().values() if owned.stream == "orders"
        }
        assert streams == {sid(0): "orders", sid(1): "orders"}
        leases = await w.leases()
        assert leases["shardId-000000000099"].lease_owner is None
        assert leases[f"{foreign}:{sid(0)}"].lease_owner is None


# --- events and life cycle -----------------------------------------------------------------------


async def test_acquisitions_yield_taken_leases_and_end_at_stop() -> None:
    async with world() as w:
        a = await w.start("a")
        seen = []

        async def consume() -> None:
            async for owned in a.acquisitions():
                seen.append(owned.lease_key)

        reader = asyncio.create_task(consume())
        await settle()
        assert sorted(seen) == sorted(a.owned())
        await a.stop()
        await asyncio.wait_for(reader, 1.0)
        await a.stop()  # idempotent


async def test_a_failing_event_callback_does_not_disturb_coordination() -> None:
    async with world() as w:

        def broken(event: object) -> None:
            raise RuntimeError("callback bug")

        a = LeaseCoordinator(
            w.store(),
            worker_id="a",
            streams=["stream"],
            kinesis=w.kinesis,
            clock=w.clock,
            on_event=broken,
        )
        w.started.append(a)
        await a.start()
        await run_for(SETTINGS.renew_every + 0.1, w.clock)
        assert len(a.owned()) == 4


def test_settings_refuse_a_renew_interval_that_lets_leases_lapse() -> None:
    with pytest.raises(ValueError, match="renew interval"):
        LeaseSettings(failover_time=3.0, renew_interval=2.8)
    assert LeaseSettings().renew_every == pytest.approx(3.308333, abs=1e-5)
    assert LeaseSettings().take_every == pytest.approx(20.05)
    assert LeaseSettings(failover_time=2.0).margin == pytest.approx(0.2)


def test_worker_ids_and_streams_are_checked() -> None:
    with pytest.raises(ValueError, match="worker_id"):
        LeaseCoordinator(InMemoryLeaseStore("t"), worker_id="", streams=["s"], kinesis=None)
    with pytest.raises(ValueError, match="twice"):
        LeaseCoordinator(InMemoryLeaseStore("t"), worker_id="w", streams=["s", "s"], kinesis=None)
    with pytest.raises(ValueError, match="initial position"):
        LeaseCoordinator(
            InMemoryLeaseStore("t"),
            worker_id="w",
            streams=["s"],
            kinesis=None,
            initial_position=StartPosition.at_sequence_number("1"),
        )
