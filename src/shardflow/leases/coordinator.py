"""The lease coordinator: which shards this worker processes, kept in KCL's lease table.

Interface (what the consumer builds on)
---------------------------------------
::

    coordinator = LeaseCoordinator(
        store,                                  # a LeaseStore (DynamoDBLeaseStore / InMemoryLeaseStore)
        worker_id="host:pid:abcd",              # unique per process
        streams=[StreamSpec("orders")],         # or plain names; several -> KCL multi-stream keys
        kinesis=kinesis_client,                 # open aiobotocore Kinesis client (ListShards)
        settings=LeaseSettings(),               # failover 10 s, renew 3.308 s, take 20.05 s, ...
        initial_position=StartPosition.trim_horizon(),   # or latest() / at_timestamp(...)
        clock=SYSTEM_CLOCK, events=emitter,     # an EventEmitter (or on_event=callback), see shardflow.events
    )
    await coordinator.start()        # table, first shard sync, first take: returns with leases
    async for owned in coordinator.acquisitions():   # OwnedLease, as each is taken (ends at stop)
        ...                          # or: owned = await coordinator.acquired.get()
    coordinator.owned()              # Mapping[lease_key, OwnedLease] held now
    await coordinator.wait_parents_done(owned)   # True once every parent lease is SHARD_END
    await coordinator.parents_done(owned)        # one check (a missing parent does not block)
    await coordinator.shard_ended(owned, children)  # after the SHARD_END checkpoint
    await coordinator.release(owned)             # after the final checkpoint (shutdown/done);
                                                 # completes a handoff begun on the lease
    await coordinator.leave()                    # before a graceful stop: hand leases over
    await coordinator.stop(release=True)         # stop loops; release what is still held

``OwnedLease`` (shardflow.leases.owned): ``lease_key``, ``stream`` (name given), ``shard_id``,
``lease`` (latest item), ``checkpoint``, ``completed_state``, ``parent_shard_ids``,
``hash_range``, ``lost`` and ``giving_up`` (asyncio.Event), ``valid()``, ``deadline``,
``remaining()``, ``ensure_valid()`` (raises ShardLeaseLostError), ``ended_why``/``released``/
``new_owner`` (after it ended), ``writer`` (the CheckpointWriter: ``await
writer.write(position, completed_state=None)``, refuses with ShardLeaseLostError once not valid,
conditional on the counter, serialized with renewals), ``record_children(ids)``.
A shard may be processed only while ``owned.valid()``; when ``lost`` is set stop at once and
never checkpoint again (the writer refuses anyway). When ``giving_up`` is set (shutdown, or a
KCL 3.x handoff away from this worker) checkpoint what was handled, then ``release``.
``completed_state`` is stored in shardflow's own attribute ``shardflowCompleted`` (see serialization).

The coordinator emits LeaseAcquired, LeaseRenewed, HeartbeatBeat, LeaseLost, LeaseReleased,
ShardEnded, WorkerJoined and WorkerLeft (shardflow.events); the consumer emits the others.
``take_cycle()``, ``sync_shards()`` and ``renew_all()`` run one round at once (tests, tools).

Behaviour
---------
- Renewal (:mod:`~shardflow.leases.renewer`): every ``renew_interval`` each held lease is
  renewed at its own slot of the interval (spread evenly, not all at once); a fixed pool of
  ``renew_concurrency`` tasks renews them, so a slow lease delays only itself. A lease that
  could not be renewed is marked lost at its deadline.
- Take cycle (:mod:`~shardflow.leases.taker`): at start and every ``take_interval``: scan the
  table, update the expiry tracker (observer's own clock), plan with the balance rules of
  :mod:`~shardflow.leases.balance` (free, then expired, then at most
  ``max_leases_to_steal_at_once`` from a worker above target), take. The plan comes from an
  index of the table kept as scans and the table's stream show changes
  (:mod:`~shardflow.leases.lease_index`) and a schedule of expiry per holder
  (:mod:`~shardflow.leases.expiry_schedule`): a cycle costs what changed, not the table. Finished shards
  (checkpoint SHARD_END) are never taken; once all their children started their leases are
  deleted (``cleanup_finished_leases``), as KCL does.
- Planned handoff (``LeaseSettings.handoff``, :mod:`~shardflow.leases.handoffs`): a held lease
  that carries a fresh handoff request is handed to its requester (seen on a renewal, which
  returns the whole item, or through pick-up); :meth:`LeaseCoordinator.leave` hands every
  held lease to the least loaded live workers before a graceful stop. The consumer drains and
  checkpoints a lease given up, then releases it, which completes the handoff.
- Pick-up (``LeaseSettings.pickup``, :mod:`~shardflow.leases.pickup`): lease changes seen on
  the lease table's DynamoDB stream (or a frequent scan) start a take cycle at once when a
  lease was released or handed to this worker; expiry is checked exactly when an observed
  lease would expire.
- Shard sync (:mod:`~shardflow.leases.shard_sync`): at start for every stream without leases
  (before the first take; otherwise right after start, in the background), then every
  ``shard_sync_interval`` on the fleet's sync leader (the live worker with the lowest id;
  the others every 10 intervals, a backstop), and on any worker whenever a finished
  shard's children lack leases.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any, Self

from shardflow.aws.kinesis import list_shards
from shardflow.backoff import Backoff
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.errors import AwsError, ShardflowError
from shardflow.events import (
    BeatOutcome,
    EventCallback,
    EventEmitter,
    HeartbeatBeat,
    LeaseAcquired,
    LeaseLost,
    LeaseReleased,
    LeaseRenewed,
    ReleasedWhy,
    ShardEnded,
)
from shardflow.leases.balance import PlannedTake
from shardflow.leases.concurrency import run_bounded
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.entities import LeaseMode
from shardflow.leases.fleet import REPORT_EVERY, FleetMode, KclFleet
from shardflow.leases.heartbeat import HeartbeatKeeper
from shardflow.leases.model import Lease
from shardflow.leases.moves import LeaseMoves
from shardflow.leases.owned import OwnedLease
from shardflow.leases.pickup import LeaseChanges
from shardflow.leases.renewer import LeaseRenewer
from shardflow.leases.settings import LeaseSettings, StreamSpec, check_initial_position
from shardflow.leases.shard_sync import LeasePlan, child_leases, create_in_order, sync_stream
from shardflow.leases.store import LeaseStore, LeaseStoreBase
from shardflow.leases.streams import StreamSet
from shardflow.leases.taker import LeaseTaker
from shardflow.positions import StartPosition
from shardflow.records import SHARD_END
from shardflow.shards import ChildShard
from shardflow.waits import first_of

log = logging.getLogger("shardflow.leases")

SYNC_BACKSTOP = 10
"""A worker that is not the fleet's sync leader lists shards every this many
``shard_sync_interval``s (see LeaseCoordinator._syncs_periodically)."""

_RECLAIM = 3
"""Attempts to claim a lease again within the safety margin after it lapsed here (see
_reclaim)."""

_RECLAIM_FOR = 3
"""Failover times after a lease lapsed here during which it is claimed again once a renew
interval (see _reclaim); later only the take cycle resumes it."""

_RETRY_PAUSE = 1.0
"""Ceiling of the first pause after a take cycle that met a failing table (doubling with each
such cycle, up to a quarter of failover_time; drawn from the ceiling's upper half)."""


class LeaseCoordinator:
    """Takes, renews, balances and releases this worker's leases (see the module docstring)."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        worker_id: str,
        streams: Sequence[StreamSpec | str],
        kinesis: Any,
        settings: LeaseSettings | None = None,
        initial_position: StartPosition | None = None,
        clock: Clock = SYSTEM_CLOCK,
        on_event: EventCallback | None = None,
        events: EventEmitter | None = None,
        rng: random.Random | None = None,
        lease_streams: Any | None = None,
    ) -> None:
        """``lease_streams``: an open ``dynamodbstreams`` client, needed to read the lease
        table's stream (``pickup`` "stream" or "auto"); without it pick-up polls. ``events``:
        the worker's event emitter (default: one of its own, subscribed by ``on_event``)."""
        if not worker_id:
            raise ValueError("worker_id must be a non-empty string")
        self._store = store
        self._worker_id = worker_id
        self._streams = StreamSet(streams)
        self._kinesis = kinesis
        self._settings = settings or LeaseSettings()
        self._initial = check_initial_position(initial_position or StartPosition.trim_horizon())
        self._clock = clock
        self._events = events or EventEmitter(worker_id, clock=clock, subscribers=[on_event])
        self._rng = rng or random.Random()
        self._owned: dict[str, OwnedLease] = {}
        self.acquired: asyncio.Queue[OwnedLease] = asyncio.Queue()
        """Every lease this worker takes, as it is taken (it may be lost by the time it is read)."""
        self._keeper: HeartbeatKeeper | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        if (
            isinstance(store, LeaseStoreBase)
            and type(store).execute_entity is not LeaseStoreBase.execute_entity
        ):
            # A store that can keep shardflow's own items: the heartbeat mode is possible.
            self._keeper = HeartbeatKeeper(
                store,
                worker_id=worker_id,
                settings=self._settings,
                clock=clock,
                owned=self._owned,
                rng=self._rng,
            )
        keeper = self._keeper
        self._renewer = LeaseRenewer(
            self._owned,
            settings=self._settings,
            clock=clock,
            on_renewed=self._renewed,
            on_failed=self._renew_failed,
            covered=keeper.covers if keeper is not None else lambda: False,
        )
        self._taker = LeaseTaker(
            store,
            worker_id=worker_id,
            streams=self._streams,
            settings=self._settings,
            clock=clock,
            owned=self._owned,
            adopt=self._adopt,
            events=self._events,
            want_sync=self._want_sync,
            rng=self._rng,
        )
        self._take_soon = asyncio.Event()
        self._moves = LeaseMoves(
            store,
            worker_id=worker_id,
            settings=self._settings,
            clock=clock,
            streams=self._streams,
            owned=self._owned,
            taker=self._taker,
            spawn=self._spawn,
            take_cycle=self.take_cycle,
            wake_taker=self._take_soon.set,
            lease_streams=lease_streams,
            rng=self._rng,
        )
        self._fleet: KclFleet | None = None
        self._taker.defers = self._defers_to_kcl
        self._taker.on_mode = self._mode_seen
        if self._keeper is not None:
            self._moves.notice_taken = self._keeper.covers
            self._keeper.on_answer = self._beat_answered
            self._keeper.on_beat = self._beaten
            self._keeper.renewals_needed = self._renewals_needed
            self._taker.on_scanned = self._scanned
        self._foreign: frozenset[str] = frozenset()
        """Lease writers without a heartbeat seen in a heartbeat-mode table."""
        self._moves.kcl_workers = self._live_kcl_workers
        self._parent_waiters: dict[str, dict[asyncio.Event, None]] = {}
        """Parent lease key -> the waits of its children here (see wait_parents_done); a dict
        as an ordered set: woken in the order they began, alike in every simulated run."""
        self._taker.on_finished = self._shard_ended_seen
        self._moves.on_finished = self._shard_ended_seen
        self._sync_wanted = asyncio.Event()
        self._sync_contended = False
        """A shard sync met another worker creating the same leases (see create_in_order)."""
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    # --- public API ---------------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def settings(self) -> LeaseSettings:
        return self._settings

    @property
    def streams(self) -> list[StreamSpec]:
        """The streams, with identifiers resolved after :meth:`start` in multi-stream mode."""
        return self._streams.specs

    @property
    def pickup_source(self) -> str:
        """How lease changes are noticed: "stream", "poll" or "off" (after :meth:`start`)."""
        return self._moves.pickup_source

    @property
    def running(self) -> bool:
        return self._started and not self._stopped.is_set()

    @property
    def fleet_mode(self) -> FleetMode:
        """ "standalone", "kcl3" (a KCL 3.x leader assigns) or "kcl3-takeover" (a KCL 3.x
        application with no live KCL worker left); see :mod:`shardflow.leases.fleet`."""
        return self._fleet.mode if self._fleet is not None else "standalone"

    @property
    def lease_mode(self) -> LeaseMode:
        """How this worker keeps its leases now: ``"heartbeat"`` (one heartbeat item keeps
        them all) or ``"per-lease"`` (each renewed on its own). The table's mode
        (:meth:`~shardflow.leases.LeaseStoreBase.set_lease_mode`) says which every worker
        should use; a worker keeps renewing lease by lease while a KCL worker is present or
        possible, its lease pick-up is off, or its heartbeat is not yet known to every peer."""
        keeper = self._keeper
        return "heartbeat" if keeper is not None and keeper.covers() else "per-lease"

    @property
    def table_lease_mode(self) -> LeaseMode:
        """The application's lease mode as this worker last read it from the table."""
        return self._taker.table_mode

    def owned(self) -> Mapping[str, OwnedLease]:
        """The leases held now, by lease key (a read-only live view)."""
        return MappingProxyType(self._owned)

    async def start(self) -> None:
        """Create the table if needed, sync shards of streams without leases, take leases.

        Returns after the first take cycle, so :meth:`owned` already shows what this worker
        got; later takes happen every ``take_interval``.
        """
        if self._started:
            raise RuntimeError("the coordinator was already started")
        self._started = True
        try:
            # "auto" gives a table it creates a stream (the cheapest pick-up at scale) and
            # leaves an existing table as it is (polled if it has none).
            pickup = self._settings.pickup
            table = await self._store.ensure_table(
                stream_view=pickup == "stream", stream_if_created=pickup == "auto"
            )
            changes = self._moves.changes(table.stream_arn)
            await self._join_fleet()
            await self._streams.resolve(self._kinesis)
            leases = await self._store.list_leases()
            specs = self._streams.specs
            empty = [spec for spec in specs if not self._streams.leases_of(spec, leases)]
            if empty:
                await asyncio.gather(*(self._sync(spec, []) for spec in empty))
            self._spawn(self._renewer.run(), "renewer")
            await self.take_cycle()
        except BaseException:
            await self.stop(release=True)
            raise
        self._spawn(self._take_loop(), "take")
        self._spawn(
            self._sync_loop(listed=len(empty) == len(specs), contended=self._sync_contended),
            "shard-sync",
        )
        if changes is not None:
            self._spawn(self._pickup_loop(changes), "pickup")
        if self._fleet is not None and self._fleet.kcl3:
            self._spawn(self._fleet_loop(self._fleet), "fleet")

    async def acquisitions(self) -> AsyncIterator[OwnedLease]:
        """The leases this worker takes, as it takes them, until :meth:`stop`."""
        while True:
            if self.acquired.empty() and self._stopped.is_set():
                return
            getter = asyncio.ensure_future(self.acquired.get())
            try:
                await first_of(getter, self._stopped)
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled():
                    self.acquired.put_nowait(getter.result())  # not delivered: keep it
                raise
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                yield getter.result()

    async def release(self, owned: OwnedLease, *, why: ReleasedWhy = "shard_done") -> bool:
        """Give ``owned`` up after its final checkpoint; True if the table shows it free."""
        return await owned.release(why)

    async def shard_ended(self, owned: OwnedLease, children: Sequence[ChildShard]) -> None:
        """After the SHARD_END checkpoint: create the children's leases, record them on the parent.

        ``children`` as GetRecords reported them; if empty they are read from ListShards.
        """
        spec = self._streams.spec_of(owned.lease) or StreamSpec(owned.stream)
        found = list(children) or await self._children_from_listing(spec, owned.shard_id)
        plan = LeasePlan((tuple(child_leases(found, self._streams.identifier_of(spec))),))
        await create_in_order(self._store, plan, concurrency=self._settings.renew_concurrency)
        child_ids = tuple(sorted(child.shard_id for child in found))
        await owned.record_children(child_ids)
        self._events.for_shard(owned.stream, owned.shard_id).emit(
            ShardEnded, child_shard_ids=child_ids
        )

    async def parents_done(self, owned: OwnedLease) -> bool:
        """Whether every parent's lease has checkpoint SHARD_END (a missing one does not block)."""
        for parent in sorted(owned.parent_shard_ids):
            lease = await self._store.get(self._streams.key_for(owned.lease, parent))
            if lease is not None and lease.checkpoint.sequence_number != SHARD_END:
                return False
        return True

    async def wait_parents_done(self, owned: OwnedLease) -> bool:
        """Wait until :meth:`parents_done` (True), re-reading every ``parent_poll_interval``
        and as soon as a parent's lease is seen finished (on the table's stream, or in a
        scan); a read that fails is tried again then. False as soon as ``owned`` is lost or
        the coordinator stops."""
        parents = [self._streams.key_for(owned.lease, p) for p in owned.parent_shard_ids]
        while not owned.lost.is_set() and not self._stopped.is_set():
            ended = asyncio.Event()  # registered before the read: an end seen meanwhile wakes it
            for key in parents:
                self._parent_waiters.setdefault(key, {})[ended] = None
            try:
                try:
                    if await self.parents_done(owned):
                        return True
                except AwsError as exc:
                    log.info("reading the parents of %s failed; again: %s", owned.lease_key, exc)
                await first_of(
                    owned.lost, ended, self._clock.sleep(self._settings.parent_poll_interval)
                )
            finally:
                for key in parents:
                    waiting = self._parent_waiters.get(key)
                    if waiting is not None:
                        waiting.pop(ended, None)
                        if not waiting:
                            del self._parent_waiters[key]
        return False

    def _shard_ended_seen(self, lease_key: str) -> None:
        """A lease was seen with checkpoint SHARD_END: its children waiting here read again
        now rather than at their next poll (a child of a split waited up to 10 s)."""
        for event in self._parent_waiters.pop(lease_key, ()):
            event.set()

    async def leave(self) -> int:
        """Begin leaving: take nothing more and, with ``handoff``, hand every held lease to
        the least loaded live workers (each lease's ``giving_up`` is set: the consumer drains,
        checkpoints and releases it, which completes the handoff). Leases nobody can get are
        left to :meth:`stop`, which releases them. Returns how many handoffs began."""
        return await self._moves.leave()

    async def stop(self, *, release: bool = True) -> None:
        """Stop renewing and taking. With ``release`` free every lease still held (others take
        them at once; a lease being handed over goes to its next owner); without, they stay
        usable until their deadline and then expire. With ``handoff``, leases handed to this
        worker meanwhile are passed on (released) rather than left to expire."""
        if self._stopped.is_set():
            return
        self._moves.leaving = True
        self._stopped.set()
        self._taker.enabled = False
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        held = list(self._owned.values())
        for owned in held:
            owned.giving_up.set()
        if release:
            await run_bounded(
                held, self._release_quietly, concurrency=self._settings.renew_concurrency
            )
            if self._settings.handoff and self._started:
                await self._moves.pass_on_inbound()
        if self._fleet is not None:
            await self._fleet.withdraw()
        keeper = self._keeper
        if keeper is not None and keeper.active and not self._owned and not self._taker.expiring:
            # Nothing held depends on the heartbeat any more (a lease left to expire would:
            # its item stays, and peers fence it once it lapsed).
            await keeper.delete()
        if isinstance(self._store, LeaseStoreBase):
            # The change marker's last bumps (sent in the background) tell the peers about
            # the releases at once rather than at their next whole-table scan.
            await self._store.settle_marks()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop(release=True)

    async def take_cycle(self, leases: list[Lease] | None = None) -> list[OwnedLease]:
        """Scan the table once (or use ``leases``, a complete scan just made) and take what
        the balance rules allow; the leases taken."""
        return await self._taker.take_cycle(leases)

    async def renew_all(self) -> None:
        """Renew every held lease once, now."""
        await self._renewer.renew_all()

    async def sync_shards(self) -> None:
        """List every stream's shards and create the missing leases (lineage order)."""
        leases = await self._store.list_leases()
        for spec in self._streams.specs:
            await self._sync(spec, self._streams.leases_of(spec, leases))

    # --- held leases --------------------------------------------------------------------------

    def _adopt(self, planned: PlannedTake, lease: Lease, sent: float) -> OwnedLease:
        """A take sent at ``sent`` succeeded: hold the lease, announce it."""
        spec = self._streams.spec_of(lease)
        assert spec is not None  # the taker only plans leases of our streams
        owned = OwnedLease(
            lease,
            stream=spec.name,
            store=self._store,
            worker_id=self._worker_id,
            settings=self._settings,
            clock=self._clock,
            acquired_at=sent,
            on_end=self._ended,
        )
        self._owned[lease.lease_key] = owned
        self._renewer.adopt(owned)  # its renewal slot now, not at the renewer's next pass
        self._events.for_shard(spec.name, lease.shard_id).emit(
            LeaseAcquired,
            lease_key=lease.lease_key,
            how=planned.how,
            previous_owner=planned.lease.lease_owner,
            checkpoint=lease.checkpoint,
        )
        self.acquired.put_nowait(owned)
        return owned

    def _renewed(self, owned: OwnedLease, duration: float) -> None:
        self._taker.tracker.answered(self._clock.monotonic())
        self._moves.consider(owned.lease)
        self._events.for_shard(owned.stream, owned.shard_id).emit(
            LeaseRenewed,
            lease_key=owned.lease_key,
            counter=owned.lease.lease_counter,
            duration=duration,
        )

    def _renew_failed(self, owned: OwnedLease) -> None:
        """The table did not answer a renewal: until a call of this worker succeeds again,
        the time does not count towards others' expiry (they may not have been able to write
        either); see :meth:`ExpiryTracker.blind`."""
        self._taker.tracker.blind(self._clock.monotonic())

    def _ended(self, owned: OwnedLease) -> None:
        """An owned lease ended (lost or released): forget it and say so."""
        if self._owned.get(owned.lease_key) is owned:
            del self._owned[owned.lease_key]
        events = self._events.for_shard(owned.stream, owned.shard_id)
        why = owned.ended_why
        if owned.released:
            assert why in ("shutdown", "shard_done", "handoff", "requested")
            self._taker.saw_own_write(owned.lease)
            events.emit(LeaseReleased, lease_key=owned.lease_key, why=why)
        else:
            assert why in ("taken", "expired", "deleted", "handoff")
            if owned.left_to_expire:
                # A handler of the shard still runs here: neither claimed again nor released
                # by this worker (see pass_on_inbound); others take it once it expired.
                self._taker.expiring.add(owned.lease_key)
            elif why == "expired" and self.running:
                # Lapsed here (the table did not answer renewals), taken by nobody yet: claim
                # it again at once, one conditional write (the peers judge it expired only a
                # failover time after they saw its last renewal, a moment from now); if that
                # fails too, the take cycle resumes it (leases that name this worker) once
                # the take loop's pause allows, rather than leave it to expire for the others.
                # Not a take cycle of its own: with renewals spread over the interval leases
                # lapse one by one, and a cycle for each was a scan for each.
                self._spawn(self._reclaim(owned.lease), f"reclaim-{owned.shard_id}")
                self._take_soon.set()
            events.emit(
                LeaseLost,
                lease_key=owned.lease_key,
                why=why,
                new_owner=owned.new_owner,
                lapse=owned.lapse,
            )

    async def _reclaim(self, lease: Lease) -> None:
        """Claim ``lease`` (as last known here) again after it lapsed here, until it is held
        again, moved (a refusal, or the view shows it elsewhere) or :data:`_RECLAIM_FOR`
        passed: at once, then up to :data:`_RECLAIM` - 1 times within the safety margin
        while other calls of this worker are answered (a brownout), then once a renew
        interval (jittered), as its renewals were: no more writes than the lease cost
        while held. The peers may take it as expired about one safety margin after its
        deadline here; left to the take cycle alone (which the loop's pause holds back while
        the table errs, and which claims with one probe first while nothing is answered), a
        lapsed lease waited for a cycle that got through: in a brownout of half the calls,
        shards stayed without a worker for the rest of it (bench/simulate.py)."""
        taker = self._taker
        tracker = taker.tracker
        settings = self._settings
        quick = Backoff(base=settings.margin / 4, cap=settings.margin / 2, jitter="half")
        until = self._clock.monotonic() + _RECLAIM_FOR * settings.failover_time
        attempt = 0
        while True:
            sent = self._clock.monotonic()
            try:
                if await taker.claim(lease, "resumed", quiet=True) is not None:
                    return
            except Exception:
                log.exception("reclaiming lease %s failed", lease.lease_key)
                return
            attempt += 1
            if not tracker.failed_since(sent) or not self.running or sent >= until:
                return  # refused (the lease moved), or not a lapsed lease any more
            if attempt < _RECLAIM and tracker.answered_since(sent):
                pause = quick.delay(attempt - 1, self._rng)
            else:
                pause = settings.renew_every * self._rng.uniform(0.75, 1.0)
            await self._clock.sleep(pause)
            if lease.lease_key in self._owned or not self.running:
                return  # resumed meanwhile by a take cycle
            seen = taker.seen(lease.lease_key)
            if seen is not None:
                if not seen.held_by(self._worker_id) or seen.checkpoint_owner is not None:
                    return  # moved on, as the table's stream showed
                if seen.lease_counter > lease.lease_counter:
                    lease = seen

    async def _release_quietly(self, owned: OwnedLease) -> None:
        try:
            await owned.release("shutdown")
        except ShardflowError as exc:
            log.warning("releasing lease %s at shutdown failed: %s", owned.lease_key, exc)

    # --- a KCL 3.x fleet -----------------------------------------------------------------------

    async def _join_fleet(self) -> None:
        """On a DynamoDB lease table of a KCL 3.x application: publish this worker's metrics
        so the KCL leader counts it, and learn whether a KCL worker is alive."""
        if not isinstance(self._store, DynamoDBLeaseStore):
            return
        fleet = KclFleet(
            self._store.client, self._store.table_name, self._worker_id, clock=self._clock
        )
        if await fleet.detect():
            await fleet.report()
        self._fleet = fleet
        log.info("worker %s starts in fleet mode %s", self._worker_id, fleet.mode)

    async def _fleet_loop(self, fleet: KclFleet) -> None:
        while True:
            await self._clock.sleep(REPORT_EVERY)
            await self._guarded("worker metrics", fleet.report())

    def _mode_seen(self, mode: LeaseMode) -> None:
        """The table's lease mode as a read showed it: the heartbeat follows it, unless a KCL
        worker is present or possible (a KCL 3.x application: its workers judge leases
        lease by lease)."""
        keeper = self._keeper
        if keeper is None or not self._started or self._stopped.is_set():
            return
        kcl_possible = self._fleet is not None and self._fleet.kcl3
        keeper.want(mode == "heartbeat" and not kcl_possible)
        task = self._heartbeat_task
        if keeper.busy and (task is None or task.done()):
            self._spawn(keeper.run(), "heartbeat")
            self._heartbeat_task = self._tasks[-1]

    def _scanned(self, leases: list[Lease]) -> None:
        """A complete scan: while the heartbeat keeps the leases, it stands in for the
        renewals that show a per-lease worker its leases whole (a handoff request a moment
        ago ignored, its requester's heartbeat not seen yet, is considered again)."""
        keeper = self._keeper
        if keeper is None or not keeper.covers():
            return
        for lease in leases:
            if lease.lease_key in self._owned:
                self._moves.consider(lease)

    def _renewals_needed(self) -> bool:
        """Whether this worker must renew its leases one by one although the table's mode is
        ``heartbeat`` (its heartbeat is then kept, so peers see who it is, but covers nothing):

        - its lease pick-up is off: a lease taken from it would go unnoticed until its next
          write (renewals are what tell a per-lease worker);
        - a worker that keeps no heartbeat renews or checkpoints leases (a shardflow version
          without the heartbeat mode: it judges expiry lease by lease and would take leases
          that are not renewed; a KCL 2.x worker cannot even start on a table with these
          items). Every worker of this version registers a heartbeat within one take
          interval of seeing the mode, which is when a heartbeat starts to cover leases:
          a lease writer without one by then is not one of them."""
        keeper = self._keeper
        if self._moves.pickup_source == "off":
            return True
        if keeper is None or keeper.wanted_since is None:
            return False
        now = self._clock.monotonic()
        settings = self._settings
        foreign: frozenset[str] = frozenset()
        if now - keeper.wanted_since >= settings.take_every:
            seen = self._taker.tracker.lease_keepers_without_heartbeat(now, settings.failover_time)
            foreign = frozenset(seen - {self._worker_id})
        if foreign != self._foreign:
            self._foreign = foreign
            if foreign:
                log.warning(
                    "lease table %s is in the heartbeat mode but %s renew leases without a "
                    "heartbeat (shardflow without the heartbeat mode?): worker %s renews its "
                    "leases one by one",
                    self._store.table_name,
                    ", ".join(sorted(foreign)),
                    self._worker_id,
                )
        return bool(foreign)

    def _beat_answered(self, answered: bool, at: float) -> None:
        tracker = self._taker.tracker
        if answered:
            tracker.answered(at)
        else:
            tracker.blind(at)

    def _beaten(
        self, counter: int, outcome: BeatOutcome, late: float, duration: float, leases: int
    ) -> None:
        self._events.emit(
            HeartbeatBeat,
            counter=counter,
            outcome=outcome,
            late=late,
            duration=duration,
            leases=leases,
        )

    def _defers_to_kcl(self) -> bool:
        return self._fleet is not None and self._fleet.defers

    def _live_kcl_workers(self) -> frozenset[str]:
        return self._fleet.kcl_workers if self._fleet is not None else frozenset()

    # --- loops --------------------------------------------------------------------------------

    async def _pickup_loop(self, changes: LeaseChanges) -> None:
        """Feed lease changes to the moves. If the feed itself fails (its first describe was
        throttled, say) it starts again after a pause: without it this worker would quietly
        fall back to take cycles for the rest of its life."""
        while True:
            try:
                async for view in changes.views():
                    await self._guarded("lease pick-up", self._moves.picked_up(view))
            except ShardflowError as exc:
                log.warning("lease pick-up failed; starting it again: %s", exc)
            await self._clock.sleep(self._settings.renew_every)

    async def _take_loop(self) -> None:
        """A take cycle every ``take_interval``, and sooner: when pick-up saw a lease move,
        when an observed lease expires, when a handoff becomes overdue.

        While the table errs, a cycle in which any call of this worker failed (its scan, a
        take, or a renewal meanwhile) is followed by a pause (:data:`_RETRY_PAUSE`, doubling up
        to a quarter of failover_time, jittered so that a fleet does not retry in step), and no wake cuts the pause short. The early moments above are planned from
        the last scan that succeeded and lie in the past by then (once retried at once, in
        a loop, through a whole brownout); and with renewals spread over the renew interval
        each lease that lapsed here woke the loop on its own, each wake a scan of a table
        that failed half of all calls: a retry storm that deepens the outage (10,000 leases,
        100 workers: 521 Scan pages per worker-minute in the brownout, bench/simulate.py).
        Leases that lapsed here meanwhile are claimed again by the first cycle after the
        pause, before the others may take them (they judge the lapse from their own
        sightings, a failover time later)."""
        settings = self._settings
        retry = Backoff(
            base=_RETRY_PAUSE,
            cap=min(settings.take_every, settings.failover_time / 4),
            max_attempts=None,
            jitter="half",
        )
        next_cycle = self._clock.monotonic() + settings.take_every
        failures = 0
        not_before = -math.inf
        while True:
            wake = next_cycle
            early = self._taker.next_wake()
            if early is not None:
                wake = min(wake, early + 0.01)  # just after: the lease is expired by then
            wake = max(wake, not_before)
            await self._sleep_unless(self._take_soon, max(wake - self._clock.monotonic(), 0.0))
            if self._clock.monotonic() < not_before:
                # Woken (a lease moved or lapsed) within the pause: the cycle waits for it.
                await self._clock.sleep(not_before - self._clock.monotonic())
            self._take_soon.clear()
            if self._moves.leaving:
                return
            # Woken early with the table's stream read: plan on what the stream showed since
            # the last scan; the table itself is scanned on the take interval.
            started = self._clock.monotonic()
            periodic = started >= next_cycle
            from_view = not periodic and self._moves.pickup_source == "stream"
            cycle = self._taker.take_cycle(from_view=from_view)
            answered = await self._guarded("take cycle", cycle)
            now = self._clock.monotonic()
            if answered and not self._taker.tracker.failed_since(started):
                failures = 0
                not_before = -math.inf
            else:
                not_before = now + retry.delay(failures, self._rng)
                failures += 1
            if not from_view:
                next_cycle = now + settings.take_every

    async def _sync_loop(self, *, listed: bool, contended: bool) -> None:
        if contended:
            # Another worker was creating the new application's leases as this one started:
            # look for what it left out once it had the time to finish (or had crashed).
            await self._sleep_unless(self._sync_wanted, self._settings.failover_time)
            self._sync_wanted.clear()
            await self._guarded("shard sync", self.sync_shards())
        elif not listed:
            # Streams that had leases at start: look for shards created meanwhile, soon.
            await self._guarded("shard sync", self.sync_shards())
        interval = self._settings.shard_sync_interval
        last = self._clock.monotonic()
        while True:
            await self._sleep_unless(self._sync_wanted, interval)
            asked = self._sync_wanted.is_set()
            self._sync_wanted.clear()
            now = self._clock.monotonic()
            if not asked and not self._syncs_periodically(now - last):
                continue
            last = now
            await self._guarded("shard sync", self.sync_shards())

    def _syncs_periodically(self, since_last: float) -> bool:
        """Whether this worker's periodic shard sync is due: every ``shard_sync_interval`` for
        the fleet's sync leader (the live worker with the lowest id, as the last take cycle
        saw the fleet), every ``SYNC_BACKSTOP`` intervals for the others, in case the leader
        cannot list shards. Every worker listing every shard each minute made shard syncs
        O(shards x workers): 100 workers on 10,000 shards listed a million shards a minute
        (bench/simulate.py). A sync asked for (a finished shard whose children lack leases)
        runs on any worker at once, as before."""
        plan = self._taker.last_plan
        live = plan.live_workers | {self._worker_id} if plan is not None else frozenset()
        leader = not live or min(live) == self._worker_id
        every = self._settings.shard_sync_interval * (1 if leader else SYNC_BACKSTOP)
        return since_last >= every - 1e-6

    def _want_sync(self) -> None:
        self._sync_wanted.set()

    async def _sync(self, spec: StreamSpec, existing: list[Lease]) -> None:
        await sync_stream(
            self._store,
            self._kinesis,
            spec.name,
            existing,
            initial=spec.initial_position or self._initial,
            stream_identifier=self._streams.identifier_of(spec),
            concurrency=self._settings.renew_concurrency,
            on_contended=self._contended,
        )

    def _contended(self) -> None:
        self._sync_contended = True

    async def _children_from_listing(self, spec: StreamSpec, shard_id: str) -> list[ChildShard]:
        shards = await list_shards(self._kinesis, spec.name)
        return [
            ChildShard(shard.shard_id, shard.parent_ids, shard.hash_range)
            for shard in shards
            if shard_id in shard.parent_ids
        ]

    # --- plumbing -----------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks = [task for task in self._tasks if not task.done()]
        self._tasks.append(asyncio.create_task(work, name=f"shardflow-lease-{name}"))

    async def _guarded(self, what: str, work: Coroutine[Any, Any, object]) -> bool:
        """Run ``work``; False (logged) if it failed."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except AwsError as exc:
            log.warning("%s of worker %s failed; tried again later: %s", what, self._worker_id, exc)
            return False
        except Exception:
            log.exception("%s of worker %s failed; tried again later", what, self._worker_id)
            return False
        return True

    async def _sleep_unless(self, event: asyncio.Event, seconds: float) -> None:
        """Sleep ``seconds`` on the coordinator's clock, or until ``event`` is set."""
        await first_of(event, self._clock.sleep(seconds))
