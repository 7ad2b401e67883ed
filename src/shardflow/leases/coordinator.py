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
        clock=SYSTEM_CLOCK, on_event=callback,  # callback(DiagnosticEvent), see consumer.events
    )
    await coordinator.start()        # table, first shard sync, first take: returns with leases
    async for owned in coordinator.acquisitions():   # OwnedLease, as each is taken (ends at stop)
        ...                          # or: owned = await coordinator.acquired.get()
    coordinator.owned()              # Mapping[lease_key, OwnedLease] held now
    await coordinator.wait_parents_done(owned)   # True once every parent lease is SHARD_END
    await coordinator.parents_done(owned)        # one check (a missing parent does not block)
    await coordinator.shard_ended(owned, children)  # after the SHARD_END checkpoint
    await coordinator.release(owned)             # after the final checkpoint (shutdown/done)
    await coordinator.stop(release=True)         # stop loops; release what is still held

``OwnedLease`` (shardflow.leases.owned): ``lease_key``, ``stream`` (name given), ``shard_id``,
``lease`` (latest item), ``checkpoint``, ``completed_state``, ``parent_shard_ids``,
``hash_range``, ``lost`` and ``giving_up`` (asyncio.Event), ``valid()``, ``deadline``,
``writer`` (CheckpointWriter: refuses with ShardLeaseLost once not valid), ``record_children``.
A shard may be processed only while ``owned.valid()``; when ``lost`` is set stop at once and
never checkpoint again (the writer refuses anyway). When ``giving_up`` is set (shutdown, or a
KCL 3.x handoff away from this worker) checkpoint what was handled, then ``release``.

Behaviour
---------
- Renewal: every ``renew_interval`` each held lease is queued for renewal; a fixed pool of
  ``renew_concurrency`` tasks renews them, so a slow lease delays only itself. The loop also
  wakes at the earliest lease deadline to set ``lost`` on leases that could not be renewed.
- Take cycle: at start and every ``take_interval``: scan the table, update the expiry tracker
  (observer's own clock), plan with :func:`~shardflow.leases.balance.plan_takes` (free, then
  expired, then at most ``max_leases_to_steal_at_once`` from a worker above target), take.
  Finished shards (checkpoint SHARD_END) are never taken; once all their children started
  their leases are deleted (``cleanup_finished_leases``), as KCL does.
- Shard sync: at start for every stream without leases (before the first take), then every
  ``shard_sync_interval`` and whenever a finished shard's children lack leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any, Final, Self

from shardflow.aws.kinesis import list_shards
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.events import (
    DiagnosticEvent,
    EventCallback,
    LeaseAcquired,
    LeaseLost,
    LeaseReleased,
    LeaseRenewed,
    ReleasedWhy,
    ShardEnded,
    WorkerJoined,
    WorkerLeft,
)
from shardflow.consumer.fetch.batch import ChildShard
from shardflow.errors import LeaseConditionFailed, ShardflowError
from shardflow.leases.balance import PlannedTake, plan_takes
from shardflow.leases.concurrency import run_bounded
from shardflow.leases.expiry import ExpiryTracker
from shardflow.leases.keys import multi_stream_lease_key
from shardflow.leases.model import Lease
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings, StreamSpec, check_initial_position
from shardflow.leases.shard_sync import (
    LeasePlan,
    child_leases,
    create_in_order,
    resolve_stream_identifier,
    sync_stream,
)
from shardflow.leases.store import LeaseStore
from shardflow.positions import StartPosition
from shardflow.records import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON

log = logging.getLogger("shardflow.leases")

_NOT_STARTED: Final = frozenset({TRIM_HORIZON, LATEST, AT_TIMESTAMP})


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
        rng: random.Random | None = None,
    ) -> None:
        if not worker_id:
            raise ValueError("worker_id must be a non-empty string")
        specs = [StreamSpec(s) if isinstance(s, str) else s for s in streams]
        if not specs:
            raise ValueError("a coordinator needs at least one stream")
        if len({spec.name for spec in specs}) != len(specs):
            raise ValueError("a stream is listed twice")
        self._store = store
        self._worker_id = worker_id
        self._specs = specs
        self._multi_stream = len(specs) > 1 or any(s.identifier is not None for s in specs)
        self._kinesis = kinesis
        self._settings = settings or LeaseSettings()
        self._initial = check_initial_position(initial_position or StartPosition.trim_horizon())
        self._clock = clock
        self._on_event = on_event
        self._rng = rng or random.Random()
        self._tracker = ExpiryTracker(self._settings.failover_time)
        self._owned: dict[str, OwnedLease] = {}
        self._identifiers: dict[str, StreamSpec] = {}  # stream identifier -> spec (multi-stream)
        self._live_peers: frozenset[str] = frozenset()
        self.acquired: asyncio.Queue[OwnedLease] = asyncio.Queue()
        """Every lease this worker takes, as it is taken (it may be lost by the time it is read)."""
        self._renew_queue: asyncio.Queue[OwnedLease] = asyncio.Queue()
        self._queued: set[str] = set()
        self._sync_wanted = asyncio.Event()
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
        return list(self._specs)

    @property
    def running(self) -> bool:
        return self._started and not self._stopped.is_set()

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
            await self._store.ensure_table()
            if self._multi_stream:
                await self._resolve_identifiers()
            leases = await self._store.list_leases()
            empty = [spec for spec in self._specs if not self._leases_of(spec, leases)]
            if empty:
                await asyncio.gather(*(self._sync(spec, []) for spec in empty))
            self._spawn(self._renew_loop(), "renew")
            for index in range(self._settings.renew_concurrency):
                self._spawn(self._renew_worker(), f"renew-{index}")
            await self.take_cycle()
        except BaseException:
            await self.stop(release=True)
            raise
        self._spawn(self._take_loop(), "take")
        self._spawn(self._sync_loop(listed=len(empty) == len(self._specs)), "shard-sync")

    async def acquisitions(self) -> AsyncIterator[OwnedLease]:
        """The leases this worker takes, as it takes them, until :meth:`stop`."""
        while True:
            if self.acquired.empty() and self._stopped.is_set():
                return
            getter = asyncio.ensure_future(self.acquired.get())
            stopper = asyncio.ensure_future(self._stopped.wait())
            try:
                await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled():
                    self.acquired.put_nowait(getter.result())  # not delivered: keep it
                raise
            finally:
                stopper.cancel()
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
        spec = self._spec_of(owned.lease) or StreamSpec(owned.stream)
        found = list(children) or await self._children_from_listing(spec, owned.shard_id)
        identifier = self._identifier_of(spec)
        plan = LeasePlan((tuple(child_leases(found, identifier)),))
        await create_in_order(self._store, plan, concurrency=self._settings.renew_concurrency)
        child_ids = tuple(sorted(child.shard_id for child in found))
        await owned.record_children(child_ids)
        self._emit(
            ShardEnded(
                worker_id=self._worker_id,
                at=self._clock.wall(),
                stream=owned.stream,
                shard_id=owned.shard_id,
                child_shard_ids=child_ids,
            )
        )

    async def parents_done(self, owned: OwnedLease) -> bool:
        """Whether every parent's lease has checkpoint SHARD_END (a missing one does not block)."""
        for parent in sorted(owned.parent_shard_ids):
            lease = await self._store.get(self._key_for(owned.lease, parent))
            if lease is not None and lease.checkpoint.sequence_number != SHARD_END:
                return False
        return True

    async def wait_parents_done(self, owned: OwnedLease) -> bool:
        """Wait until :meth:`parents_done` (True), re-reading every ``parent_poll_interval``;
        False as soon as ``owned`` is lost or the coordinator stops."""
        while not owned.lost.is_set() and not self._stopped.is_set():
            if await self.parents_done(owned):
                return True
            await self._sleep_unless(owned.lost, self._settings.parent_poll_interval)
        return False

    async def stop(self, *, release: bool = True) -> None:
        """Stop renewing and taking. With ``release`` free every lease still held (others take
        them at once); without, they stay usable until their deadline and then expire."""
        if self._stopped.is_set():
            return
        self._stopped.set()
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

    # --- take cycle ---------------------------------------------------------------------------

    async def take_cycle(self) -> list[OwnedLease]:
        """Scan the table once and take what the balance rules allow; the leases taken."""
        leases = await self._store.list_leases()
        now = self._clock.monotonic()  # after the scan: no item was read later than this
        self._tracker.observe(leases, now)
        ours = [lease for lease in leases if self._spec_of(lease) is not None]
        active, finished = self._split_finished(ours)
        plan = plan_takes(
            active,
            worker_id=self._worker_id,
            held=self._owned.keys(),
            is_expired=lambda lease: self._tracker.is_expired(lease, now),
            max_leases_per_worker=self._settings.max_leases_per_worker,
            max_steal=self._settings.max_leases_to_steal_at_once,
            rng=self._rng,
        )
        self._note_workers(plan.live_workers)
        taken: list[OwnedLease] = []

        async def take(planned: PlannedTake) -> None:
            owned = await self._take(planned)
            if owned is not None:
                taken.append(owned)

        await run_bounded(plan.takes, take, concurrency=self._settings.renew_concurrency)
        if finished and self._settings.cleanup_finished_leases:
            await self._clean_up(finished, ours)
        return taken

    def _split_finished(self, leases: list[Lease]) -> tuple[list[Lease], list[Lease]]:
        """Leases with work left, and finished ones (SHARD_END); asks for a shard sync when a
        finished shard's children have no leases yet."""
        keys = {lease.lease_key for lease in leases}
        active: list[Lease] = []
        finished: list[Lease] = []
        for lease in leases:
            if lease.checkpoint.sequence_number != SHARD_END:
                active.append(lease)
                continue
            finished.append(lease)
            children = {self._key_for(lease, child) for child in lease.child_shard_ids}
            if not children or not children <= keys:
                self._sync_wanted.set()
        return active, finished

    async def _take(self, planned: PlannedTake) -> OwnedLease | None:
        seen = planned.lease
        spec = self._spec_of(seen)
        if spec is None or self._stopped.is_set():
            return None
        sent = self._clock.monotonic()
        try:
            lease = await self._store.take(seen, self._worker_id)
        except LeaseConditionFailed:
            return None  # another worker was quicker, or the owner renewed meanwhile
        except ShardflowError as exc:
            log.warning("taking lease %s failed: %s", seen.lease_key, exc)
            return None
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
        self._emit(
            LeaseAcquired(
                worker_id=self._worker_id,
                at=self._clock.wall(),
                stream=spec.name,
                shard_id=lease.shard_id,
                lease_key=lease.lease_key,
                how=planned.how,
                previous_owner=seen.lease_owner,
                checkpoint=lease.checkpoint,
            )
        )
        self.acquired.put_nowait(owned)
        return owned

    async def _clean_up(self, finished: list[Lease], leases: list[Lease]) -> None:
        """Delete finished leases whose children all have leases that started (as KCL)."""
        by_key = {lease.lease_key: lease for lease in leases}
        doomed = []
        for lease in finished:
            if lease.lease_key in self._owned or not lease.child_shard_ids:
                continue
            children = [by_key.get(self._key_for(lease, c)) for c in lease.child_shard_ids]
            if all(
                child is not None and child.checkpoint.sequence_number not in _NOT_STARTED
                for child in children
            ):
                doomed.append(lease)

        async def delete(lease: Lease) -> None:
            with contextlib.suppress(ShardflowError):
                await self._store.delete(lease)
                log.info("deleted the lease of finished shard %s", lease.lease_key)

        await run_bounded(doomed, delete, concurrency=self._settings.renew_concurrency)

    def _note_workers(self, live: frozenset[str]) -> None:
        peers = live - {self._worker_id}
        now = self._clock.wall()
        for peer in sorted(peers - self._live_peers):
            self._emit(WorkerJoined(worker_id=self._worker_id, at=now, peer_id=peer))
        for peer in sorted(self._live_peers - peers):
            self._emit(WorkerLeft(worker_id=self._worker_id, at=now, peer_id=peer))
        self._live_peers = peers

    # --- renewal ------------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        """Queue every held lease each renew interval; wake at deadlines to mark lapses."""
        interval = self._settings.renew_every
        next_round = self._clock.monotonic() + interval
        while True:
            now = self._clock.monotonic()
            for owned in list(self._owned.values()):
                if not owned.valid():
                    owned.mark_lost("expired")
            if now >= next_round:
                next_round = now + interval
                for key, owned in list(self._owned.items()):
                    if key not in self._queued:
                        self._queued.add(key)
                        self._renew_queue.put_nowait(owned)
            wake = min([next_round, *(owned.deadline for owned in self._owned.values())])
            await self._clock.sleep(max(wake - self._clock.monotonic(), 0.0))

    async def _renew_worker(self) -> None:
        while True:
            owned = await self._renew_queue.get()
            self._queued.discard(owned.lease_key)
            started = self._clock.monotonic()
            outcome = await owned.renew()
            if outcome == "renewed":
                self._emit(
                    LeaseRenewed(
                        worker_id=self._worker_id,
                        at=self._clock.wall(),
                        stream=owned.stream,
                        shard_id=owned.shard_id,
                        lease_key=owned.lease_key,
                        counter=owned.lease.lease_counter,
                        duration=self._clock.monotonic() - started,
                    )
                )

    async def renew_all(self) -> None:
        """Renew every held lease once, now (bounded concurrency); for tests and tools."""
        await run_bounded(
            list(self._owned.values()),
            self._renew_one,
            concurrency=self._settings.renew_concurrency,
        )

    async def _renew_one(self, owned: OwnedLease) -> None:
        await owned.renew()

    def _ended(self, owned: OwnedLease) -> None:
        """An owned lease ended (lost or released): forget it and say so."""
        if self._owned.get(owned.lease_key) is owned:
            del self._owned[owned.lease_key]
        common: dict[str, Any] = {
            "worker_id": self._worker_id,
            "at": self._clock.wall(),
            "stream": owned.stream,
            "shard_id": owned.shard_id,
            "lease_key": owned.lease_key,
        }
        why = owned.ended_why
        if owned.released:
            assert why in ("shutdown", "shard_done", "handoff", "requested")
            self._emit(LeaseReleased(**common, why=why))
        else:
            assert why in ("taken", "expired", "deleted", "handoff")
            self._emit(LeaseLost(**common, why=why, new_owner=owned.new_owner))

    async def _release_quietly(self, owned: OwnedLease) -> None:
        try:
            await owned.release("shutdown")
        except ShardflowError as exc:
            log.warning("releasing lease %s at shutdown failed: %s", owned.lease_key, exc)

    # --- shard sync ---------------------------------------------------------------------------

    async def sync_shards(self) -> None:
        """List every stream's shards and create the missing leases (lineage order)."""
        leases = await self._store.list_leases()
        for spec in self._specs:
            await self._sync(spec, self._leases_of(spec, leases))

    async def _sync(self, spec: StreamSpec, existing: list[Lease]) -> None:
        await sync_stream(
            self._store,
            self._kinesis,
            spec.name,
            existing,
            initial=spec.initial_position or self._initial,
            stream_identifier=self._identifier_of(spec),
            concurrency=self._settings.renew_concurrency,
        )

    async def _take_loop(self) -> None:
        while True:
            await self._clock.sleep(self._settings.take_every)
            await self._guarded("take cycle", self.take_cycle())

    async def _sync_loop(self, *, listed: bool) -> None:
        if not listed:
            # Streams that had leases at start: look for shards created meanwhile, soon.
            await self._guarded("shard sync", self.sync_shards())
        while True:
            await self._sleep_unless(self._sync_wanted, self._settings.shard_sync_interval)
            self._sync_wanted.clear()
            await self._guarded("shard sync", self.sync_shards())

    async def _children_from_listing(self, spec: StreamSpec, shard_id: str) -> list[ChildShard]:
        shards = await list_shards(self._kinesis, spec.name)
        return [
            ChildShard(shard.shard_id, shard.parent_ids, shard.hash_range)
            for shard in shards
            if shard_id in shard.parent_ids
        ]

    # --- streams and keys ---------------------------------------------------------------------

    async def _resolve_identifiers(self) -> None:
        resolved = []
        for spec in self._specs:
            if spec.identifier is None:
                identifier = await resolve_stream_identifier(self._kinesis, spec.name)
                spec = StreamSpec(spec.name, identifier, spec.initial_position)
            resolved.append(spec)
        self._specs = resolved
        self._identifiers = {str(spec.identifier): spec for spec in resolved}

    def _identifier_of(self, spec: StreamSpec) -> str | None:
        if not self._multi_stream:
            return None
        return str(spec.identifier) if spec.identifier is not None else None

    def _spec_of(self, lease: Lease) -> StreamSpec | None:
        """The stream a lease belongs to, or None for leases of streams not consumed here."""
        if not self._multi_stream:
            return self._specs[0] if lease.stream_name is None else None
        if lease.stream_name is None:
            return None
        return self._identifiers.get(lease.stream_name)

    def _leases_of(self, spec: StreamSpec, leases: list[Lease]) -> list[Lease]:
        return [lease for lease in leases if self._spec_of(lease) is spec]

    def _key_for(self, lease: Lease, shard_id: str) -> str:
        """The lease key of ``shard_id`` in the same stream as ``lease``."""
        if lease.stream_name is None:
            return shard_id
        return multi_stream_lease_key(lease.stream_name, shard_id)

    # --- plumbing -----------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(work, name=f"shardflow-lease-{name}"))

    async def _guarded(self, what: str, work: Coroutine[Any, Any, object]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s of worker %s failed; tried again later", what, self._worker_id)

    async def _sleep_unless(self, event: asyncio.Event, seconds: float) -> None:
        """Sleep ``seconds`` on the coordinator's clock, or until ``event`` is set."""
        if event.is_set():
            return
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiter.cancel()

    def _emit(self, event: DiagnosticEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:
            log.exception("diagnostic event callback failed on %s", type(event).__name__)
