"""The lease store: what the lease coordinator and the checkpointer may do to the lease table.

Every mutating call is one conditional write (see :mod:`shardflow.leases.writes` for the exact
conditions, which follow KCL). It returns the lease as it is after the write, or raises
:class:`~shardflow.leases.errors.LeaseConditionFailedError` carrying the lease as it is now (``current``),
read from the failed write's own response. Transient AWS failures are retried with backoff; a
failed condition never is. Worker ids must be non-empty strings: an empty ``leaseOwner`` is
never written.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from shardflow.errors import AwsError
from shardflow.leases import entities, writes
from shardflow.leases.entities import Entity, Heartbeat, LeaseMode, ModeSetting
from shardflow.leases.errors import EntityConditionFailedError
from shardflow.leases.marker import ChangeMarker
from shardflow.leases.model import Item, Lease
from shardflow.records import ExtendedSequenceNumber
from shardflow.shards import HashKeyRange

log = logging.getLogger("shardflow.leases")


@dataclass(frozen=True, slots=True)
class TableStatus:
    """The lease table after :meth:`LeaseStore.ensure_table`.

    ``created`` tells whether this call created it. ``stream_arn`` is the table's DynamoDB
    stream (NEW_AND_OLD_IMAGES) when one is enabled.
    """

    name: str
    created: bool
    billing_mode: str
    stream_arn: str | None = None
    stream_view_type: str | None = None


@dataclass(frozen=True, slots=True)
class TableScan:
    """One scan of the lease table: its leases (sorted by key, as :meth:`LeaseStore.list_leases`)
    and shardflow's own items in it (see :mod:`~shardflow.leases.entities`)."""

    leases: list[Lease]
    heartbeats: tuple[Heartbeat, ...] = ()
    mode: LeaseMode | None = None
    """The mode item's value; None: no mode item (the ``per-lease`` mode)."""
    changes: int = 0
    """The mode item's change marker (see :mod:`~shardflow.leases.entities`)."""

    @classmethod
    def of(cls, leases: list[Lease], found: list[Entity]) -> TableScan:
        heartbeats = tuple(entity for entity in found if isinstance(entity, Heartbeat))
        modes = [entity for entity in found if isinstance(entity, ModeSetting)]
        if not modes:
            return cls(leases, heartbeats)
        return cls(leases, heartbeats, modes[0].mode, modes[0].changes)


@dataclass(frozen=True, slots=True)
class TableMarks:
    """What lease pick-up reads between scans of a heartbeat-mode table (see
    :meth:`LeaseStoreBase.read_marks`): the mode item (``mode`` None: no mode item) with its
    change marker, and the heartbeat items asked for that exist."""

    mode: LeaseMode | None
    changes: int
    heartbeats: tuple[Heartbeat, ...]


def marks_of(items: Iterable[Item], store: LeaseStoreBase) -> TableMarks:
    """The marks in ``items`` (the answer of a store's read of the mode item and heartbeats);
    tells ``store`` the mode seen."""
    heartbeats: list[Heartbeat] = []
    mode: ModeSetting | None = None
    for item in items:
        entity = entities.entity_from_item(item)
        if isinstance(entity, Heartbeat):
            heartbeats.append(entity)
        elif isinstance(entity, ModeSetting):
            mode = entity
    store.saw_mode(mode.mode if mode is not None else None)
    if mode is None:
        return TableMarks(None, 0, tuple(heartbeats))
    return TableMarks(mode.mode, mode.changes, tuple(heartbeats))


@runtime_checkable
class LeaseStore(Protocol):
    """A KCL-compatible lease table (DynamoDB, or in memory with the same semantics)."""

    @property
    def table_name(self) -> str: ...

    async def ensure_table(
        self, *, stream_view: bool = False, stream_if_created: bool = False
    ) -> TableStatus:
        """Create the table if missing (key leaseKey S, on-demand) and wait until it is ACTIVE.

        ``stream_view`` enables a DynamoDB stream with NEW_AND_OLD_IMAGES on it;
        ``stream_if_created`` does so only when this call creates the table (an existing
        table, e.g. a KCL application's, is left as it is).
        """
        ...

    async def list_leases(self) -> list[Lease]:
        """Every lease, read strongly consistently, sorted by lease key.

        Items that are not leases (KCL 3.5 entities) are skipped, and so are malformed lease
        items, with a warning: one broken item must not stop every shard.
        """
        ...

    async def get(self, lease_key: str) -> Lease | None:
        """The lease (consistent read), or None if there is no lease item with that key."""
        ...

    async def create_if_absent(self, lease: Lease) -> Lease:
        """Write a new lease item; fails (``current`` = the existing lease) if the key exists."""
        ...

    async def renew(
        self, lease: Lease, owner: str, *, throughput_kbps: float | None = None
    ) -> Lease: ...

    async def take(self, lease: Lease, new_owner: str) -> Lease: ...

    async def release(
        self,
        lease: Lease,
        owner: str,
        *,
        final_checkpoint: ExtendedSequenceNumber | None = None,
        completed_state: bytes | None = None,
    ) -> Lease: ...

    async def checkpoint(
        self,
        lease: Lease,
        owner: str,
        position: ExtendedSequenceNumber,
        *,
        pending: ExtendedSequenceNumber | None = None,
        pending_state: bytes | None = None,
        clear_pending: bool = True,
        completed_state: bytes | None = None,
    ) -> Lease: ...

    async def prepare_checkpoint(
        self,
        lease: Lease,
        owner: str,
        pending: ExtendedSequenceNumber,
        *,
        pending_state: bytes | None = None,
    ) -> Lease: ...

    async def update_children(self, lease: Lease, child_shard_ids: Iterable[str]) -> Lease: ...

    async def update_hash_range(self, lease: Lease, hash_range: HashKeyRange) -> Lease: ...

    async def delete(self, lease: Lease) -> None: ...

    async def handoff(self, lease: Lease, from_owner: str, to_owner: str) -> Lease: ...

    async def redirect_handoff(self, lease: Lease, via: str, to_owner: str) -> Lease: ...

    async def complete_handoff(self, lease: Lease, from_owner: str) -> Lease: ...

    async def request_handoff(self, lease: Lease, requester: str) -> Lease: ...

    async def decline_handoff(self, lease: Lease, owner: str) -> Lease: ...

    async def mark_leaving(self, lease: Lease, owner: str) -> Lease: ...


class LeaseStoreBase(abc.ABC):
    """The lease operations, built once on :mod:`~shardflow.leases.writes` for every backend.

    A backend supplies reads, table creation and :meth:`execute` of one conditional write.
    """

    def __init__(self, table_name: str) -> None:
        if not table_name:
            raise ValueError("the lease table needs a name (the application name)")
        self._table_name = table_name
        self._marker = ChangeMarker(self._note_change)
        self._heartbeat_table = False
        self._streamed = False
        self.marks_changes = False
        """Whether this store bumps the table's change marker after the writes peers should
        notice (:func:`~shardflow.leases.writes.noticed_by_peers`): while the table's mode,
        as last read, is ``heartbeat`` and the table has no DynamoDB stream (see
        :meth:`saw_mode`, :meth:`saw_stream`)."""

    def saw_mode(self, mode: LeaseMode | None) -> None:
        """The table's mode as a read showed it (None: no mode item): in the heartbeat mode,
        writes bump the change marker; in a table of leases only they must not create it."""
        self._heartbeat_table = mode == "heartbeat"
        self.marks_changes = self._heartbeat_table and not self._streamed

    def saw_stream(self, enabled: bool) -> None:
        """Whether the table has a DynamoDB stream (:meth:`ensure_table` tells): its readers
        see every write there, and a worker that polls such a table scans every poll
        (:meth:`~shardflow.leases.moves.LeaseMoves.changes`), so a bump would be a write for
        nobody."""
        self._streamed = enabled
        self.marks_changes = self._heartbeat_table and not enabled

    async def read_marks(self, heartbeat_keys: Sequence[str]) -> TableMarks | None:
        """The mode item and the heartbeat items of ``heartbeat_keys``, read consistently in
        one request; None when this store cannot (lease pick-up then scans every time)."""
        return None

    async def _note_change(self) -> None:
        try:
            await self.execute_entity(entities.note_change())
        except EntityConditionFailedError:
            self.marks_changes = False  # the table is no longer in the heartbeat mode
        except AwsError as exc:
            # A hint only: readers still scan the whole table every renew interval.
            log.info("the change marker of %s was not bumped: %s", self._table_name, exc)

    def _noticed(self, write: writes.LeaseWrite) -> None:
        if self.marks_changes and writes.noticed_by_peers(write):
            self._marker.note()

    async def settle_marks(self) -> None:
        """Wait until the change marker was bumped for every write so far that asked for it
        (bumps go out in the background: see :mod:`~shardflow.leases.marker`); for a worker
        that stops, and for tests."""
        await self._marker.settle()

    @property
    def table_name(self) -> str:
        return self._table_name

    @abc.abstractmethod
    async def ensure_table(
        self, *, stream_view: bool = False, stream_if_created: bool = False
    ) -> TableStatus: ...

    @abc.abstractmethod
    async def list_leases(self) -> list[Lease]: ...

    @abc.abstractmethod
    async def get(self, lease_key: str) -> Lease | None: ...

    @abc.abstractmethod
    async def execute(self, write: writes.LeaseWrite) -> Lease | None:
        """Perform one conditional write; the lease after it (None after a delete).

        Raises :class:`~shardflow.leases.errors.LeaseConditionFailedError` when a condition does not hold.
        """

    async def scan_table(self) -> TableScan:
        """The leases and shardflow's own items in one scan (a store that keeps only leases
        answers with its leases)."""
        return TableScan(await self.list_leases())

    async def execute_entity(self, write: writes.LeaseWrite) -> Item | None:
        """Perform one conditional write of a shardflow entity item (a heartbeat, the mode);
        the item after it (None after a delete). Raises
        :class:`~shardflow.leases.errors.EntityConditionFailedError` when a condition fails."""
        raise NotImplementedError(f"{type(self).__name__} keeps no heartbeats")

    async def _heartbeat(self, write: writes.LeaseWrite) -> Heartbeat:
        item = await self.execute_entity(write)
        found = entities.entity_from_item(item or {})
        if not isinstance(found, Heartbeat):
            raise EntityConditionFailedError(write.operation, write.lease_key, current=item)
        self._noticed(write)
        return found

    async def register_heartbeat(self, worker_id: str, current: Heartbeat | None) -> Heartbeat:
        """Start ``worker_id``'s heartbeat (see :func:`entities.register_heartbeat`)."""
        return await self._heartbeat(entities.register_heartbeat(worker_id, current))

    async def beat(self, heartbeat: Heartbeat) -> Heartbeat:
        """One heartbeat, conditional on ``heartbeat`` as last written and unfenced."""
        return await self._heartbeat(entities.beat(heartbeat))

    async def fence_heartbeat(self, heartbeat: Heartbeat, by: str) -> Heartbeat:
        """Fence a heartbeat judged expired (see :func:`entities.fence`)."""
        return await self._heartbeat(entities.fence(heartbeat, by))

    async def delete_heartbeat(self, heartbeat: Heartbeat) -> None:
        write = entities.delete_heartbeat(heartbeat)
        await self.execute_entity(write)
        self._noticed(write)

    async def set_lease_mode(self, mode: LeaseMode) -> None:
        """Store the application's lease mode; every worker follows it (``per-lease`` removes
        the mode item, leaving a table of leases only, as KCL 2.x workers need)."""
        if mode == "per-lease":
            await self.execute_entity(entities.clear_mode())
        else:
            await self.execute_entity(entities.set_mode(mode))
        self.saw_mode(None if mode == "per-lease" else mode)

    async def _lease(self, write: writes.LeaseWrite) -> Lease:
        result = await self.execute(write)
        if result is None:  # only deletes answer None
            raise AssertionError(f"{write.operation} returned no lease")
        self._noticed(write)
        return result

    async def create_if_absent(self, lease: Lease) -> Lease:
        """Write a new lease item (attribute_not_exists(leaseKey)), as KCL creates leases."""
        return await self._lease(writes.create(lease))

    async def renew(
        self, lease: Lease, owner: str, *, throughput_kbps: float | None = None
    ) -> Lease:
        """Bump the counter if ``owner`` still holds ``lease`` at ``lease.lease_counter``."""
        return await self._lease(writes.renew(lease, owner, throughput_kbps=throughput_kbps))

    async def take(self, lease: Lease, new_owner: str) -> Lease:
        """Become the owner of ``lease`` if it is unchanged since it was read."""
        return await self._lease(writes.take(lease, new_owner))

    async def release(
        self,
        lease: Lease,
        owner: str,
        *,
        final_checkpoint: ExtendedSequenceNumber | None = None,
        completed_state: bytes | None = None,
    ) -> Lease:
        """Free the lease (or, during a handoff, pass it to the next owner) at once; with
        ``final_checkpoint``, store that checkpoint in the same conditional write."""
        return await self._lease(
            writes.release(
                lease, owner, final_checkpoint=final_checkpoint, completed_state=completed_state
            )
        )

    async def checkpoint(
        self,
        lease: Lease,
        owner: str,
        position: ExtendedSequenceNumber,
        *,
        pending: ExtendedSequenceNumber | None = None,
        pending_state: bytes | None = None,
        clear_pending: bool = True,
        completed_state: bytes | None = None,
    ) -> Lease:
        """Record ``position`` (SHARD_END allowed) as processed by ``owner``, with the records
        handled beyond it (``shardflowCompleted``; None removes it)."""
        return await self._lease(
            writes.checkpoint(
                lease,
                owner,
                position,
                pending=pending,
                pending_state=pending_state,
                clear_pending=clear_pending,
                completed_state=completed_state,
            )
        )

    async def prepare_checkpoint(
        self,
        lease: Lease,
        owner: str,
        pending: ExtendedSequenceNumber,
        *,
        pending_state: bytes | None = None,
    ) -> Lease:
        """Store a prepared checkpoint (and optional application state) next to the checkpoint."""
        return await self._lease(
            writes.prepare_checkpoint(lease, owner, pending, pending_state=pending_state)
        )

    async def update_children(self, lease: Lease, child_shard_ids: Iterable[str]) -> Lease:
        """Record the child shards of an ended shard (non-empty)."""
        return await self._lease(writes.update_children(lease, child_shard_ids))

    async def update_hash_range(self, lease: Lease, hash_range: HashKeyRange) -> Lease:
        """Record the shard's hash-key range."""
        return await self._lease(writes.update_hash_range(lease, hash_range))

    async def delete(self, lease: Lease) -> None:
        """Delete the lease item if it still has the counter and owner of ``lease``."""
        write = writes.delete(lease)
        await self.execute(write)
        self._noticed(write)

    async def handoff(self, lease: Lease, from_owner: str, to_owner: str) -> Lease:
        """Begin a graceful handoff of a lease held by ``from_owner`` to ``to_owner``."""
        return await self._lease(writes.handoff(lease, from_owner, to_owner))

    async def redirect_handoff(self, lease: Lease, via: str, to_owner: str) -> Lease:
        """Pass a handoff under way to ``via`` (leaving too) on to ``to_owner``."""
        return await self._lease(writes.redirect_handoff(lease, via, to_owner))

    async def complete_handoff(self, lease: Lease, from_owner: str) -> Lease:
        """End a handoff begun by :meth:`handoff`: ``from_owner`` lets the lease go."""
        return await self._lease(writes.complete_handoff(lease, from_owner))

    async def request_handoff(self, lease: Lease, requester: str) -> Lease:
        """Ask the owner of ``lease`` to hand it to ``requester`` (see writes.request_handoff)."""
        return await self._lease(writes.request_handoff(lease, requester))

    async def decline_handoff(self, lease: Lease, owner: str) -> Lease:
        """Remove the handoff request seen on ``lease`` (see writes.decline_handoff)."""
        return await self._lease(writes.decline_handoff(lease, owner))

    async def mark_leaving(self, lease: Lease, owner: str) -> Lease:
        """Say on ``lease`` that its owner leaves (see writes.mark_leaving)."""
        return await self._lease(writes.mark_leaving(lease, owner))
