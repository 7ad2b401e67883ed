"""Lease expiry as one worker observes it, on its own clock (clocks of workers need not agree).

A held lease is expired when its ``leaseCounter`` has not changed for ``failover_time`` since
this observer first saw that counter value; a lease nobody holds is free at once. The first
sighting of a lease starts its clock, so after a restart a crashed worker's leases are taken
one failover time later, as in KCL.

Time during which this observer could not read the table does not count against a lease:
after an outage of the lease table every lease looks unchanged for longer than failover_time
(nobody could write), although their owners only could not renew. Silence that this
observer could not have seen is no evidence that an owner died; a lease expires once it has
stayed unchanged for failover_time of the time this observer could read (:meth:`blind`).

Nor is the moment the table answers again: its owners need that moment too, to get a write
through. After a blind stretch of at least :data:`LONG_BLIND` of failover_time, nothing
expires for this observer until it has seen ``grace`` seconds more (the renew interval, given
by the taker): one round in which every owner renews, beats or claims again what lapsed. An
observer that saw again first fenced the heartbeat of a worker whose beat was a moment
behind, and took its leases: one move each, for a worker that was alive all along
(bench/simulate.py's brownout). Patience costs a takeover time, never safety; a table that
answers this observer throughout (every crash without a brownout) costs nothing.

Heartbeats (the ``heartbeat`` lease mode, :mod:`~shardflow.leases.entities`): a worker that
keeps a heartbeat item need not renew its leases one by one. One rule serves every worker,
whatever mode it runs in, so that a fleet half-way through a switch of modes stays safe: a
held lease is expired when its counter has not changed for ``failover_time`` **and** its
holder keeps no heartbeat or its heartbeat is expired (fenced, or its counter unchanged for
``failover_time`` on this observer's clock; while its worker is seen writing other items, for
``failover_time`` after its last such write and at most twice ``failover_time``: see
:meth:`ExpiryTracker._heartbeat_until`). The holder may use the lease until
``failover_time - safety_margin`` after the later of its last lease write and its last
heartbeat, so both must be silent. A heartbeat judged expired is fenced
(:func:`~shardflow.leases.entities.fence`) before a lease of its worker is taken.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final

from shardflow.leases.entities import Heartbeat
from shardflow.leases.expiry_schedule import ExpirySchedule
from shardflow.leases.handoff_request import (
    HANDOFF_REQUEST,
    LEAVING,
    handoff_request_of,
    leaving_owner_of,
)
from shardflow.leases.model import Lease
from shardflow.records import SHARD_END

LONG_BLIND: Final = 0.1
"""A blind stretch at least this fraction of failover_time long (1 s at the default 10 s)
is followed by ``grace`` (see the module doc); shorter ones, a failure among successes, are
not."""


@dataclass(frozen=True, slots=True)
class _Sighting:
    counter: int
    owner: str | None
    checkpoint_owner: str | None
    since: float
    request: object = None
    """The handoff request attribute as seen (a joiner's own write)."""


@dataclass(frozen=True, slots=True)
class _Beat:
    heartbeat: Heartbeat
    since: float


class ExpiryTracker:
    """Remembers, per lease key, since when the lease has looked the same to this observer."""

    def __init__(
        self, failover_time: float, *, worker_id: str | None = None, grace: float = 0.0
    ) -> None:
        """``worker_id``: the observer's own id, when it asks :meth:`next_expiry` for the
        leases of the others (answered from the schedule, not a pass over every lease).
        ``grace``: seconds of seeing after a long blind stretch before anything expires (see
        the module doc)."""
        if not failover_time > 0:
            raise ValueError(f"failover_time must be positive, got {failover_time}")
        if grace < 0:
            raise ValueError(f"grace must not be negative, got {grace}")
        self._failover = failover_time
        self._grace = grace
        self._floor = -math.inf
        """Nothing expires before this moment of the tracked clock: ``grace`` after the last
        long blind stretch ended (see the module doc)."""
        self._me = worker_id
        self._seen: dict[str, _Sighting] = {}
        self._schedule = ExpirySchedule()
        """Every sighting with a holder, by holder and failover moment (see
        :mod:`~shardflow.leases.expiry_schedule`)."""
        self._renewed: dict[str, float] = {}
        self._excused = 0.0
        """Seconds of blind stretches ended so far. Sightings, beats and proofs of life are
        kept on the observer's clock minus this (:meth:`_tracked`), so that ending a blind
        stretch moves every one of them on at once (:meth:`_excuse`) instead of rewriting
        each: in a brownout a per-lease worker goes blind and sees again a few times a
        second, and each time rewrote all 10,000 sightings and rebuilt the schedule
        (bench/simulate.py at 10,000 leases x 100 workers: most of a brownout's wall time)."""
        self._blind_since: float | None = None
        self._failed_at: float | None = None
        self._beats: dict[str, _Beat] = {}
        """Worker id -> its heartbeat as last seen, and since when it looks so."""
        self._kept: dict[str, float] = {}
        """Worker id -> when it was last seen writing a lease it already held (a renewal or a
        checkpoint): how a worker that keeps no heartbeat shows itself."""
        self._pruned_at = -math.inf
        self._beat_gone: dict[str, float] = {}
        """Worker id -> when its heartbeat item was seen gone (deleted by a worker that left,
        or that went back to the per-lease mode): it is of a version with the heartbeat mode,
        so its last lease writes do not make it one without (see
        :meth:`lease_keepers_without_heartbeat`)."""
        self._said_leaving: dict[str, float] = {}
        """Worker id -> when (tracked clock) it was last seen saying on a lease that it leaves
        (``shardflowLeaving``): no longer one of the fleet that :meth:`staying` counts."""
        self._released: dict[str, float] = {}
        """Worker id -> when (tracked clock) it was last seen releasing a lease of a shard that
        had not ended: a worker stopping without handoffs releases what it holds."""

    @property
    def is_blind(self) -> bool:
        """A call failed and none succeeded since (see :meth:`blind`)."""
        return self._blind_since is not None

    def blind(self, now: float) -> None:
        """A call of this observer to the table failed at ``now``: until one succeeds again
        (:meth:`answered`, or a complete scan), that stretch does not count towards any
        lease's expiry. A single failure among successes costs nothing: the stretch ends at
        the next success, moments later."""
        self._failed_at = now
        if self._blind_since is None:
            self._blind_since = now

    def answered_since(self, moment: float) -> bool:
        """Whether a call of this observer succeeded after ``moment`` (or none failed)."""
        since = self._blind_since
        return since is None or since > moment

    def failed_since(self, moment: float) -> bool:
        """Whether a call of this observer to the table failed at or after ``moment``."""
        return self._failed_at is not None and self._failed_at >= moment

    def judged_at(self, now: float) -> float:
        """The moment expiry is judged at, asked at ``now``: ``now``, or while this observer
        is blind the moment it went blind. What a call answered at ``now`` would excuse
        (:meth:`answered`) counts for no lease already, so a take cycle planned on what the
        table's stream showed need not scan first to end the blind stretch: in a brownout
        (half of all calls failing) a worker is blind most of the time, and every cycle
        that woke then scanned the whole table (bench/simulate.py, 10,000 leases: 521 Scan
        pages per worker-minute in the brownout, 1,818 read units a minute steady became
        105,197)."""
        since = self._blind_since
        return since if since is not None and since < now else now

    def failed_within(self, now: float, seconds: float) -> bool:
        """Whether a call of this observer to the table failed in the last ``seconds``."""
        return self._failed_at is not None and now - self._failed_at < seconds

    def answered(self, now: float) -> None:
        """A call of this observer to the table succeeded at ``now``: a blind stretch ends."""
        if self._blind_since is not None:
            self._excuse(now)

    def _excuse(self, now: float) -> None:
        """The blind stretch ended at ``now``: every sighting's clock moves on by its length
        (all at once: they are kept net of the stretches excused, see ``_excused``)."""
        since, self._blind_since = self._blind_since, None
        if since is None or now <= since:
            return
        self._excused += now - since
        if self._grace and now - since >= LONG_BLIND * self._failover:
            self._floor = max(self._floor, self._tracked(now) + self._grace)

    def _in_grace(self, now: float) -> bool:
        """Whether nothing expires at ``now`` for the grace after a long blind stretch (see
        the module doc): in it, or blind for long already (a call answered now would start
        one: judged so at once, for a cycle planned while still blind)."""
        if not self._grace:
            return False
        since = self._blind_since
        if since is not None and now - since >= LONG_BLIND * self._failover:
            return True
        return self._tracked(self.judged_at(now)) < self._floor

    def _tracked(self, now: float) -> float:
        """``now`` on the clock the sightings are kept on (net of the stretches excused)."""
        return now - self._excused

    def observe_heartbeats(
        self, heartbeats: Iterable[Heartbeat], now: float, *, complete: bool = True
    ) -> None:
        """Record heartbeat items as read at ``now``; with ``complete`` (a whole-table scan)
        workers whose item is missing keep no heartbeat. A changed counter is proof of life."""
        present: set[str] = set()
        at = self._tracked(now)
        for heartbeat in heartbeats:
            worker = heartbeat.worker_id
            present.add(worker)
            previous = self._beats.get(worker)
            if previous is not None and previous.heartbeat == heartbeat:
                continue
            if (
                previous is not None
                and previous.heartbeat.counter != heartbeat.counter
                and heartbeat.fenced_by is None
            ):
                self._renewed[worker] = at
            self._beats[worker] = _Beat(heartbeat, at)
        if complete:
            for worker in self._beats.keys() - present:
                self.forget_heartbeat(worker, now)

    def lease_keepers_without_heartbeat(self, now: float, seconds: float) -> set[str]:
        """Workers seen renewing or checkpointing a lease they hold within ``seconds``, that
        keep no heartbeat: KCL 2.x workers, or shardflow versions without the heartbeat mode
        (both judge expiry lease by lease, and would take a heartbeat worker's leases)."""
        self._prune(now)
        gone = self._beat_gone
        for worker, at in list(gone.items()):
            # Forgotten once its lease writes no longer count either (bounded memory).
            if now - at > seconds and now - self._kept.get(worker, -math.inf) > seconds:
                del gone[worker]
        # A worker whose heartbeat was seen and then deleted is not one of them: a graceful
        # leaver checkpoints its last records and says on a lease that it leaves, then deletes
        # its heartbeat once it holds nothing. Counted as a worker without the heartbeat mode,
        # every leave put the whole fleet on renewals lease by lease (and on a scan every
        # poll) for a failover time: throughout a rolling restart (bench/fleet.py, 128 shards).
        return {
            worker
            for worker, at in self._kept.items()
            if now - at <= seconds and worker not in self._beats and worker not in gone
        }

    def forget_heartbeat(self, worker_id: str, now: float) -> None:
        """The worker's heartbeat item was seen deleted at ``now``."""
        if self._beats.pop(worker_id, None) is not None:
            self._beat_gone[worker_id] = now

    def heartbeat_of(self, worker_id: str) -> Heartbeat | None:
        """The worker's heartbeat as last seen; None: it keeps none (as far as seen)."""
        beat = self._beats.get(worker_id)
        return None if beat is None else beat.heartbeat

    @property
    def heartbeats(self) -> list[Heartbeat]:
        return [beat.heartbeat for beat in self._beats.values()]

    def heartbeat_lapsed(self, worker_id: str, now: float) -> bool:
        """Whether the worker keeps a heartbeat that is expired (fenced, or silent as seen
        here for as long as :meth:`_heartbeat_until` says). False for a worker that keeps
        none."""
        if worker_id not in self._beats:
            return False
        until = self._heartbeat_until(worker_id)
        if until is None:
            return True  # fenced
        return not self._in_grace(now) and self._tracked(now) >= until

    def _heartbeat_until(self, worker_id: str | None) -> float | None:
        """When the worker's heartbeat expires as last seen, on the tracked clock (None: it
        keeps none or it is fenced, which counts as expired already).

        Unchanged for failover_time, as a lease; but while its worker is seen writing (its
        leases renewed one by one, a take, a request: :meth:`renewed_within`) only its beats
        fail, and it expires once that worker has been silent for failover_time, or its beat
        for twice that. A worker whose beats fail renews its leases one by one meanwhile;
        when half the table's calls fail, some of those beats fail several times in a row,
        and a peer fenced the heartbeat of a worker whose renewals were landing: every lease
        it had not renewed in that stretch moved (bench/simulate.py's brownout, 10,000 x 100:
        88 leases taken as expired). The bound keeps a worker whose beats alone fail for good
        from holding leases it gave up on for longer than one more failover time."""
        beat = self._beats.get(worker_id) if worker_id is not None else None
        if beat is None or beat.heartbeat.fenced_by is not None:
            return None
        assert worker_id is not None
        wrote = self._renewed.get(worker_id, -math.inf)
        return min(beat.since + 2 * self._failover, max(beat.since, wrote) + self._failover)

    def observe(self, leases: Iterable[Lease], now: float, *, complete: bool = True) -> None:
        """Record a table scan taken at ``now`` (monotonic seconds of this observer).

        With ``complete`` the scan is the whole table: leases missing from it are forgotten
        (and a blind stretch before it ends, see :meth:`blind`).
        """
        if complete and self._blind_since is not None:
            self._excuse(now)
        self._prune(now)
        at = self._tracked(now)
        seen = self._seen
        present: set[str] = set()
        for lease in leases:
            key = lease.lease_key
            if complete:
                present.add(key)
            previous = seen.get(key)
            # Owner changes are counted as changes too: a handoff moves the lease without
            # bumping the counter, and the new holder deserves a fresh failover time.
            extra = lease.extra
            request = extra.get(HANDOFF_REQUEST) if extra else None
            if extra and LEAVING in extra:
                leaver = leaving_owner_of(lease)
                if leaver is not None:
                    self._said_leaving[leaver] = at
            counter = lease.lease_counter
            if previous is None:
                self._sight(
                    key, _Sighting(counter, lease.lease_owner, lease.checkpoint_owner, at, request)
                )
                continue
            if previous.counter != counter or request is not None:
                self._note_writers(previous, lease, request, now)
            if (
                previous.counter != counter
                or previous.owner != lease.lease_owner
                or previous.checkpoint_owner != lease.checkpoint_owner
            ):
                self._sight(
                    key, _Sighting(counter, lease.lease_owner, lease.checkpoint_owner, at, request)
                )
            elif request != previous.request:
                seen[key] = replace(previous, request=request)
        if complete:
            for key in seen.keys() - present:
                del seen[key]
                self._schedule.forget(key)

    def _sight(self, key: str, sighting: _Sighting) -> None:
        self._seen[key] = sighting
        self._schedule.set(key, _holder(sighting), sighting.since + self._failover)

    def renewed(self, leases: Iterable[Lease], now: float) -> None:
        """Record renewals read from the table's stream at ``now``: changes that moved only a
        lease's counter (same owner, same checkpoint owner, same handoff request). What
        :meth:`observe` would record for them, without its general comparisons (a worker of a
        per-lease fleet reads every renewal of every worker: 3,000 a second at 10,000
        leases); any lease not seen so as last time goes through :meth:`observe`."""
        self._prune(now)
        seen = self._seen
        at = self._tracked(now)
        odd: list[Lease] = []
        moved: list[str] = []
        owners: set[str] = set()
        for lease in leases:
            key = lease.lease_key
            previous = seen.get(key)
            owner = lease.lease_owner
            extra = lease.extra
            request = extra.get(HANDOFF_REQUEST) if extra else None
            if (
                previous is None
                or owner is None
                or previous.owner != owner
                or previous.checkpoint_owner != lease.checkpoint_owner
                or previous.request != request
            ):
                odd.append(lease)
                continue
            if extra and LEAVING in extra:
                leaver = leaving_owner_of(lease)
                if leaver is not None:
                    self._said_leaving[leaver] = at
            if previous.counter != lease.lease_counter:
                seen[key] = _Sighting(
                    lease.lease_counter, owner, lease.checkpoint_owner, at, request
                )
                moved.append(key)
                owners.add(owner)
        # The same holders: only their moments move, all to the same one (read together).
        self._schedule.renewed_at(moved, at + self._failover)
        for owner in owners:
            self._kept[owner] = now
            self._renewed[owner] = at
        if odd:
            self.observe(odd, now, complete=False)

    def _note_writers(self, previous: _Sighting, lease: Lease, request: object, now: float) -> None:
        """Who must have been alive for ``lease`` to change from ``previous``: proof of life
        for :meth:`renewed_within`."""
        owner = lease.lease_owner
        at = self._tracked(now)
        if owner is not None and previous.counter != lease.lease_counter:
            same_holder = (
                previous.owner == owner and previous.checkpoint_owner == lease.checkpoint_owner
            )
            taken = previous.owner != owner and previous.checkpoint_owner is None
            if same_holder:
                self._kept[owner] = now
            if same_holder or (taken and lease.checkpoint_owner is None):
                # The same owner wrote again (a renewal or a checkpoint), or a worker took the
                # lease for itself. (A handover changes the checkpoint owner too, and is written
                # by the old owner: no proof that the new one lives.)
                self._renewed[owner] = at
        elif (
            owner is None
            and previous.owner is not None
            and previous.counter != lease.lease_counter
            and lease.checkpoint.sequence_number != SHARD_END
        ):
            # Released, and not because its shard ended (each worker does that at a split and
            # goes on): what a worker stopping without handoffs does with everything it holds.
            self._released[previous.owner] = at
        if request is not None and request != previous.request:
            # A joiner asked for the lease: its own write, moments ago.
            parsed = handoff_request_of(lease)
            if parsed is not None:
                self._renewed[parsed.requester] = at

    def renewed_within(self, worker_id: str, now: float, seconds: float) -> bool:
        """Whether this observer saw ``worker_id`` write in the last ``seconds``: renew or
        checkpoint one of its leases, take one, or ask for one. Proof of life, which a
        handover to it is not. ``seconds``: at most twice the failover time (older proofs are
        forgotten, see :meth:`seen_writing`)."""
        last = self._renewed.get(worker_id)
        return last is not None and self._tracked(now) - last <= seconds

    def seen_writing(self, now: float, seconds: float) -> set[str]:
        """The workers :meth:`renewed_within` ``seconds`` of ``now``. Workers last seen
        writing longer ago than twice the failover time are forgotten here and, at most once
        a failover time, on every read (:meth:`_prune`): every worker id a fleet ever had
        would otherwise stay, and be walked, for the process's life (a rolling restart brings
        new ids each time)."""
        self._prune(now, force=True)
        tracked = self._tracked(now)
        return {worker for worker, at in self._renewed.items() if tracked - at <= seconds}

    def staying(self, now: float, seconds: float) -> set[str]:
        """The workers :meth:`seen_writing` ``seconds`` of ``now``, less those known to be
        leaving or gone: seen saying on a lease that they leave, releasing a lease of a shard
        that had not ended with no write of theirs since (a worker stopping without handoffs),
        or whose heartbeat was seen deleted with no lease write of theirs since (a graceful
        leaver deletes it once it holds nothing; a worker gone back to the per-lease mode goes
        on renewing).

        The fleet a take cycle balances over, beyond the workers holding live leases: after a
        split wave every worker has released its finished parents before it takes a child,
        and for that moment holds nothing. Counted by their leases alone, half a fleet of 10
        was invisible to a taker that scanned then, which took twice its share and the fleet
        handed the surplus back (bench/simulate.py, 1,000 shards split under 10 workers:
        2,737 moves for 2,000). Leavers left out, a scale-in does not wait a failover time for
        the workers that left to stop counting."""
        writers = self.seen_writing(now, seconds)
        said, gone, beats, kept = self._said_leaving, self._beat_gone, self._beats, self._kept
        released, renewed = self._released, self._renewed
        return {
            worker
            for worker in writers
            if worker not in said
            and released.get(worker, -math.inf) < renewed[worker]
            and not (
                worker in gone
                and worker not in beats
                and kept.get(worker, -math.inf) <= gone[worker]
            )
        }

    def _prune(self, now: float, *, force: bool = False) -> None:
        """Forget the workers not seen writing within twice the failover time (every question
        asks about at most one); unless ``force``d, at most once a failover time, so that the
        reads that call it (every view) do not walk every worker each time."""
        if not force and now - self._pruned_at < self._failover:
            return
        self._pruned_at = now
        horizon = 2 * self._failover
        tracked = self._tracked(now)
        renewed, kept = self._renewed, self._kept
        for worker in [w for w, at in renewed.items() if tracked - at > horizon]:
            del renewed[worker]
        for worker in [w for w, at in kept.items() if now - at > horizon]:
            del kept[worker]
        for marks in (self._said_leaving, self._released):
            for worker in [w for w, at in marks.items() if tracked - at > horizon]:
                del marks[worker]

    @property
    def writers_remembered(self) -> int:
        """Worker ids kept as seen writing (:meth:`seen_writing` bounds them)."""
        return len(self._renewed.keys() | self._kept.keys())

    def unchanged_since(self, lease_key: str) -> float | None:
        """When this observer first saw the lease as it is now (None: never seen)."""
        sighting = self._seen.get(lease_key)
        return None if sighting is None else sighting.since + self._excused

    def is_expired(self, lease: Lease, now: float) -> bool:
        """Whether ``lease`` may be taken as expired at ``now``.

        Free leases are expired at once. A lease this observer has never seen, or has seen
        with another counter, is not expired: its clock starts when :meth:`observe` sees it.
        While this observer is blind, judged at the moment it went blind (:meth:`judged_at`).
        """
        if lease.is_free:
            return True
        sighting = self._seen.get(lease.lease_key)
        if sighting is None or sighting.counter != lease.lease_counter:
            return False
        if self._in_grace(now):
            return False
        now = self.judged_at(now)
        # The schedule's own comparison (failover moment <= now), so that the two agree to
        # the last bit (a silence of exactly failover_time, net of excused stretches).
        if self._tracked(now) < sighting.since + self._failover:
            return False
        holder = lease.actual_owner
        if holder is not None and holder in self._beats:
            return self.heartbeat_lapsed(holder, now)
        return True

    def expires_at(self, lease: Lease) -> float | None:
        """When ``lease`` (as last observed) expires for this observer; None: not observed."""
        sighting = self._seen.get(lease.lease_key)
        if sighting is None or sighting.counter != lease.lease_counter:
            return None
        beat = self._heartbeat_until(lease.actual_owner)
        moment = max(
            sighting.since + self._failover,
            beat if beat is not None else -math.inf,
            self._floor,
        )
        return moment + self._excused

    def forget(self, lease_keys: Iterable[str]) -> None:
        """Drop what was seen of leases whose items are gone."""
        for key in lease_keys:
            self._seen.pop(key, None)
            self._schedule.forget(key)

    def next_expiry(self, after: float, *, holder_not: str) -> float | None:
        """The earliest moment later than ``after`` at which a lease observed as held by a
        worker other than ``holder_not`` expires, if it does not change before; None: none.

        Lets a worker check a lease exactly when it would expire instead of at its next
        take cycle, which bounds takeover after a crash by failover time plus the read.
        For the observer's own ``worker_id`` (given at construction) the answer comes from the
        schedule, in time proportional to the holders, not the leases.
        """
        schedule = self._schedule
        tracked = self._tracked(after)
        if self._seen and self._in_grace(after):
            # Leases due by then expire at the floor, none before it: a look then (at most
            # one cycle that finds nothing due). Blind for long: a grace after the first
            # answer, at the earliest.
            if self._blind_since is not None:
                return after + self._grace
            return self._floor + self._excused
        if holder_not == self._me and tracked >= schedule.advanced_to:
            moment = schedule.next_moment(
                tracked, holder_not=holder_not, beat_until=self._heartbeat_until
            )
            return None if moment is None else moment + self._excused
        return self.next_expiry_by_scan(after, holder_not=holder_not)

    def next_expiry_by_scan(self, after: float, *, holder_not: str) -> float | None:
        """:meth:`next_expiry` by a pass over every sighting (the definition)."""
        moment = self._next_by_scan(self._tracked(after), holder_not=holder_not)
        return None if moment is None else moment + self._excused

    def _next_by_scan(self, after: float, *, holder_not: str) -> float | None:
        moments = []
        for sighting in self._seen.values():
            holder = sighting.checkpoint_owner or sighting.owner
            if holder is None or holder == holder_not:
                continue
            moment = sighting.since + self._failover
            beat = self._heartbeat_until(holder)
            if beat is not None:
                moment = max(moment, beat)
            if moment > after:
                moments.append(moment)
        return min(moments, default=None)

    def expired_candidates(self, now: float) -> list[str]:
        """Keys of the leases that may be expired at ``now`` (a superset of those
        :meth:`is_expired` accepts, free leases aside): those unchanged for failover_time whose
        holder keeps no heartbeat or a lapsed one. Proportional to the holders and the leases
        returned, not to every lease observed."""
        keys: list[str] = []
        if self._in_grace(now):
            return keys
        now = self.judged_at(now)
        for holder, due in self._schedule.due(self._tracked(now)).items():
            if holder in self._beats and not self.heartbeat_lapsed(holder, now):
                continue  # its heartbeat keeps every one of them
            keys.extend(due)
        return keys

    def __len__(self) -> int:
        return len(self._seen)


def _holder(sighting: _Sighting) -> str | None:
    return sighting.checkpoint_owner or sighting.owner
