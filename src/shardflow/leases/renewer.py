"""Renewing every held lease each renew interval, spread over the interval, with a fixed
number of writes in flight.

Each held lease has a slot in the renew interval (its phase) and is renewed once per interval
at that slot, on a fixed rate: a renewal sent late does not push the lease's later renewals
back. One scheduler task keeps the slots in a heap and hands the leases that are due to a pool
of ``renew_concurrency`` tasks, so a slow or failing lease delays only itself, and 1,000
leases cost 1 + pool tasks, not one per lease.

Why slots, not rounds: a round that queues every lease at once makes 1,000 writes a burst, and
the n-th lease of the burst waits for the n - 1 before it. How long the burst takes then
decides each lease's renewal time: any stall or slower stretch of the lease table (a GC pause,
a scan, a busy machine) moves every lease behind it, and they come late by the same amount
(bench/consumer.py's scale part: renewal lateness p99 0.6-1.4 s at 1,000 leases). Spread
evenly, ~300 writes a second arrive one or two at a time, none waits behind the others, and a
stall delays only the leases whose slot falls in it.

A new lease gets the least-filled slot within one interval of its last successful write
(never later than a round would have renewed it; on a tie the latest, so no write comes sooner
than needed), so leases taken in a burst are spread out at once. The scheduler also marks a lease lost the moment its deadline passes (a
lease whose renewals could not be written), not a round later.

While ``covered`` (the heartbeat lease mode: the worker's heartbeat keeps its leases), no lease
is renewed on its own; the slots stay, and renewals resume at them once it is no longer.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections.abc import Callable, Mapping

from shardflow.clock import Clock
from shardflow.leases.concurrency import run_bounded
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings
from shardflow.waits import first_of

log = logging.getLogger("shardflow.leases")

SLOTS = 64
"""The renew interval is cut into this many slots (52 ms each at the default failover); the
leases of a slot are due at its start, so the scheduler wakes at most once a slot."""


class RenewalSlots:
    """When each held lease is next renewed: a phase per lease, the least-filled slot first.

    Pure bookkeeping (no clock, no tasks): :class:`LeaseRenewer` asks it what is due."""

    def __init__(self, interval: float, *, epoch: float, slots: int = SLOTS) -> None:
        self._interval = interval
        self._epoch = epoch
        self._width = interval / slots
        self._counts = [0] * slots
        self._due: dict[str, tuple[float, int]] = {}
        """lease key -> (next due, slot index)."""
        self._heap: list[tuple[float, str]] = []

    def __contains__(self, key: str) -> bool:
        return key in self._due

    def __len__(self) -> int:
        return len(self._due)

    @property
    def counts(self) -> tuple[int, ...]:
        """Leases per slot (for tests and the benches)."""
        return tuple(self._counts)

    def due_at(self, key: str) -> float | None:
        entry = self._due.get(key)
        return None if entry is None else entry[0]

    def place(self, key: str, *, now: float, latest: float) -> float:
        """Give ``key`` (not placed yet) its first renewal time: the start of the least-filled
        slot in (``now``, ``latest``] (at most one interval ahead), the latest of those on a
        tie (no write sooner than needed); ``latest`` itself when no slot starts before it,
        ``now`` when it has passed. Returns the time."""
        counts = self._counts
        size = len(counts)
        width = self._width
        # The slot ``now`` is in: its number since the epoch (slot k starts at epoch + k*width).
        current = math.floor((now - self._epoch) / width)
        if latest <= now:
            when, slot = now, current % size
        else:
            latest = min(latest, now + self._interval)
            when, slot = latest, current % size
            best = math.inf
            # Every slot once, from the next one on, as long as it starts by ``latest``.
            for number in range(current, current + size + 1):
                begins = self._epoch + number * width
                if begins <= now:
                    continue
                if begins > latest:
                    break
                index = number % size
                if counts[index] <= best:
                    when, slot, best = begins, index, counts[index]
        counts[slot] += 1
        self._due[key] = (when, slot)
        heapq.heappush(self._heap, (when, key))
        return when

    def remove(self, key: str) -> None:
        entry = self._due.pop(key, None)
        if entry is not None:
            self._counts[entry[1]] -= 1

    def next_due(self) -> float | None:
        """The earliest renewal time placed (None: nothing placed)."""
        heap = self._heap
        while heap and self._due.get(heap[0][1], (None,))[0] != heap[0][0]:
            heapq.heappop(heap)  # removed, or moved on
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> list[str]:
        """The keys due by ``now``, each moved on to its next time after ``now`` in its own
        phase (the fixed rate: a late renewal keeps its lease's slot)."""
        due: list[str] = []
        heap = self._heap
        interval = self._interval
        while heap and heap[0][0] <= now:
            when, key = heapq.heappop(heap)
            entry = self._due.get(key)
            if entry is None or entry[0] != when:
                continue  # removed, or moved on
            due.append(key)
            after = when + interval
            if after <= now:
                after += math.ceil((now - after) / interval + 1e-9) * interval
            self._due[key] = (after, entry[1])
            heapq.heappush(heap, (after, key))
        return due


class LeaseRenewer:
    """Keeps the leases of ``owned`` (a live map, changed by others) renewed."""

    def __init__(
        self,
        owned: Mapping[str, OwnedLease],
        *,
        settings: LeaseSettings,
        clock: Clock,
        on_renewed: Callable[[OwnedLease, float], None] | None = None,
        on_failed: Callable[[OwnedLease], None] | None = None,
        covered: Callable[[], bool] = lambda: False,
    ) -> None:
        """``on_failed``: a renewal failed for now (the table did not answer). ``covered``:
        True while this worker's heartbeat keeps its leases (the heartbeat lease mode): no
        lease is renewed on its own then, but each is still marked lost at its deadline."""
        self._owned = owned
        self._settings = settings
        self._clock = clock
        self._on_renewed = on_renewed
        self._on_failed = on_failed
        self._queue: asyncio.Queue[OwnedLease] = asyncio.Queue()
        self._queued: set[str] = set()
        self._covered = covered
        self._slots = RenewalSlots(settings.renew_every, epoch=clock.monotonic())
        self._check_at = -math.inf
        """No held lease's deadline is before this (deadlines only move later): until then
        there is nothing to mark lost, and no pass over every lease is needed."""
        self._wake = asyncio.Event()

    @property
    def slots(self) -> RenewalSlots:
        return self._slots

    async def run(self) -> None:
        """Renew until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._schedule(), name="shardflow-lease-renew")
            for index in range(self._settings.renew_concurrency):
                group.create_task(self._work(), name=f"shardflow-lease-renew-{index}")

    async def renew_all(self) -> None:
        """Renew every held lease once, now."""
        await run_bounded(
            list(self._owned.values()), self._renew, concurrency=self._settings.renew_concurrency
        )

    def adopt(self, owned: OwnedLease) -> None:
        """A lease was just taken: give it its slot now (not at the next pass over the held
        leases) and let the scheduler know its deadline."""
        self._check_at = min(self._check_at, owned.deadline)
        if owned.lease_key not in self._slots:
            self._place(owned)
            self._wake.set()

    def expire_lapsed(self) -> None:
        """Mark lost every held lease whose deadline has passed."""
        earliest = math.inf
        for owned in list(self._owned.values()):
            if not owned.valid():
                owned.mark_lost("expired")
            else:
                earliest = min(earliest, owned.deadline)
        self._check_at = earliest

    def _place(self, owned: OwnedLease) -> None:
        # The last successful write was sent usable_time before the deadline: the lease is
        # renewed within one interval of it, as a round would have.
        interval = self._settings.renew_every
        last_write = owned.deadline - self._settings.usable_time
        self._slots.place(
            owned.lease_key, now=self._clock.monotonic(), latest=last_write + interval
        )

    def _sync(self) -> None:
        """Slots for held leases that have none; none for leases no longer held."""
        slots = self._slots
        for key, owned in list(self._owned.items()):
            if key not in slots:
                self._place(owned)
        self.expire_lapsed()

    async def _schedule(self) -> None:
        interval = self._settings.renew_every
        slots = self._slots
        sync_at = -math.inf
        while True:
            now = self._clock.monotonic()
            self._wake.clear()
            if now >= sync_at:
                # Once an interval, a pass over every held lease: leases taken without
                # adopt() get their slots, and the earliest deadline is known again.
                self._sync()
                sync_at = now + interval
            elif now >= self._check_at:
                self.expire_lapsed()
            renewing = not self._covered()
            for key in slots.pop_due(now):
                owned = self._owned.get(key)
                if owned is None:  # (an ended lease leaves the map)
                    slots.remove(key)
                elif renewing and key not in self._queued:
                    # Still queued from its last slot (the pool is behind): once is enough.
                    self._queued.add(key)
                    self._queue.put_nowait(owned)
            wake = min(sync_at, self._check_at)
            due = slots.next_due()
            if due is not None and renewing:
                wake = min(wake, due)
            delay = max(wake - self._clock.monotonic(), 0.0)
            if delay > 0 and not self._wake.is_set():
                await first_of(self._wake, self._clock.sleep(delay))

    async def _work(self) -> None:
        while True:
            owned = await self._queue.get()
            self._queued.discard(owned.lease_key)
            try:
                await self._renew(owned)
            except Exception:
                # A bug or an unexpected answer must not stop the renewal of every other
                # lease; this one is tried again at its next slot and lapses at its deadline.
                log.exception("renewing lease %s failed unexpectedly", owned.lease_key)

    async def _renew(self, owned: OwnedLease) -> None:
        started = self._clock.monotonic()
        outcome = await owned.renew()
        if outcome == "renewed" and self._on_renewed is not None:
            self._on_renewed(owned, self._clock.monotonic() - started)
        elif outcome == "failed" and self._on_failed is not None:
            self._on_failed(owned)
