"""When each observed lease's failover time runs out, kept per holder so that a take cycle
looks only at what is due, not at every lease of the table.

A take cycle needs the leases that may be expired and the next moment one expires. Both were
found by a pass over every sighting: at 10,000 leases and 100 workers that was a million
comparisons per fleet-wide round of cycles (bench/simulate.py), whatever changed. Here each
sighting sits either in its holder's heap, ordered by the moment its failover time ends
(``since + failover_time``), or, once that moment passed, in its holder's *due* set. The
heartbeat rule (:mod:`~shardflow.leases.expiry`) judges a holder's due leases together: while
its heartbeat is alive none of them is expired, so a cycle skips them in one step.

Heap entries are dropped lazily: a sighting that changed keeps its old entry (at most one per
lease, ``_queued``); when that entry comes up it is pushed again at the sighting's current
moment. Renewals, the commonest change by far, then cost two dictionary look-ups.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator


class ExpirySchedule:
    """Sightings by holder: pending (a heap by failover moment) or due (moment passed)."""

    def __init__(self) -> None:
        self._current: dict[str, tuple[str, float]] = {}
        """Lease key -> (holder, failover moment) of its sighting now."""
        self._queued: dict[str, tuple[str, float]] = {}
        """Lease key -> (holder, moment) of its one live heap entry (maybe earlier than now)."""
        self._heaps: dict[str, list[tuple[float, str]]] = {}
        self._due: dict[str, dict[str, None]] = {}
        """Holder -> keys whose failover moment passed (insertion-ordered: deterministic)."""
        self._due_of: dict[str, str] = {}
        self.advanced_to = float("-inf")
        """The latest moment :meth:`advance` moved due sightings up to."""

    def set(self, key: str, holder: str | None, moment: float) -> None:
        """The sighting of ``key`` is now held by ``holder`` and its failover time ends at
        ``moment`` (None holder: a free lease, which is not scheduled)."""
        self._undue(key)
        if holder is None:
            self._current.pop(key, None)
            self._queued.pop(key, None)
            return
        self._current[key] = (holder, moment)
        queued = self._queued.get(key)
        if queued is not None and queued[0] == holder and queued[1] <= moment:
            return  # its entry comes up first and is pushed again then
        self._enqueue(key, holder, moment)

    def moved_on(self, key: str, moment: float) -> None:
        """:meth:`set` for a sighting whose holder is unchanged and whose moment moved
        later (a renewal): its entry, if queued, comes up first and is pushed again then."""
        current = self._current.get(key)
        if current is None:
            return
        holder = current[0]
        self._current[key] = (holder, moment)
        if key in self._queued:
            return
        self._undue(key)
        self._enqueue(key, holder, moment)

    def forget(self, key: str) -> None:
        self._undue(key)
        self._current.pop(key, None)
        self._queued.pop(key, None)

    def clear(self) -> None:
        self._current.clear()
        self._queued.clear()
        self._heaps.clear()
        self._due.clear()
        self._due_of.clear()
        self.advanced_to = float("-inf")

    def _undue(self, key: str) -> None:
        holder = self._due_of.pop(key, None)
        if holder is not None:
            keys = self._due[holder]
            del keys[key]
            if not keys:
                del self._due[holder]

    def _enqueue(self, key: str, holder: str, moment: float) -> None:
        if moment <= self.advanced_to:
            self._queued.pop(key, None)
            self._due.setdefault(holder, {})[key] = None
            self._due_of[key] = holder
            return
        self._queued[key] = (holder, moment)
        heapq.heappush(self._heaps.setdefault(holder, []), (moment, key))

    def advance(self, now: float) -> None:
        """Move every sighting whose failover moment is ``now`` or earlier to its holder's
        due set."""
        if now > self.advanced_to:
            self.advanced_to = now
        for holder in list(self._heaps):
            heap = self._heaps[holder]
            while heap and heap[0][0] <= now:
                moment, key = heapq.heappop(heap)
                if self._queued.get(key) != (holder, moment):
                    continue  # superseded by a later entry
                del self._queued[key]
                current = self._current.get(key)
                if current is not None:
                    self._enqueue(key, *current)
            if not heap:
                del self._heaps[holder]

    def due(self, now: float) -> dict[str, dict[str, None]]:
        """Holder -> keys of its leases whose failover moment is ``now`` or earlier (the
        dicts are live: do not change them)."""
        self.advance(now)
        return self._due

    def next_moment(
        self, after: float, *, holder_not: str, beat_until: Callable[[str], float | None]
    ) -> float | None:
        """The earliest moment later than ``after`` at which a lease held by a worker other
        than ``holder_not`` expires (the later of its failover moment and its holder's
        heartbeat end, ``beat_until``), as :meth:`ExpiryTracker.next_expiry` defines it.
        Requires ``after >= advanced_to`` (see there)."""
        self.advance(after)
        best: float | None = None
        for holder in self._holders():
            if holder == holder_not:
                continue
            beat = beat_until(holder)
            if holder in self._due and beat is not None and beat > after:
                best = beat if best is None else min(best, beat)
            top = self._top(holder)
            if top is not None:
                moment = top if beat is None else max(top, beat)
                best = moment if best is None else min(best, moment)
        return best

    def _holders(self) -> Iterator[str]:
        yield from list(self._heaps)
        for holder in self._due:
            if holder not in self._heaps:
                yield holder

    def _top(self, holder: str) -> float | None:
        """The exact earliest pending moment of ``holder`` (entries that moved on are pushed
        again at their current moment first)."""
        heap = self._heaps.get(holder)
        while heap:
            moment, key = heap[0]
            if self._queued.get(key) != (holder, moment):
                heapq.heappop(heap)
                continue
            current = self._current.get(key)
            if current == (holder, moment):
                return moment
            heapq.heappop(heap)
            del self._queued[key]
            if current is not None:
                self._enqueue(key, *current)
        if heap is not None and not heap:
            del self._heaps[holder]
        return None

    def __len__(self) -> int:
        return len(self._current)
