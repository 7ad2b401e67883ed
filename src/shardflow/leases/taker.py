"""One take cycle: scan the lease table, judge expiry, decide by the balance rules, take.

With planned handoffs (``LeaseSettings.handoff``) a cycle also claims leases handed to this
worker, asks a busy worker for a lease (a handoff request) where KCL would steal one, steals
only when such a request was not answered in ``handoff_timeout``, and takes over a handoff to
this worker that its old owner did not complete only once the lease expired (the old owner
stopped renewing it; see :mod:`~shardflow.leases.handoffs`).

Also what a scan shows besides balance: other workers appearing and leaving, finished shards
(checkpoint SHARD_END: never taken) whose children lack leases (a shard sync is asked for)
or have all started (the finished lease is deleted, as KCL does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Final

from shardflow.clock import Clock
from shardflow.errors import AwsError, ConditionFailedError, ShardflowError
from shardflow.events import AcquiredHow, EventEmitter, WorkerJoined, WorkerLeft
from shardflow.leases.balance import (
    PlannedTake,
    TakePlan,
    decide,
    may_give,
    orphan_part,
    target_for,
)
from shardflow.leases.concurrency import run_bounded
from shardflow.leases.entities import Heartbeat, LeaseMode, entity_from_item
from shardflow.leases.errors import EntityConditionFailedError, LeaseConditionFailedError
from shardflow.leases.expiry import ExpiryTracker
from shardflow.leases.handoffs import HandoffBook, asked_by_another
from shardflow.leases.lease_index import LeaseIndex, shape_from_index
from shardflow.leases.model import Lease
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.store import LeaseStore, LeaseStoreBase, TableScan
from shardflow.leases.streams import StreamSet
from shardflow.records import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON

log = logging.getLogger("shardflow.leases")

_NOT_STARTED: Final = frozenset({TRIM_HORIZON, LATEST, AT_TIMESTAMP})

SCAN_PACE: Final = 2_500
"""Leases a worker may scan per ``pickup_poll_interval`` while free leases call for scans
(see :meth:`LeaseTaker.take_cycle`)."""

UNPACED_SCANS: Final = 8
"""A worker's first scans since it started are not paced by :data:`SCAN_PACE`: a worker that
joins (or a fleet that starts on a new application) takes its share over a few cycles, each
taking at most what it already holds, and a pace of one scan a second at 10,000 leases made
that slow (start-up of 100 workers on 10,000 shards: longest time a shard had no owner 8.3 s
paced, 4.0 s before the pace, bench/simulate.py). Bounded: a worker's lifetime has at most
this many unpaced scans, so a split wave later (the reason for the pace) is still paced."""

SPREAD_AFTER: Final = 1.0
"""Seconds the fleet a worker knows (the live workers it counts, and those it saw write within
a failover time) must have stayed the same before it takes free leases as its own run of them
rather than at random (see :func:`~shardflow.leases.balance.free_share`)."""

SYNC_ASKED_SLACK: Final = 64
"""Entries of ``LeaseTaker._sync_asked`` beyond twice the finished leases in view before the
ones no longer in view are forgotten (see :meth:`LeaseTaker._look_at_finished`)."""

Adopt = Callable[[PlannedTake, Lease, float], OwnedLease]
"""Turns a successful take (plan, lease after the write, send time) into a held lease."""


class LeaseTaker:
    """Runs take cycles for one worker; ``owned`` is the coordinator's live map of held leases."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        worker_id: str,
        streams: StreamSet,
        settings: LeaseSettings,
        clock: Clock,
        owned: Mapping[str, OwnedLease],
        adopt: Adopt,
        events: EventEmitter,
        want_sync: Callable[[], None],
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._streams = streams
        self._settings = settings
        self._clock = clock
        self._owned = owned
        self._adopt = adopt
        self._events = events
        self._want_sync = want_sync
        self._rng = rng or random.Random()
        self._tracker = ExpiryTracker(
            settings.failover_time, worker_id=worker_id, grace=settings.renew_every
        )
        self._peers: frozenset[str] = frozenset()
        self._sync_asked: set[str] = set()
        """Finished leases that asked for a shard sync (once each): forgotten once their
        children have leases or the finished lease left the table (see _look_at_finished)."""
        self._children_missing: dict[str, float] = {}
        """Finished leases seen without their children's leases -> when first seen so (in
        that order): a sync is asked for those still lacking them ``failover_time`` later
        (see :meth:`_look_at_finished`)."""
        self._resume_own = True  # the first cycle picks up leases that already name us
        self._book = HandoffBook(worker_id, settings.handoff_timeout)
        self._lock = asyncio.Lock()
        self._claiming: set[str] = set()
        self._patient_until: float | None = None
        self._view: LeaseIndex | None = None
        """The table as the last complete scan showed it, with the stream's changes since,
        indexed for the take cycle (:mod:`~shardflow.leases.lease_index`)."""
        self._cleanable: dict[str, None] = {}
        """Finished leases whose children all have leases that started (see _clean_up)."""
        self._last_cycle: float | None = None
        self._first_cycle: float | None = None
        """When this worker's first take cycle ran (see _max_takes)."""
        self._last_scan: float | None = None
        """When the view was last rebuilt from a complete scan."""
        self._scan_deferred = False
        self._scans = 0
        """Complete scans made so far (the first :data:`UNPACED_SCANS` are not paced)."""
        self._live_seen: frozenset[str] = frozenset()
        self._live_since = 0.0
        """The fleet the last plan knew (the live workers it counted and those seen writing
        within a failover time), and since when it knew the same (see SPREAD_AFTER)."""
        self._free_left = False
        self._mine_left = False
        """Leases naming this worker were left unclaimed by the last cycle (see _resume)."""
        """Free or expired leases were left that this worker may still want: another cycle
        soon (see next_wake)."""
        self.enabled = True
        """False stops taking (at shutdown), even in a cycle under way."""
        self.expiring: set[str] = set()
        """Leases this worker left to expire (:meth:`OwnedLease.let_expire`): never claimed
        again here, although they still name this worker."""
        self.on_finished: Callable[[str], None] = lambda key: None
        """Called with the key of every finished lease (checkpoint SHARD_END) a scan shows."""
        self.last_plan: TakePlan | None = None
        """The last cycle's balancing decision (its target and the loads it saw)."""
        self.table_mode: LeaseMode = "per-lease"
        """The application's lease mode as the table last showed it."""
        self.on_mode: Callable[[LeaseMode], None] = lambda mode: None
        """Called after every read that showed the table's mode (a scan, a stream change)."""
        self.on_scanned: Callable[[list[Lease]], None] = lambda leases: None
        """Called with every complete scan of the table this worker made (its take cycles)."""
        self.defers: Callable[[], bool] = lambda: False
        """True while a KCL 3.x leader assigns leases: take free and expired leases only,
        never steal or ask for a live one (see :mod:`shardflow.leases.fleet`)."""

    @property
    def tracker(self) -> ExpiryTracker:
        return self._tracker

    def observe(self, leases: list[Lease], removed: list[str]) -> None:
        """Leases that changed (a stream), as seen now: expiry clocks restart on changes, and
        the table as last scanned is brought up to date (see :meth:`take_cycle`)."""
        self._tracker.observe(leases, self._clock.monotonic(), complete=False)
        self._tracker.forget(removed)
        self._update_view(leases, removed)

    def observe_renewed(self, leases: list[Lease]) -> None:
        """Renewals read from the table's stream (see LeaseView.renewed): the lease is alive,
        its owner unchanged. The expiry clocks restart and the view takes the new counter,
        without the general bookkeeping of :meth:`observe` (a lease the view shows with
        another owner gets it)."""
        self._tracker.renewed(leases, self._clock.monotonic())
        view = self._view
        if view is None:
            return
        odd = view.renew_all(leases)
        if odd:
            self._update_view(odd, [])

    def saw_own_write(self, lease: Lease) -> None:
        """``lease`` as this worker's own write left it (a release, a handover): the view
        takes it now, before the table's stream shows it, so that no cycle plans on the image
        before it (a lease released here still named this worker there, and was claimed)."""
        self._update_view([lease], [])

    def _update_view(self, leases: list[Lease], removed: list[str]) -> None:
        view = self._view
        if view is not None:
            for lease in leases:
                known = view.get(lease.lease_key)
                # An image older than the scan (the stream lags) leaves the scan's lease.
                if known is None or lease.lease_counter >= known.lease_counter:
                    view.put(lease)
            for key in removed:
                view.remove(key)
        for key in removed:
            self._sync_asked.discard(key)  # a finished lease deleted: nothing to ask for

    def observe_entities(
        self,
        heartbeats: Collection[Heartbeat],
        *,
        complete: bool,
        mode: LeaseMode | None = None,
        mode_seen: bool = False,
        removed_heartbeats: Collection[str] = (),
    ) -> None:
        """shardflow's own items as a read showed them: the heartbeats (for expiry) and the
        table's lease mode (``mode_seen``: the read showed the mode item or its absence;
        a complete scan always does)."""
        now = self._clock.monotonic()
        self._tracker.observe_heartbeats(heartbeats, now, complete=complete)
        for worker in removed_heartbeats:
            self._tracker.forget_heartbeat(worker, now)
        if complete or mode_seen:
            self.table_mode = mode or "per-lease"
            self.on_mode(self.table_mode)

    def next_wake(self) -> float | None:
        """When a cycle should run before the next periodic one: when an observed lease
        expires, a handoff becomes overdue, or soon after free leases were left untaken."""
        after = self._last_cycle
        if after is None or self._settings.pickup == "off":
            return None  # KCL's rhythm: one cycle per take interval
        tracker = self._tracker
        expiry = tracker.next_expiry(tracker.judged_at(after), holder_not=self._worker_id)
        if expiry is not None and tracker.is_blind:
            # Blind: no lease expires before a call answers again (it is judged as of the
            # moment this worker went blind). Looked at again a second later, not in a loop.
            expiry = max(expiry + after - tracker.judged_at(after), after + 1.0)
        moments = [expiry]
        if self._settings.handoff:
            deadline = self._book.next_deadline()
            if deadline is not None:
                # Overdue but not settled last cycle (the take raced a renewal): retry soon.
                moments.append(deadline if deadline > after else after + 1.0)
        if self._free_left:
            moments.append(after + max(1.0, self._settings.pickup_poll_interval))
        if self._mine_left:
            # Leases that name this worker were not claimed (the table did not answer): again
            # a second later (or once the take loop's pause is over), not at the next take
            # interval, 20 s on, when peers will have taken them as expired.
            moments.append(after + 1.0)
        for since in self._children_missing.values():
            moments.append(since + self._settings.failover_time)  # the first seen: the earliest
            break
        wake = min((m for m in moments if m is not None), default=None)
        if self._scan_deferred and self._last_scan is not None:
            # A cycle was put off until a scan is due (see take_cycle): then, not before.
            wake = self._last_scan + self._scan_gap()
        return wake

    def _scan_gap(self) -> float:
        """Seconds between the scans that free leases in the view call for: one pick-up
        interval per ``SCAN_PACE`` leases of the table (up to 2,500 leases, every stream read
        may scan, as before; a 30,000-lease table is scanned every 3 s at most)."""
        view = self._view
        size = len(view) if view is not None else 0
        return self._settings.pickup_poll_interval * max(1.0, size / SCAN_PACE)

    def seen(self, lease_key: str) -> Lease | None:
        """The lease as the view (the last scan and the stream since) shows it, if any."""
        view = self._view
        return view.get(lease_key) if view is not None else None

    def forget_view(self) -> None:
        """Changes to the table may have been missed (the stream is read again from its latest
        change): the next cycle scans."""
        self._view = None

    async def take_cycle(
        self, leases: list[Lease] | None = None, *, from_view: bool = False
    ) -> list[OwnedLease]:
        """Scan once (or use ``leases``, a complete scan just made) and take what the balance
        rules allow; the leases taken.

        ``from_view``: plan on the table as the last scan showed it, brought up to date by
        the changes read from the table's stream since (:meth:`observe`), without a scan:
        for the cycles lease pick-up wakes whenever a lease moved (while leases move, every
        worker would otherwise scan the whole table a few times a second). Scans once the
        view is missing (the stream was read again from its latest change), or when it
        shows free leases: those are raced for (a new application, a split), and a
        picture a moment old shows leases free that others took since and hides who took
        them, so a worker would count too few peers and take far beyond its share. Such
        scans are paced by the table's size (:meth:`_scan_gap`); a cycle woken sooner is left
        to the wake that follows the gap (see :meth:`next_wake`): while a split wave or a new
        application's leases were free, every worker scanned the whole table at each stream
        read that showed a new lease, four times a second (100 workers on a 30,000-lease
        table during a split: 1,310 Scan pages per worker per minute, 40 of a simulated
        run's 71 minutes, bench/simulate.py).
        """
        async with self._lock:
            view = self._view
            # Not while this worker's calls fail either: a scan is one more call to a table
            # that errs, and the stream's iterators hold what it has not read yet (the view
            # misses nothing; expiry is judged as of the moment the calls began to fail,
            # ExpiryTracker.judged_at). A cycle woken while blind scanned: in a brownout every
            # lease that lapsed here and every lease seen moving made a scan (10,000 leases,
            # 100 workers: 521 Scan pages per worker-minute, 70 before renewals had slots of
            # their own and leases lapsed one by one; bench/simulate.py).
            if from_view and leases is None and view is not None:
                if not view.free_anywhere:
                    # Nothing free any more: the scan a deferred cycle waited for is not
                    # needed. Left set, next_wake kept answering that past moment (the last
                    # scan + the gap) and the take loop ran this cycle again at once, without
                    # end: 50 workers starting on 5,000 shards, one worker's loop spun at one
                    # instant (bench/simulate.py, seed 1: the start-up never came to rest).
                    self._scan_deferred = False
                    return await self._cycle(None, fresh=False)
                if not self._wants_free(view):
                    # Below no share: a scan could not give this worker anything to take (the
                    # free leases are for the workers below theirs), and the cycle on the
                    # view skips planning (see _cycle).
                    self._scan_deferred = False
                    return await self._cycle(None, fresh=False)
                scanned = self._last_scan
                if (
                    scanned is not None
                    and self._scans >= UNPACED_SCANS
                    and self._clock.monotonic() - scanned < self._scan_gap()
                ):
                    self._free_left = True  # next_wake: a scan once the gap has passed
                    self._scan_deferred = True
                    return []
            return await self._cycle(leases)

    async def _cycle(self, scanned: list[Lease] | None, *, fresh: bool = True) -> list[OwnedLease]:
        """One cycle: on a scan (``scanned``, or one made here when None and ``fresh``), or,
        not ``fresh``, on the view as the stream kept it. Planned from the view's indexes
        (:mod:`~shardflow.leases.lease_index`): what a cycle costs grows with what is free,
        expired, held here or finished-and-changed, not with the table."""
        if scanned is None and fresh:
            try:
                store = self._store
                if isinstance(store, LeaseStoreBase):
                    scan = await store.scan_table()
                else:
                    scan = TableScan(await store.list_leases())
            except ShardflowError:
                self._tracker.blind(self._clock.monotonic())
                raise
            scanned = scan.leases
            self._scans += 1
            self.observe_entities(scan.heartbeats, complete=True, mode=scan.mode)
        now = self._clock.monotonic()  # after the scan: no item was read later than this
        self._last_cycle = now
        if self._first_cycle is None:
            self._first_cycle = now
        view = self._view
        if fresh or view is None:
            self._last_scan = now
            self._scan_deferred = False
            leases = scanned if scanned is not None else []
            self._tracker.observe(leases, now)
            self.on_scanned(leases)
            if view is None:
                view = self._view = LeaseIndex(
                    ours=lambda lease: self._streams.spec_of(lease) is not None,
                    key_for=self._streams.key_for,
                )
                self._cleanable = {}
            view.refresh(leases)
        self._look_at_finished(view, now)
        taken: list[OwnedLease] = []
        resumed = self._resume_own
        if resumed or self._settings.handoff:
            self._resume_own = False
            taken += await self._resume(view, how="resumed" if resumed else "handoff")
        else:
            # Without handoffs nothing claims leases that name this worker after the first
            # cycle (they expire and are taken as any other): none is left to retry a second
            # later, which would wake the take loop every second for good.
            self._mine_left = False
        await self._complete_stranded(view)
        handoff = self._settings.handoff
        max_steal = self._settings.max_leases_to_steal_at_once
        if handoff:
            self._book.update(view.active, now, mine=view.owned_by(self._worker_id))
            taken += await self._take_overdue(view, now)
            budget = self._request_budget(view, now)
            max_steal = max(budget - self._book.open_requests, 0)
        defers = self.defers()
        if defers:
            max_steal = 0  # the KCL leader balances; a steal would fight it
        if (view.free or view.free_anywhere) and not self._wants_free(view):
            # Free leases are there, for workers below their share, and this one is not: no
            # take, no request (none is made while leases are free). Planning anyway sorted
            # every free lease (20,000 after a split wave) for each worker at every read of
            # the table's stream that showed a change, four times a second.
            self._free_left = False
            await self._tidy(view, scanned if fresh else None)
            return taken
        shape = shape_from_index(
            view,
            self._tracker,
            worker_id=self._worker_id,
            held=self._owned.keys(),
            now=now,
            even_out=handoff and not defers,
        )
        # The fleet as this worker knows it: the live workers counted, and those it saw write
        # within a failover time that did not say they leave (after a split wave nobody holds
        # a lease for a moment, while every worker of the fleet has just written): they count
        # in the target (see ExpiryTracker.staying).
        seen = self._tracker.staying(now, self._settings.failover_time) - {self._worker_id}
        fleet = frozenset(shape.alive_counts) | shape.requesters | {self._worker_id} | seen
        if fleet != self._live_seen:
            self._live_seen, self._live_since = fleet, now
        if seen:
            shape = replace(shape, seen=frozenset(seen))
        plan = decide(
            shape,
            worker_id=self._worker_id,
            max_leases_per_worker=self._settings.max_leases_per_worker,
            max_steal=max_steal,
            rng=self._rng,
            orphans_beyond_target=defers,
            even_out=handoff and not defers,
            max_takes=self._max_takes(defers),
            asked=self._book.open_requests if handoff else 0,
            spread=now - self._live_since >= SPREAD_AFTER,
        )
        self.last_plan = plan
        self._note_peers(plan.live_workers)
        if handoff:
            self._drop_declined(plan)
        planned_keys = {planned.lease.lease_key for planned in plan.takes}
        capped = len(plan.takes) < plan.wanted  # max_takes: more wanted soon
        self._free_left = any(key not in planned_keys for key in view.free) or (
            capped and any(lease.lease_key not in planned_keys for lease in shape.expired)
        )
        total = shape.total

        # Refused takes of free or expired leases name who got them: workers this scan could
        # not show (they held nothing yet). Once the leases taken here reach the share the
        # fleet known now allows, the cycle stops taking; the rest goes to the others (100
        # workers starting together on 10,000 shards each tried to take all 10,000).
        revealed: set[str] = set()
        got = 0

        def enough() -> bool:
            if defers or not revealed:
                return False
            known = len(plan.live_workers | revealed)
            share = target_for(total, known, self._settings.max_leases_per_worker)
            if plan.held + got < share:
                return False
            # Orphans taken beyond the target: this worker's part, shared with the workers
            # the refusals revealed as well.
            return got >= orphan_part(plan.orphans, len(plan.holders | revealed))

        async def take(planned: PlannedTake) -> None:
            nonlocal got
            if handoff and planned.how == "stolen":
                await self._request(planned.lease)
                return
            if planned.how in ("free", "expired") and enough():
                self._free_left = True
                return
            owned = await self._take(planned, revealed)
            if owned is not None:
                taken.append(owned)
                got += 1

        await run_bounded(plan.takes, take, concurrency=self._settings.renew_concurrency)
        await self._tidy(view, scanned if fresh else None)
        return taken

    async def _tidy(self, view: LeaseIndex, scanned: list[Lease] | None) -> None:
        """A cycle's last chores: finished leases deleted, and (after a scan, ``scanned``)
        fenced heartbeats of workers that hold nothing."""
        if self._cleanable and self._settings.cleanup_finished_leases:
            await self._clean_up(view)
        if scanned is not None:
            await self._drop_fenced(scanned)

    def may_give(self, requester: str, handing: Collection[str] = ()) -> bool:
        """Whether to answer ``requester``'s request for one of this worker's leases: only
        while this worker keeps its share (see :func:`~shardflow.leases.balance.may_give`),
        judged on the table as the stream has shown it since the last scan (the last take
        cycle's picture is seconds old while leases move: an owner that still saw its old
        share gave joiners more than its surplus, then asked others for leases back).
        ``handing``: leases whose handoff is being begun (counted as given to ``requester``)."""
        mine = 0
        in_flight = 0
        for key, owned in self._owned.items():
            if key in handing:
                in_flight += 1
            elif not owned.giving_up.is_set():
                mine += 1
        view = self._view
        if view is not None:
            loads = view.loads
            workers = {owner for owner, count in loads.items() if count > 0}
            workers |= {self._worker_id, requester}
            held = sum(count for count in loads.values() if count > 0)  # finished ones: nobody's
            return may_give(mine, loads[requester] + in_flight, held, len(workers))
        plan = self.last_plan
        if plan is None:
            return True
        giving = sum(
            1
            for owned in self._owned.values()
            if owned.giving_up.is_set() and owned.lease.lease_owner == requester
        )
        holds = plan.loads.get(requester, 0) + giving + in_flight
        leases = sum(plan.loads.values())
        return may_give(mine, holds, leases, len(plan.live_workers | {requester}))

    def _request_budget(self, view: LeaseIndex, now: float) -> int:
        """Handoff requests open at once. Requests are answered gracefully, so many may be
        (a joiner needing 91 leases asked for one at a time: 91 round trips); but a worker
        that joins a running fleet (its first scan shows no free lease) first waits
        failover_time: in a deploy a new worker starts as an old one leaves and the leaver
        hands it its leases, and a burst of requests to everyone else before that would move
        twice as many leases as the deploy needs."""
        if self._patient_until is None:
            joined = not view.free
            self._patient_until = now + (self._settings.failover_time if joined else 0.0)
        steal = self._settings.max_leases_to_steal_at_once
        if now < self._patient_until:
            return steal
        return max(steal, self._settings.renew_concurrency)

    def _drop_declined(self, plan: TakePlan) -> None:
        """Forget open requests of owners that, as ``plan`` shows them, no longer hold more
        than their share (they decline them, see :meth:`may_give`): the budget goes to
        requests others can answer, and nothing is stolen when they time out."""
        for key, owner in self._book.requested_of().items():
            load = plan.loads.get(owner, 0)
            if not (load > plan.target or load >= plan.held + 2):
                self._book.forget_request(key)

    def _wants_free(self, view: LeaseIndex) -> bool:
        """Whether this worker may want a free or expired lease, judged on ``view`` in time
        proportional to the workers: it holds fewer leases than its share among the workers
        holding active leases (the fewest it may count, so the largest share), a lease may
        have expired, or a KCL leader assigns (then every free lease is taken)."""
        if self.defers() or self._tracker.expired_candidates(self._clock.monotonic()):
            return True
        workers = len(view.by_owner.keys() | {self._worker_id})
        share = target_for(len(view.active), workers, self._settings.max_leases_per_worker)
        return len(self._owned) < share

    def _max_takes(self, defers: bool) -> int | None:
        """At most what this worker holds (at least one batch of writes) per cycle, so that a
        hundred workers starting together do not each try every free lease (see
        :func:`plan_takes`); only where the next cycle comes soon (pick-up on: a cycle a
        second while leases are left), not in KCL's rhythm of a cycle per take interval."""
        if defers or self._settings.pickup == "off":
            return None
        takes = max(len(self._owned), self._settings.renew_concurrency)
        view, now = self._view, self._clock.monotonic()
        failover = self._settings.failover_time
        if view is None or self._first_cycle is None or now - self._first_cycle < failover:
            return takes
        # Running for a failover time, this worker has seen every live peer write within one
        # (renewals, beats, takes): the fleet is known, and its share bounds what a cycle
        # takes, not the doubling. After a split wave every worker held nothing (its parents
        # finished) and doubled from one batch, a paced scan apart (32, 64, 128 of 200 at
        # 10,000 shards under 100 workers: four rounds of 3 s).
        seen = self._tracker.staying(now, failover) | view.by_owner.keys()
        share = target_for(
            len(view.active), len(seen | {self._worker_id}), self._settings.max_leases_per_worker
        )
        return max(takes, share)

    async def _request(self, lease: Lease) -> None:
        """Ask the owner for ``lease`` instead of stealing it (see handoff_request)."""
        if (
            not self.enabled
            or self._book.is_requested(lease.lease_key)
            or asked_by_another(lease, self._worker_id)  # two joiners would overwrite each other
        ):
            return
        try:
            await self._store.request_handoff(lease, self._worker_id)
        except ShardflowError as exc:
            log.info("asking for lease %s failed: %s", lease.lease_key, exc)
            return
        log.info("asked %s to hand over lease %s", lease.lease_owner, lease.lease_key)
        self._book.requested(lease, self._clock.monotonic())

    async def _take_overdue(self, view: LeaseIndex, now: float) -> list[OwnedLease]:
        """Fall back to taking: handoffs to us whose old owner stopped renewing them, requests
        not answered in time.

        A handoff to us is never taken on a timeout while its old owner renews it: that owner
        may still be running a handler for the shard (it completes the handoff only once none
        runs). Once the lease expired (no renewal for ``failover_time`` as seen here) the old
        owner's own deadline has passed, and it is taken as any expired lease."""
        by_key = view.active
        taken: list[OwnedLease] = []
        for key in self._book.inbound():
            lease = by_key.get(key)
            if lease is None or not self._tracker.is_expired(lease, now):
                continue
            log.warning(
                "lease %s: the handoff from %s was not completed and %s stopped renewing it "
                "%.1fs ago; taking it",
                key,
                lease.checkpoint_owner,
                lease.checkpoint_owner,
                self._settings.failover_time,
            )
            owned = await self._take(PlannedTake(lease, "expired"))
            if owned is not None:
                taken.append(owned)
        overdue = self._book.overdue_requests(now)
        if overdue and self._tracker.failed_within(now, self._settings.handoff_timeout):
            # The table failed this worker's own calls lately: the owner may have been unable
            # to answer (a brownout), not unwilling (a KCL worker), and a steal from a live
            # owner runs the shard twice. Steal only once the table answered for a whole
            # handoff_timeout (bench/simulate.py's brownout phase: two owners, a request
            # unanswered through the brownout and the lease stolen from its live owner).
            overdue = []
        if overdue:
            loads = self._live_loads(view, now)
            mine = loads[self._worker_id]
            share = target_for(
                len(by_key),
                len(set(loads) | {self._worker_id}),
                self._settings.max_leases_per_worker,
            )
        for key in overdue:
            lease = by_key.get(key)
            if lease is None or lease.handoff_pending or lease.lease_owner is None:
                continue
            load = loads[lease.lease_owner]
            if not (load > share or load >= mine + 2):
                continue  # the owner holds no more than its share: it declined, rightly
            log.warning(
                "lease %s: handoff request not answered within %.1fs; taking it",
                key,
                self._settings.handoff_timeout,
            )
            owned = await self._take(PlannedTake(lease, "stolen"))
            if owned is not None:
                taken.append(owned)
        return taken

    async def _take(
        self, planned: PlannedTake, revealed: set[str] | None = None
    ) -> OwnedLease | None:
        """Take ``planned``; None if that failed. A take refused because another worker got
        the lease first adds that worker to ``revealed``."""
        if not self.enabled:
            return None
        if planned.how == "expired" and not await self._fence_holder(planned.lease):
            return None
        sent = self._clock.monotonic()
        try:
            lease = await self._store.take(planned.lease, self._worker_id)
        except LeaseConditionFailedError as exc:
            # Another worker was quicker, or the owner renewed meanwhile.
            holder = exc.current.actual_owner if exc.current is not None else None
            if revealed is not None and holder not in (None, self._worker_id):
                assert holder is not None
                revealed.add(holder)
            return None
        except ShardflowError as exc:
            self._unanswered(exc)
            log.warning("taking lease %s failed: %s", planned.lease.lease_key, exc)
            return None
        return self._adopt(planned, lease, sent)

    def _unanswered(self, exc: ShardflowError) -> None:
        """A write of this cycle failed: if the table did not answer (not a refused
        condition), this worker is blind until a call succeeds, and the take loop pauses
        before its next cycle (see LeaseCoordinator._take_loop). Ignored, a cycle whose claims
        of the leases that lapsed here all failed counted as a success: the next lapse woke
        it at once, and it tried every one of them again (2,000 leases, 20 workers, the
        table down: 19,000 refused claims in 2 s, bench/simulate.py)."""
        if isinstance(exc, AwsError) and not isinstance(exc, ConditionFailedError):
            self._tracker.blind(self._clock.monotonic())

    async def _fence_holder(self, lease: Lease) -> bool:
        """Before taking ``lease`` as expired: fence its holder's heartbeat, if it keeps one
        (see :mod:`~shardflow.leases.expiry`); False when the heartbeat turns out alive (the
        fence was refused by a beat that landed first) or the fence failed."""
        holder = lease.actual_owner
        heartbeat = self._tracker.heartbeat_of(holder) if holder is not None else None
        if heartbeat is None or heartbeat.fenced_by is not None:
            return True
        store = self._store
        assert isinstance(store, LeaseStoreBase)  # only such stores keep heartbeats
        try:
            fenced = await store.fence_heartbeat(heartbeat, self._worker_id)
        except EntityConditionFailedError as exc:
            found = entity_from_item(exc.current or {})
            now = self._clock.monotonic()
            if isinstance(found, Heartbeat):
                self._tracker.observe_heartbeats([found], now, complete=False)
                # Fenced by another worker first: expired all the same.
                return found.fenced_by is not None
            # Deleted (its worker retired it, or a peer removed it once fenced): the lease
            # is judged lease by lease from now on, and it was: expired.
            assert holder is not None
            self._tracker.forget_heartbeat(holder, now)
            return True
        except ShardflowError as exc:
            log.warning("fencing the heartbeat of %s failed: %s", holder, exc)
            return False
        log.info("heartbeat of %s expired; fenced it", holder)
        self._tracker.observe_heartbeats([fenced], self._clock.monotonic(), complete=False)
        return True

    async def _drop_fenced(self, leases: list[Lease]) -> None:
        """Delete fenced heartbeats of workers that hold no lease any more (dead workers'
        items would pile up otherwise); conditional on the heartbeat as seen."""
        fenced = [
            heartbeat
            for heartbeat in self._tracker.heartbeats
            if heartbeat.fenced_by is not None and heartbeat.worker_id != self._worker_id
        ]
        store = self._store
        if not fenced or not isinstance(store, LeaseStoreBase):
            return  # as a rule: no pass over every lease of the scan
        holders = {lease.actual_owner for lease in leases}
        doomed = [heartbeat for heartbeat in fenced if heartbeat.worker_id not in holders]
        for heartbeat in doomed:
            with contextlib.suppress(ShardflowError):
                await store.delete_heartbeat(heartbeat)
            self._tracker.forget_heartbeat(heartbeat.worker_id, self._clock.monotonic())

    async def _resume(self, view: LeaseIndex, *, how: AcquiredHow) -> list[OwnedLease]:
        """Hold the leases that name this worker already and are not held here: at start
        (KCL's renewer does the same: after a restart with the same worker id they need not
        expire first), and with handoffs whenever a handoff to this worker completed.
        Renewing is the claim, conditional on the counter seen, so a live holder of the same
        id loses them as it would to a steal."""
        mine = [
            lease
            for lease in view.owned_by(self._worker_id)
            if lease.checkpoint_owner is None and lease.lease_key not in self._owned
        ]
        resumed: list[OwnedLease] = []

        async def resume(lease: Lease) -> None:
            owned = await self.claim(lease, how)
            if owned is not None:
                resumed.append(owned)

        self._mine_left = False
        if mine and self._tracker.is_blind:
            # The table has not answered this worker since a call failed: one claim first,
            # the rest only if it was answered. Every lease that lapsed here in an outage was
            # claimed again each cycle, all of them failing (100 a worker, every pause).
            sent = self._clock.monotonic()
            await resume(mine[0])
            if self._tracker.failed_since(sent):
                self._mine_left = True
                return resumed
            mine = mine[1:]
        await run_bounded(mine, resume, concurrency=self._settings.renew_concurrency)
        self._mine_left = any(
            lease.lease_key not in self._owned and lease.lease_key not in self.expiring
            for lease in mine
        )
        return resumed

    async def _complete_stranded(self, view: LeaseIndex) -> None:
        """Complete the handoffs this worker began on leases it no longer holds (and runs no
        handler of): its hold lapsed meanwhile (a lease-table outage). Nobody else completes
        them: the successor waits for the lease to expire, and in the heartbeat mode a lease
        whose checkpoint owner beats never does, so the shard stayed without a worker for good
        (bench/simulate.py --short, heartbeat mode: 6 shards unowned from the brownout on).
        Conditional on the handoff as seen; the successor then claims the lease."""
        stranded = [
            lease
            for lease in view.handed_by(self._worker_id)
            if lease.lease_key not in self._owned
            and lease.lease_key not in self.expiring  # a handler of its shard may still run
            and lease.lease_key not in self._claiming
            and lease.lease_owner not in (None, self._worker_id)
        ]
        if not stranded or not self.enabled:
            return

        async def complete(lease: Lease) -> None:
            try:
                await self._store.complete_handoff(lease, self._worker_id)
            except ShardflowError as exc:
                log.info("completing the handoff of lease %s failed: %s", lease.lease_key, exc)
                return
            log.info(
                "completed the handoff of lease %s to %s (no longer held here)",
                lease.lease_key,
                lease.lease_owner,
            )

        await run_bounded(stranded, complete, concurrency=self._settings.renew_concurrency)

    async def claim(
        self, lease: Lease, how: AcquiredHow, *, quiet: bool = False
    ) -> OwnedLease | None:
        """Hold ``lease``, which names this worker as its owner with no handoff pending (as
        seen, or as expected), by renewing it conditionally on the counter seen; None if that
        failed (``quiet``: a refusal is expected at times and logged at debug level only)."""
        key = lease.lease_key
        known = self._view.get(key) if self._view is not None else None
        if known is not None and known.lease_counter > lease.lease_counter:
            # A later image is known (this worker's own release, say, read before the stream
            # showed it): claim that one, or nothing. Claims of such stale images were
            # refused writes: after a split wave of 10,000 shards under 100 workers, 72,000
            # claims of the parents each worker had just finished and released, in 6.5
            # simulated seconds (bench/simulate.py, heartbeat mode, profiled).
            lease = known
        if (
            not self.enabled
            or lease.checkpoint.sequence_number == SHARD_END  # finished: never held again
            or key in self._owned
            or key in self._claiming  # one claim at a time: a second would renew ours away
            or key in self.expiring  # a handler of its shard may still run here
            or lease.lease_owner != self._worker_id
            or lease.checkpoint_owner is not None
        ):
            return None
        self._claiming.add(key)
        try:
            sent = self._clock.monotonic()
            try:
                renewed = await self._store.renew(lease, self._worker_id)
            except LeaseConditionFailedError as exc:
                current = exc.current
                if current is not None:
                    # The lease as it is now: the next cycle plans on it, not on the image
                    # that was refused (a view whose counter lags would be refused each time).
                    self._tracker.observe([current], self._clock.monotonic(), complete=False)
                    self._update_view([current], [])
                log.log(
                    logging.DEBUG if quiet else logging.INFO, "not claiming lease %s: %s", key, exc
                )
                return None
            except ShardflowError as exc:
                self._unanswered(exc)
                log.log(
                    logging.DEBUG if quiet else logging.INFO, "not claiming lease %s: %s", key, exc
                )
                return None
            # With the write's own time: on a slow table the claim's wait is mostly here.
            took = self._clock.monotonic() - sent
            log.info("claimed lease %s (%s; write %.3f s)", key, how, took)
            return self._adopt(PlannedTake(lease, how), renewed, sent)
        finally:
            self._claiming.discard(key)

    def _look_at_finished(self, view: LeaseIndex, now: float) -> None:
        """Finished leases (SHARD_END) whose item or children changed since the last cycle:
        each is reported (``on_finished``); one whose children lack leases asks for a shard
        sync once they still lack them ``failover_time`` after this worker first saw it so
        (once; the periodic sync keeps trying); one whose children all have leases that
        started is left for :meth:`_clean_up` (as KCL).

        Why not at once: the owner that wrote SHARD_END creates the children's leases with
        its next writes (:meth:`LeaseCoordinator.shard_ended`), and a peer's read often falls
        between the two. Asking then made every worker list the whole stream once per read
        while shards ended: a split wave of 10,000 shards under 100 workers ran 1,600 syncs
        (each listing 30,000 shards) in 2 simulated seconds, 95 % of the simulation's time
        (bench/simulate.py, profiled), and a fleet as many ListShards calls. A sync is needed
        only when that owner stopped in between; by ``failover_time`` its lease would have
        lapsed too."""
        missing = self._children_missing
        for key in view.take_touched():
            self.on_finished(key)
            kids = view.children.get(key)
            known = kids is not None and all(
                kid in view.active or kid in view.finished for kid in kids
            )
            if known:
                missing.pop(key, None)
                self._sync_asked.discard(key)  # done: nothing left to ask for
            elif key not in self._sync_asked:
                missing.setdefault(key, now)
            started = kids is not None and all(
                (kid_lease := view.get(kid)) is not None
                and kid_lease.checkpoint.sequence_number not in _NOT_STARTED
                for kid in kids
            )
            if started:
                self._cleanable[key] = None
            else:
                self._cleanable.pop(key, None)
        # In order of first sight: only the overdue head of the dict is looked at.
        due = []
        for key, since in missing.items():
            if now - since < self._settings.failover_time:
                break
            due.append(key)
        asked = False
        for key in due:
            del missing[key]
            if key in view.finished:  # children seen since would have removed it above
                self._sync_asked.add(key)
                asked = True
        if len(self._sync_asked) > 2 * len(view.finished) + SYNC_ASKED_SLACK:
            # Finished leases deleted since they asked (cleaned up once their children
            # started) are never touched again: forgotten here, in a pass that runs only once
            # the set has doubled past the finished leases, so it costs O(1) per entry.
            # Without it the set grew by every shard that ever ended without its children's
            # leases in sight, for the worker's whole life.
            finished = view.finished
            self._sync_asked = {key for key in self._sync_asked if key in finished}
        if asked:
            self._want_sync()

    async def _clean_up(self, view: LeaseIndex) -> None:
        """Delete finished leases whose children all have leases that started (as KCL)."""
        doomed = []
        for key in list(self._cleanable):
            lease = view.get(key)
            if lease is None or key not in view.finished:
                del self._cleanable[key]
            elif key not in self._owned:
                doomed.append(lease)

        async def delete(lease: Lease) -> None:
            # Conditional on the counter and owner seen: a lease that moved on is left alone.
            with contextlib.suppress(ShardflowError):
                await self._store.delete(lease)
                log.info("deleted the lease of finished shard %s", lease.lease_key)

        await run_bounded(doomed, delete, concurrency=self._settings.renew_concurrency)

    def _live_loads(self, view: LeaseIndex, now: float) -> Counter[str]:
        """Active leases per owner, those expired at ``now`` left out."""
        loads = Counter({owner: len(keys) for owner, keys in view.by_owner.items()})
        active = view.active
        for key in self._tracker.expired_candidates(now):
            lease = active.get(key)
            if (
                lease is not None
                and lease.lease_owner is not None
                and self._tracker.is_expired(lease, now)
            ):
                loads[lease.lease_owner] -= 1
        return +loads

    def _note_peers(self, live: frozenset[str]) -> None:
        peers = live - {self._worker_id}
        for peer in sorted(peers - self._peers):
            self._events.emit(WorkerJoined, peer_id=peer)
        for peer in sorted(self._peers - peers):
            self._events.emit(WorkerLeft, peer_id=peer)
        self._peers = peers
