"""The heartbeat lease mode: one write per worker per renew interval, not one per lease.

In the ``heartbeat`` mode (stored in the lease table, see :mod:`~shardflow.leases.entities`)
each worker keeps one heartbeat item alive; its leases are written when taken, checkpointed,
handed off or released, not on every renewal. The :class:`HeartbeatKeeper` is that worker's
side:

- it registers the heartbeat when the table's mode is ``heartbeat`` and no KCL worker is
  present or possible, and beats every ``renew_interval``;
- its leases stop being renewed one by one only once the heartbeat is *established*: it has
  existed for ``take_interval`` + 1 s, by which time every peer has scanned the table (its
  periodic take cycle) and knows it. A peer that knows a worker's heartbeat never takes that
  worker's leases before the heartbeat is expired and fenced (see
  :mod:`~shardflow.leases.expiry`); one that did not know it would judge them lease by lease;
- a successful beat sent at ``t`` extends every held lease's deadline to ``t +
  failover_time - safety_margin``, exactly as a renewal would: a worker whose heartbeat fails
  stops its shards within the bound it has for a lost lease today;
- a beat that fails (no answer) has its leases renewed one by one until a beat succeeds
  again: a heartbeat-only brownout costs writes, not shards. It is tried again after a short
  jittered pause (:data:`RETRY_BASE`), not a whole interval later: one item stands for all of a
  worker's leases, and peers fence it once it has not changed for ``failover_time``. Beating
  every interval, a worker lost its heartbeat, and with it every lease it had not renewed
  one by one, to three failed writes in a row: one worker in eight per failover time when
  half the table's calls fail (bench/simulate.py's brownout);
- a refused beat (a peer fenced the heartbeat) extends nothing: the leases lapse at their
  deadlines (peers take them only after that) and the heartbeat is registered again;
- when the mode goes back to ``per-lease`` it stops beating at once (the renewer renews every
  lease again from its next round) and deletes its item once ``failover_time`` has passed
  since its last beat was sent, when no lease's deadline depends on it any more; at a graceful
  stop it deletes its item once it holds nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping

from shardflow.backoff import Backoff
from shardflow.clock import Clock
from shardflow.errors import AwsError
from shardflow.events import BeatOutcome
from shardflow.leases.entities import Heartbeat, entity_from_item
from shardflow.leases.errors import EntityConditionFailedError
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.store import LeaseStoreBase
from shardflow.waits import first_of

log = logging.getLogger("shardflow.leases")

ESTABLISH_SLACK = 1.0
"""Seconds beyond one take interval before a new heartbeat stands in for renewals."""

RETRY_BASE = 0.1
"""Ceiling of the pause after a first failed beat, as a fraction of ``failover_time`` (1 s at
the default 10 s); it doubles per failure in a row up to half the renew interval (1.65 s),
each pause drawn from the upper half of its ceiling. In a brownout of half the calls a
worker tries about seven times per failover time instead of three (all failing: 1 in 128,
not 1 in 8). In an outage that is one failed write per worker every 0.8-1.65 s, beside the
renewals one by one that a failing beat brings anyway (a write per lease per interval)."""


class HeartbeatKeeper:
    """One worker's heartbeat (see the module doc). ``owned`` is the live map of held leases."""

    def __init__(
        self,
        store: LeaseStoreBase,
        *,
        worker_id: str,
        settings: LeaseSettings,
        clock: Clock,
        owned: Mapping[str, OwnedLease],
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self._rng = rng or random.Random()
        self._retry = Backoff(
            base=RETRY_BASE * settings.failover_time,
            cap=settings.renew_every / 2,
            max_attempts=None,
            jitter="half",
        )
        self._failures = 0
        """Beats failed in a row (no answer; a refusal leaves the count): while any did,
        leases are renewed one by one, so that a brownout of heartbeats alone does not cost
        this worker its shards, and the next beat comes after a short pause (RETRY_BASE)."""
        self._worker_id = worker_id
        self._settings = settings
        self._clock = clock
        self._owned = owned
        self.heartbeat: Heartbeat | None = None
        """The heartbeat as this worker last wrote it (None: it keeps none)."""
        self.wanted = False
        """The table's mode is ``heartbeat`` and no KCL worker is present or possible."""
        self.renewals_needed: Callable[[], bool] = lambda: False
        """True while leases must be renewed one by one anyway (pick-up off, a worker without
        heartbeat renewing leases): the heartbeat is kept (peers see a shardflow worker) but
        covers nothing."""
        self._established_at: float | None = None
        self._last_sent_ok: float | None = None
        self._wake = asyncio.Event()
        self.on_lapsed: Callable[[], None] = lambda: None
        """Called when a beat was refused (the heartbeat was fenced or deleted by a peer)."""
        self.on_answer: Callable[[bool, float], None] = lambda answered, at: None
        """Called after every beat with whether the table answered, and when: the expiry
        tracker does not count a stretch this worker could not reach the table against
        others (as a failed renewal does not)."""
        self.wanted_since: float | None = None
        """When the table's mode last turned ``heartbeat`` for this worker."""
        self.on_beat: Callable[[int, BeatOutcome, float, float, int], None] = (
            lambda counter, outcome, late, duration, leases: None
        )
        """Called after every beat with the counter it wrote (or tried to), its outcome, how
        late it was sent, how long it took and how many leases it extended (the coordinator
        emits :class:`~shardflow.events.HeartbeatBeat`)."""
        self._last_sent: float | None = None
        """When the last beat (answered or not) was sent: the next is due an interval later."""

    @property
    def active(self) -> bool:
        return self.heartbeat is not None

    def covers(self) -> bool:
        """Whether held leases are kept by the heartbeat now (not renewed one by one)."""
        established = self._established_at
        last = self._last_sent_ok
        # From the first beat sent once established, not from the moment itself: that beat
        # is what extends the leases the renewer stops renewing (a round of renewals before
        # it and a beat up to one interval after could otherwise outlast the deadlines).
        return (
            self.wanted
            and self.heartbeat is not None
            and not self._failures
            and established is not None
            and last is not None
            and last >= established
            and not self.renewals_needed()
        )

    def want(self, wanted: bool) -> None:
        """Follow the table's mode (and what the fleet allows); acts at the next round."""
        if wanted != self.wanted:
            self.wanted = wanted
            self.wanted_since = self._clock.monotonic() if wanted else None
            log.info(
                "worker %s %s its heartbeat",
                self._worker_id,
                "starts" if wanted else "stops",
            )
            self._wake.set()

    @property
    def busy(self) -> bool:
        """Whether :meth:`run` has work: a heartbeat to keep, start or retire."""
        return self.wanted or self.heartbeat is not None

    async def run(self) -> None:
        """Beat every renew interval (acting at once when the mode changes) while
        :attr:`busy`; returns once the heartbeat is retired (or never started)."""
        interval = self._settings.renew_every
        while self.busy:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("heartbeat of %s failed unexpectedly", self._worker_id)
            self._wake.clear()
            if self.busy:
                # At a fixed rate, as the renewer: a slow write does not push every later
                # beat back by its own duration.
                last = self._last_sent
                now = self._clock.monotonic()
                pause = interval if last is None else max(last + interval - now, 0.0)
                if self._failures:
                    pause = min(pause, self._retry.delay(self._failures - 1, self._rng))
                await first_of(self._wake, self._clock.sleep(pause))

    async def round(self) -> None:
        """One beat (or registration, or retirement)."""
        if self.wanted:
            if self.heartbeat is None:
                await self._register()
            else:
                await self._beat()
        elif self.heartbeat is not None:
            await self._retire()

    async def _register(self) -> None:
        current: Heartbeat | None = None
        for _ in range(3):
            try:
                self.heartbeat = await self._store.register_heartbeat(self._worker_id, current)
            except EntityConditionFailedError as exc:
                found = entity_from_item(exc.current or {})
                current = found if isinstance(found, Heartbeat) else None
                continue
            except AwsError as exc:
                log.warning("registering the heartbeat of %s failed: %s", self._worker_id, exc)
                return
            now = self._clock.monotonic()
            self._established_at = now + self._settings.take_every + ESTABLISH_SLACK
            log.info(
                "worker %s keeps a heartbeat (leases renewed one by one for %.1fs more)",
                self._worker_id,
                self._established_at - now,
            )
            return

    async def _beat(self) -> None:
        heartbeat = self.heartbeat
        assert heartbeat is not None
        sent = self._clock.monotonic()
        previous, self._last_sent = self._last_sent, sent
        interval = self._settings.renew_every
        late = 0.0 if previous is None else max(sent - previous - interval, 0.0)

        def report(outcome: BeatOutcome, counter: int, leases: int = 0) -> None:
            self.on_beat(counter, outcome, late, self._clock.monotonic() - sent, leases)

        try:
            async with asyncio.timeout(self._settings.renew_every):
                self.heartbeat = await self._store.beat(heartbeat)
        except EntityConditionFailedError as exc:
            found = entity_from_item(exc.current or {})
            if (
                isinstance(found, Heartbeat)
                and found.fenced_by is None
                and found.counter == heartbeat.counter + 1
            ):
                # Our own beat whose answer was lost (a retried timeout): it landed. The
                # deadlines stay: we do not know when it landed.
                self.heartbeat = found
                report("written", found.counter)
                return
            fenced = found.fenced_by if isinstance(found, Heartbeat) else None
            log.warning(
                "heartbeat of %s lapsed (%s); its leases lapse at their deadlines",
                self._worker_id,
                f"fenced by {fenced}" if fenced else "its item changed",
            )
            self.heartbeat = None
            self._established_at = None
            self._last_sent = None
            report("refused", heartbeat.counter + 1)
            self.on_lapsed()
            return
        except (AwsError, TimeoutError) as exc:
            log.warning("heartbeat of %s failed, tried again: %r", self._worker_id, exc)
            self._failures += 1
            self.on_answer(False, self._clock.monotonic())
            report("failed", heartbeat.counter + 1)
            return
        self._failures = 0
        self.on_answer(True, self._clock.monotonic())
        self._last_sent_ok = sent
        established = self._established_at
        extended = 0
        if established is not None and sent >= established:
            for owned in list(self._owned.values()):
                owned.extend(sent)
                extended += 1
        report("written", self.heartbeat.counter, extended)

    async def _retire(self) -> None:
        """The mode went back to per-lease: no more beats; the item goes once no deadline
        depends on it."""
        self._established_at = None
        last = self._last_sent_ok
        if last is not None and self._clock.monotonic() - last < self._settings.failover_time:
            return
        await self.delete()

    async def delete(self) -> None:
        """Delete this worker's heartbeat item (conditional on it as last written)."""
        heartbeat, self.heartbeat = self.heartbeat, None
        self._established_at = None
        if heartbeat is None:
            return
        try:
            await self._store.delete_heartbeat(heartbeat)
        except (AwsError, EntityConditionFailedError) as exc:
            log.info("heartbeat item of %s not deleted: %s", self._worker_id, exc)
