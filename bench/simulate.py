"""A simulated fleet: the real lease coordinator, 100 workers, 10,000 shards, a day's churn.

Every worker is shardflow's own :class:`~shardflow.leases.coordinator.LeaseCoordinator` (taker,
balance, handoffs and leaving, renewer, shard sync, lease pick-up from the table's stream),
unchanged, against the in-memory lease table (:class:`~shardflow.leases.InMemoryLeaseTables`,
DynamoDB's conditional-write semantics, its stream read through
:class:`~shardflow.leases.memory.InMemoryLeaseStreams`) and the in-memory Kinesis
(:class:`~shardflow.testing.MemoryKinesis`: shard listing, the split wave), on a virtual clock:
nothing sleeps, time jumps to the next timer once every task has run (the event loop's own
timers follow the same clock). The lease table answers at once (no latency) and a worker's
CPU is free, so what this measures is the algorithm: who takes what when, how many writes,
how many moves, how long a shard waits; not how fast a server answers.

Each worker also runs what the consumer does with a lease (the shard's lifecycle, without
records): a child shard waits for its parents (``wait_parents_done``, as the consumer), a shard
is processed from then until its lease is lost, given up (drain ``--drain`` s, then release,
which completes a handoff) or its shard ends after a split (SHARD_END checkpoint, the
children's leases, release).

Phases, one after the other on the same table (``--phases``):

    startup     W workers start at once on a new application of S shards
    steady      nothing happens for ``--steady`` s: what an idle fleet costs
    scale_out   J workers join at once
    scale_in    the J newest workers leave at once, gracefully (handing their leases over)
    rolling     a deploy: R workers replaced in batches (start B new ones, then B old ones
                leave gracefully, the next batch once they have exited)
    crash       C workers crash at once (no more writes: their leases must expire)
    replace     C new workers join (the crashed ones' replacements)
    brownout    the lease table fails half of all calls for ``--brownout`` s, then every call
                for ``--outage`` s (longer than failover_time - safety margin: leases lapse),
                then answers again; each worker's store retries a failed call as the
                DynamoDB store does (up to 6 attempts within ~1.5 s; ``--no-store-retries``:
                none), its stream reads as lease pick-up does
    split       every open shard is split in two at once (the shard count doubles)
    idle        nothing happens for ``--idle`` s on the split table (twice the leases)

A phase lasts until the fleet has converged (every lease of an unfinished shard held by a
live worker, no handoff under way, every workable shard processed, max - min leases per live
worker <= 1) and stayed so for ``--settle`` s, or ``--max-phase`` s. Per phase:

- converged after: from the phase's event until it converged (the last time, if it broke
  again);
- moves: lease assignments (a lease's processing worker, as the table names it, changing to
  another worker, a first assignment included), against the minimum that phase needed (the
  leases without a live holder, new leases, and the fewest moves from the loads at the
  event to a balance within one lease);
- longest without owner: the longest time a workable shard (not finished, parents finished)
  was processed by no worker, by the workers' own start/stop of processing;
- two owners at once: judged from the table's write history alone (every landed or refused
  write, by which worker, when): a worker whose lease was taken by another may process until
  its last landed write on that lease that moved its leaseCounter + failover_time -
  safety_margin (the deadline every worker keeps, the protocol's rule: a decline of a handoff
  request or a handoff's start moves neither the counter nor the deadline); a take by another
  before that moment is two owners.
  Must be 0. (Also checked from the workers' processing: two at once on one shard.)
- lease-table requests per worker per minute: every call a worker made to the lease table
  and its stream, by operation; a Scan counts its pages (1 MB each, as DynamoDB pages them).

Lease modes (``--modes``): ``per-lease`` (every held lease renewed on its own, KCL's way, the
default) and ``heartbeat`` (the table's mode item says ``heartbeat`` before the first worker
starts: one heartbeat item per worker keeps its leases, see ``shardflow.leases.heartbeat``).
The mode is one entry of ``LEASE_MODES`` (its settings, the table's mode, how a worker is made).
In the heartbeat mode the two-owners check counts a worker's heartbeats as writes that keep
every lease it holds (its deadline follows its last beat too), and the steady (idle) phase
starts once every worker's heartbeat stands in for its renewals (one take interval + 1 s
after it started, then its next beat; the wait is counted in no phase).

Costs: DynamoDB write units (every conditional write, landed or refused, of an item under
1 KB) and read units (strongly consistent: a Scan page costs its size / 4 KB, a GetItem 1) per
hour of the whole fleet, per phase; ``render_costs`` prints the idle (steady) phase of each
mode against the per-lease mode's of the same run.

A day (``render_day``): the issue asks for 24 simulated hours of churn. The phases run in
full; the rest of the day, quiet between the events, is **extrapolated**, not run: each event
is followed by an equal share of it, costed at the rate of the quiet phase measured on a table
of the same size (``steady`` before the split, ``idle`` after it), and the JSON says so
(``day.extrapolated``, ``day.gaps``). Running it would not finish in minutes in one process:
per lease, 10,000 leases renewed every 3.3 s are ~260 million renewals a day, each read from
the table's stream by every one of the 100 workers; nothing but the clock changes meanwhile.

Lease modes run side by side, each in a process of its own (``--jobs``); ``--phase-wall``
cuts a phase after that many wall seconds (reported, ``cut_at_wall_limit``) so that one that
does not converge cannot take the whole run.

Lease timings are shardflow's defaults (KCL's: failover 10 s, renew every 3.308 s, take cycle
every 20.05 s, shard sync every 60 s), handoff on, pick-up from the table's stream.

    .venv/bin/python bench/simulate.py           # 10,000 shards, 100 workers, both modes (minutes)
    .venv/bin/python bench/simulate.py --short   # 1,000 shards, 10 workers (seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import gc
import heapq
import json
import logging
import math
import multiprocessing
import os
import platform
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from shardflow.aws.kinesis import list_shards
from shardflow.clock import ManualClock
from shardflow.errors import ShardflowError, TransientError
from shardflow.events import DiagnosticEvent, LeaseAcquired, LeaseLost
from shardflow.leases import InMemoryLeaseStore, InMemoryLeaseTables
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.dynamodb import LEASE_BACKOFF
from shardflow.leases.entities import LeaseMode as TableLeaseMode
from shardflow.leases.memory import InMemoryLeaseStreams, LeaseWriteSeen
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings, PickupMode
from shardflow.records import SHARD_END, ExtendedSequenceNumber
from shardflow.shards import ChildShard, ShardInfo
from shardflow.testing import LeaseTableBrownout, MemoryKinesis
from shardflow.waits import first_of

RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
APPLICATION = "simulated"
STREAM = "simulated"
PHASES = (
    "startup",
    "steady",
    "scale_out",
    "scale_in",
    "rolling",
    "crash",
    "replace",
    "brownout",
    "split",
    "idle",
)
QUIET = ("steady", "idle")
"""Phases in which nothing happens: what a quiet stretch of the day costs (see day_totals)."""
DAY = 24 * 3600.0
SCAN_PAGE = 1024 * 1024  # DynamoDB returns at most 1 MB per Scan page
READ_UNIT = 4096  # a strongly consistent read unit
PROGRESS_EVERY = 60.0  # simulated seconds between progress lines of a phase
QUIET_LIMIT = 5_000_000  # turns of the loop at one instant before the simulation gives up


@dataclass(frozen=True)
class Config:
    shards: int = 10_000
    workers: int = 100
    join: int = 10
    rolling: int = 20
    rolling_batch: int = 5
    crash: int = 5
    steady: float = 60.0
    idle: float = 30.0
    brownout: float = 30.0
    brownout_fraction: float = 0.5
    outage: float = 20.0
    settle: float = 20.0
    max_phase: float = 1800.0
    phase_wall: float | None = None
    """Wall seconds after which a phase is cut (reported not converged, ``cut_at_wall_limit``)
    and the next one begins: a phase that does not converge cannot take the whole run."""
    step: float = 0.5
    drain: float = 0.2
    read_to_end: float = 1.0
    pickup: PickupMode = "stream"
    store_retries: bool = True
    """Each worker's store retries the table's failures as the DynamoDB store does
    (``LEASE_BACKOFF``: up to 6 attempts within ~1.5 s), so a brownout reaches the coordinator
    as it would from DynamoDB. False: every failed call reaches it at once (the runs before
    2026-11-28 did so, and saw leases lost to a half-failing table that retries would keep)."""
    seed: int = 1
    phases: tuple[str, ...] = PHASES
    modes: tuple[str, ...] = ("per-lease", "heartbeat")


DEFAULT = Config(phase_wall=300.0)
SHORT = Config(
    shards=1_000,
    workers=10,
    join=2,
    rolling=4,
    rolling_batch=2,
    crash=2,
    steady=60.0,
    idle=30.0,
    brownout=30.0,
    outage=15.0,
    settle=20.0,
    max_phase=900.0,
)


# --- lease modes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseMode:
    """How workers keep their leases: the settings, and how one worker's coordinator is made.
    A new mode is a new entry of :data:`LEASE_MODES`; the phases and figures stay the same."""

    name: str
    description: str
    settings: Callable[[Config], LeaseSettings]
    coordinator: Callable[..., LeaseCoordinator] = LeaseCoordinator
    table_mode: TableLeaseMode | None = None
    """The mode stored in the table before the first worker starts (None: no mode item)."""


LEASE_MODES = {
    "per-lease": LeaseMode(
        "per-lease",
        "every held lease renewed on its own every renew interval (KCL's way)",
        lambda config: LeaseSettings(pickup=config.pickup),
    ),
    "heartbeat": LeaseMode(
        "heartbeat",
        "one heartbeat item per worker every renew interval; leases written when taken, "
        "checkpointed, handed off or released",
        lambda config: LeaseSettings(pickup=config.pickup),
        table_mode="heartbeat",
    ),
}


# --- the clock -----------------------------------------------------------------------------------


class SimClock(ManualClock):
    """A :class:`ManualClock` that runs every task to a standstill before time moves on, and
    that the event loop's own timers (``asyncio.timeout``, ``asyncio.wait``) follow too."""

    def __init__(self) -> None:
        super().__init__(start=0.0)
        self.turns = 0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.time = self.monotonic  # type: ignore[method-assign]

    async def quiesce(self) -> None:
        """Let every ready task run until none is left (nothing else can happen at this
        instant)."""
        loop = asyncio.get_running_loop()
        ready = vars(loop)["_ready"]
        for _ in range(QUIET_LIMIT):
            await asyncio.sleep(0)
            self.turns += 1
            if not ready:
                return
        raise RuntimeError(f"the simulation did not come to rest at t={self.monotonic():.2f}")

    def _next_timer(self) -> float | None:
        """When the loop's earliest live timer is due. The loop keeps its timers in a heap
        and drops cancelled ones only when they reach its top; dropped here the same way (as
        ``BaseEventLoop._run_once`` does), the top is the answer. A pass over every timer
        instead cost O(timers) per instant: with the stores' retries (thousands of jittered
        pauses) that was most of the brownout's wall time at 10,000 x 100."""
        loop = asyncio.get_running_loop()
        state = vars(loop)
        scheduled: list[asyncio.TimerHandle] = state["_scheduled"]
        while scheduled and scheduled[0].cancelled():
            state["_timer_cancelled_count"] -= 1
            handle = heapq.heappop(scheduled)
            handle._scheduled = False  # type: ignore[attr-defined]
        return scheduled[0].when() if scheduled else None

    async def advance(self, seconds: float) -> None:
        target = self._now + seconds
        await self.quiesce()
        for _ in range(QUIET_LIMIT):
            sleeper = self._sleepers[0][0] if self._sleepers else None
            timer = self._next_timer()
            moments = [m for m in (sleeper, timer) if m is not None and m <= target]
            if not moments:
                break
            self._now = max(self._now, min(moments))
            while self._sleepers and self._sleepers[0][0] <= self._now:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            await self.quiesce()
        self._now = target
        await self.quiesce()


# --- what the table shows ------------------------------------------------------------------------


@dataclass
class Tally:
    """Counters of one phase."""

    requests: Counter[str] = field(default_factory=Counter)
    read_units: float = 0.0
    list_shards: int = 0
    writes: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    assignments: int = 0
    two_owners: list[dict[str, Any]] = field(default_factory=list)
    two_processing: int = 0
    gaps: list[float] = field(default_factory=list)
    longest: tuple[float, str, float] = (0.0, "", 0.0)
    """The longest gap that ended in the phase: seconds, lease key, when it began."""
    worker_seconds: float = 0.0
    acquired: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)


def moves_counter(seen: LeaseWriteSeen) -> bool:
    """Whether a landed write created, deleted or changed ``leaseCounter`` of its item."""
    before, after = seen.before, seen.after
    return before is None or after is None or after.lease_counter != before.lease_counter


class Ledger:
    """Who holds what, from the table's writes alone (a :meth:`InMemoryLeaseTables.watch`er)."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self.holder: dict[str, str] = {}
        """Lease key -> the worker processing it as the table names it (the checkpoint owner
        during a handoff, else the owner); free leases are absent."""
        self.loads: Counter[str] = Counter()
        """Leases of unfinished shards per holder."""
        self.pending: set[str] = set()
        self.finished: set[str] = set()
        self.active: set[str] = set()
        self.last_write: dict[tuple[str, str], float] = {}
        self.last_beat: dict[str, float] = {}
        """Worker -> when its last heartbeat landed (the heartbeat mode)."""
        self.created: int = 0

    def seen(self, seen: LeaseWriteSeen) -> None:
        sim = self._sim
        tally = sim.tally
        operation = seen.write.operation
        worker = sim.store_owner[id(seen.store)]
        if seen.refused:
            tally.refused[operation] += 1
            return
        tally.writes[operation] += 1
        now = sim.clock.monotonic()
        key = seen.write.lease_key
        if operation == "heartbeat":
            self.last_beat[worker] = now
            return
        if operation == "register_heartbeat":
            # A new heartbeat keeps nothing (HeartbeatKeeper: only a beat sent once it is
            # established extends held leases). Counted as a beat, a worker that registered
            # again after its old heartbeat was fenced, and after its leases had lapsed
            # here, looked like it kept them: "two owners" 0.2 s after the registration,
            # with no shard processed twice (seed 7 of 1,000 x 20, brownout).
            return
        if key.startswith("_shardflow#"):
            return  # the mode item, a fence or a deleted heartbeat: no lease
        before = self.holder.get(key)
        after_lease = seen.after
        if moves_counter(seen):
            # Only a write that moves leaseCounter keeps a lease: it is what a taker's
            # conditional take proves it saw, and the only kind that moves the writer's own
            # deadline (OwnedLease: a renewal, a checkpoint, its take or claim). A decline, a
            # handoff's start, a request or a leaving mark leaves the counter as it was: the
            # holder's deadline stays where its last counted write put it, and so do the
            # others' expiry clocks. Counting them too reported two owners where neither the
            # protocol nor the workers' processing had any (the default run's brownout, c71ae2b:
            # 2 takes "5.5 s early", each after the old owner declined the taker's request
            # while its renewals failed).
            self.last_write[key, worker] = now
        if after_lease is None:  # deleted
            self._forget(key)
            return
        if key not in self.active and key not in self.finished:
            self.active.add(key)
            self.created += 1
            sim.shard_created(after_lease)
        after = after_lease.actual_owner
        if after_lease.checkpoint_owner is not None:
            self.pending.add(key)
        else:
            self.pending.discard(key)
        finished = after_lease.checkpoint.sequence_number == SHARD_END
        if finished and key not in self.finished:
            if before is not None and key in self.active:
                self.loads[before] -= 1
            self.active.discard(key)
            self.finished.add(key)
            sim.shard_finished(key)
        if after == before:
            return
        if before is not None:
            if key in self.active:
                self.loads[before] -= 1
            del self.holder[key]
            if worker != before and after is not None:
                # Taken from `before` by another worker's write: `before` may go on processing
                # until its last landed counter move + failover_time - safety_margin.
                allowed = (
                    max(
                        self.last_write.get((key, before), -math.inf),
                        self.last_beat.get(before, -math.inf),
                    )
                    + sim.usable_time
                )
                if allowed > now:
                    tally.two_owners.append(
                        {
                            "lease": key,
                            "from": before,
                            "to": after,
                            "by": worker,
                            "at": round(now, 3),
                            "overlap": round(allowed - now, 3),
                            "operation": operation,
                        }
                    )
        if after is not None:
            self.holder[key] = after
            if key in self.active:
                self.loads[after] += 1
            tally.assignments += 1

    def _forget(self, key: str) -> None:
        holder = self.holder.pop(key, None)
        if holder is not None and key in self.active:
            self.loads[holder] -= 1
        self.active.discard(key)
        self.pending.discard(key)
        self.finished.discard(key)


# --- a worker ------------------------------------------------------------------------------------


class SimWorker:
    """One worker: a coordinator and, per lease, the shard's lifecycle as the consumer runs it."""

    def __init__(self, sim: Simulation, worker_id: str, mode: LeaseMode, seed: int) -> None:
        self.sim = sim
        self.worker_id = worker_id
        self.dead = False
        self.running = False
        self.exited = asyncio.Event()
        self.stopping = asyncio.Event()
        self.store = InMemoryLeaseStore(
            APPLICATION,
            tables=sim.tables,
            fault=self._fault,
            backoff=LEASE_BACKOFF if sim.config.store_retries else None,
            rng=random.Random(f"store-{seed}"),
        )
        sim.store_owner[id(self.store)] = worker_id
        streams = (
            InMemoryLeaseStreams(sim.tables, fault=self._fault)
            if sim.config.pickup == "stream"
            else None
        )
        self.coordinator = mode.coordinator(
            self.store,
            worker_id=worker_id,
            streams=[STREAM],
            kinesis=sim.kinesis,
            settings=sim.settings,
            clock=sim.clock,
            rng=random.Random(seed),
            lease_streams=streams,
            on_event=sim.event,
        )
        self._tasks: dict[asyncio.Task[None], None] = {}  # ordered: the same order every run
        self._acceptor: asyncio.Task[None] | None = None

    def _fault(self, operation: str) -> None:
        if self.dead:
            raise TransientError("the worker crashed", operation=operation)
        self.sim.count(operation)
        self.sim.brownout(operation)

    async def start(self) -> None:
        self.running = True
        await self.coordinator.start()
        self._acceptor = asyncio.create_task(self._accept())

    async def _accept(self) -> None:
        async for owned in self.coordinator.acquisitions():
            task = asyncio.create_task(self._shard(owned))
            self._tasks[task] = None
            task.add_done_callback(lambda done: self._tasks.pop(done, None))

    async def _shard(self, owned: OwnedLease) -> None:
        """The shard's lifecycle as the consumer's supervisor runs it (without records)."""
        sim = self.sim
        key = owned.lease_key
        processing = False
        try:
            if owned.parent_shard_ids:
                waiting = asyncio.ensure_future(self.coordinator.wait_parents_done(owned))
                await first_of(waiting, self.stopping)
                if not waiting.done():
                    waiting.cancel()
                    return
                if not waiting.result():
                    return
            if self.stopping.is_set() or not owned.valid():
                return
            sim.processing(key, self.worker_id, True)
            processing = True
            closed = sim.closed_event(owned.shard_id)
            await first_of(owned.lost, owned.giving_up, self.stopping, closed)
            if owned.lost.is_set():
                return
            if closed.is_set() and not owned.giving_up.is_set() and not self.stopping.is_set():
                await sim.clock.sleep(sim.config.read_to_end)  # reads to the shard's end
                if not owned.valid():
                    return
                await owned.writer.write(ExtendedSequenceNumber(SHARD_END))
                sim.processing(key, self.worker_id, False)
                processing = False
                try:
                    await self.coordinator.shard_ended(owned, sim.children_of(owned.shard_id))
                finally:
                    await self.coordinator.release(owned, why="shard_done")
                return
            await sim.clock.sleep(sim.config.drain)  # drains, checkpoints
            sim.processing(key, self.worker_id, False)
            processing = False
            handed = owned.lease.handoff_pending
            await self.coordinator.release(owned, why="handoff" if handed else "shutdown")
        except ShardflowError:
            # As the consumer: never a lease held with nothing processing it.
            if processing:
                sim.processing(key, self.worker_id, False)
                processing = False
            with contextlib.suppress(ShardflowError):
                await self.coordinator.release(owned, why="requested")
        finally:
            if processing:
                sim.processing(key, self.worker_id, False)

    async def leave(self) -> None:
        """A graceful stop, as the consumer's: hand over, drain, release the rest, stop."""
        with contextlib.suppress(ShardflowError):
            await self.coordinator.leave()
        self.stopping.set()
        if self._acceptor is not None:
            self._acceptor.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.coordinator.stop(release=True)
        self.running = False
        self.exited.set()

    async def crash(self) -> None:
        """The process dies: nothing more is written, every shard stops at once."""
        self.dead = True
        if self._acceptor is not None:
            self._acceptor.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.coordinator.stop(release=False)
        self.running = False
        self.exited.set()


# --- the simulation ------------------------------------------------------------------------------


class Simulation:
    def __init__(self, config: Config, mode: LeaseMode, say: Callable[[str], None]) -> None:
        self.config = config
        self.mode = mode
        self.say = say
        self.clock = SimClock()
        self.settings = mode.settings(config)
        self.usable_time = self.settings.usable_time
        self.tables = InMemoryLeaseTables()
        self.kinesis = MemoryKinesis()
        self.kinesis.create_stream(STREAM, config.shards)
        self.brownout = LeaseTableBrownout(seed=config.seed)
        self.rng = random.Random(config.seed)
        self.store_owner: dict[int, str] = {}
        self.tally = Tally()
        self.ledger = Ledger(self)
        self.tables.watch(self.ledger.seen)
        self.workers: dict[str, SimWorker] = {}
        self.live: set[str] = set()
        """Workers counted in the balance: started, not leaving, not crashed."""
        self._numbered = 0
        self._closed: dict[str, asyncio.Event] = {}
        self._children: dict[str, list[ChildShard]] = {}
        self._parents_open: dict[str, set[str]] = {}
        self._waiting_for: dict[str, set[str]] = {}
        self._processor: dict[str, str] = {}
        self._idle_since: dict[str, float] = {}
        self._tasks: dict[asyncio.Task[Any], None] = {}  # ordered: the same order every run
        self.phases: list[dict[str, Any]] = []
        self.on_phase: Callable[[list[dict[str, Any]]], None] = lambda phases: None
        """Called with the phases so far after each one (a long run keeps what it did)."""
        self.own_list_calls = 0
        self._said_at = 0.0
        self._wall_start = self._phase_wall_start = time.perf_counter()
        self._cut = False

    # --- hooks from the workers and the ledger ---------------------------------------------------

    def count(self, operation: str) -> None:
        tally = self.tally
        if operation == "Scan":
            _, size = self.tables.size(APPLICATION)
            tally.requests["Scan"] += max(1, math.ceil(size / SCAN_PAGE))
            tally.read_units += max(1.0, math.ceil(size / READ_UNIT))
        else:
            tally.requests[operation] += 1
            if operation == "GetItem":
                tally.read_units += 1

    def event(self, event: DiagnosticEvent) -> None:
        if isinstance(event, LeaseAcquired):
            self.tally.acquired[event.how] += 1
        elif isinstance(event, LeaseLost):
            self.tally.lost[event.why] += 1

    def closed_event(self, shard_id: str) -> asyncio.Event:
        event = self._closed.get(shard_id)
        if event is None:
            event = self._closed[shard_id] = asyncio.Event()
        return event

    def children_of(self, shard_id: str) -> list[ChildShard]:
        return self._children.get(shard_id, [])

    def shard_created(self, lease: Any) -> None:
        key = lease.lease_key
        open_parents = {p for p in lease.parent_shard_ids if p in self.ledger.active}
        if open_parents:
            self._parents_open[key] = open_parents
            for parent in open_parents:
                self._waiting_for.setdefault(parent, set()).add(key)
        elif key not in self._processor:
            self._idle_since[key] = self.clock.monotonic()

    def shard_finished(self, key: str) -> None:
        self._idle_since.pop(key, None)
        for child in self._waiting_for.pop(key, set()):
            parents = self._parents_open.get(child)
            if parents is None:
                continue
            parents.discard(key)
            if not parents:
                del self._parents_open[child]
                if child not in self._processor and child in self.ledger.active:
                    self._idle_since[child] = self.clock.monotonic()

    def processing(self, key: str, worker: str, started: bool) -> None:
        now = self.clock.monotonic()
        if started:
            if key in self._processor:
                self.tally.two_processing += 1
            self._processor[key] = worker
            since = self._idle_since.pop(key, None)
            if since is not None:
                self.tally.gaps.append(now - since)
                if now - since > self.tally.longest[0]:
                    self.tally.longest = (now - since, key, since)
            return
        if self._processor.get(key) != worker:
            return
        del self._processor[key]
        if key in self.ledger.active and key not in self._parents_open:
            self._idle_since[key] = now

    # --- workers --------------------------------------------------------------------------------

    def new_worker(self) -> SimWorker:
        self._numbered += 1
        worker_id = f"worker-{self._numbered:04d}"
        worker = SimWorker(self, worker_id, self.mode, self.config.seed * 100_003 + self._numbered)
        self.workers[worker_id] = worker
        return worker

    async def join(self, count: int) -> list[SimWorker]:
        joined = [self.new_worker() for _ in range(count)]
        self.live.update(worker.worker_id for worker in joined)
        await asyncio.gather(*(worker.start() for worker in joined))
        return joined

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(work)
        self._tasks[task] = None
        task.add_done_callback(lambda done: self._tasks.pop(done, None))
        return task

    def leave(self, workers: Iterable[SimWorker]) -> list[asyncio.Task[Any]]:
        tasks = []
        for worker in workers:
            self.live.discard(worker.worker_id)
            tasks.append(self.spawn(worker.leave()))
        return tasks

    async def kill(self, workers: Iterable[SimWorker]) -> None:
        for worker in workers:
            self.live.discard(worker.worker_id)
            await worker.crash()

    def running_workers(self) -> list[SimWorker]:
        return [worker for worker in self.workers.values() if worker.running]

    def oldest_live(self, count: int) -> list[SimWorker]:
        return [self.workers[w] for w in sorted(self.live)[:count]]

    def newest_live(self, count: int) -> list[SimWorker]:
        return [self.workers[w] for w in sorted(self.live)[-count:]]

    # --- time -----------------------------------------------------------------------------------

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass in steps, counting worker time."""
        steps = max(1, round(seconds / self.config.step))
        for _ in range(steps):
            self.tally.worker_seconds += len(self.running_workers()) * (seconds / steps)
            await self.clock.advance(seconds / steps)
            self._progress()

    def _progress(self) -> None:
        """A line every ``PROGRESS_EVERY`` simulated seconds of a phase: a long phase shows
        where it stands (workers leaving, handoffs under way, shards without a worker)."""
        now = self.clock.monotonic()
        if now - self._said_at < PROGRESS_EVERY:
            return
        self._said_at = now
        running = self.running_workers()
        leaving = [w for w in running if w.worker_id not in self.live]
        self.say(
            f"    t={now:,.1f} s ({time.perf_counter() - self._wall_start:,.0f} s wall): "
            f"{len(self.live)} live, {len(leaving)} leaving "
            f"(holding {sum(self.ledger.loads[w.worker_id] for w in leaving):,}), "
            f"{len(self.ledger.pending):,} handoffs under way, "
            f"{len(self._idle_since):,} shards without a worker"
        )

    async def until(self, done: Callable[[], bool], limit: float) -> bool:
        """Advance until ``done()`` or ``limit`` seconds passed; whether it was done."""
        end = self.clock.monotonic() + limit
        while not done():
            if self.clock.monotonic() >= end or self._out_of_wall():
                return False
            await self.advance(self.config.step)
        return True

    def _out_of_wall(self) -> bool:
        """The phase has used up ``phase_wall`` seconds of wall time (it is cut, see
        Config.phase_wall)."""
        limit = self.config.phase_wall
        if limit is None or time.perf_counter() - self._phase_wall_start < limit:
            return False
        self._cut = True
        return True

    # --- the state of the fleet -----------------------------------------------------------------

    def converged(self) -> bool:
        ledger = self.ledger
        live = self.live
        if not live or ledger.pending or self._idle_since:
            return False
        loads = [ledger.loads[worker] for worker in live]
        if sum(loads) != len(ledger.active):
            return False  # a lease of an unfinished shard is free, or held by a dead worker
        return max(loads) - min(loads) <= 1

    def minimum_moves(self) -> int:
        """The fewest assignments that balance the fleet from now: every lease of an
        unfinished shard without a live holder once, and from each live worker above its
        share what is above it (the busiest get the larger shares)."""
        ledger = self.ledger
        live = sorted(self.live, key=lambda w: -ledger.loads[w])
        total = len(ledger.active)
        if not live:
            return total
        share, extra = divmod(total, len(live))
        held = 0
        surplus = 0
        for index, worker in enumerate(live):
            load = ledger.loads[worker]
            held += load
            surplus += max(0, load - (share + (1 if index < extra else 0)))
        return total - held + surplus

    # --- phases ---------------------------------------------------------------------------------

    async def phase(
        self,
        name: str,
        action: Callable[[], Coroutine[Any, Any, int | None]],
        *,
        fixed: float | None = None,
    ) -> dict[str, Any]:
        """Run ``action`` (it returns the minimum moves it calls for, or None: computed after
        it), then wait for convergence (or ``fixed`` seconds); the phase's figures."""
        self.tally = Tally()
        self.tally.list_shards = self._list_calls()
        started_wall = self._phase_wall_start = time.perf_counter()
        self._cut = False
        start = self.clock.monotonic()
        created_before = self.ledger.created
        minimum = await action()
        if fixed is not None:
            await self.advance(fixed)
            converged_at: float | None = self.clock.monotonic() if self.converged() else None
            done = converged_at is not None
        else:
            converged_at = None
            deadline = start + self.config.max_phase
            done = False
            while self.clock.monotonic() < deadline and not self._out_of_wall():
                if self.converged():
                    if converged_at is None:
                        converged_at = self.clock.monotonic()
                    if self.clock.monotonic() - converged_at >= self.config.settle:
                        done = True
                        break
                else:
                    converged_at = None
                await self.advance(self.config.step)
        end = self.clock.monotonic()
        if minimum is None:
            minimum = self.ledger.created - created_before
        figures = self._figures(name, start, end, converged_at, done, minimum)
        figures["wall_seconds"] = round(time.perf_counter() - started_wall, 1)
        figures["cut_at_wall_limit"] = self._cut
        self.phases.append(figures)
        self.say(describe(figures))
        self.on_phase(self.phases)
        return figures

    def _figures(
        self,
        name: str,
        start: float,
        end: float,
        converged_at: float | None,
        done: bool,
        minimum: int,
    ) -> dict[str, Any]:
        tally = self.tally
        now = self.clock.monotonic()
        open_gaps = [now - since for since in self._idle_since.values()]
        gaps = tally.gaps + open_gaps
        minutes = tally.worker_seconds / 60.0
        total_requests = sum(tally.requests.values())
        loads = [self.ledger.loads[w] for w in self.live]
        return {
            "name": name,
            "start": round(start, 1),
            "seconds": round(end - start, 1),
            "live_workers": len(self.live),
            "leases": len(self.ledger.active),
            "converged": done,
            "converged_after": round(converged_at - start, 1) if converged_at is not None else None,
            "balance": (max(loads) - min(loads)) if loads else None,
            "moves": tally.assignments,
            "minimum_moves": minimum,
            "longest_without_owner": round(max(gaps), 2) if gaps else 0.0,
            "without_owner_p99": round(percentile(gaps, 0.99), 2) if gaps else 0.0,
            "longest_gap": {
                "lease": tally.longest[1],
                "from": round(tally.longest[2], 1),
                "seconds": round(tally.longest[0], 2),
            },
            "shards_waited": len(gaps),
            "still_without_owner": len(open_gaps),
            "two_owners": len(tally.two_owners),
            "two_owners_examples": tally.two_owners[:5],
            "two_processing": tally.two_processing,
            "requests_per_worker_minute": round(total_requests / minutes, 1) if minutes else None,
            "requests_by_operation": {
                op: round(count / minutes, 2) for op, count in sorted(tally.requests.items())
            }
            if minutes
            else {},
            "read_units_per_worker_minute": round(tally.read_units / minutes, 1)
            if minutes
            else None,
            # The whole fleet, per hour of this phase: every conditional write (landed or
            # refused) of an item under 1 KB costs one write unit.
            "write_units_per_hour": round(
                (sum(tally.writes.values()) + sum(tally.refused.values())) * 3600 / (end - start),
                1,
            )
            if end > start
            else None,
            "read_units_per_hour": round(tally.read_units * 3600 / (end - start), 1)
            if end > start
            else None,
            # Raw counts of the phase, for the day's totals (see day_totals).
            "worker_seconds": round(tally.worker_seconds, 1),
            "requests": dict(sorted(tally.requests.items())),
            "write_units": sum(tally.writes.values()) + sum(tally.refused.values()),
            "read_units": round(tally.read_units, 1),
            "acquired": dict(sorted(tally.acquired.items())),
            "lost": dict(sorted(tally.lost.items())),
            "writes": dict(sorted(tally.writes.items())),
            "refused": dict(sorted(tally.refused.items())),
            "list_shards_calls": self._list_calls() - tally.list_shards,
        }

    def _list_calls(self) -> int:
        return self.kinesis.calls.get("ListShards", 0) - self.own_list_calls

    # --- the phases, one by one --------------------------------------------------------------

    async def startup(self) -> int | None:
        await self.join(self.config.workers)
        return self.config.shards

    async def steady(self) -> int | None:
        return 0

    async def scale_out(self) -> int | None:
        await self.join(self.config.join)
        return self.minimum_moves()

    async def scale_in(self) -> int | None:
        leaving = self.newest_live(self.config.join)
        self.leave(leaving)
        return self.minimum_moves()

    async def rolling(self) -> int | None:
        minimum = 0
        old = self.oldest_live(self.config.rolling)
        batch = self.config.rolling_batch
        for index in range(0, len(old), batch):
            group = old[index : index + batch]
            await self.join(len(group))
            held = sum(self.ledger.loads[w.worker_id] for w in group)
            minimum += held
            tasks = self.leave(group)

            def exited(tasks: list[asyncio.Task[Any]] = tasks) -> bool:
                return all(task.done() for task in tasks)

            await self.until(exited, self.config.max_phase)
        return minimum

    async def crash(self) -> int | None:
        chosen = self.rng.sample(sorted(self.live), self.config.crash)
        await self.kill([self.workers[w] for w in chosen])
        return self.minimum_moves()

    async def replace(self) -> int | None:
        await self.join(self.config.crash)
        return self.minimum_moves()

    async def split(self) -> int | None:
        shards = [shard for shard in await self._list_shards() if shard.is_open]
        for shard in shards:
            low, high = shard.hash_range.start, shard.hash_range.end
            await self.kinesis.split_shard(
                StreamName=STREAM,
                ShardToSplit=shard.shard_id,
                NewStartingHashKey=str((low + high + 1) // 2),
            )
        for shard in await self._list_shards():
            for parent in shard.parent_ids:
                self._children.setdefault(parent, []).append(
                    ChildShard(shard.shard_id, shard.parent_ids, shard.hash_range)
                )
        for shard in shards:
            self.closed_event(shard.shard_id).set()
        return None  # every new lease once: counted at the end

    async def _list_shards(self) -> list[ShardInfo]:
        shards = await list_shards(self.kinesis, STREAM)
        self.own_list_calls += 1
        return shards

    async def brownout_phase(self) -> int | None:
        self.brownout.start(self.config.brownout_fraction)
        await self.advance(self.config.brownout)
        self.brownout.start(1.0)
        await self.advance(self.config.outage)
        self.brownout.stop()
        return 0

    async def _heartbeats_cover(self) -> None:
        """Before the idle phase of the heartbeat mode: wait (uncounted) until every worker's
        heartbeat stands in for its renewals (one take interval + 1 s after it started, then
        its next beat), so that the idle figures are the mode's, not its start-up's."""
        limit = self.clock.monotonic() + self.settings.take_every * 3
        while self.clock.monotonic() < limit:
            workers = self.running_workers()
            if all(w.coordinator.lease_mode == "heartbeat" for w in workers):
                return
            await self.advance(self.config.step)
        self.say("  (not every worker's heartbeat covers its leases yet)")

    async def run(self) -> list[dict[str, Any]]:
        self.clock.install(asyncio.get_running_loop())
        if self.mode.table_mode is not None:
            # The operator's switch, before the fleet starts (a live switch is tested in
            # tests/unit/leases/test_heartbeat_mode.py).
            operator = InMemoryLeaseStore(APPLICATION, tables=self.tables)
            self.store_owner[id(operator)] = "operator"
            await operator.ensure_table(stream_view=self.config.pickup == "stream")
            await operator.set_lease_mode(self.mode.table_mode)
        actions: dict[str, Callable[[], Coroutine[Any, Any, int | None]]] = {
            "startup": self.startup,
            "steady": self.steady,
            "scale_out": self.scale_out,
            "scale_in": self.scale_in,
            "rolling": self.rolling,
            "crash": self.crash,
            "replace": self.replace,
            "split": self.split,
            "brownout": self.brownout_phase,
            "idle": self.steady,
        }
        for name in self.config.phases:
            fixed = {"steady": self.config.steady, "idle": self.config.idle}.get(name)
            if name in QUIET and self.mode.table_mode == "heartbeat":
                await self._heartbeats_cover()
            await self.phase(name, actions[name], fixed=fixed)
        for worker in self.running_workers():
            worker.dead = True
            await worker.coordinator.stop(release=False)
        return self.phases


# --- the report ----------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def describe(phase: dict[str, Any]) -> str:
    if phase["converged"]:
        converged = f"converged after {phase['converged_after']:.1f} s"
    elif phase.get("cut_at_wall_limit") and phase.get("converged_after") is not None:
        converged = (
            f"converged after {phase['converged_after']:.1f} s, settle cut at the wall limit"
        )
    else:
        converged = "NOT converged" + (
            " (cut at the wall limit)" if phase.get("cut_at_wall_limit") else ""
        )
    return (
        f"  {phase['name']:<10} {phase['seconds']:>7.1f} s simulated ({phase['wall_seconds']} s "
        f"wall): {phase['live_workers']} workers, {phase['leases']:,} leases, {converged}; "
        f"moves {phase['moves']:,} (minimum {phase['minimum_moves']:,}); longest without owner "
        f"{phase['longest_without_owner']:.1f} s (p99 {phase['without_owner_p99']:.1f} s, "
        f"{phase['longest_gap']}); two owners {phase['two_owners']} "
        f"(processing {phase['two_processing']}); {phase['requests_per_worker_minute']} "
        f"lease-table requests/worker/min {phase['requests_by_operation']}; acquired "
        f"{phase['acquired']}, lost {phase['lost']}"
    )


def _event(name: str, config: dict[str, Any]) -> str:
    """What a phase did, in words, from the run's configuration."""
    workers, join, crash = config["workers"], config["join"], config["crash"]
    return {
        "startup": f"{workers} workers start at once on {config['shards']:,} new shards",
        "steady": f"nothing happens for {config['steady']:g} s",
        "scale_out": f"{join} workers join ({workers} → {workers + join})",
        "scale_in": f"the {join} newest leave gracefully ({workers + join} → {workers})",
        "rolling": (
            f"deploy: {config['rolling']} workers replaced, {config['rolling_batch']} at a time"
        ),
        "crash": f"{crash} workers crash ({workers} → {workers - crash})",
        "replace": f"{crash} new workers join ({workers - crash} → {workers})",
        "split": "every shard split in two at once",
        "idle": f"nothing happens for {config.get('idle', 0):g} s (after the split)",
        "brownout": (
            f"lease table fails {config['brownout_fraction']:.0%} of calls for "
            f"{config['brownout']:g} s, then all for {config['outage']:g} s"
        ),
    }.get(name, name)


def _footer(result: dict[str, Any]) -> str:
    config = result["config"]
    settings = result["settings"]
    simulated = sum(run["simulated_seconds"] for run in result["runs"])
    wall = sum(run["wall_seconds"] for run in result["runs"])
    return (
        f"`bench/simulate.py` at commit {result['commit']}: {config['shards']:,} shards, "
        f"{config['workers']} workers, lease pick-up from the table's {settings['pickup']} "
        f"(in-memory DynamoDB stream), failover {settings['failover_time']:g} s, renew every "
        f"{settings['renew_every']:g} s, take cycle {settings['take_every']:g} s; "
        f"{simulated / 60:.1f} simulated minutes in {wall / 60:.1f} minutes of "
        f"{result['machine']}."
    )


def render(result: dict[str, Any]) -> str:
    """The table of bench/results/simulate.json."""
    lines = [
        "| lease mode | phase | leases | converged after | moves (minimum) "
        "| longest without owner (p99) | two owners | lease-table requests / worker / min |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in result["runs"]:
        for phase in run["phases"]:
            if phase["name"] in QUIET:
                converged = "—"
            elif phase["converged"]:
                converged = f"{phase['converged_after']:.1f} s"
            elif phase.get("cut_at_wall_limit") and phase.get("converged_after") is not None:
                # Converged, then cut during the settle (the fleet stayed converged until then).
                converged = f"{phase['converged_after']:.1f} s (settle cut: wall limit)"
            else:
                converged = f"not in {phase['seconds']:.0f} s" + (
                    " (cut: wall limit)" if phase.get("cut_at_wall_limit") else ""
                )
            lines.append(
                f"| {run['mode']} | {_event(phase['name'], result['config'])} | "
                f"{phase['leases']:,} | {converged} | "
                f"{phase['moves']:,} ({phase['minimum_moves']:,}) | "
                f"{phase['longest_without_owner']:.1f} s ({phase['without_owner_p99']:.1f} s) | "
                f"{phase['two_owners']} | {phase['requests_per_worker_minute']:,.0f} |"
            )
    lines.append("")
    lines.append(_footer(result))
    return "\n".join(lines)


def render_requests(result: dict[str, Any]) -> str:
    """Lease-table requests per worker per minute, by operation and phase."""
    operations = ("UpdateItem", "Scan", "GetItem", "PutItem", "DeleteItem", "GetRecords")
    lines = [
        "| lease mode | phase | all | "
        + " | ".join("Scan (1 MB pages)" if op == "Scan" else op for op in operations)
        + " | other | read units |",
        "|---|---|---:|" + "---:|" * (len(operations) + 2),
    ]
    for run in result["runs"]:
        for phase in run["phases"]:
            by = phase["requests_by_operation"]
            other = sum(v for k, v in by.items() if k not in operations)
            cells = " | ".join(f"{by.get(op, 0.0):,.1f}" for op in operations)
            lines.append(
                f"| {run['mode']} | {phase['name'].replace('_', ' ')} | "
                f"{phase['requests_per_worker_minute']:,.0f} | {cells} | {other:,.1f} | "
                f"{phase['read_units_per_worker_minute']:,.0f} |"
            )
    lines.append("")
    lines.append(_footer(result))
    return "\n".join(lines)


def _ratio(value: float, base: float | None, digits: int) -> str:
    """``value`` against ``base`` ("—" without a base to divide by: a tiny run's idle phase
    may have read nothing)."""
    if not base:
        return "—"
    return f"{value / base:.{digits}f}x"


def render_costs(result: dict[str, Any]) -> str:
    """DynamoDB units per hour of the idle fleet (the steady phase) in each lease mode, against
    the per-lease mode's in the same run."""
    config = result["config"]
    lines = [
        "| lease mode | write units / hour | read units / hour | writes vs per-lease "
        "| reads vs per-lease | on-demand cost / month (writes) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base: dict[str, Any] | None = None
    for run in result["runs"]:
        steady = next((p for p in run["phases"] if p["name"] == "steady"), None)
        if steady is None:
            continue
        if run["mode"] == "per-lease":
            base = steady
        writes = steady["write_units_per_hour"] or 0.0
        reads = steady["read_units_per_hour"] or 0.0
        ratio_w = _ratio(writes, base["write_units_per_hour"] if base else None, 3)
        ratio_r = _ratio(reads, base["read_units_per_hour"] if base else None, 2)
        # On-demand: $0.625 per million write request units (us-east-1, as operations.md).
        monthly = writes * 730 * 0.625 / 1_000_000
        lines.append(
            f"| {run['mode']} | {writes:,.0f} | {reads:,.0f} | {ratio_w} | {ratio_r} "
            f"| ${monthly:,.2f} |"
        )
    lines.append("")
    lines.append(
        f"Idle fleet of {config['shards']:,} shards and {config['workers']} workers, "
        f"{config['steady']:g} s measured after start-up converged (in the heartbeat mode, "
        "once every worker's heartbeat covered its leases). " + _footer(result)
    )
    return "\n".join(lines)


def day_totals(phases: list[dict[str, Any]], day: float = DAY) -> dict[str, Any] | None:
    """The lease table's bill for a day of this churn: every phase as run, and the rest of
    the day (quiet between the events) **extrapolated** from a quiet phase measured on a
    table of the same size (``steady`` before the split, ``idle`` after it).

    Why extrapolated: 24 simulated hours of renewals one by one (10,000 leases renewed every
    3.3 s: ~260 million a day, each read by every worker from the table's stream) do not run
    in minutes in one process, and in a quiet stretch nothing changes but the clock: its cost
    per second is the quiet phase's. Each event is followed by an equal share of the quiet
    time. None without a quiet phase to extrapolate from."""
    quiet = [phase for phase in phases if phase["name"] in QUIET and phase["seconds"] > 0]
    events = [phase for phase in phases if phase["name"] not in QUIET]
    if not quiet or not events:
        return None
    run_seconds = sum(phase["seconds"] for phase in phases)
    quiet_seconds = max(0.0, day - run_seconds)
    share = quiet_seconds / len(events)
    requests: Counter[str] = Counter()
    for phase in phases:
        requests.update(phase.get("requests", {}))
    write_units = float(sum(phase.get("write_units", 0) for phase in phases))
    run_write_units = write_units
    read_units = float(sum(phase.get("read_units", 0.0) for phase in phases))
    worker_seconds = float(sum(phase.get("worker_seconds", 0.0) for phase in phases))
    gaps: list[dict[str, Any]] = []
    for event in events:
        # The quiet phase on a table of the size the event left (else the first measured).
        source = next((q for q in quiet if q["leases"] == event["leases"]), quiet[0])
        scale = share / source["seconds"]
        gaps.append(
            {"after": event["name"], "seconds": round(share, 1), "rate_from": source["name"]}
        )
        requests.update({op: n * scale for op, n in source.get("requests", {}).items()})
        write_units += source.get("write_units", 0) * scale
        read_units += source.get("read_units", 0.0) * scale
        worker_seconds += source.get("worker_seconds", 0.0) * scale
    minutes = worker_seconds / 60.0
    return {
        "seconds": day,
        "run_seconds": round(run_seconds, 1),
        "extrapolated_seconds": round(quiet_seconds, 1),
        "extrapolated": quiet_seconds > 0,
        "gaps": gaps,
        "write_units": round(write_units),
        "write_units_run": round(run_write_units),
        "read_units": round(read_units),
        "requests_per_worker_minute": round(sum(requests.values()) / minutes, 1)
        if minutes
        else None,
        "requests_by_operation": {
            op: round(count / minutes, 2) for op, count in sorted(requests.items())
        }
        if minutes
        else {},
    }


def render_day(result: dict[str, Any]) -> str:
    """A day of the run's churn: the phases as run plus the quiet rest of the day,
    extrapolated from the measured quiet phases (see :func:`day_totals`)."""
    lines = [
        "| lease mode | simulated (run) | quiet, extrapolated | write units / day "
        "| of them run | read units / day | requests / worker / min | on-demand writes / day |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in result["runs"]:
        if run.get("unfinished"):
            continue  # not every phase ran: no day to extrapolate (see the run's "stopped")
        day = run.get("day") or day_totals(run["phases"])
        if day is None:
            continue
        cost = day["write_units"] * 0.625 / 1_000_000
        lines.append(
            f"| {run['mode']} | {day['run_seconds'] / 60:,.1f} min | "
            f"{day['extrapolated_seconds'] / 3600:,.1f} h | {day['write_units']:,} | "
            f"{day['write_units_run']:,} | {day['read_units']:,} | "
            f"{day['requests_per_worker_minute'] or 0:,.0f} | ${cost:,.2f} |"
        )
    lines.append("")
    lines.append(
        "24 simulated hours: every phase run in full on the virtual clock, the rest of the day "
        "(quiet between the events, one equal stretch after each) **extrapolated** from the "
        "quiet phase measured on a table of the same size (steady before the split, idle "
        "after it), not run. On-demand writes at $0.625 per million write request units. "
        + _footer(result)
    )
    return "\n".join(lines)


def commit() -> str:
    """The commit measured: ``SHARDFLOW_BENCH_COMMIT`` (a run from an exported snapshot of
    it), else the checkout's HEAD."""
    if named := os.environ.get("SHARDFLOW_BENCH_COMMIT"):
        return named
    answer = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return answer.stdout.strip() or "unknown"


class _Warnings(logging.Handler):
    """Counts shardflow's log messages by level and message template (nothing is printed)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.levelname} {record.msg}"] += 1


def run(
    config: Config,
    say: Callable[[str], None] = print,
    each: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every lease mode of ``config`` through its phases; the result (JSON-ready). ``each``
    is given the result so far after every mode (a long run keeps what it finished)."""
    code = commit()
    logger = logging.getLogger("shardflow")
    counter = _Warnings()
    logger.addHandler(counter)
    logger.propagate = False
    runs: list[dict[str, Any]] = []
    try:
        for name in config.modes:
            mode = LEASE_MODES[name]
            say(f"lease mode {name}: {config.shards:,} shards, {config.workers} workers")
            counter.counts.clear()
            started = time.perf_counter()
            cpu = time.process_time()
            simulation = Simulation(config, mode, say)
            if each is not None:

                def partial(
                    phases: list[dict[str, Any]],
                    name: str = name,
                    started: float = started,
                    simulation: Simulation = simulation,
                ) -> None:
                    assert each is not None
                    now = {
                        "mode": name,
                        "description": LEASE_MODES[name].description,
                        "phases": list(phases),
                        "simulated_seconds": round(simulation.clock.monotonic(), 1),
                        "wall_seconds": round(time.perf_counter() - started, 1),
                        "unfinished": True,
                    }
                    each(_result(config, code, [*runs, now]))

                simulation.on_phase = partial
            phases = asyncio.run(simulation.run())
            runs.append(
                {
                    "mode": name,
                    "description": mode.description,
                    "phases": phases,
                    "simulated_seconds": round(simulation.clock.monotonic(), 1),
                    "wall_seconds": round(time.perf_counter() - started, 1),
                    "cpu_seconds": round(time.process_time() - cpu, 1),
                    "log_messages": dict(counter.counts.most_common(12)),
                    "day": day_totals(phases),
                }
            )
            if each is not None:
                each(_result(config, code, runs))
    finally:
        logger.removeHandler(counter)
        logger.propagate = True
    return _result(config, code, runs)


def _run_one(config: Config, name: str, partial: Path | None) -> dict[str, Any]:
    """One lease mode of ``config`` (in a process of its own, see :func:`run_parallel`);
    the result so far written to ``partial`` after every phase, if given."""
    gc.set_threshold(*GC_THRESHOLDS)

    def keep(result: dict[str, Any]) -> None:
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(result, indent=2) + "\n")

    return run(
        replace(config, modes=(name,)),
        say=lambda line: print(f"[{name}] {line}", flush=True),
        each=keep,
    )


def run_parallel(config: Config, jobs: int, partial: Path | None = None) -> dict[str, Any]:
    """:func:`run`, each lease mode in a process of its own (at most ``jobs`` at once): the
    modes share nothing (each has its own table, fleet and clock), and one process runs on
    one core. The result is the same as :func:`run`'s, the modes in ``config``'s order.
    ``partial``: each mode's result so far is kept in ``<partial>.<mode>.partial.json``
    while it runs (a long run cut short keeps what it finished)."""
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [
            pool.submit(
                _run_one,
                config,
                name,
                partial.with_suffix(f".{name}.partial.json") if partial is not None else None,
            )
            for name in config.modes
        ]
        results = [future.result() for future in futures]
    runs = [mode_run for result in results for mode_run in result["runs"]]
    return _result(config, results[0]["commit"], runs)


def _result(config: Config, code: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    settings = LEASE_MODES[config.modes[0]].settings(config)
    return {
        "bench": "simulate",
        "commit": code,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "config": {**asdict(config), "phases": list(config.phases), "modes": list(config.modes)},
        "settings": {
            "failover_time": settings.failover_time,
            "renew_every": round(settings.renew_every, 3),
            "take_every": round(settings.take_every, 3),
            "shard_sync_interval": settings.shard_sync_interval,
            "handoff": settings.handoff,
            "pickup": settings.pickup,
        },
        "runs": runs,
    }


GC_THRESHOLDS = (100_000, 20, 100)
"""The simulation keeps the state of every worker (100 coordinators, their views of a
10,000-lease table, the table's stream) in one process, where each real worker has its own:
with the interpreter's default thresholds (700, 10, 10) its cyclic garbage collector, which
walks every live object on each full collection, took half the wall time of a 5,000-shard,
50-worker run (32.5 s of 64.9 s, measured with gc.callbacks). Collections far apart change
nothing the simulation measures (nothing in it depends on when memory is freed)."""


HASH_SEED = "0"
"""The string hash seed the simulation runs under: the coordinator walks sets of lease keys and
worker ids, whose order follows it; pinned, a run at one ``--seed`` repeats exactly."""


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        environment = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        os.execve(sys.executable, [sys.executable, *sys.argv], environment)
    gc.set_threshold(*GC_THRESHOLDS)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--short", action="store_true", help="1,000 shards, 10 workers")
    parser.add_argument("--shards", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--phases", help=f"comma-separated, from {','.join(PHASES)}")
    parser.add_argument("--modes", help=f"comma-separated, from {','.join(LEASE_MODES)}")
    parser.add_argument("--pickup", choices=("stream", "poll", "off"))
    parser.add_argument("--steady", type=float)
    parser.add_argument("--settle", type=float)
    parser.add_argument("--max-phase", type=float)
    parser.add_argument(
        "--phase-wall", type=float, help="wall seconds after which a phase is cut (default: none)"
    )
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--no-store-retries",
        action="store_true",
        help="the stores raise every failed call at once (no DynamoDB-store retries)",
    )
    parser.add_argument(
        "--save", metavar="VARIANT", help="write bench/results/simulate-VARIANT.json"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="lease modes run side by side in processes of their own (default: one per mode, "
        "up to the cores)",
    )
    args = parser.parse_args()
    config = SHORT if args.short else DEFAULT
    overrides: dict[str, Any] = {
        "shards": args.shards,
        "workers": args.workers,
        "pickup": args.pickup,
        "steady": args.steady,
        "settle": args.settle,
        "max_phase": args.max_phase,
        "phase_wall": args.phase_wall,
        "seed": args.seed,
    }
    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    if args.no_store_retries:
        config = replace(config, store_retries=False)
    if args.phases:
        config = replace(config, phases=tuple(args.phases.split(",")))
    if args.modes:
        config = replace(config, modes=tuple(args.modes.split(",")))
    path: Path | None = None
    if args.save:
        path = RESULTS / f"simulate-{args.save}.json"
    elif os.environ.get("SHARDFLOW_BENCH_RESULTS") or config == DEFAULT:
        path = RESULTS / "simulate.json"

    def write(result: dict[str, Any]) -> None:
        if path is not None:
            RESULTS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2) + "\n")

    jobs = args.jobs if args.jobs is not None else min(len(config.modes), os.cpu_count() or 1)
    if jobs > 1 and len(config.modes) > 1:
        # Each mode in a process of its own; the result is written once all have finished.
        result = run_parallel(config, jobs, partial=path)
        if path is not None:
            for name in config.modes:  # the whole result is written below
                path.with_suffix(f".{name}.partial.json").unlink(missing_ok=True)
    else:
        # Written after each lease mode too: the full run takes a while.
        result = run(config, say=lambda line: print(line, flush=True), each=write)
    print("\n" + render(result))
    if len(result["runs"]) > 1:
        print("\n" + render_costs(result))
    print("\n" + render_day(result))
    if path is not None:
        write(result)
        print(f"written to {path}")
    else:
        print(
            "(not written: only the full default run writes bench/results/simulate.json; set "
            "SHARDFLOW_BENCH_RESULTS=DIR to keep this one)"
        )


if __name__ == "__main__":
    main()
