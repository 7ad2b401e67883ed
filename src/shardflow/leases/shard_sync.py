"""Creating leases for a stream's shards, parents before children (lineage order).

For a stream without any lease (a new application) leases follow the initial position:
TRIM_HORIZON and AT_TIMESTAMP lease every shard still in retention, open and closed, with that
checkpoint; LATEST leases only the open shards, with checkpoint LATEST.

Once a stream has leases, a sync only fills gaps: a shard without a lease whose ancestors have
(or get) leases continues their lineage from TRIM_HORIZON; a shard with no leased ancestor
starts per the initial position (for LATEST only when it is open); a shard one of whose
descendants already has a lease is finished (its lease was cleaned up) and gets none.

Leases are created one generation at a time, so a child's lease never exists before its
parents' leases: a worker taking the child then finds its parents and waits for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shardflow.aws.kinesis import describe_stream_summary, list_shards
from shardflow.leases.concurrency import run_bounded
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.leases.keys import StreamIdentifier
from shardflow.leases.model import Lease
from shardflow.leases.store import LeaseStore
from shardflow.positions import PositionKind, StartPosition
from shardflow.records import AT_TIMESTAMP, LATEST, TRIM_HORIZON
from shardflow.shards import ChildShard, ShardInfo

log = logging.getLogger("shardflow.leases")

_CHECKPOINT_OF = {
    PositionKind.TRIM_HORIZON: TRIM_HORIZON,
    PositionKind.LATEST: LATEST,
    PositionKind.AT_TIMESTAMP: AT_TIMESTAMP,
}


def initial_checkpoint(position: StartPosition) -> str:
    """The checkpoint sentinel a new lease gets for an initial position."""
    try:
        return _CHECKPOINT_OF[position.kind]
    except KeyError:
        raise ValueError(f"not an initial position: {position}") from None


def lineage_depths(shards: Iterable[ShardInfo]) -> dict[str, int]:
    """Each shard's generation within the listing: 0 without a listed parent, else 1 + the
    deepest listed parent."""
    by_id = {shard.shard_id: shard for shard in shards}
    depths: dict[str, int] = {}

    def depth(shard_id: str) -> int:
        # Iterative, so that a long chain of reshards cannot exhaust the recursion limit.
        stack = [shard_id]
        while stack:
            current = stack[-1]
            if current in depths:
                stack.pop()
                continue
            parents = [p for p in by_id[current].parent_ids if p in by_id]
            missing = [p for p in parents if p not in depths and p not in stack]
            if missing:
                stack.extend(missing)
                continue
            depths[current] = 1 + max((depths.get(p, 0) for p in parents), default=-1)
            stack.pop()
        return depths[shard_id]

    for shard_id in by_id:
        depth(shard_id)
    return depths


def _with_leased_descendants(shards: Sequence[ShardInfo], leased: Collection[str]) -> set[str]:
    """Shards one of whose descendants (in the listing) has a lease."""
    depths = lineage_depths(shards)
    covered: set[str] = set()
    # Children before parents: a shard is covered when a child is leased or covered.
    for shard in sorted(shards, key=lambda s: depths[s.shard_id], reverse=True):
        if shard.shard_id in leased or shard.shard_id in covered:
            covered.update(shard.parent_ids)
    return covered


@dataclass(frozen=True, slots=True)
class LeasePlan:
    """Leases to create, by generation: every lease of ``generations[i]`` before ``[i+1]``."""

    generations: tuple[tuple[Lease, ...], ...]

    @property
    def leases(self) -> list[Lease]:
        return [lease for generation in self.generations for lease in generation]


def plan_leases(
    shards: Sequence[ShardInfo],
    leased: Collection[str],
    *,
    initial: StartPosition,
    stream_identifier: str | None = None,
) -> LeasePlan:
    """The leases to create for ``shards`` given the shard ids that already have leases.

    ``stream_identifier`` (multi-stream mode) prefixes the lease keys.
    """
    initial_value = initial_checkpoint(initial)
    leased_ids = set(leased)
    new_table = not leased_ids
    covered = _with_leased_descendants(shards, leased_ids)
    depths = lineage_depths(shards)
    # Shards whose lineage is (or will be) leased: a finished (covered) shard was leased once.
    continuing: set[str] = leased_ids | covered
    planned: dict[int, list[Lease]] = {}
    for shard in sorted(shards, key=lambda s: (depths[s.shard_id], s.shard_id)):
        if shard.shard_id in leased_ids or shard.shard_id in covered:
            continue
        checkpoint = _checkpoint_for(shard, continuing, initial, initial_value, new_table)
        if checkpoint is None:
            continue
        continuing.add(shard.shard_id)
        lease = Lease.new(
            shard.shard_id,
            stream=stream_identifier,
            parent_shard_ids=shard.parent_ids,
            hash_range=shard.hash_range,
            checkpoint=checkpoint,
        )
        planned.setdefault(depths[shard.shard_id], []).append(lease)
    return LeasePlan(tuple(tuple(planned[depth]) for depth in sorted(planned)))


def _checkpoint_for(
    shard: ShardInfo,
    continuing: set[str],
    initial: StartPosition,
    initial_value: str,
    new_table: bool,
) -> str | None:
    latest = initial.kind is PositionKind.LATEST
    if new_table:
        # A new application: the initial position alone decides.
        return None if latest and not shard.is_open else initial_value
    if any(parent in continuing for parent in shard.parent_ids):
        return TRIM_HORIZON  # continues a leased lineage: nothing of it may be skipped
    if latest and not shard.is_open:
        return None
    return initial_value


def child_leases(children: Iterable[ChildShard], stream_identifier: str | None) -> list[Lease]:
    """Leases for the children of an ended shard: from TRIM_HORIZON, parents recorded."""
    return [
        Lease.new(
            child.shard_id,
            stream=stream_identifier,
            parent_shard_ids=child.parent_shard_ids,
            hash_range=child.hash_range,
            checkpoint=TRIM_HORIZON,
        )
        for child in children
    ]


async def create_in_order(
    store: LeaseStore,
    plan: LeasePlan,
    *,
    concurrency: int,
    on_created: Callable[[Lease], None] | None = None,
    on_contended: Callable[[], None] | None = None,
) -> list[Lease]:
    """Create the planned leases generation by generation; existing ones are left alone.

    With ``on_contended`` the plan's first lease is created alone, first: when that creation
    is refused, another worker is creating the same leases at this moment (workers that start
    together on a new application, or whose shard syncs meet), so nothing more is created
    here and ``on_contended`` is called; that worker creates them, each once, instead of
    every worker sending every creation.

    Returns the leases this call created (another worker may have created the rest).
    """
    created: list[Lease] = []

    async def create(lease: Lease) -> bool:
        try:
            result = await store.create_if_absent(lease)
        except LeaseConditionFailedError:
            return False  # someone else created it first: same shard, same lineage rules
        created.append(result)
        if on_created is not None:
            on_created(result)
        return True

    async def create_quietly(lease: Lease) -> None:
        await create(lease)

    generations = [list(generation) for generation in plan.generations if generation]
    if on_contended is not None and generations and not await create(generations[0].pop(0)):
        on_contended()
        return created
    for generation in generations:
        await run_bounded(generation, create_quietly, concurrency=concurrency)
    return created


async def sync_stream(
    store: LeaseStore,
    kinesis: Any,
    stream: str,
    existing: Sequence[Lease],
    *,
    initial: StartPosition,
    stream_identifier: str | None = None,
    concurrency: int = 32,
    on_contended: Callable[[], None] | None = None,
) -> list[Lease]:
    """List ``stream``'s shards and create the leases missing from ``existing`` (its leases);
    ``on_contended``: see :func:`create_in_order`.

    Returns the leases created by this call.
    """
    shards = await list_shards(kinesis, stream)
    leased = {lease.shard_id for lease in existing}
    plan = plan_leases(shards, leased, initial=initial, stream_identifier=stream_identifier)
    created = await create_in_order(store, plan, concurrency=concurrency, on_contended=on_contended)
    if created:
        log.info("created %d leases for stream %s", len(created), stream)
    return created


async def resolve_stream_identifier(kinesis: Any, stream: str) -> StreamIdentifier:
    """The KCL multi-stream identifier ``account:name:creation-epoch`` of a stream."""
    summary = await describe_stream_summary(kinesis, stream)
    arn: str = summary["StreamARN"]  # arn:aws:kinesis:REGION:ACCOUNT:stream/NAME
    account = arn.split(":")[4]
    created = summary["StreamCreationTimestamp"]
    epoch = int(created.timestamp()) if isinstance(created, datetime) else int(float(created))
    return StreamIdentifier(account, summary["StreamName"], epoch)
