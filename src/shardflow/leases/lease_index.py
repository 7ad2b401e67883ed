"""The lease table as one worker last saw it, with the indexes a take cycle plans from.

A take cycle used to sort every lease of the table into free, expired and live per owner,
look for finished shards and their children, and count loads: a pass over all leases per
cycle per worker, so a fleet's cost grew with shards x workers (100 workers on 10,000 shards,
bench/simulate.py). The index is kept up to date as each change arrives (a scan rebuilds it,
the table's stream or a poll changes it lease by lease), so a cycle costs what is free,
expired, finished-and-changed or held here, plus one step per worker:

- ``active``: leases of this worker's streams whose shard is not finished, by key;
- ``free``: those without an owner; ``by_owner``: the others by ``leaseOwner``;
- ``requested``: those carrying a handoff request attribute;
- ``finished``: leases at SHARD_END, with ``children`` (recorded on the parent or naming it
  as a parent) and ``touched``: finished leases whose own item or a child's changed since
  the last cycle looked (only those need looking at again);
- ``loads``: leases per owner over every lease of the table (what a worker answering a
  handoff request weighs, see :meth:`LeaseTaker.may_give`).

Expiry is judged by the :class:`~shardflow.leases.expiry.ExpiryTracker`, whose schedule
gives the few leases that may be expired (:func:`shape_from_index`). Dicts with ``None``
values serve as sets: their order is the order of arrival, so a seeded run plans the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable
from typing import Final

from shardflow.leases.balance import TableShape
from shardflow.leases.expiry import ExpiryTracker
from shardflow.leases.handoff_request import HANDOFF_REQUEST, handoff_request_of
from shardflow.leases.model import Lease
from shardflow.records import SHARD_END

_NONE: Final[dict[str, None]] = {}


class LeaseIndex:
    """Every lease last seen, and the indexes of the module doc, kept by :meth:`put` and
    :meth:`remove`."""

    def __init__(
        self,
        *,
        ours: Callable[[Lease], bool],
        key_for: Callable[[Lease, str], str],
    ) -> None:
        """``ours``: whether a lease is of this worker's streams; ``key_for``: the lease key
        of a shard in the stream of a lease (:meth:`StreamSet.key_for`)."""
        self._ours = ours
        self._key_for = key_for
        self.leases: dict[str, Lease] = {}
        self.loads: Counter[str] = Counter()
        self.free_anywhere = 0
        """Free leases of unfinished shards, of any stream (a finished lease is never taken:
        counted, every worker scanned the table at the scan pace for as long as the parents
        of a split stayed in it, see :meth:`LeaseTaker.take_cycle`)."""
        self.active: dict[str, Lease] = {}
        self.free: dict[str, None] = {}
        self.by_owner: dict[str, dict[str, None]] = {}
        self.requested: dict[str, None] = {}
        self.handing: dict[str, dict[str, None]] = {}
        """Checkpoint owner -> active leases it is handing over (a handoff under way)."""
        self.finished: dict[str, None] = {}
        self.children: dict[str, Counter[str]] = {}
        """Parent key -> child keys (counted per lease that names the link)."""
        self.touched: dict[str, None] = {}
        self._links: dict[str, list[tuple[str, str]]] = {}

    def __len__(self) -> int:
        return len(self.leases)

    def values(self) -> Iterable[Lease]:
        return self.leases.values()

    def get(self, key: str) -> Lease | None:
        return self.leases.get(key)

    def reset(self, leases: Iterable[Lease]) -> None:
        """Start again from a complete scan."""
        self.leases = {}
        self.loads = Counter()
        self.free_anywhere = 0
        self.active = {}
        self.free = {}
        self.by_owner = {}
        self.requested = {}
        self.handing = {}
        self.finished = {}
        self.children = {}
        self.touched = {}
        self._links = {}
        for lease in leases:
            self.put(lease)

    def refresh(self, leases: Iterable[Lease]) -> None:
        """Bring the index to a complete scan: only leases that differ from what is kept
        are indexed again (a scan of an unchanged 30,000-lease table costs a comparison per
        lease, not a rebuild)."""
        present: dict[str, None] = {}
        known = self.leases
        for lease in leases:
            key = lease.lease_key
            present[key] = None
            old = known.get(key)
            if old is not lease and old != lease:
                self.put(lease)
        for key in [key for key in known if key not in present]:
            self.remove(key)

    def put(self, lease: Lease) -> None:
        """``lease`` as now seen (it replaces what was seen of its key)."""
        old = self.leases.get(lease.lease_key)
        # The same lineage (as a rule: only a parent's children are ever added) keeps its
        # links: unlinking and linking again was a third of the index's time while 100
        # workers each read the changes of a split wave of 10,000 shards (bench/simulate.py).
        relink = old is None or (
            old.parent_shard_ids != lease.parent_shard_ids
            or old.child_shard_ids != lease.child_shard_ids
            or old.stream_name != lease.stream_name
        )
        if old is not None:
            self._drop(old, relink=relink)
        self.leases[lease.lease_key] = lease
        self._add(lease, relink=relink)

    def remove(self, key: str) -> None:
        old = self.leases.pop(key, None)
        if old is not None:
            self._drop(old)

    def renew(self, lease: Lease) -> None:
        """``lease`` as now seen, changed only in its counter since (a renewal: owner,
        checkpoint and attributes as before), so no index moves."""
        key = lease.lease_key
        self.leases[key] = lease
        if key in self.active:
            self.active[key] = lease

    def renew_all(self, leases: Iterable[Lease]) -> list[Lease]:
        """:meth:`renew` for each of ``leases`` known here with the same owner and a counter
        not older than the one kept (renewals read from the table's stream); the others are
        returned, for :meth:`put`. One loop over plain dicts: a worker of a per-lease fleet
        reads every renewal of every worker."""
        known = self.leases
        active = self.active
        odd: list[Lease] = []
        for lease in leases:
            key = lease.lease_key
            kept = known.get(key)
            if kept is None or kept.lease_owner != lease.lease_owner:
                odd.append(lease)
            elif lease.lease_counter >= kept.lease_counter:
                known[key] = lease
                if key in active:
                    active[key] = lease
        return odd

    def owned_by(self, owner: str) -> list[Lease]:
        """Active leases naming ``owner`` as ``leaseOwner``."""
        active = self.active
        return [active[key] for key in self.by_owner.get(owner, _NONE)]

    def handed_by(self, worker: str) -> list[Lease]:
        """Active leases ``worker`` is handing over (their checkpoint owner)."""
        active = self.active
        return [active[key] for key in self.handing.get(worker, _NONE)]

    def take_touched(self) -> list[str]:
        """Finished leases touched since the last call (and forgets them)."""
        touched = [key for key in self.touched if key in self.finished]
        self.touched = {}
        return touched

    def _add(self, lease: Lease, *, relink: bool = True) -> None:
        key = lease.lease_key
        owner = lease.lease_owner
        if owner is None:
            if lease.checkpoint.sequence_number != SHARD_END:
                self.free_anywhere += 1
        else:
            self.loads[owner] += 1
        if not self._ours(lease):
            return
        if not relink:
            # Links kept (see put); a finished parent still looks again at a changed child.
            finished = self.finished
            for parent, _ in self._links.get(key, ()):
                if parent in finished:
                    self.touched[parent] = None
        elif links := self._links_of(lease):
            self._links[key] = links
            children = self.children
            for parent, child in links:
                kids = children.get(parent)
                if kids is None:
                    kids = children[parent] = Counter()
                kids[child] += 1
                if parent in self.finished:
                    self.touched[parent] = None
        if lease.checkpoint.sequence_number == SHARD_END:
            self.finished[key] = None
            self.touched[key] = None
            return
        self.active[key] = lease
        if owner is None:
            self.free[key] = None
        else:
            self.by_owner.setdefault(owner, {})[key] = None
        if lease.extra and HANDOFF_REQUEST in lease.extra:
            self.requested[key] = None
        if lease.checkpoint_owner is not None:
            self.handing.setdefault(lease.checkpoint_owner, {})[key] = None

    def _drop(self, lease: Lease, *, relink: bool = True) -> None:
        key = lease.lease_key
        owner = lease.lease_owner
        if owner is None:
            if lease.checkpoint.sequence_number != SHARD_END:
                self.free_anywhere -= 1
        else:
            self.loads[owner] -= 1
            if not self.loads[owner]:
                del self.loads[owner]
        links = self._links.pop(key, None) if relink else None
        if links:
            for parent, child in links:
                kids = self.children[parent]
                kids[child] -= 1
                if not kids[child]:
                    del kids[child]
                    if not kids:
                        del self.children[parent]
                if parent in self.finished:
                    self.touched[parent] = None
        if key in self.finished:
            del self.finished[key]
            return
        if self.active.pop(key, None) is None:
            return  # not of this worker's streams
        if owner is None:
            self.free.pop(key, None)
        else:
            keys = self.by_owner[owner]
            del keys[key]
            if not keys:
                del self.by_owner[owner]
        self.requested.pop(key, None)
        handed_by = lease.checkpoint_owner
        if handed_by is not None:
            keys = self.handing[handed_by]
            del keys[key]
            if not keys:
                del self.handing[handed_by]

    def _links_of(self, lease: Lease) -> list[tuple[str, str]]:
        """(parent key, child key) pairs ``lease`` names: its children and its parents."""
        if not lease.child_shard_ids and not lease.parent_shard_ids:
            return []
        key_for = self._key_for
        key = lease.lease_key
        links = [(key, key_for(lease, child)) for child in lease.child_shard_ids]
        links += [(key_for(lease, parent), key) for parent in lease.parent_shard_ids]
        return links


def shape_from_index(
    index: LeaseIndex,
    tracker: ExpiryTracker,
    *,
    worker_id: str,
    held: Collection[str],
    now: float,
    even_out: bool = False,
) -> TableShape:
    """The :class:`TableShape` of the index's active leases, as :func:`shape_of` would sort
    them with ``tracker.is_expired`` at ``now``, in time proportional to what is free,
    expired or held here and to the number of owners."""
    active = index.active
    free = sorted((active[key] for key in index.free if key not in held), key=_by_key)
    expired: list[Lease] = []
    for key in tracker.expired_candidates(now):
        lease = active.get(key)
        if lease is None or key in held or lease.is_free:
            continue
        if tracker.is_expired(lease, now):
            expired.append(lease)
    expired.sort(key=_by_key)
    gone = {lease.lease_key for lease in expired}
    counts = {owner: len(keys) for owner, keys in index.by_owner.items() if owner != worker_id}
    mine = 0
    for key in held:
        lease = active.get(key)
        if lease is None:
            continue
        mine += 1
        owner = lease.lease_owner
        if owner is not None and owner != worker_id:
            counts[owner] -= 1
    for lease in expired:
        owner = lease.lease_owner
        if owner is not None and owner != worker_id:
            counts[owner] -= 1
    # Ours by name but not held here (and not expired): counted as ours, as shape_of does.
    mine += sum(
        1 for key in index.by_owner.get(worker_id, _NONE) if key not in held and key not in gone
    )
    requesters: set[str] = set()
    if even_out:
        for key in index.requested:
            lease = active[key]
            request = handoff_request_of(lease)
            if request is not None and request.fresh_for(lease):
                requesters.add(request.requester)

    def alive_of(owner: str) -> list[Lease]:
        if owner == worker_id:
            return []  # counted as this worker's own (see shape_of)
        keys = index.by_owner.get(owner, _NONE)
        return sorted(
            (active[key] for key in keys if key not in held and key not in gone), key=_by_key
        )

    return TableShape(
        total=len(active),
        mine=mine,
        free=free,
        expired=expired,
        alive_counts={owner: count for owner, count in counts.items() if count > 0},
        alive_of=alive_of,
        requesters=frozenset(requesters),
    )


def _by_key(lease: Lease) -> str:
    return lease.lease_key
