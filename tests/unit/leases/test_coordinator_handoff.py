"""Planned handoff, pick-up and expiry-timed takes in the coordinator (in-memory table,
manual clock). The consumer's part (drain, checkpoint, release) is played by ``complete``."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from shardflow.errors import TransientError
from shardflow.events import LeaseAcquired, LeaseLost, LeaseReleased
from shardflow.leases import Lease
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.expiry import ExpiryTracker
from shardflow.leases.handoff_request import HandoffRequest, handoff_request_of
from shardflow.leases.handoffs import HandoffBook, asked_by_another, successors
from shardflow.leases.memory import InMemoryLeaseStore, InMemoryLeaseStreams, LeaseWriteSeen
from shardflow.leases.moves import LEAVE_RESCAN
from shardflow.leases.pickup import LeaseView
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.writes import LeaseWrite
from shardflow.records import ExtendedSequenceNumber
from support.coordinator_fakes import run_for, settle, shard, world

HANDOFF = LeaseSettings(pickup="poll", pickup_poll_interval=0.25, handoff_timeout=5.0)


def complete_handoffs(
    coordinator: LeaseCoordinator, *, not_before: float | None = None, clock: Any = None
) -> asyncio.Task[None]:
    """What the consumer does: a lease given up is checkpointed, then released (not before
    ``not_before`` on ``clock``: a slow drain, or a slow lease table)."""

    async def loop() -> None:
        while True:
            if not_before is not None and clock.monotonic() < not_before:
                await asyncio.sleep(0)
                continue
            for owned in list(coordinator.owned().values()):
                if owned.giving_up.is_set() and not owned.ended:
                    await owned.writer.write(ExtendedSequenceNumber("7"))
                    await owned.release("handoff")
            await asyncio.sleep(0)

    return asyncio.create_task(loop())


async def leave(w: Any, worker: LeaseCoordinator) -> int:
    """``worker.leave()`` with time passing (a leaver in a fleet gives its peers a moment)."""
    leaving = asyncio.ensure_future(worker.leave())
    while not leaving.done():
        await run_for(0.05, w.clock, step=0.05)
    return leaving.result()


async def test_a_joiner_gets_its_share_by_handoff_requests_not_steals() -> None:
    async with world([shard(i) for i in range(4)]) as w:
        a = await w.start("a", settings=HANDOFF)
        helper = complete_handoffs(a)
        b = await w.start("b", settings=HANDOFF)
        assert not b.owned(), "nothing is stolen at start"
        assert any(handoff_request_of(lease) for lease in (await w.leases()).values())
        await run_for(3.0, w.clock, step=0.05)
        helper.cancel()
        assert (len(a.owned()), len(b.owned())) == (2, 2)
        assert {e.how for e in w.recorders["b"].of(LeaseAcquired)} == {"handoff"}
        assert not w.recorders["a"].of(LeaseLost)
        assert {e.why for e in w.recorders["a"].of(LeaseReleased)} == {"handoff"}
        for lease in (await w.leases()).values():
            assert lease.checkpoint_owner is None
            if lease.lease_owner == "b":
                assert lease.checkpoint == ExtendedSequenceNumber("7"), "checkpoint first"


async def test_a_request_nobody_answers_falls_back_to_a_steal() -> None:
    async with world([shard(i) for i in range(4)]) as w:
        kcl_like = replace(HANDOFF, handoff=False)  # ignores requests, as KCL does
        a = await w.start("a", settings=kcl_like)
        b = await w.start("b", settings=HANDOFF)
        await run_for(HANDOFF.handoff_timeout - 1.0, w.clock, step=0.25)
        assert not b.owned()
        await run_for(2.0, w.clock, step=0.25)
        assert len(b.owned()) == 1
        assert [e.how for e in w.recorders["b"].of(LeaseAcquired)] == ["stolen"]
        await run_for(HANDOFF.renew_every + 0.5, w.clock, step=0.25)
        assert len(a.owned()) == 3
        assert [e.why for e in w.recorders["a"].of(LeaseLost)] == ["taken"]


async def test_a_handoff_is_not_taken_over_while_its_old_owner_renews_it() -> None:
    """The old owner may still run a handler for the shard (it completes the handoff only once
    none runs): however long past ``handoff_timeout``, the next owner waits while it renews."""
    async with world([shard(i) for i in range(2)]) as w:
        a = await w.start("a", settings=HANDOFF)  # nobody completes a's handoffs
        b = await w.start("b", settings=HANDOFF)
        await run_for(1.0, w.clock, step=0.05)
        pending = [lease for lease in (await w.leases()).values() if lease.handoff_pending]
        assert len(pending) == 1
        assert pending[0].lease_owner == "b"
        assert not b.owned()
        await run_for(3 * HANDOFF.handoff_timeout, w.clock, step=0.1)
        assert not b.owned(), "taken over while the old owner still renews it"
        assert pending[0].lease_key in a.owned()
        assert not w.recorders["a"].of(LeaseLost)


async def test_a_handoff_whose_old_owner_stopped_renewing_is_taken_once_it_expires() -> None:
    async with world([shard(i) for i in range(2)]) as w:
        a = await w.start("a", settings=HANDOFF)  # nobody completes a's handoffs
        b = await w.start("b", settings=HANDOFF)
        await run_for(1.0, w.clock, step=0.05)
        (pending,) = [lease for lease in (await w.leases()).values() if lease.handoff_pending]
        await a.stop(release=False)  # a dies: its renewals stop
        stopped = w.clock.monotonic()
        await run_for(HANDOFF.failover_time - 1.0, w.clock, step=0.1)
        assert pending.lease_key not in b.owned(), "taken before it expired"
        await run_for(2.0 + 3 * HANDOFF.pickup_poll_interval, w.clock, step=0.1)
        assert pending.lease_key in b.owned()
        takes = [at for at, e in w.recorders["b"].times(LeaseAcquired) if e.how == "expired"]
        assert takes
        assert min(takes) >= stopped + HANDOFF.failover_time - HANDOFF.renew_every


async def test_leave_hands_every_lease_to_the_least_loaded_live_workers() -> None:
    async with world([shard(i) for i in range(6)]) as w:
        fixed = replace(HANDOFF, max_leases_to_steal_at_once=0)
        a = await w.start("a", settings=fixed)
        helper_a = complete_handoffs(a)
        b = await w.start("b", settings=fixed)
        c = await w.start("c", settings=fixed)
        for owned, to in zip(list(a.owned().values()), ("b", "b", "c"), strict=False):
            await owned.begin_handoff(to)
        await run_for(1.0, w.clock, step=0.05)
        assert Counter({"a": 3, "b": 2, "c": 1}) == await w.owners()
        assert await leave(w, a) == 3
        await run_for(1.0, w.clock, step=0.05)
        helper_a.cancel()
        assert not a.owned()
        assert (len(b.owned()), len(c.owned())) == (3, 3), "c had fewer: it gets more"
        await a.stop()


async def test_a_crashed_workers_leases_are_taken_when_they_expire_not_a_take_cycle_later() -> None:
    async with world() as w:
        a = await w.start("a", settings=HANDOFF)
        b = await w.start("b", settings=HANDOFF)
        await run_for(4.0, w.clock, step=0.05)
        last_renewal = max(owned.deadline for owned in a.owned().values()) - HANDOFF.usable_time
        await a.stop(release=False)  # renewals stop
        await run_for(HANDOFF.failover_time + 1.0, w.clock, step=0.05)
        assert len(b.owned()) == 4
        takes = [at for at, e in w.recorders["b"].times(LeaseAcquired) if e.how == "expired"]
        assert takes
        # Seen at most one poll after the last renewal; taken when expired, plus one poll.
        assert max(takes) <= last_renewal + HANDOFF.failover_time + 3 * HANDOFF.pickup_poll_interval
        assert max(takes) < last_renewal + HANDOFF.take_every


async def test_a_worker_that_leaves_passes_on_leases_handed_to_it_meanwhile() -> None:
    async with world([shard(i) for i in range(2)]) as w:
        a = await w.start("a", settings=HANDOFF)
        owned = next(iter(a.owned().values()))
        b = await w.start("b", settings=replace(HANDOFF, max_leases_to_steal_at_once=0))
        await leave(w, b)
        await owned.begin_handoff("b")  # a chose b just before b said it leaves
        await owned.writer.write(ExtendedSequenceNumber("7"))
        await owned.release("handoff")
        await b.stop()
        await settle()
        assert (await w.leases())[owned.lease_key].lease_owner is None, "free for the others"


async def test_a_leaver_hands_to_a_joiner_that_has_only_asked_so_far_at_64_shards() -> None:
    """Seen at 64 shards: a deploy stopped the old workers while the new ones had only asked
    for leases (none held and renewed yet), and each old worker handed everything to the
    other old one, the only peer it had seen renewing. A joiner's request is its own write,
    as good a proof of life as a renewal."""
    settings = replace(HANDOFF, handoff_timeout=30.0)
    async with world([shard(i) for i in range(64)]) as w:
        a = await w.start("a", settings=replace(settings, max_leases_per_worker=32))
        b = await w.start("b", settings=replace(settings, max_leases_per_worker=32))
        await run_for(HANDOFF.renew_every + 1.0, w.clock, step=0.25)  # both seen renewing
        c = await w.start("c", settings=replace(settings, max_leases_to_steal_at_once=1))
        await run_for(2 * HANDOFF.pickup_poll_interval, w.clock, step=0.05)
        assert not c.owned()
        assert await leave(w, a) >= 31  # one may be under way to c already: c asked for it
        await settle()
        to = Counter(
            lease.lease_owner
            for lease in (await w.leases()).values()
            if lease.checkpoint_owner == "a"
        )
        assert to["c"] >= 16, f"a handed {dict(to)}"
        await a.stop(release=False)
        await b.stop(release=False)


SLOW_DRAIN = 12.0
"""Longer than the failover time: what the old owners' last checkpoints took at 64 shards on a
lease table near its limit (bench/handoff.py, commit 3306ef9)."""


async def a_hands_to_b_as_both_leave(w: Any, settings: LeaseSettings) -> tuple[Any, Any, float]:
    """a and b hold 32 leases each and leave one right after the other: a chose b for all of
    its leases before b said that it leaves (the race two workers stopping at once can run);
    b then has nobody to hand its own to. b's shards drain at once, a's take SLOW_DRAIN s
    (a's leave, paced while the first handoffs drain, ends before); returns when they end."""
    a = await w.start("a", settings=replace(settings, max_leases_per_worker=32))
    b = await w.start("b", settings=replace(settings, max_leases_per_worker=32))
    assert Counter({"a": 32, "b": 32}) == await w.owners()
    drained_at = w.clock.monotonic() + SLOW_DRAIN
    complete_handoffs(a, not_before=drained_at, clock=w.clock)
    complete_handoffs(b)
    assert await leave(w, a) == 32
    assert await leave(w, b) == 0
    from_a = [lease for lease in (await w.leases()).values() if lease.checkpoint_owner == "a"]
    assert len(from_a) == 32
    assert {lease.lease_owner for lease in from_a} == {"b"}, "a chose b for all of them"
    return a, b, drained_at


async def test_a_leaver_waits_for_handoffs_to_it_and_frees_them_at_64_shards() -> None:
    """A worker that leaves must neither leave while a handoff to it is under way (the lease
    would name a worker that is gone until it expired) nor keep what it gets: it frees each
    lease when completed."""
    settings = replace(
        HANDOFF, handoff_timeout=30.0, max_leases_to_steal_at_once=0, successor_wait=0.0
    )
    async with world([shard(i) for i in range(64)]) as w:
        a, b, drained_at = await a_hands_to_b_as_both_leave(w, settings)
        b_stopped = asyncio.create_task(b.stop())
        await run_for(drained_at - w.clock.monotonic() - 1.0, w.clock, step=0.25)
        assert not b_stopped.done(), "b left with a's handoffs to it under way"
        await run_for(2.0, w.clock, step=0.25)
        assert b_stopped.done()
        owners = await w.owners()
        assert owners["b"] == 0, f"stranded with b, which is gone: {owners}"
        await a.stop()
        assert Counter({None: 64}) == await w.owners(), "every lease free for the next workers"


async def test_a_leaver_passes_a_handoff_to_it_on_to_a_live_worker_at_64_shards() -> None:
    """As above, with a new worker c in sight by the time b stops (it asked for a lease): b
    passes a's handoffs on to c and leaves at once; c gets them when a completes them, not
    after they expire."""
    settings = replace(
        HANDOFF, handoff_timeout=30.0, max_leases_to_steal_at_once=0, successor_wait=0.0
    )
    async with world([shard(i) for i in range(64)]) as w:
        a, b, _ = await a_hands_to_b_as_both_leave(w, settings)
        c = await w.start("c", settings=replace(settings, max_leases_to_steal_at_once=1))
        await run_for(1.0, w.clock, step=0.25)
        b_stopped = asyncio.create_task(b.stop())
        await run_for(1.0, w.clock, step=0.25)
        assert b_stopped.done(), "b had somebody to pass a's handoffs on to"
        assert Counter({"c": 64}) == Counter(
            lease.lease_owner for lease in (await w.leases()).values()
        )
        await run_for(SLOW_DRAIN, w.clock, step=0.25)
        assert len(c.owned()) == 64
        assert {e.how for e in w.recorders["c"].of(LeaseAcquired)} <= {"free", "handoff"}
        assert not w.recorders["a"].of(LeaseLost)
        await a.stop()


async def test_workers_leaving_at_once_say_so_and_choose_neither_each_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen at 64 shards (and more so with more workers): every old worker of a deploy gets
    SIGTERM at the same moment, and each handed leases to the others, which were leaving
    too. Each now first says on a lease that it leaves; the others skip it (nothing is handed
    to a leaver, so nothing needs passing on)."""
    caplog.set_level(logging.INFO, logger="shardflow.leases")
    settings = replace(HANDOFF, handoff_timeout=30.0, max_leases_to_steal_at_once=0)
    async with world([shard(i) for i in range(96)]) as w:
        capped = replace(settings, max_leases_per_worker=32)
        a = await w.start("a", settings=capped)
        b = await w.start("b", settings=capped)
        c = await w.start("c", settings=capped)
        await run_for(HANDOFF.renew_every + 1.0, w.clock, step=0.25)  # all seen renewing
        leaving = asyncio.gather(a.leave(), b.leave())
        # Paced: HANDOFFS_IN_FLIGHT to c per pick-up interval while none completes (nobody
        # drains here), so 8 rounds.
        await run_for(3.0, w.clock, step=0.25)
        assert leaving.done()
        assert leaving.result() == [32, 32]
        moved = Counter(
            (lease.checkpoint_owner, lease.lease_owner)
            for lease in (await w.leases()).values()
            if lease.checkpoint_owner is not None
        )
        assert moved == Counter({("a", "c"): 32, ("b", "c"): 32}), f"moves: {dict(moved)}"
        assert "passed the handoff" not in caplog.text
        for worker in (a, b):
            complete_handoffs(worker)
        await run_for(1.0, w.clock, step=0.25)
        await a.stop()
        await b.stop()
        assert len(c.owned()) == 96


def drain_after(coordinator: LeaseCoordinator, clock: Any, seconds: float) -> asyncio.Task[None]:
    """As :func:`complete_handoffs`, each lease ``seconds`` after it was given up (its
    handler calls finishing, the final checkpoint)."""
    given_up: dict[str, float] = {}

    async def loop() -> None:
        while True:
            for owned in list(coordinator.owned().values()):
                if owned.giving_up.is_set() and not owned.ended:
                    since = given_up.setdefault(owned.lease_key, clock.monotonic())
                    if clock.monotonic() - since >= seconds:
                        await owned.writer.write(ExtendedSequenceNumber("7"))
                        await owned.release("handoff")
            await asyncio.sleep(0)

    return asyncio.create_task(loop())


async def replace_both_at_once(
    w: Any, settings: LeaseSettings, *, stream: bool
) -> tuple[list[tuple[str | None, str | None, str]], dict[str, int], float]:
    """bench/handoff.py's (d) at 64 shards: a and b (32 leases each, a's shards slower to
    drain) leave at the moment two new workers c and d start. Returns every write that made
    a or b the owner of a lease another worker had, the scans a and b sent while leaving,
    and how long their leave took; asserts that c and d end with 32 leases each, all by handoff."""
    scans = {"a": 0, "b": 0}
    leaving_now = False

    def counter(name: str) -> Any:
        def count(operation: str) -> None:
            if operation == "Scan" and leaving_now:
                scans[name] += 1

        return count

    def options(name: str) -> dict[str, Any]:
        got: dict[str, Any] = {"settings": settings}
        if name in scans:
            got["settings"] = replace(settings, max_leases_per_worker=32)
            got["store"] = w.store(fault=counter(name))
        if stream:
            got["lease_streams"] = InMemoryLeaseStreams(w.tables)
        return got

    a = await w.start("a", **options("a"))
    b = await w.start("b", **options("b"))
    await run_for(HANDOFF.renew_every + 1.0, w.clock, step=0.25)  # both seen renewing
    assert a.pickup_source == b.pickup_source == ("stream" if stream else "poll")
    drain_after(a, w.clock, 0.4)  # a's shards take longer to drain than b's
    drain_after(b, w.clock, 0.05)
    to_leavers: list[tuple[str | None, str | None, str]] = []

    def watch(seen: LeaseWriteSeen) -> None:
        before, after = seen.before, seen.after
        if seen.refused or before is None or after is None:
            return
        if after.lease_owner in ("a", "b") and after.lease_owner != before.lease_owner:
            to_leavers.append((before.lease_owner, after.lease_owner, after.lease_key))

    stop_watching = w.tables.watch(watch)
    leaving_now = True
    leaving = asyncio.gather(a.leave(), b.leave())
    began = w.clock.monotonic()
    await run_for(1.0, w.clock, step=0.05)  # the new workers' processes start meanwhile
    await w.start("c", **options("c"))
    await w.start("d", **options("d"))
    for _ in range(200):
        if leaving.done():
            break
        await run_for(0.05, w.clock, step=0.05)
    leaving_now = False
    took = w.clock.monotonic() - began
    stop_watching()
    assert leaving.done()
    assert leaving.result() == [32, 32]
    await run_for(1.0, w.clock, step=0.25)
    assert Counter({"c": 32, "d": 32}) == await w.owners()
    assert {e.how for name in "cd" for e in w.recorders[name].of(LeaseAcquired)} == {"handoff"}
    await a.stop()
    await b.stop()
    return to_leavers, scans, took


async def test_two_leavers_replaced_at_once_never_hand_to_each_other_at_64_shards() -> None:
    """bench/handoff.py (d) at 64 shards on moto (e4c46e6): both old workers stopped as two
    new ones started; w2's handoffs drained first, and w1 then handed 9 leases to w2, which
    could only release them (3.8 s pauses until a take cycle found them). w2 had said that it
    leaves on its lowest lease, and handed that lease over in its first round: until it said
    so again on another lease, a scan showed it with few leases and no word, the least loaded
    worker in sight. The word now stays on the lease handed over last, and a leaver remembers
    every peer it saw leaving."""
    settings = replace(HANDOFF, pickup_poll_interval=0.2, handoff_timeout=30.0, successor_wait=10.0)
    async with world([shard(i) for i in range(64)]) as w:
        to_leavers, _, _ = await replace_both_at_once(w, settings, stream=False)
        assert not to_leavers, f"handed to a leaver: {to_leavers}"


async def test_leavers_reading_the_tables_stream_scan_it_once_a_second_at_64_shards() -> None:
    """The same replacement with pick-up from the lease table's stream: the leavers scanned
    the table every pick-up interval (10 scans/s between two of them, on a lease table that
    answers one request at a time in the bench); the stream keeps their view whole, so they
    scan once per LEAVE_RESCAN, and still hand nothing to each other."""
    settings = replace(
        HANDOFF,
        pickup="stream",
        pickup_poll_interval=0.2,
        handoff_timeout=30.0,
        successor_wait=10.0,
    )
    async with world([shard(i) for i in range(64)]) as w:
        to_leavers, scans, took = await replace_both_at_once(w, settings, stream=True)
        assert not to_leavers, f"handed to a leaver: {to_leavers}"
        # Each leaver: its first scan and one a second (LEAVE_RESCAN), not one per 0.2 s.
        assert LEAVE_RESCAN == 1.0
        most = 1 + took / 1.0
        assert max(scans.values()) <= most, f"scans while leaving: {scans} in {took:.1f} s"


async def test_leavers_with_nobody_to_hand_to_keep_their_shards_until_a_worker_shows() -> None:
    """A deploy that stops the old workers as the new ones start: at the SIGTERM nobody else
    is in sight. The old workers keep their shards going (up to ``successor_wait``) and hand
    them over once a new worker shows, instead of releasing them for whoever starts next
    (a pause of a process start per shard)."""
    settings = replace(HANDOFF, handoff_timeout=30.0, successor_wait=30.0)
    async with world([shard(i) for i in range(64)]) as w:
        capped = replace(settings, max_leases_per_worker=32)
        a = await w.start("a", settings=capped)
        b = await w.start("b", settings=capped)
        await run_for(HANDOFF.renew_every + 1.0, w.clock, step=0.25)  # a fleet: seen renewing
        for worker in (a, b):
            complete_handoffs(worker)
        leaving = asyncio.gather(a.leave(), b.leave())
        # Longer than the word that they leave stays fresh (their own renewals date it).
        await run_for(5 * HANDOFF.renew_every, w.clock, step=0.25)
        assert not leaving.done(), "nobody to hand to yet: the shards keep going"
        assert Counter({"a": 32, "b": 32}) == await w.owners(), "handed to each other"
        c = await w.start("c", settings=replace(settings, max_leases_to_steal_at_once=1))
        await run_for(2.0, w.clock, step=0.25)
        assert leaving.done()
        assert leaving.result() == [32, 32]
        await run_for(1.0, w.clock, step=0.25)
        assert len(c.owned()) == 64
        assert {e.how for e in w.recorders["c"].of(LeaseAcquired)} == {"handoff"}
        await a.stop()
        await b.stop()


async def test_a_lone_leaver_releases_at_once() -> None:
    """``successor_wait`` applies to a fleet being replaced, not to the last worker stopping."""
    settings = replace(HANDOFF, successor_wait=10.0)
    async with world([shard(i) for i in range(4)]) as w:
        a = await w.start("a", settings=settings)
        await run_for(HANDOFF.renew_every + 1.0, w.clock, step=0.25)
        leaving = asyncio.ensure_future(a.leave())
        await run_for(0.5, w.clock, step=0.25)
        assert leaving.done()
        assert leaving.result() == 0


# --- pure pieces ---------------------------------------------------------------------------------


def test_successors_are_the_least_loaded_live_workers_and_skip_leavers() -> None:
    leases = [
        Lease("1", lease_owner="me"),
        Lease("2", lease_owner="me"),
        Lease("3", lease_owner="b"),
        Lease("4", lease_owner="b"),
        Lease("5", lease_owner="c"),
        Lease("6", lease_owner="x", checkpoint_owner="d"),  # d is leaving too
        Lease("7", lease_owner="dead"),
        Lease(
            "8",
            lease_owner="c",
            lease_counter=4,
            extra={"shardflowHandoffRequest": {"S": "3:joiner"}},
        ),
    ]
    picks = successors(
        leases, 4, worker_id="me", is_expired=lambda lease: lease.lease_owner == "dead"
    )
    assert picks == ["joiner", "joiner", "x", "b"]  # ties go by name
    assert successors([Lease("1", lease_owner="me")], 1, worker_id="me", is_expired=bool) == []


def test_the_handoff_book_times_out_requests_but_never_inbound_handoffs() -> None:
    book = HandoffBook("me", timeout=5.0)
    asked = Lease("1", lease_owner="a")
    book.requested(asked, now=10.0)
    inbound = Lease("2", lease_owner="me", checkpoint_owner="a")
    with_request = replace(asked, extra={"shardflowHandoffRequest": {"S": "0:me"}})
    book.update({"1": with_request, "2": inbound}, now=11.0)
    assert book.open_requests == 1
    assert book.next_deadline() == 15.0
    assert book.overdue_requests(14.0) == []
    assert book.overdue_requests(15.0) == ["1"]
    assert book.next_deadline() is None, "an inbound handoff waits for expiry, not a timeout"
    assert book.inbound() == ["2"]
    book.update({"2": replace(inbound, checkpoint_owner=None)}, now=17.0)
    assert book.inbound() == []


def test_a_request_overwritten_by_another_joiner_is_dropped_at_once() -> None:
    book = HandoffBook("me", timeout=5.0)
    asked = Lease("1", lease_owner="a", lease_counter=7)
    book.requested(asked, now=10.0)
    mine = {"shardflowHandoffRequest": {"S": HandoffRequest("me", 7).encode()}}
    book.update({"1": replace(asked, extra=mine)}, now=10.5)
    assert book.open_requests == 1
    theirs = {"shardflowHandoffRequest": {"S": HandoffRequest("c", 7).encode()}}
    book.update({"1": replace(asked, extra=theirs)}, now=11.0)
    assert book.open_requests == 0, "ask for another lease instead of waiting out the timeout"
    assert asked_by_another(replace(asked, extra=theirs), "me")
    assert not asked_by_another(replace(asked, extra=mine), "me")
    stale = replace(asked, extra=theirs, lease_counter=7 + 4)
    assert not asked_by_another(stale, "me")


def test_the_next_expiry_ignores_own_and_free_leases_and_the_past() -> None:
    tracker = ExpiryTracker(10.0)
    tracker.observe(
        [
            Lease("1", lease_owner="a", lease_counter=1),
            Lease("2", lease_owner="me", lease_counter=1),
            Lease("3"),
        ],
        now=100.0,
    )
    tracker.observe([Lease("4", lease_owner="b", lease_counter=1)], now=103.0, complete=False)
    assert tracker.next_expiry(100.0, holder_not="me") == 110.0
    assert tracker.next_expiry(110.0, holder_not="me") == 113.0
    assert tracker.next_expiry(113.0, holder_not="me") is None


def test_a_request_names_the_requester_and_the_counter_it_saw() -> None:
    assert HandoffRequest("host:1:ab", 12).encode() == "12:host:1:ab"
    lease = Lease("k", lease_owner="a", extra={"shardflowHandoffRequest": {"S": "12:host:1:ab"}})
    assert handoff_request_of(lease) == HandoffRequest("host:1:ab", 12)


async def test_the_final_checkpoint_of_a_handoff_is_the_handover_write() -> None:
    async with world([shard(i) for i in range(4)]) as w:
        sent: list[str] = []

        class Recording(InMemoryLeaseStore):
            async def execute(self, write: LeaseWrite) -> Lease | None:
                sent.append(write.operation)
                return await super().execute(write)

        a = await w.start("a", settings=HANDOFF, store=Recording("app", tables=w.tables))

        async def finish_with_one_write() -> None:
            while True:
                for owned in list(a.owned().values()):
                    if owned.giving_up.is_set() and not owned.ended:
                        await owned.writer.write(ExtendedSequenceNumber("9"), final=True)
                        assert owned.ended, "the final write handed it over"
                        assert owned.released
                        assert not await owned.release("handoff"), "nothing left to release"
                await asyncio.sleep(0)

        helper = asyncio.create_task(finish_with_one_write())
        b = await w.start("b", settings=HANDOFF)
        await run_for(3.0, w.clock, step=0.05)
        helper.cancel()
        assert (len(a.owned()), len(b.owned())) == (2, 2)
        assert "checkpoint" not in sent, "no separate checkpoint write"
        assert sent.count("release") == 2
        assert {e.why for e in w.recorders["a"].of(LeaseReleased)} == {"handoff"}
        for lease in (await w.leases()).values():
            assert lease.checkpoint_owner is None
            if lease.lease_owner == "b":
                assert lease.checkpoint == ExtendedSequenceNumber("9")


async def test_a_dead_workers_leases_run_again_a_failover_time_after_it_died() -> None:
    """bench/chaos.py: of 4 workers on 16 shards one is killed -9 and its replacement starts
    3 s later and asks for a lease at once. The survivors, at target counting the
    replacement, left the dead worker's leases to it, and it saw them expire a failover time
    after its own start: 11-13.4 s after the kill at failover time 6 s. The survivors take
    them as they expire; the replacement gets its share afterwards by handoff."""
    settings = replace(HANDOFF, failover_time=6.0, pickup_poll_interval=1.0, handoff_timeout=12.0)
    async with world([shard(i) for i in range(16)]) as w:
        workers = {}
        helpers = {}
        for name in ("a", "b", "c", "d"):
            workers[name] = await w.start(name, settings=settings)
            helpers[name] = complete_handoffs(workers[name])
            await run_for(2.0, w.clock, step=0.1)
        await run_for(20.0, w.clock, step=0.1)
        assert sorted(len(x.owned()) for x in workers.values()) == [4, 4, 4, 4]
        orphans = set(workers["d"].owned())
        helpers.pop("d").cancel()  # nothing drains or releases what it held
        await workers["d"].stop(release=False)  # kill -9: its renewals stop
        died = w.clock.monotonic()
        await run_for(3.0, w.clock, step=0.1)
        workers["e"] = await w.start("e", settings=settings)
        helpers["e"] = complete_handoffs(workers["e"])
        await run_for(30.0, w.clock, step=0.1)
        first_taken: dict[str, float] = {}
        for name in "abce":
            for at, event in w.recorders[name].times(LeaseAcquired):
                if at > died and event.lease_key in orphans:
                    first_taken[event.lease_key] = min(at, first_taken.get(event.lease_key, at))
        assert set(first_taken) == orphans
        late = {key: round(at - died, 1) for key, at in first_taken.items()}
        assert max(late.values()) <= settings.failover_time + 1.5, (
            f"the dead worker's shards waited for the replacement: {late}"
        )
        for helper in helpers.values():
            helper.cancel()
        loads = sorted(len(workers[name].owned()) for name in "abce")
        assert sum(loads) == 16
        assert loads[-1] - loads[0] <= 1, f"evened out by handoff afterwards: {loads}"


async def test_no_steal_on_a_request_unanswered_while_the_table_fails_this_workers_calls() -> None:
    """bench/simulate.py's brownout phase (heartbeat mode): an owner the brownout kept from
    answering a handoff request had a lease stolen while it still held it (two owners). While
    the table fails the requester's own calls, silence is no refusal; the steal waits until
    the table answered for a whole handoff_timeout."""
    failing = {"on": False, "calls": 0}

    def brownout(operation: str) -> None:
        if failing["on"]:
            failing["calls"] += 1
            if failing["calls"] % 2:
                raise TransientError("brownout", operation=operation, code="InternalFailure")

    async with world([shard(i) for i in range(4)]) as w:
        kcl_like = replace(HANDOFF, handoff=False)  # ignores requests, as KCL does
        await w.start("a", settings=kcl_like)
        b = await w.start("b", settings=HANDOFF, store=w.store(fault=brownout))
        await run_for(0.5, w.clock, step=0.25)
        failing["on"] = True
        await run_for(HANDOFF.handoff_timeout + 3.0, w.clock, step=0.25)
        failing["on"] = False
        healed = w.clock.monotonic()
        assert not b.owned(), "stolen while the table failed the requester's calls"
        await run_for(HANDOFF.handoff_timeout + 2.0, w.clock, step=0.25)
        stolen = [at for at, e in w.recorders["b"].times(LeaseAcquired) if e.how == "stolen"]
        assert stolen, "never stolen once the table answered again"
        assert stolen[0] >= healed + HANDOFF.handoff_timeout - 1.0


async def test_a_claim_sent_on_sight_of_a_begun_handoff_never_cuts_it_short() -> None:
    # The new owner claims a lease as soon as it reads that the handoff to it began (see
    # test_coordinator_scale.py): read before the old owner's handover landed, that claim is
    # refused and the handoff goes on undisturbed; the handover's own image, read next, is
    # claimed as before.
    async with world([shard(i) for i in range(2)]) as w:
        a = await w.start("a", settings=HANDOFF)
        await run_for(HANDOFF.renew_every + 1.0, w.clock)
        b = await w.start(
            "b",
            settings=replace(HANDOFF, pickup="stream"),
            lease_streams=InMemoryLeaseStreams(w.tables),
        )
        await settle()
        owned = a.owned()[sorted(a.owned())[0]]
        last = ExtendedSequenceNumber("4967")
        assert await owned.begin_handoff("b")
        await b._moves.picked_up(LeaseView((owned.lease,), complete=False))
        await settle()
        assert owned.lease_key not in b.owned()
        await owned.write_checkpoint(last, final=True)
        assert owned.ended_why == "handoff"
        await run_for(1.0, w.clock)
        assert owned.lease_key in b.owned()
        assert b.owned()[owned.lease_key].checkpoint == last
