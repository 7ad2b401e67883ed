"""shardflow's own items in the lease table: worker heartbeats and the application's lease mode.

The lease table holds one item per shard (:mod:`~shardflow.leases.model`). In the
``heartbeat`` lease mode it also holds one item per live worker, and every table whose mode was
ever set holds one item naming the mode. Both carry an ``entityType`` other than ``LEASE``, as
KCL 3.5 marks the other entities it keeps in the lease table, so readers that follow that rule
(KCL 3.5, shardflow's :func:`~shardflow.leases.model.is_lease_item`) skip them. KCL 2.x reads
every item as a lease and fails on these: the heartbeat mode is for fleets without KCL workers,
and a table goes back to lease items only when the mode is switched back (see
``docs/guides/migration.md``).

Heartbeat item (``leaseKey`` = ``_shardflow#heartbeat#<worker id>``):

============================== ==== ==========================================================
attribute                      type meaning
============================== ==== ==========================================================
entityType                     S    ``SHARDFLOW_HEARTBEAT``
workerId                       S    the worker whose heartbeat it is
heartbeatCounter               N    bumped by every heartbeat; every write conditions on it
fencedBy                       S    set (conditionally on the counter seen) by a worker that
                                    judged the heartbeat expired, before it takes a lease of
                                    that worker: no heartbeat of the owner lands after it
============================== ==== ==========================================================

Mode item (``leaseKey`` = ``_shardflow#leaseMode``): ``entityType`` ``SHARDFLOW_LEASE_MODE``,
``leaseMode`` (S) ``per-lease`` or ``heartbeat``, ``changeCounter`` (N). No item: ``per-lease``.

``changeCounter`` is the table's change marker in the heartbeat mode: after a lease write that
peers should notice soon (a take, release, handoff, request, new lease, finished shard, a
heartbeat registered, fenced or deleted: everything but renewals, beats and ordinary
checkpoints) the writer adds 1 to it (:func:`note_change`). Lease pick-up then reads this one
item and the heartbeats, not the whole table, while the counter stands still (see
:class:`~shardflow.leases.pickup.PollingChanges`). It is a hint for speed only: ownership is
decided by the conditional writes, and the whole table is still scanned every renew interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Final, Literal

from shardflow.leases.model import ENTITY_TYPE, LEASE_KEY, AttributeValue, Item, n, s
from shardflow.leases.writes import Absent, Add, Equals, LeaseWrite, Put, Remove

LeaseMode = Literal["per-lease", "heartbeat"]
"""How the workers of an application keep their leases (see the lease guide)."""

LEASE_MODES: Final = ("per-lease", "heartbeat")

HEARTBEAT_ENTITY: Final = "SHARDFLOW_HEARTBEAT"
MODE_ENTITY: Final = "SHARDFLOW_LEASE_MODE"
HEARTBEAT_PREFIX: Final = "_shardflow#heartbeat#"
MODE_KEY: Final = "_shardflow#leaseMode"

WORKER_ID: Final = "workerId"
HEARTBEAT_COUNTER: Final = "heartbeatCounter"
FENCED_BY: Final = "fencedBy"
MODE: Final = "leaseMode"
CHANGE_COUNTER: Final = "changeCounter"


def heartbeat_key(worker_id: str) -> str:
    """The lease-table key of ``worker_id``'s heartbeat item."""
    if not worker_id:
        raise ValueError("a heartbeat needs a non-empty worker id")
    return HEARTBEAT_PREFIX + worker_id


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One worker's heartbeat item as read. ``fenced_by``: a peer judged it expired and
    fenced it; its worker's heartbeats fail from then on, and its leases may be taken."""

    worker_id: str
    counter: int
    fenced_by: str | None = None

    @property
    def key(self) -> str:
        return heartbeat_key(self.worker_id)


@dataclass(frozen=True, slots=True)
class ModeSetting:
    """The application's lease mode as stored in its table, with its change marker
    (``changes``: 0 while no writer has bumped it)."""

    mode: LeaseMode
    changes: int = 0


Entity = Heartbeat | ModeSetting


def entity_from_item(item: Mapping[str, AttributeValue]) -> Entity | None:
    """The shardflow entity an item holds; None for leases, other entities and broken items
    (a broken heartbeat counts as none: its worker's leases are judged lease by lease)."""
    kind = item.get(ENTITY_TYPE, {}).get("S")
    if kind == HEARTBEAT_ENTITY:
        worker = item.get(WORKER_ID, {}).get("S")
        raw = item.get(HEARTBEAT_COUNTER, {}).get("N")
        if not worker or raw is None:
            return None
        try:
            counter = int(Decimal(raw))
        except (InvalidOperation, ValueError):
            return None
        fenced = item.get(FENCED_BY, {}).get("S")
        return Heartbeat(worker, counter, fenced)
    if kind == MODE_ENTITY:
        mode = item.get(MODE, {}).get("S")
        if mode in LEASE_MODES:
            return ModeSetting(mode, _number(item.get(CHANGE_COUNTER, {}).get("N")))
    return None


def _number(raw: str | None) -> int:
    if raw is None:
        return 0
    try:
        return int(Decimal(raw))
    except (InvalidOperation, ValueError):
        return 0


def heartbeat_item(heartbeat: Heartbeat) -> Item:
    item: Item = {
        LEASE_KEY: s(heartbeat.key),
        ENTITY_TYPE: s(HEARTBEAT_ENTITY),
        WORKER_ID: s(heartbeat.worker_id),
        HEARTBEAT_COUNTER: n(heartbeat.counter),
    }
    if heartbeat.fenced_by is not None:
        item[FENCED_BY] = s(heartbeat.fenced_by)
    return item


# --- writes ----------------------------------------------------------------------------------


def register_heartbeat(worker_id: str, current: Heartbeat | None) -> LeaseWrite:
    """Start ``worker_id``'s heartbeat: create its item, or take over the one found
    (``current``: an earlier process with the same id, fenced or not), conditional on it."""
    if current is None:
        return LeaseWrite(
            "register_heartbeat",
            heartbeat_key(worker_id),
            "put",
            (Absent(LEASE_KEY),),
            item=heartbeat_item(Heartbeat(worker_id, 1)),
        )
    return LeaseWrite(
        "register_heartbeat",
        current.key,
        "update",
        (Equals(HEARTBEAT_COUNTER, n(current.counter)),),
        (
            Put(HEARTBEAT_COUNTER, n(current.counter + 1)),
            Put(ENTITY_TYPE, s(HEARTBEAT_ENTITY)),
            Put(WORKER_ID, s(worker_id)),
            Remove(FENCED_BY),
        ),
    )


def beat(heartbeat: Heartbeat) -> LeaseWrite:
    """One heartbeat: counter + 1, only while unfenced and at the counter this worker wrote."""
    return LeaseWrite(
        "heartbeat",
        heartbeat.key,
        "update",
        (Equals(HEARTBEAT_COUNTER, n(heartbeat.counter)), Absent(FENCED_BY)),
        (Put(HEARTBEAT_COUNTER, n(heartbeat.counter + 1)),),
    )


def fence(heartbeat: Heartbeat, by: str) -> LeaseWrite:
    """Mark a heartbeat seen unchanged for failover_time as expired, conditional on the counter
    seen: a heartbeat of its worker still in flight either lands first (the fence fails: the
    worker lives) or is refused after it (the worker learns it lost its leases)."""
    return LeaseWrite(
        "fence_heartbeat",
        heartbeat.key,
        "update",
        (Equals(HEARTBEAT_COUNTER, n(heartbeat.counter)), Absent(FENCED_BY)),
        (Put(FENCED_BY, s(by)),),
    )


def delete_heartbeat(heartbeat: Heartbeat) -> LeaseWrite:
    """Remove a heartbeat item if unchanged since it was read as ``heartbeat``."""
    return LeaseWrite(
        "delete_heartbeat",
        heartbeat.key,
        "delete",
        (Equals(HEARTBEAT_COUNTER, n(heartbeat.counter)),),
    )


def set_mode(mode: LeaseMode) -> LeaseWrite:
    """Store the application's lease mode (every worker follows it). An update, not a put:
    the change marker keeps counting up (a reset could bring it back to a value a reader
    saw before, and that reader would miss the changes in between)."""
    if mode not in LEASE_MODES:
        raise ValueError(f"lease mode must be one of {LEASE_MODES}, got {mode!r}")
    return LeaseWrite(
        "set_lease_mode",
        MODE_KEY,
        "update",
        (),
        (Put(ENTITY_TYPE, s(MODE_ENTITY)), Put(MODE, s(mode)), Add(CHANGE_COUNTER, 1)),
    )


def note_change() -> LeaseWrite:
    """Bump the table's change marker, only on a table in the heartbeat mode: the condition
    keeps it from creating a mode item in a table of leases only (KCL 2.x reads every item
    as a lease), and from counting on a table switched back to ``per-lease``."""
    return LeaseWrite(
        "note_change",
        MODE_KEY,
        "update",
        (Equals(ENTITY_TYPE, s(MODE_ENTITY)), Equals(MODE, s("heartbeat"))),
        (Add(CHANGE_COUNTER, 1),),
    )


def clear_mode() -> LeaseWrite:
    """Remove the mode item (the table then holds only leases, as KCL 2.x needs)."""
    return LeaseWrite("clear_lease_mode", MODE_KEY, "delete", ())
