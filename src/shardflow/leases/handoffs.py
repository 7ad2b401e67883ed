"""Bookkeeping of planned handoffs as one worker sees them, and who should get a leaver's leases.

Three kinds of handoff concern a worker besides its own leases:

- requests it made (a joining worker asks a busy one for a lease): answered when the owner
  begins the handoff; not answered within ``handoff_timeout`` (the owner is a KCL worker, or
  stuck) the requester steals the lease as KCL would;
- handoffs to it under way (``leaseOwner`` is this worker, ``checkpointOwner`` the old one):
  the old owner completes them, once no handler call of the shard runs there any more. This
  worker never takes one over while the old owner renews it, however long that takes (it may
  still be running a handler for the shard); only once the lease has expired (the old owner
  stopped renewing it for ``failover_time``: crashed, frozen, cut off) is it taken, as any
  expired lease. KCL 3.x works the same way: its old owner transfers the lease itself, and
  its next owner never takes a lease whose ``checkpointOwner`` is set;
- when it leaves: which live workers get its leases (:func:`successors`).

Times are the observer's monotonic clock, as for expiry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shardflow.leases.handoff_request import handoff_request_of, leaving_owner_of
from shardflow.leases.model import Lease

_SEEN_WITHIN = 1.0
"""Seconds within which a request this worker wrote shows in what it reads (the stream lags):
missing after that, the owner removed it (declined)."""


@dataclass(frozen=True, slots=True)
class _Sighting:
    worker: str
    """The owner asked (requests) or the old owner (handoffs to this worker)."""
    since: float


class HandoffBook:
    """What this worker asked for and what is being handed to it (see the module doc)."""

    def __init__(self, worker_id: str, timeout: float) -> None:
        self._me = worker_id
        self._timeout = timeout
        self._requested: dict[str, _Sighting] = {}
        self._inbound: dict[str, _Sighting] = {}

    def requested(self, lease: Lease, now: float) -> None:
        """This worker asked the owner of ``lease`` for it at ``now``."""
        assert lease.lease_owner is not None
        self._requested[lease.lease_key] = _Sighting(lease.lease_owner, now)

    def update(
        self, leases: Mapping[str, Lease], now: float, *, mine: Iterable[Lease] | None = None
    ) -> None:
        """Bring the book up to date with a complete scan taken at ``now``. ``mine``: the
        leases of the scan naming this worker as owner, if known (else found in ``leases``)."""
        for key, request in list(self._requested.items()):
            lease = leases.get(key)
            if (
                lease is None
                or lease.lease_owner != request.worker
                or lease.handoff_pending
                or asked_by_another(lease, self._me)
                or (handoff_request_of(lease) is None and now - request.since >= _SEEN_WITHIN)
            ):
                # Answered, declined, taken, gone, or overwritten by another joiner's request:
                # free to ask for a different lease now rather than wait out the timeout (a
                # declined request is never stolen).
                del self._requested[key]
        inbound: dict[str, _Sighting] = {}
        for lease in leases.values() if mine is None else mine:
            key = lease.lease_key
            if lease.lease_owner == self._me and lease.checkpoint_owner not in (None, self._me):
                seen = self._inbound.get(key)
                old = lease.checkpoint_owner
                assert old is not None
                inbound[key] = (
                    seen if seen is not None and seen.worker == old else _Sighting(old, now)
                )
        self._inbound = inbound

    def requested_of(self) -> dict[str, str]:
        """Open requests: lease key -> the owner asked."""
        return {key: sighting.worker for key, sighting in self._requested.items()}

    def forget_request(self, lease_key: str) -> None:
        """Stop waiting for an answer to the request for ``lease_key`` (nothing is stolen)."""
        self._requested.pop(lease_key, None)

    @property
    def open_requests(self) -> int:
        return len(self._requested)

    def is_requested(self, lease_key: str) -> bool:
        return lease_key in self._requested

    def overdue_requests(self, now: float) -> list[str]:
        """Requests not answered within the timeout (forgotten here: the caller steals)."""
        overdue = [k for k, r in self._requested.items() if now - r.since >= self._timeout]
        for key in overdue:
            del self._requested[key]
        return overdue

    def inbound(self) -> list[str]:
        """Handoffs to this worker under way: taken over only once they expire (see the
        module doc), never on a timeout."""
        return list(self._inbound)

    def next_deadline(self) -> float | None:
        """When the next request becomes overdue (inbound handoffs wait for expiry, which
        the expiry tracker schedules)."""
        return min((s.since + self._timeout for s in self._requested.values()), default=None)


def asked_by_another(lease: Lease, worker_id: str) -> bool:
    """Whether ``lease`` carries a fresh handoff request of a worker other than ``worker_id``."""
    request = handoff_request_of(lease)
    return request is not None and request.requester != worker_id and request.fresh_for(lease)


def successors(
    leases: Iterable[Lease],
    count: int,
    *,
    worker_id: str,
    is_expired: Callable[[Lease], bool],
    also: Iterable[str] = (),
    seen_alive: Callable[[str], bool] | None = None,
    tie_break: Callable[[str], int] | None = None,
    leaving_too: Iterable[str] = (),
) -> list[str]:
    """Who should get ``count`` leases of leaving worker ``worker_id``: least loaded first.

    Candidates are the owners of live (unexpired) leases, the workers that asked for a
    lease (a joining worker holds nothing yet) and ``also`` (live KCL 3.x workers, which may
    hold nothing yet either), except this worker and workers that are leaving too (handing
    leases away, or having said so on a lease: ``shardflowLeaving``; ``leaving_too``: seen
    saying so earlier, see :func:`said_leaving`). When ``seen_alive`` confirms some candidates (they were seen
    renewing lately), only those are picked: a KCL worker that stopped keeps its metrics item
    and looks live for a while. Each pick counts towards the picked worker's load. Empty when
    there is nobody to hand to (the leases are then released). Ties go by ``tie_break`` (then
    by name): a leaver passes its own order, so that workers leaving together do not all
    hand their leases to the same workers (ten leavers of 110 workers each gave its 91 leases
    to the same 91 of the 100 that stayed, and the leases moved again to even out).
    """
    leases = list(leases)
    loads: Counter[str] = Counter()
    leaving: set[str] = {worker_id, *leaving_too}
    for lease in leases:
        if lease.checkpoint_owner is not None and lease.checkpoint_owner != lease.lease_owner:
            leaving.add(lease.checkpoint_owner)
        leaver = leaving_owner_of(lease)
        if leaver is not None:
            leaving.add(leaver)
        owner = lease.lease_owner
        if owner is not None and not is_expired(lease):
            loads[owner] += 1
        request = handoff_request_of(lease)
        if request is not None and request.fresh_for(lease):
            loads[request.requester] += 0
    for worker in also:
        loads[worker] += 0
    for worker in leaving:
        loads.pop(worker, None)
    if seen_alive is not None:
        confirmed = Counter({worker: n for worker, n in loads.items() if seen_alive(worker)})
        if confirmed:
            loads = confirmed
    picks: list[str] = []
    for _ in range(count if loads else 0):
        chosen = min(
            loads,
            key=lambda worker: (loads[worker], tie_break(worker) if tie_break else 0, worker),
        )
        loads[chosen] += 1
        picks.append(chosen)
    return picks


def said_leaving(leases: Iterable[Lease]) -> set[str]:
    """Workers that said on one of ``leases`` that they leave (a fresh ``shardflowLeaving``).

    A leaver remembers them for the rest of its own leave: the word lives on a lease its
    writer still holds, and a scan taken while that lease moves on (or before the word is
    said again elsewhere) no longer shows it. Two workers leaving at 64 shards: the one whose
    handoffs drained first showed no sign of leaving for a moment, was the least loaded
    worker in sight, and got 9 of the other's leases, which it could only release (a 3-4 s
    pause each until a take cycle found them)."""
    return {leaver for lease in leases if (leaver := leaving_owner_of(lease)) is not None}
