"""How one worker moves leases by plan: handoff requests honoured, leaving, and pick-up.

The coordinator's renewals, take cycles and pick-up feed every fresh view of a lease through
:meth:`LeaseMoves.consider` (a held lease asked for is handed over) and every change read from
the lease table's stream through :meth:`LeaseMoves.picked_up` (a lease handed here is claimed
at once; a lease that moved wakes the take cycle). :meth:`LeaseMoves.leave` hands every held
lease to the least loaded live workers before a graceful stop; from then on, leases handed to
this worker are passed on (:meth:`LeaseMoves.pass_on`): two workers stopping at the same moment
may each have chosen the other, and neither may end with the other's leases.
"""

from __future__ import annotations

import logging
import random
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import replace
from typing import Any

from shardflow.clock import Clock
from shardflow.errors import ShardflowError
from shardflow.leases.concurrency import run_bounded
from shardflow.leases.handoff_request import (
    FRESH_RENEWALS,
    handoff_request_of,
    leaving_word_age,
)
from shardflow.leases.handoffs import said_leaving, successors
from shardflow.leases.model import Lease
from shardflow.leases.owned import OwnedLease
from shardflow.leases.pickup import LeaseChanges, LeaseView, PollingChanges, StreamChanges
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.store import LeaseStore
from shardflow.leases.streams import StreamSet
from shardflow.leases.taker import LeaseTaker
from shardflow.records import SHARD_END

log = logging.getLogger("shardflow.leases")

HANDOFFS_IN_FLIGHT = 4
"""Handoffs a leaving worker has under way to any one successor at once (begun, and not yet
claimed by it); the rest of that successor's share follows as these are claimed. A lease
still draining here a pick-up interval after its handoff began no longer counts: its handler
is slow, not the successor, and waiting on it would only make the leave longer. A rolling
restart at 128 shards (bench/fleet.py, 8 workers on 2 cores) handed 13 leases at once to the
replacement that had just started: it claimed them together and started 13 shards on one busy
event loop, each reader 0.03-0.18 s late and its first records 0.1-0.3 s after that, and all
eight pauses over 1 s were among them (shards a worker claimed 3 at most at a time paused
0.83 s at most). Meanwhile the leaver keeps handling the shards it still holds."""


LEAVE_RESCAN = 1.0
"""Seconds between full scans of the lease table while leaving, when the table's stream
keeps this worker's view of it (pick-up ``stream``); every pick-up interval otherwise. Two
workers leaving 64 shards on moto scanned it ten times a second between them, each scan of
64 items ~20 ms of a server that answers one request at a time (a conditional write: ~3 ms),
just when their handovers and the successors' claims queue there."""


class LeaseMoves:
    """Planned handoffs and pick-up for one worker (see the module doc)."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        worker_id: str,
        settings: LeaseSettings,
        clock: Clock,
        streams: StreamSet,
        owned: Mapping[str, OwnedLease],
        taker: LeaseTaker,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        take_cycle: Callable[[list[Lease]], Awaitable[object]],
        wake_taker: Callable[[], None],
        lease_streams: Any | None,
        rng: random.Random | None = None,
    ) -> None:
        self._rng = rng
        """The worker's random source (retry jitter): seeded, a simulated fleet repeats."""
        self._store = store
        self._worker_id = worker_id
        self._settings = settings
        self._clock = clock
        self._streams = streams
        self._owned = owned
        self._taker = taker
        self._spawn = spawn
        self._take_cycle = take_cycle
        self._planned = False
        """The take cycle on the last complete view ran to its end (see picked_up)."""
        self._wake_taker = wake_taker
        self._lease_streams = lease_streams
        self._images: dict[str, tuple[str | None, str | None]] = {}
        self._handing: set[str] = set()
        self._declining: set[str] = set()
        self._view: dict[str, Lease] = {}
        """While leaving: the table as last seen (the leave's scan, then pick-up's changes),
        for choosing who gets a lease passed on."""
        self._passing: set[str] = set()
        self._word_on: str | None = None
        """The lease carrying this worker's word that it leaves (handed over last)."""
        self._leavers: set[str] = set()
        """While leaving: the peers seen saying that they leave (never successors)."""
        self._handed_to: dict[str, tuple[str, OwnedLease, float]] = {}
        """While leaving: each lease this worker began to hand over -> (successor, the lease
        as held here, when it began), for pacing the handoffs (:data:`HANDOFFS_IN_FLIGHT`)."""
        self._held_back = False
        """While leaving: leases were kept back from a successor with enough under way."""
        self._claimed_early: set[str] = set()
        """Leases seen being handed here (handoff begun) that were claimed once on that sight
        (see :meth:`_claim_when_handed`): not again until the stream shows them otherwise."""
        self.leaving = False
        """Set once the worker leaves: nothing is claimed, taken or handed over any more."""
        self.kcl_workers: Callable[[], frozenset[str]] = frozenset
        """Live KCL 3.x workers: candidates to hand leases to even while they hold none."""
        self.on_finished: Callable[[str], None] = lambda key: None
        """Called with the key of every finished lease (checkpoint SHARD_END) the stream shows."""
        self.notice_taken: Callable[[], bool] = lambda: False
        """True while held leases are not renewed one by one (the heartbeat mode): a lease seen
        taken by another worker is marked lost from the view (see :meth:`consider`)."""
        self.pickup_source = "off"
        """How lease changes are noticed: "stream", "poll" or "off" (after :meth:`changes`)."""

    async def leave(self) -> int:
        """See :meth:`LeaseCoordinator.leave`."""
        self.leaving = True
        self._taker.enabled = False
        if not self._settings.handoff:
            return 0
        tracker = self._taker.tracker
        peers = tracker.seen_writing(self._clock.monotonic(), self._settings.failover_time)
        await self._say_leaving()
        if peers - {self._worker_id}:
            # Peers told to stop at the same moment (a deploy) say so too: give their word a
            # moment to land before choosing among them.
            await self._clock.sleep(min(self._settings.pickup_poll_interval, 0.25))
        try:
            leases = await self._store.list_leases()
        except ShardflowError as exc:
            log.warning("reading the lease table before leaving failed: %s", exc)
            return 0
        self._see(leases)
        # Handed here before this scan (this worker's own leases are held: not among them).
        for lease in [lease for lease in self._view.values() if self._handed_here(lease)]:
            self._pass_on_soon(lease)
        now = self._clock.monotonic()
        tracker.observe(leases, now)
        in_a_fleet = bool(
            tracker.seen_writing(now, self._settings.failover_time) - {self._worker_id}
        )
        # Paced (see HANDOFFS_IN_FLIGHT) for at most a failover time: a successor that has not
        # claimed what it was handed by then is gone or stuck, and the rest goes at once.
        pace_until = now + self._settings.failover_time
        started = await self._hand_over(leases, now, paced=True)
        wait_until = now + (self._settings.successor_wait if in_a_fleet else 0.0)

        def waiting_until() -> float:
            return max(wait_until, pace_until) if self._held_back else wait_until

        scanned = now
        while self._still_held() and self._clock.monotonic() < waiting_until():
            # Leases kept back for a successor busy claiming the ones under way; or every peer
            # known is leaving too: keep the shards going until a worker shows.
            await self._clock.sleep(self._settings.pickup_poll_interval)
            now = self._clock.monotonic()
            if self.pickup_source == "stream" and now - scanned < LEAVE_RESCAN:
                # The stream keeps the view whole while leaving (see picked_up).
                leases = list(self._view.values())
            else:
                try:
                    leases = await self._store.list_leases()
                except ShardflowError as exc:
                    log.info("looking for a worker to hand leases to failed: %s", exc)
                    continue
                now = scanned = self._clock.monotonic()
                tracker.observe(leases, now)
                self._see(leases)
            await self._still_say_leaving()
            # The last round before the pace ends hands whatever is left at once.
            paced = now + self._settings.pickup_poll_interval < pace_until
            started += await self._hand_over(leases, now, paced=paced)
        if self._still_held() and in_a_fleet:
            log.info(
                "nobody to hand %d lease(s) to within %.1fs; releasing them",
                len(self._still_held()),
                self._settings.successor_wait,
            )
        return started

    def _still_held(self) -> list[OwnedLease]:
        return [owned for owned in self._owned.values() if not owned.giving_up.is_set()]

    async def _say_leaving(self) -> None:
        """Write on one held lease that this worker leaves, before choosing successors: a
        peer leaving at the same moment then chooses neither this worker nor itself."""
        for owned in sorted(self._still_held(), key=lambda owned: owned.lease_key):
            try:
                await self._store.mark_leaving(owned.lease, self._worker_id)
                self._word_on = owned.lease_key
                return
            except ShardflowError as exc:  # moved meanwhile, or a brownout: the next one
                log.info(
                    "saying on lease %s that %s leaves failed: %s",
                    owned.lease_key,
                    self._worker_id,
                    exc,
                )

    async def _still_say_leaving(self) -> None:
        """While waiting for a successor: say it again when the word has gone stale (this
        worker's own renewals date it) or its lease was handed on."""
        lease = self._view.get(self._word_on) if self._word_on is not None else None
        if lease is None or lease.lease_owner != self._worker_id or lease.handoff_pending:
            await self._say_leaving()
        elif (age := leaving_word_age(lease)) is None or age >= FRESH_RENEWALS - 1:
            # Said again before it lapses: a peer must never see this worker as staying.
            try:
                await self._store.mark_leaving(lease, self._worker_id)
            except ShardflowError as exc:
                log.info("saying again that %s leaves failed: %s", self._worker_id, exc)

    async def _hand_over(self, leases: list[Lease], now: float, *, paced: bool) -> int:
        """Begin handing every lease still held to the least loaded live workers (as the scan
        ``leases`` shows them); how many handoffs began. ``paced``: no successor gets more
        than :data:`HANDOFFS_IN_FLIGHT` unclaimed at once; the others stay held (and handled
        here) for a later round."""
        # The lease with this worker's word goes last: handed over with the others, it would
        # leave the word nowhere until said again on another (a peer's scan in between took
        # this worker for a staying one with few leases, the best successor).
        held = sorted(self._still_held(), key=lambda owned: owned.lease_key == self._word_on)
        self._held_back = False
        if not held:
            return 0
        picks = self._successors(self._streams.ours(leases), len(held), now)
        in_flight = self._in_flight(leases, now)
        pairs: list[tuple[OwnedLease, str]] = []
        for owned, to in zip(held, picks, strict=False):
            if paced and in_flight[to] >= HANDOFFS_IN_FLIGHT:
                self._held_back = True
                continue
            in_flight[to] += 1
            pairs.append((owned, to))
        started = 0

        async def hand(pair: tuple[OwnedLease, str]) -> None:
            nonlocal started
            owned, to = pair
            began = self._clock.monotonic()
            if await owned.begin_handoff(to):
                self._handed_to[owned.lease_key] = (to, owned, began)
                started += 1

        await run_bounded(pairs, hand, concurrency=self._settings.renew_concurrency)
        return started

    def _in_flight(self, leases: list[Lease], now: float) -> Counter[str]:
        """Per successor, the handoffs to it not yet claimed, as the scan ``leases`` shows
        them: still draining here (``checkpointOwner`` this worker; for one pick-up interval
        at most, see :data:`HANDOFFS_IN_FLIGHT`) or completed here but not yet written by the
        successor (the counter of the handover write). A lease gone, or owned by another
        worker since (passed on), no longer counts."""
        seen = {lease.lease_key: lease for lease in leases}
        counts: Counter[str] = Counter()
        patience = self._settings.pickup_poll_interval
        for key, (to, owned, began) in list(self._handed_to.items()):
            lease = seen.get(key)
            if lease is None or lease.lease_owner != to:
                del self._handed_to[key]
            elif lease.checkpoint_owner is not None:
                if now - began < patience:
                    counts[to] += 1
            elif lease.lease_counter <= owned.lease.lease_counter:
                counts[to] += 1
            else:
                del self._handed_to[key]  # claimed: the successor wrote it
        return counts

    async def pass_on_inbound(self) -> None:
        """At stop: pass on every lease still handed to this worker (see :meth:`pass_on`).

        A handoff under way that could not be passed on (nobody else to take it) is waited
        for while its old owner still renews it, up to ``handoff_timeout``, and released once
        completed: leaving earlier would strand the lease with a worker that is gone, and the
        others would get it only once it expired (at 64 shards on a slow lease table the old
        owners' last checkpoints took longer than a failover time)."""
        give_up_at = self._clock.monotonic() + self._settings.handoff_timeout
        tracker = self._taker.tracker
        while True:
            try:
                leases = self._streams.ours(await self._store.list_leases())
            except ShardflowError as exc:
                log.warning("looking for leases handed to %s failed: %s", self._worker_id, exc)
                return
            now = self._clock.monotonic()
            tracker.observe(leases, now)
            self._see(leases, complete=True)
            inbound = [lease for lease in leases if self._handed_here(lease)]
            await run_bounded(inbound, self.pass_on, concurrency=self._settings.renew_concurrency)
            awaited = [
                lease
                for lease in inbound
                if lease.checkpoint_owner is not None and not tracker.is_expired(lease, now)
            ]
            if not awaited or now >= give_up_at:
                if awaited:
                    log.warning(
                        "leaving with %d handoff(s) to %s still under way after %.1fs; they "
                        "are taken over once they expire",
                        len(awaited),
                        self._worker_id,
                        self._settings.handoff_timeout,
                    )
                return
            await self._clock.sleep(min(self._settings.pickup_poll_interval, 0.25))

    async def pass_on(self, lease: Lease) -> None:
        """A lease handed to this worker while it leaves, as seen: a handoff still under way
        goes on to the least loaded live worker that is not leaving (if there is one and the
        old owner is not a KCL worker, which completes handoffs its own way); a completed one
        is released, free for anyone at once."""
        key = lease.lease_key
        if key in self._passing or not self._handed_here(lease):
            return
        self._passing.add(key)
        try:
            old = lease.checkpoint_owner
            if old is None:
                await self._store.release(lease, self._worker_id)
                log.info("passed on lease %s, handed over while leaving", key)
                return
            if old in self.kcl_workers():
                return
            to = self._successor(exclude=old)
            if to is None:
                return  # released once the old owner completes the handoff
            self._view[key] = await self._store.redirect_handoff(lease, self._worker_id, to)
            log.info("passed the handoff of lease %s from %s on to %s", key, old, to)
        except ShardflowError as exc:  # changed meanwhile, or a brownout: seen again later
            log.info("passing on lease %s failed: %s", key, exc)
        finally:
            self._passing.discard(key)

    def _handed_here(self, lease: Lease) -> bool:
        return (
            lease.lease_owner == self._worker_id
            and lease.lease_key not in self._owned
            and lease.lease_key not in self._taker.expiring
        )

    def _pass_on_soon(self, lease: Lease) -> None:
        if self._handed_here(lease) and lease.lease_key not in self._passing:
            self._spawn(self.pass_on(lease), f"pass-on-{lease.shard_id}")

    def _see(self, leases: Iterable[Lease], *, complete: bool = False) -> None:
        """Keep the leaving worker's view of the table (see ``_view``)."""
        if complete:
            self._view = {}
        for lease in self._streams.ours(list(leases)):
            self._view[lease.lease_key] = lease

    def _successor(self, *, exclude: str) -> str | None:
        """The least loaded live worker that is not leaving, as seen in ``_view``."""
        picks = self._successors(self._view.values(), 1, self._clock.monotonic(), exclude)
        return picks[0] if picks and picks[0] != exclude else None

    def _successors(
        self, leases: Iterable[Lease], count: int, now: float, exclude: str | None = None
    ) -> list[str]:
        """:func:`successors` as this worker sees the fleet at ``now``: expiry and proof of
        life from its tracker, live KCL 3.x workers (but ``exclude``) as candidates too."""
        tracker = self._taker.tracker
        leases = list(leases)
        self._leavers |= said_leaving(leases)
        return successors(
            leases,
            count,
            worker_id=self._worker_id,
            is_expired=lambda lease: tracker.is_expired(lease, now),
            also=self.kcl_workers() - {exclude},
            seen_alive=lambda worker: tracker.renewed_within(
                worker, now, self._settings.failover_time * 0.75
            ),
            tie_break=self._tie_break,
            leaving_too=self._leavers,
        )

    def _tie_break(self, worker: str) -> int:
        """This worker's own order among equally loaded candidates (see successors)."""
        return zlib.crc32(f"{self._worker_id}\n{worker}".encode())

    def consider(self, lease: Lease) -> None:
        """A fresh view of ``lease``: answer a handoff request on a lease held here, by
        handing it over while this worker keeps its share, else by declining it."""
        owned = self._owned.get(lease.lease_key)
        if (
            owned is not None
            and self.notice_taken()
            and lease.lease_counter > owned.lease.lease_counter
            and not lease.held_by(self._worker_id)
        ):
            # Written by another worker since our last write and no longer ours: taken (a
            # steal). In the heartbeat mode no renewal would tell us (renewals are what tell
            # a per-lease worker): stop at once.
            owned.mark_lost("taken", lease.actual_owner)
            return
        if owned is None or not self._settings.handoff or self.leaving:
            return
        request = handoff_request_of(lease)
        if (
            request is None
            or request.requester == self._worker_id
            or not request.fresh_for(lease)
            or lease.lease_owner != self._worker_id
            or lease.handoff_pending
            or owned.giving_up.is_set()
            or lease.lease_key in self._handing
            or lease.lease_key in self._declining
        ):
            return
        requester = request.requester
        tracker = self._taker.tracker
        if self._taker.table_mode == "heartbeat" and (
            tracker.heartbeat_of(requester) is None
            or tracker.heartbeat_lapsed(requester, self._clock.monotonic())
        ):
            # In the heartbeat mode a lease's counter stands still, so a request stays fresh
            # by its counter for as long as nobody writes the lease: the requester's own
            # heartbeat says whether it still lives (a dead one would be handed a lease; its
            # fenced heartbeat may already be gone). Every worker of this version keeps one
            # in this mode before it asks (it registers at its first scan).
            return
        if not self._taker.may_give(requester, self._handing):
            self._declining.add(lease.lease_key)

            async def decline() -> None:
                try:
                    await self._store.decline_handoff(lease, self._worker_id)
                    log.info("declined to hand lease %s to %s", lease.lease_key, requester)
                except ShardflowError as exc:  # a new request meanwhile, or a brownout
                    log.info("declining lease %s to %s failed: %s", lease.lease_key, requester, exc)
                finally:
                    self._declining.discard(lease.lease_key)

            self._spawn(decline(), f"decline-{lease.shard_id}")
            return
        self._handing.add(lease.lease_key)

        async def hand() -> None:
            try:
                await owned.begin_handoff(requester)
            finally:
                self._handing.discard(lease.lease_key)

        self._spawn(hand(), f"handoff-{lease.shard_id}")

    def changes(self, stream_arn: str | None) -> LeaseChanges | None:
        """The pick-up source the settings and the table allow."""
        mode = self._settings.pickup
        interval = self._settings.pickup_poll_interval
        if mode == "off":
            return None
        readable = (
            stream_arn is not None
            and stream_arn.startswith("arn:")
            and self._lease_streams is not None
        )
        if mode in ("stream", "auto") and readable:
            assert stream_arn is not None
            self.pickup_source = "stream"
            return StreamChanges(
                self._lease_streams, stream_arn, interval=interval, clock=self._clock, rng=self._rng
            )
        if mode == "stream":
            log.warning(
                "lease table %s: its stream cannot be read here; polling it instead",
                self._store.table_name,
            )
        self.pickup_source = "poll"
        # In the heartbeat mode the whole table is scanned once a renew interval (and when
        # its change marker moves); per-lease tables every interval, as before. So is a
        # table with a stream: its writers do not bump the marker (their readers use the
        # stream).
        return PollingChanges(
            self._store,
            interval=interval,
            clock=self._clock,
            full_every=self._settings.renew_every if stream_arn is None else None,
        )

    async def picked_up(self, view: LeaseView) -> None:
        """React to lease changes: a complete scan is a take cycle of its own; changes from
        the stream start one when a lease became free, was handed here, or moved."""
        self._taker.observe_entities(
            view.heartbeats,
            complete=view.complete,
            mode=view.mode,
            mode_seen=view.mode_seen,
            removed_heartbeats=view.removed_heartbeats,
        )
        if view.complete:
            if self.leaving:
                self._see(view.leases, complete=True)
                for lease in view.leases:
                    self._pass_on_soon(lease)
                return
            if view.unchanged and self._planned:
                # The last poll's take cycle planned on exactly this (polling a 1,000-lease
                # table four times a second, a cycle per poll was most of an idle worker's
                # CPU); the take loop still wakes for expiries and overdue handoffs.
                return
            self._planned = False
            await self._take_cycle(list(view.leases))
            self._planned = True
            for lease in view.leases:
                self.consider(lease)
            return
        if view.resumed:
            self._taker.forget_view()  # changes were missed: the next cycle scans
        changed = list(view.leases)
        renewed: list[Lease] = []
        if self.leaving:
            changed += view.renewed
        else:
            owned = self._owned
            images = self._images
            me = self._worker_id
            for lease in view.renewed:
                # A renewal of a lease held here, or naming this worker, is looked at whole (a
                # renewal by another worker of a lease we hold means it was taken); so is the
                # first sight of a lease on the stream (it wakes the take loop, as any lease
                # not seen before: without that wake 2 joiners of a 1,000-shard fleet
                # converged in 30.5 s instead of 15.5 s, bench/simulate.py --short).
                key = lease.lease_key
                if key in owned or lease.lease_owner == me or key not in images:
                    changed.append(lease)
                else:
                    renewed.append(lease)
        if renewed:
            self._taker.observe_renewed(renewed)
        self._taker.observe(changed, list(view.removed))
        if self.leaving:
            self._see(changed)
            for key in view.removed:
                self._view.pop(key, None)
            for lease in changed:
                self._pass_on_soon(lease)
            return
        moved = False
        for lease in changed:
            if lease.checkpoint.sequence_number == SHARD_END:
                self.on_finished(lease.lease_key)
            image = (lease.lease_owner, lease.checkpoint_owner)
            previous = self._images.get(lease.lease_key)
            self._images[lease.lease_key] = image
            mine_unheld = (
                lease.lease_owner == self._worker_id and lease.lease_key not in self._owned
            )
            if previous != image or lease.is_free or mine_unheld:
                moved = True
            if mine_unheld and lease.checkpoint_owner is None and self._settings.handoff:
                # Handed to us: claim it from this image at once, without a scan first.
                self._spawn(self._claim(lease), f"claim-{lease.shard_id}")
            # Being handed to us (begun, not yet handed over): see _claim_when_handed.
            handed_here = lease.checkpoint_owner not in (None, self._worker_id)
            if mine_unheld and handed_here and self._settings.handoff:
                self._claim_when_handed(lease)
            elif not mine_unheld or not handed_here:
                self._claimed_early.discard(lease.lease_key)
            self.consider(lease)
        for key in view.removed:
            self._images.pop(key, None)
        if moved and not self.leaving:
            self._wake_taker()

    def _claim_when_handed(self, lease: Lease) -> None:
        """A handoff to this worker was seen begun (``lease``: this worker the owner, the old
        one the checkpoint owner): claim it as the handover would leave it, once, now.

        The old owner's handover is the next write of the lease (its last checkpoint; it
        drains for a moment first): counter + 1, checkpoint owner removed. A claim sent on
        sight of the begun handoff, conditional on exactly that (the counter + 1, this worker
        the owner, no checkpoint owner), lands once the handover has, and is refused while the
        handoff is still under way (then the handover's own image is claimed when the stream
        shows it, as before). On a table that answers one request at a time (moto, 64
        shards) the handover had usually landed by the time its begin was read, and the new
        owner waited another stream read (0.2 s apart, each queued there) before claiming:
        the median move spent 0.31-0.37 s from the handover to the claim. Nothing is handled
        before the claim lands (its answer is the lease as the handover left it: the old
        owner's last checkpoint), so no record is handled twice; the claim is a write like
        any take, so the deadline runs from when it was sent."""
        key = lease.lease_key
        if key in self._claimed_early:
            return  # the old owner renewing while it drains: one early try is enough
        self._claimed_early.add(key)
        handed = replace(lease, checkpoint_owner=None, lease_counter=lease.lease_counter + 1)
        self._spawn(self._claim(handed, quiet=True), f"claim-{lease.shard_id}")

    async def _claim(self, lease: Lease, *, quiet: bool = False) -> None:
        if self.leaving:
            return
        try:
            held = await self._taker.claim(lease, "handoff", quiet=quiet)
        except Exception:
            log.exception("claiming lease %s failed; the take cycle tries again", lease.lease_key)
            return
        if held is None and quiet and lease.lease_key not in self._owned:
            # Refused as too early; the handover's own image may have come in meanwhile and
            # found this claim under way (one at a time): the take cycle claims it from the
            # view then, rather than at the next take interval.
            self._wake_taker()
