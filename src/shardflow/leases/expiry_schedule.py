"""When each observed lease's failover time runs out, kept per holder so that a take cycle
looks only at what is due, not at every lease of the table.

A take cycle needs the leases that may be expired and the next moment one expires. Both were
found by a pass over every sighting: at 10,000 leases and 100 workers that was a million
comparisons per fleet-wide round of cycles (bench/simulate.py), whatever changed. Here each
sighting sits either in its holder's queue, in the order of the moment its failover time
ends (``since + failover_time``), or, once that moment passed, in its holder's *due* set. The
heartbeat rule (:mod:`~shardflow.leases.expiry`) judges a holder's due leases together: while
its heartbeat is alive none of them is expired, so a cycle skips them in one step.

Sightings are made at the observer's monotonic ``now``, so a changed sighting's moment is the
latest of all: it goes to the end of its holder's queue (an ordered dict, O(1)), and the
queue's first entry is always its earliest moment. Renewals, the commonest change by far (a
worker of a per-lease fleet reads every renewal of every worker), cost a few dict operations.
A moment earlier than the queue's last (never from the taker, which observes at ``now``)
re-sorts that holder's queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator


class ExpirySchedule:
    """Sightings by holder: pending (a queue by failover moment) or due (moment passed)."""

    def __init__(self) -> None:
        self._holder_of: dict[str, str] = {}
        """Lease key -> its holder (queued or due)."""
        self._queues: dict[str, OrderedDict[str, float]] = {}
        """Holder -> key -> failover moment, earliest first."""
        self._due: dict[str, dict[str, None]] = {}
        """Holder -> keys whose failover moment passed (insertion-ordered: deterministic)."""
        self.advanced_to = float("-inf")
        """The latest moment :meth:`advance` moved due sightings up to."""
        self._latest = float("-inf")
        """No queued moment is later than this (the latest ever placed): a moment at or after
        it goes to the end of its holder's queue without a look at the queue's last."""

    def set(self, key: str, holder: str | None, moment: float) -> None:
        """The sighting of ``key`` is now held by ``holder`` and its failover time ends at
        ``moment`` (None holder: a free lease, which is not scheduled)."""
        self.forget(key)
        if holder is None:
            return
        self._holder_of[key] = holder
        self._place(key, holder, moment)

    def moved_on(self, key: str, moment: float) -> None:
        """:meth:`set` for a sighting whose holder is unchanged and whose moment moved
        later (a renewal)."""
        holder = self._holder_of.get(key)
        if holder is None:
            return
        queue = self._queues.get(holder)
        if queue is not None and key in queue:
            del queue[key]
        else:
            self._undue(key, holder)
        self._place(key, holder, moment)

    def renewed_at(self, keys: Iterable[str], moment: float) -> None:
        """:meth:`moved_on` for many ``keys`` with one ``moment`` (the renewals one read of
        the table's stream showed, all sighted at the same ``now``). When ``moment`` is the
        latest of all (always, for sightings made at the observer's ``now``), each key moves
        to the end of its holder's queue in two dict operations: a worker of a per-lease
        fleet reads every renewal of every worker (3,000 a second at 10,000 leases)."""
        if moment <= self.advanced_to or moment < self._latest:
            for key in keys:
                self.moved_on(key, moment)
            return
        holder_of = self._holder_of
        queues = self._queues
        for key in keys:
            holder = holder_of.get(key)
            if holder is None:
                continue
            queue = queues.get(holder)
            if queue is not None and key in queue:
                del queue[key]
            else:
                self._undue(key, holder)
                if queue is None:
                    queue = queues[holder] = OrderedDict()
            queue[key] = moment
        self._latest = moment

    def forget(self, key: str) -> None:
        holder = self._holder_of.pop(key, None)
        if holder is None:
            return
        queue = self._queues.get(holder)
        if queue is not None and key in queue:
            del queue[key]
            if not queue:
                del self._queues[holder]
        else:
            self._undue(key, holder)

    def clear(self) -> None:
        self._holder_of.clear()
        self._queues.clear()
        self._due.clear()
        self.advanced_to = float("-inf")
        self._latest = float("-inf")

    def _undue(self, key: str, holder: str) -> None:
        keys = self._due.get(holder)
        if keys is not None and key in keys:
            del keys[key]
            if not keys:
                del self._due[holder]

    def _place(self, key: str, holder: str, moment: float) -> None:
        if moment <= self.advanced_to:
            self._due.setdefault(holder, {})[key] = None
            return
        queue = self._queues.get(holder)
        if queue is None:
            queue = self._queues[holder] = OrderedDict()
        if moment >= self._latest:
            self._latest = moment
            queue[key] = moment
            return
        last = next(reversed(queue.values()), None) if queue else None
        queue[key] = moment
        if last is not None and moment < last:
            self._queues[holder] = OrderedDict(sorted(queue.items(), key=lambda kv: kv[1]))

    def advance(self, now: float) -> None:
        """Move every sighting whose failover moment is ``now`` or earlier to its holder's
        due set."""
        if now > self.advanced_to:
            self.advanced_to = now
        for holder in [h for h, q in self._queues.items() if q and next(iter(q.values())) <= now]:
            queue = self._queues[holder]
            due = self._due.setdefault(holder, {})
            while queue:
                key, moment = next(iter(queue.items()))
                if moment > now:
                    break
                queue.popitem(last=False)
                due[key] = None
            if not queue:
                del self._queues[holder]

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
            queue = self._queues.get(holder)
            if queue:
                first = next(iter(queue.values()))
                moment = first if beat is None else max(first, beat)
                best = moment if best is None else min(best, moment)
        return best

    def _holders(self) -> Iterator[str]:
        yield from self._queues
        for holder in self._due:
            if holder not in self._queues:
                yield holder

    def __len__(self) -> int:
        return len(self._holder_of)
