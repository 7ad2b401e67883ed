"""Which leases a worker should take, given one scan of the lease table: pure functions.

The rules follow KCL 2.x's lease taker, with one difference noted below:

- Live workers are the owners of leases that are not expired (as this worker observes them),
  plus this worker. The target is ``ceil(leases / live workers)``, capped by
  ``max_leases_per_worker``.
- A worker below target takes free leases first, then expired ones, up to the target.
- Only when no lease is free or expired does it steal, from the most loaded worker and only
  if that worker holds more than the target, at most ``max_steal`` leases and never so many
  that the victim drops below the target. (KCL also steals from a worker *at* target when the
  thief needs more than one lease; shardflow never takes a live lease from a worker that is
  not above target, so a spread like 3/3/1 of 7 leases may stay as it is.)
- With ``even_out`` (planned handoff: a "steal" becomes a request the owner answers by a
  graceful handoff, so a move repeats nothing) a worker below target asks every worker above
  target for its surplus at once (up to ``max_steal`` requests, in random order), not
  one lease a cycle from one worker: a worker joining 100 others on 10,000 shards needs 91
  leases, and one request at a time took 91 round trips. Workers that asked for a lease (a
  fresh request on it) count as live, so that joiners holding nothing yet are in everyone's
  target. When no worker is above target it asks the most loaded worker for one lease if
  that one holds at least two more than itself: workers that join together (each counts
  only itself among those holding nothing, so the target looks met by everyone else) still
  get their share, and the fleet ends within one lease of even. Workers the taker saw write
  lately and not leaving (``TableShape.seen``) count as live too: after a split wave each
  worker holds nothing between releasing its finished parents and taking a child. (The owner answers a request
  only while it keeps its own share, :func:`may_give`, judged on the table as it sees it
  now, not as its last take cycle did.)
- With ``even_out``, expired leases (shards whose owner stopped) are also taken beyond the
  target: each worker takes at least its part of them, ``ceil(expired / workers holding live
  leases)``, and the fleet evens out afterwards by handoff. The target counts joiners that hold
  nothing and only asked for a lease, and a joiner judges expiry from its own first sight of
  a lease: after a crash and a restart, the survivors were all at target and left the dead
  worker's leases to the replacement, which took them a failover time after it started, not
  after the crash (bench/chaos.py, kill -9 and a restart 3 s later: 11-13.4 s until the last
  shard ran again at failover time 6 s).
- With ``max_takes`` a worker takes at most that many free and expired leases at once (the
  taker passes what it holds, at least one batch of writes): a worker that sees nobody else
  live (every lease free: a new application, a fleet started again) cannot tell whether it
  is alone or one of a hundred starting together. Alone, it doubles what it holds every
  cycle; among a hundred, the next scan shows the others, and their share is the target.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from shardflow.events import AcquiredHow
from shardflow.leases.handoff_request import handoff_request_of
from shardflow.leases.model import Lease


@dataclass(frozen=True, slots=True)
class PlannedTake:
    """One lease to take, as it was seen (the take is conditional on that view)."""

    lease: Lease
    how: AcquiredHow


@dataclass(frozen=True, slots=True)
class TakePlan:
    """The outcome of one balancing decision."""

    takes: tuple[PlannedTake, ...]
    target: int
    held: int
    """Leases counted as this worker's before the takes."""
    live_workers: frozenset[str]
    loads: dict[str, int]
    """Live leases per live worker (this worker included), before the takes."""
    wanted: int = 0
    """Free and expired leases this worker wanted (``takes`` may hold fewer: ``max_takes``)."""
    orphans: int = 0
    """Expired leases seen, when they are taken beyond the target (``even_out``: see the
    module doc); else 0."""
    holders: frozenset[str] = frozenset()
    """The workers holding live leases, this one included: those the orphans are shared by."""


def target_for(lease_count: int, worker_count: int, max_per_worker: int | None = None) -> int:
    """How many leases each worker should hold: ``ceil(leases / workers)``, capped."""
    if lease_count <= 0:
        return 0
    target = math.ceil(lease_count / max(worker_count, 1))
    if max_per_worker is not None:
        target = min(target, max_per_worker)
    return target


@dataclass(frozen=True, slots=True)
class TableShape:
    """The leases to balance, sorted into what :func:`decide` needs: built by a pass over
    every lease (:func:`shape_of`) or from the taker's incrementally kept index
    (:mod:`~shardflow.leases.lease_index`); both give the same shape for the same table."""

    total: int
    """Leases to balance (the target's numerator)."""
    mine: int
    """Held here, or naming this worker as owner without being expired."""
    free: list[Lease]
    """Free leases not held here, in lease-key order."""
    expired: list[Lease]
    """Expired leases not held here (not free), in lease-key order."""
    alive_counts: dict[str, int]
    """Other workers -> their live leases (only workers with at least one)."""
    alive_of: Callable[[str], list[Lease]]
    """A worker's live leases in lease-key order (asked for a few workers only)."""
    requesters: frozenset[str] = frozenset()
    """Workers that asked for a lease (a fresh handoff request), when evening out."""
    seen: frozenset[str] = frozenset()
    """Other workers known to be live without holding a live lease now (the taker's: seen
    writing lately and not leaving): counted in the target as requesters are."""


def shape_of(
    leases: Sequence[Lease],
    *,
    worker_id: str,
    held: Collection[str],
    is_expired: Callable[[Lease], bool],
    even_out: bool = False,
) -> TableShape:
    """The shape of ``leases`` by one pass over them (see :func:`plan_takes`)."""
    held_keys = set(held)
    requesters: set[str] = set()
    free: list[Lease] = []
    expired: list[Lease] = []
    alive_by_owner: dict[str, list[Lease]] = {}
    mine = 0
    for lease in leases:
        if even_out and lease.extra:
            request = handoff_request_of(lease)
            if request is not None and request.fresh_for(lease):
                requesters.add(request.requester)
        if lease.lease_key in held_keys:
            mine += 1
        elif lease.is_free:
            free.append(lease)
        elif is_expired(lease):
            expired.append(lease)
        else:
            owner = lease.lease_owner
            assert owner is not None  # not free
            if owner == worker_id:
                mine += 1  # ours by name but not held here: never a candidate, counted as ours
            else:
                alive_by_owner.setdefault(owner, []).append(lease)
    for owned in alive_by_owner.values():
        owned.sort(key=_by_key)
    free.sort(key=_by_key)
    expired.sort(key=_by_key)
    return TableShape(
        total=len(leases),
        mine=mine,
        free=free,
        expired=expired,
        alive_counts={owner: len(owned) for owner, owned in alive_by_owner.items()},
        alive_of=lambda owner: alive_by_owner.get(owner, []),
        requesters=frozenset(requesters),
    )


def _by_key(lease: Lease) -> str:
    return lease.lease_key


def plan_takes(
    leases: Sequence[Lease],
    *,
    worker_id: str,
    held: Collection[str],
    is_expired: Callable[[Lease], bool],
    max_leases_per_worker: int | None = None,
    max_steal: int = 1,
    rng: random.Random | None = None,
    orphans_beyond_target: bool = False,
    even_out: bool = False,
    max_takes: int | None = None,
    asked: int = 0,
) -> TakePlan:
    """The leases ``worker_id`` should take now.

    ``leases`` are the leases to balance (finished shards and other applications' streams
    already left out); ``held`` the keys this worker holds; ``is_expired`` the observer's
    judgement (free leases count as expired). ``rng`` shuffles candidates so that workers
    starting together do not all race for the same leases. ``orphans_beyond_target`` takes
    every free and expired lease up to ``max_leases_per_worker`` whatever the target (in a
    KCL 3.x fleet, whose leader spreads them again by graceful handoff: a dead worker's shards
    then wait no longer than its failover time for the leader's next pass). ``even_out`` and
    ``max_takes``: see the module doc; ``asked``: handoff requests of this worker still open
    (with ``even_out``, fewer new ones are made).
    """
    shape = shape_of(
        leases, worker_id=worker_id, held=held, is_expired=is_expired, even_out=even_out
    )
    return decide(
        shape,
        worker_id=worker_id,
        max_leases_per_worker=max_leases_per_worker,
        max_steal=max_steal,
        rng=rng,
        orphans_beyond_target=orphans_beyond_target,
        even_out=even_out,
        max_takes=max_takes,
        asked=asked,
    )


def decide(
    shape: TableShape,
    *,
    worker_id: str,
    max_leases_per_worker: int | None = None,
    max_steal: int = 1,
    rng: random.Random | None = None,
    orphans_beyond_target: bool = False,
    even_out: bool = False,
    max_takes: int | None = None,
    asked: int = 0,
    spread: bool = False,
) -> TakePlan:
    """The balance rules (the module doc) applied to ``shape``; arguments as
    :func:`plan_takes`. Candidates are shuffled from lease-key order, so the same shape and
    the same ``rng`` state give the same plan however the shape was built. ``spread``: the
    live workers seen have not changed for a while, so free leases are taken as this
    worker's run of them (:func:`free_share`) rather than drawn at random."""
    chooser = rng or random.Random()
    mine = shape.mine
    free = list(shape.free)
    expired = list(shape.expired)
    loads = Counter(shape.alive_counts)
    loads[worker_id] = mine
    holders = frozenset(loads)
    live = holders | shape.requesters | shape.seen
    target = target_for(shape.total, len(live), max_leases_per_worker)
    need = target - mine
    wanted = need
    orphans = 0
    if orphans_beyond_target:
        cap = max_leases_per_worker if max_leases_per_worker is not None else shape.total
        need = wanted = cap - mine
    elif even_out and expired:
        # Beyond the target: this worker's part of the shards whose owner stopped (see the
        # module doc). Not free leases: at a fleet's start every lease is free, and the
        # target is what keeps workers that scan first from taking everyone's share.
        part = orphan_part(len(expired), len(holders))
        if max_leases_per_worker is not None:
            part = min(part, max_leases_per_worker - mine)
        if part > need:
            wanted = part
            orphans = len(expired)

    def plan(takes: list[PlannedTake]) -> TakePlan:
        return TakePlan(
            tuple(takes), target, mine, live, dict(loads), max(wanted, 0), orphans, holders
        )

    if wanted <= 0:
        return plan([])
    if free or expired:
        # Free leases first, then expired ones: up to the target, and expired ones beyond it
        # up to what is wanted (see above); at most ``max_takes``. Drawn at random, and only
        # as many as are taken: after a split wave 20,000 leases are free, and shuffling them
        # all (and a planned take each) in every worker's cycle was a tenth of a simulated
        # fleet's time (bench/simulate.py, 100 workers, profiled).
        from_free = min(len(free), max(need, 0))
        from_expired = min(len(expired), max(wanted - from_free, 0))
        if max_takes is not None:
            limit = max(max_takes, 1)
            from_free = min(from_free, limit)
            from_expired = min(from_expired, limit - from_free)
        picked = (
            free_share(free, loads, live, target, worker_id, from_free)
            if spread and not orphans_beyond_target
            else None
        )
        if picked is None:
            picked = chooser.sample(free, from_free)
        takes = [PlannedTake(lease, "free") for lease in picked]
        chooser.shuffle(expired)  # few, as a rule: a stopped worker's
        takes += [PlannedTake(lease, "expired") for lease in expired[:from_expired]]
        return plan(takes)
    if need <= 0:
        return plan([])
    if even_out:
        wanted = need - asked
        return plan(_requests(shape, target, mine, wanted, max_steal, chooser))
    return plan(_steals(shape, target, need, max_steal, chooser))


def free_share(
    free: Sequence[Lease],
    loads: Mapping[str, int],
    live: Collection[str],
    target: int,
    worker_id: str,
    count: int,
) -> list[Lease] | None:
    """This worker's ``count`` free leases when several live workers are below ``target``:
    a run of ``free`` (in lease-key order) that the others' runs do not overlap, or None
    (one such worker or none: drawn at random, see :func:`decide`).

    Every worker below the target gets a run of the free leases as long as its need
    (``target`` - its load), in the order of the workers' ids: this worker's starts after the
    needs of the workers before it. Workers that see the same table plan disjoint runs; and a
    worker that took part of its run since a peer's picture leaves that picture consistent
    (its need and the free leases before the others' runs shrank alike), so only a picture
    that differs otherwise (a lease freed or taken unseen) moves a run, by that difference.
    Drawn at random, the last free leases of a split wave were raced for: 100 workers each
    drawing its need from 20,000 free leases had about a third of their takes refused
    (e^-1 of the leases drawn twice or more), and so again for what was left, one scan pace
    apart each time (bench/simulate.py, 10,000 shards split under 100 workers: 19 shards
    still waiting after 24.5 simulated seconds).

    Only once the live workers seen have stayed the same a while (``spread`` of
    :func:`decide`): while workers are still appearing (a fleet starting together) a worker
    that does not see them all plans runs for too few workers and, its takes no longer
    refused, never learns of the others from the refusals either (see
    :meth:`LeaseTaker.take_cycle`): 20 workers starting on 2,000 shards took 933 leases
    beyond their share, handed back over 14 s."""
    if count <= 0 or not free:
        return None
    needy = sorted(
        worker for worker in live if loads.get(worker, 0) < target or worker == worker_id
    )
    if len(needy) < 2:
        return None
    start = 0
    for worker in needy:
        if worker == worker_id:
            break
        start += target - loads.get(worker, 0)
    start %= len(free)
    run = list(free[start : start + count])
    if len(run) < count:
        run += free[: count - len(run)]  # past the end (needs above what is free): wrap
    return run


def orphan_part(orphans: int, holders: int) -> int:
    """How many of ``orphans`` expired leases one of ``holders`` workers holding
    live leases takes beyond its target (``even_out``): ``ceil(orphans / holders)``. Workers
    racing for the same leases together take at most all of them, and those left (takes
    refused, or a worker that did not see them expire yet) are shared again next cycle."""
    if orphans <= 0:
        return 0
    return math.ceil(orphans / max(holders, 1))


def may_give(mine: int, requester_holds: int, leases: int, workers: int) -> bool:
    """Whether a worker holding ``mine`` leases (not counting those it is handing over) should
    hand one to a worker holding ``requester_holds``, in a fleet of ``workers`` live workers
    sharing ``leases``: while it holds more than its share (``ceil(leases / workers)``), or,
    evening out, more than the least share (``floor``) and two more than the requester. Never
    below the least share: several joiners ask one worker for its surplus at once, and a worker
    that gave more than its surplus asked others for leases back, which moved again."""
    if workers <= 0:
        return True
    least, extra = divmod(leases, workers)
    share = least + (1 if extra else 0)
    return mine > share or (mine > least and mine >= requester_holds + 2)


def _requests(
    shape: TableShape,
    target: int,
    mine: int,
    need: int,
    budget: int,
    chooser: random.Random,
) -> list[PlannedTake]:
    """Handoff requests (see the module doc): each worker above target asked for at most its
    surplus, up to ``budget`` in all, the workers with a surplus in random order (workers
    that plan at the same moment spread over them rather than all asking the busiest); else
    the evening-out request."""
    counts = shape.alive_counts
    if not counts or budget <= 0 or need <= 0:
        return []
    above = sorted(owner for owner, count in counts.items() if count > target)
    chooser.shuffle(above)
    wanted = min(need, budget)
    takes: list[PlannedTake] = []
    for owner in above:
        if len(takes) >= wanted:
            break
        movable = [lease for lease in shape.alive_of(owner) if not lease.handoff_pending]
        count = min(counts[owner] - target, wanted - len(takes), len(movable))
        takes += [PlannedTake(lease, "stolen") for lease in chooser.sample(movable, count)]
    if takes:
        return takes
    return _steals(shape, min(target, mine + 1), need, 1, chooser)


def _steals(
    shape: TableShape,
    floor: int,
    need: int,
    max_steal: int,
    chooser: random.Random,
) -> list[PlannedTake]:
    """At most ``max_steal`` of the most loaded worker's leases, never leaving it below
    ``floor`` (the target; with ``even_out``, one more than the thief holds)."""
    counts = shape.alive_counts
    if not counts or max_steal <= 0:
        return []
    # The most loaded worker; ties go to the smallest id so that every thief picks the same one.
    victim = min(counts, key=lambda owner: (-counts[owner], owner))
    surplus = counts[victim] - floor
    if surplus <= 0:
        return []
    # A lease already being handed over is moving anyway: leave it alone.
    stealable = [lease for lease in shape.alive_of(victim) if not lease.handoff_pending]
    count = min(need, surplus, max_steal, len(stealable))
    return [PlannedTake(lease, "stolen") for lease in chooser.sample(stealable, count)]
