"""The lease: one shard's ownership and progress, as one item of the KCL lease table holds it.

:class:`Lease` <-> KCL lease table items (:func:`lease_from_item`, :func:`lease_to_item`).

LeaseTableSchema
----------------
The table is named after the application; its only key is ``leaseKey`` (S, HASH). One item per
shard, attributes as KCL 2.x and 3.x read and write them:

============================== ==== ==========================================================
attribute                      type meaning
============================== ==== ==========================================================
leaseKey                       S    shard id; multi-stream: ``account:stream:epoch:shardId``
leaseOwner                     S    worker holding the lease; absent = free (never ``""``)
leaseCounter                   N    bumped by every renew/take/checkpoint; writes condition on it
ownerSwitchesSinceCheckpoint   N    hand-overs since the last checkpoint
checkpoint                     S    sequence number or TRIM_HORIZON/LATEST/AT_TIMESTAMP/SHARD_END
checkpointSubSequenceNumber    N    sub-record index within an aggregated (KPL) record
pendingCheckpoint              S    prepared (two-phase) checkpoint, optional
pendingCheckpointSubSequenceNumber N sub-sequence of the prepared checkpoint
pendingCheckpointState         B    application bytes stored with the prepared checkpoint
parentShardId                  SS   parent shard ids (singular name, set value), optional
childShardIds                  SS   child shard ids, written at shard end, optional
startingHashKey, endingHashKey S    the shard's hash-key range (decimal), optional
throughputKBps                 N    (3.x) measured throughput of the lease, optional
checkpointOwner                S    (3.x) graceful handoff: worker that must checkpoint first
streamName, shardId            S    multi-stream only: stream identifier and shard id
shardflowCompleted             B    shardflow only: records handled beyond the checkpoint
============================== ==== ==========================================================

``shardflowCompleted`` holds :func:`~shardflow.consumer.checkpointing.completed.encode_completed` bytes whose
base is the checkpoint they were written with. KCL workers ignore it and keep it (their updates
name the attributes they change); a checkpoint by any worker that does not write it leaves a
state whose base no longer matches, which readers ignore. Earlier shardflow versions stored the
same bytes as a prepared checkpoint equal to the checkpoint (``pendingCheckpoint`` +
``pendingCheckpointState``), which a KCL worker would take for a real prepared checkpoint;
that form is still read (:attr:`Lease.completed_state_or_legacy`), no longer written.

KCL 2.5.8 refuses to start on an item without ``leaseCounter`` or
``ownerSwitchesSinceCheckpoint`` (or with them not N), and never processes a shard whose item
lacks ``checkpoint``: :func:`lease_to_item` always writes those, plus
``checkpointSubSequenceNumber`` as KCL does. KCL 3.5 may keep other entities in the same table
(``entityType`` other than ``LEASE``); they are not leases and :func:`is_lease_item` says so.
Any other attribute is kept in :attr:`Lease.extra` and written back only by
:func:`lease_to_item` (item creation): updates touch only the attributes they own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any, Final

from shardflow.errors import MalformedLeaseError
from shardflow.leases.keys import multi_stream_lease_key, split_multi_stream_lease_key
from shardflow.records import TRIM_HORIZON, ExtendedSequenceNumber
from shardflow.shards import HashKeyRange

AttributeValue = dict[str, Any]
"""One DynamoDB attribute value in wire form: ``{"S": "..."}``, ``{"N": "3"}``, ``{"SS": [...]}``."""

Item = dict[str, AttributeValue]
"""One DynamoDB item in wire form."""

_EMPTY: Mapping[str, AttributeValue] = MappingProxyType({})
_START: Final = ExtendedSequenceNumber(TRIM_HORIZON)


@dataclass(frozen=True, slots=True)
class Lease:
    """A snapshot of one lease item; stores return a new one after every write.

    ``lease_owner`` None means the lease is free (the item has no ``leaseOwner``). During a KCL
    3.x graceful handoff ``lease_owner`` is already the next owner while ``checkpoint_owner``
    is the worker that still processes the shard until it checkpoints: :attr:`actual_owner`.

    ``stream_name`` is set only for multi-stream leases: KCL stores the serialized stream
    identifier ``account:stream:epoch`` in the attribute ``streamName``. ``shard_id`` is always
    the shard's id (for single-stream leases, the lease key).

    ``completed_state`` (attribute ``shardflowCompleted``, shardflow's own) lists records
    handled beyond the checkpoint, for a restart or the next owner to skip; it counts only while
    its encoded base equals :attr:`checkpoint` (see :mod:`shardflow.read.completed`).

    ``extra`` holds the item's other attributes, as DynamoDB values, untouched: stores write
    only the attributes an operation owns, so what newer KCL versions add survives.
    """

    lease_key: str
    lease_owner: str | None = None
    lease_counter: int = 0
    owner_switches_since_checkpoint: int = 0
    checkpoint: ExtendedSequenceNumber = _START
    pending_checkpoint: ExtendedSequenceNumber | None = None
    pending_checkpoint_state: bytes | None = None
    completed_state: bytes | None = None
    parent_shard_ids: frozenset[str] = frozenset()
    child_shard_ids: frozenset[str] = frozenset()
    hash_range: HashKeyRange | None = None
    checkpoint_owner: str | None = None
    throughput_kbps: float | None = None
    stream_name: str | None = None
    shard_id: str = ""
    extra: Mapping[str, AttributeValue] = field(default_factory=lambda: _EMPTY, hash=False)

    def __post_init__(self) -> None:
        if not self.lease_key:
            raise ValueError("lease_key must not be empty")
        if self.lease_counter < 0 or self.owner_switches_since_checkpoint < 0:
            raise ValueError("lease counters must not be negative")
        if self.throughput_kbps is not None:
            if not (math.isfinite(self.throughput_kbps) and 0 <= self.throughput_kbps < 1e15):
                raise ValueError(f"throughput_kbps out of range: {self.throughput_kbps}")
            # Kept as stored: to the thousandth of a KB/s (DynamoDB numbers have 38 digits).
            object.__setattr__(self, "throughput_kbps", round(self.throughput_kbps, 3))
        # Sets arrive as lists or sets from callers; keep them immutable and hashable.
        object.__setattr__(self, "parent_shard_ids", frozenset(self.parent_shard_ids))
        object.__setattr__(self, "child_shard_ids", frozenset(self.child_shard_ids))
        if not isinstance(self.extra, MappingProxyType):
            object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        if not self.shard_id:
            shard_id = self.lease_key
            if self.stream_name is not None:
                shard_id = split_multi_stream_lease_key(self.lease_key)[1]
            object.__setattr__(self, "shard_id", shard_id)

    @classmethod
    def new(
        cls,
        shard_id: str,
        *,
        stream: str | None = None,
        parent_shard_ids: Iterable[str] = (),
        hash_range: HashKeyRange | None = None,
        checkpoint: ExtendedSequenceNumber | str = TRIM_HORIZON,
    ) -> Lease:
        """A fresh, free lease for a shard, as KCL creates it (counter 0, no owner).

        ``stream`` (a serialized stream identifier ``account:stream:epoch``) makes it a
        multi-stream lease keyed ``<stream>:<shard id>``.
        """
        position = (
            checkpoint
            if isinstance(checkpoint, ExtendedSequenceNumber)
            else ExtendedSequenceNumber(checkpoint)
        )
        key = shard_id if stream is None else multi_stream_lease_key(stream, shard_id)
        return cls(
            lease_key=key,
            checkpoint=position,
            parent_shard_ids=frozenset(parent_shard_ids),
            hash_range=hash_range,
            stream_name=stream,
            shard_id=shard_id,
        )

    @property
    def completed_state_or_legacy(self) -> bytes | None:
        """The completed-record state: ``shardflowCompleted``, else the form earlier shardflow
        versions wrote (a prepared checkpoint equal to the checkpoint, the state as its bytes)."""
        if self.completed_state is not None:
            return self.completed_state
        if self.pending_checkpoint is not None and self.pending_checkpoint == self.checkpoint:
            return self.pending_checkpoint_state
        return None

    @property
    def actual_owner(self) -> str | None:
        """Who processes the shard now: the checkpoint owner during a handoff, else the owner."""
        return self.checkpoint_owner if self.checkpoint_owner is not None else self.lease_owner

    @property
    def is_free(self) -> bool:
        """No worker holds the lease."""
        return self.lease_owner is None

    @property
    def handoff_pending(self) -> bool:
        """A graceful handoff has begun: the checkpoint owner must checkpoint and let go."""
        return self.checkpoint_owner is not None

    @property
    def is_multi_stream(self) -> bool:
        return self.stream_name is not None

    def held_by(self, worker_id: str) -> bool:
        """Whether ``worker_id`` is the one processing the shard (see :attr:`actual_owner`)."""
        return self.actual_owner == worker_id


LEASE_KEY: Final = "leaseKey"
LEASE_OWNER: Final = "leaseOwner"
LEASE_COUNTER: Final = "leaseCounter"
OWNER_SWITCHES: Final = "ownerSwitchesSinceCheckpoint"
CHECKPOINT: Final = "checkpoint"
CHECKPOINT_SUB: Final = "checkpointSubSequenceNumber"
PENDING_CHECKPOINT: Final = "pendingCheckpoint"
PENDING_CHECKPOINT_SUB: Final = "pendingCheckpointSubSequenceNumber"
PENDING_CHECKPOINT_STATE: Final = "pendingCheckpointState"
PARENT_SHARD_IDS: Final = "parentShardId"
CHILD_SHARD_IDS: Final = "childShardIds"
STARTING_HASH_KEY: Final = "startingHashKey"
ENDING_HASH_KEY: Final = "endingHashKey"
THROUGHPUT_KBPS: Final = "throughputKBps"
CHECKPOINT_OWNER: Final = "checkpointOwner"
STREAM_NAME: Final = "streamName"
SHARD_ID: Final = "shardId"
SHARDFLOW_COMPLETED: Final = "shardflowCompleted"
ENTITY_TYPE: Final = "entityType"
LEASE_ENTITY: Final = "LEASE"

KNOWN_ATTRIBUTES: Final = frozenset(
    {
        LEASE_KEY,
        LEASE_OWNER,
        LEASE_COUNTER,
        OWNER_SWITCHES,
        CHECKPOINT,
        CHECKPOINT_SUB,
        PENDING_CHECKPOINT,
        PENDING_CHECKPOINT_SUB,
        PENDING_CHECKPOINT_STATE,
        PARENT_SHARD_IDS,
        CHILD_SHARD_IDS,
        STARTING_HASH_KEY,
        ENDING_HASH_KEY,
        THROUGHPUT_KBPS,
        CHECKPOINT_OWNER,
        STREAM_NAME,
        SHARD_ID,
        SHARDFLOW_COMPLETED,
    }
)
"""Attributes :class:`Lease` models; every other one lands in :attr:`Lease.extra`."""

ATTRIBUTE_TYPES: Final[Mapping[str, str]] = {
    LEASE_KEY: "S",
    LEASE_OWNER: "S",
    LEASE_COUNTER: "N",
    OWNER_SWITCHES: "N",
    CHECKPOINT: "S",
    CHECKPOINT_SUB: "N",
    PENDING_CHECKPOINT: "S",
    PENDING_CHECKPOINT_SUB: "N",
    PENDING_CHECKPOINT_STATE: "B",
    PARENT_SHARD_IDS: "SS",
    CHILD_SHARD_IDS: "SS",
    STARTING_HASH_KEY: "S",
    ENDING_HASH_KEY: "S",
    THROUGHPUT_KBPS: "N",
    CHECKPOINT_OWNER: "S",
    STREAM_NAME: "S",
    SHARD_ID: "S",
    SHARDFLOW_COMPLETED: "B",
}
"""The DynamoDB type of every attribute in the schema above."""


# --- single values -----------------------------------------------------------------------------


def s(value: str) -> AttributeValue:
    return {"S": value}


def n(value: int | float) -> AttributeValue:
    if isinstance(value, int):
        return {"N": str(value)}
    if not math.isfinite(value):
        raise ValueError(f"DynamoDB numbers must be finite, got {value}")
    # Rates are kept to 1/1000 (DynamoDB numbers have at most 38 significant digits); repr
    # round-trips a float exactly and format "f" writes it without an exponent.
    return {"N": format(Decimal(repr(round(value, 3))), "f")}


def ss(values: Iterable[str]) -> AttributeValue:
    ordered = sorted(set(values))
    if not ordered:
        raise ValueError("DynamoDB string sets must not be empty")
    return {"SS": ordered}


def b(value: bytes) -> AttributeValue:
    return {"B": bytes(value)}


def _get(item: Mapping[str, AttributeValue], name: str, kind: str) -> Any:
    """The ``kind`` value of attribute ``name``; None if absent; MalformedLeaseError if mistyped."""
    value = item.get(name)
    if value is None or "NULL" in value:
        return None
    if kind not in value:
        key = item.get(LEASE_KEY, {}).get("S", "?")
        found = ", ".join(value) or "nothing"
        raise MalformedLeaseError(key, f"{name} must be of type {kind}, found {found}")
    return value[kind]


def _int(item: Mapping[str, AttributeValue], name: str, *, default: int | None) -> int:
    raw = _get(item, name, "N")
    key = item.get(LEASE_KEY, {}).get("S", "?")
    if raw is None:
        if default is None:
            raise MalformedLeaseError(key, f"{name} (N) is missing")
        return default
    try:
        number = Decimal(raw)
    except InvalidOperation:
        raise MalformedLeaseError(key, f"{name} is not a number: {raw!r}") from None
    if number != number.to_integral_value():
        raise MalformedLeaseError(key, f"{name} is not an integer: {raw!r}")
    return int(number)


# --- items --------------------------------------------------------------------------------------


def is_lease_item(item: Mapping[str, AttributeValue]) -> bool:
    """False for the non-lease entities KCL 3.5 may keep in the lease table (``entityType``)."""
    entity = item.get(ENTITY_TYPE)
    return entity is None or entity.get("S") in (None, LEASE_ENTITY)


class ParsedItem(dict[str, AttributeValue]):
    """A lease item that carries the lease parsed from it, for a store that never changes its
    items in place (the in-memory table): :func:`lease_from_item` returns that lease rather
    than parsing the item again (a simulated fleet reads each write once per worker)."""

    __slots__ = ("lease",)

    def __init__(self, item: Mapping[str, AttributeValue], lease: Lease) -> None:
        super().__init__(item)
        self.lease = lease


def lease_from_item(item: Mapping[str, AttributeValue]) -> Lease:
    """The lease an item describes. Raises :class:`MalformedLeaseError` where KCL would fail.

    Required: ``leaseKey`` (S), ``leaseCounter`` (N), ``ownerSwitchesSinceCheckpoint`` (N) and
    ``checkpoint`` (S). ``checkpointSubSequenceNumber`` defaults to 0 as in KCL.
    """
    if type(item) is ParsedItem:
        return item.lease
    key = _get(item, LEASE_KEY, "S")
    if not key:
        raise MalformedLeaseError("?", f"{LEASE_KEY} (S) is missing")
    if not is_lease_item(item):
        raise MalformedLeaseError(
            key, f"item is a {item[ENTITY_TYPE].get('S')} entity, not a lease"
        )
    checkpoint = _get(item, CHECKPOINT, "S")
    if not checkpoint:
        raise MalformedLeaseError(key, f"{CHECKPOINT} (S) is missing")
    pending = _get(item, PENDING_CHECKPOINT, "S")
    state = item.get(PENDING_CHECKPOINT_STATE, {}).get("B")
    start, end = _get(item, STARTING_HASH_KEY, "S"), _get(item, ENDING_HASH_KEY, "S")
    throughput = _get(item, THROUGHPUT_KBPS, "N")
    extra = {name: value for name, value in item.items() if name not in KNOWN_ATTRIBUTES}
    if PENDING_CHECKPOINT_STATE in item and state is None:
        # KCL's own item builder once stored a number here; keep it as an unknown attribute.
        extra[PENDING_CHECKPOINT_STATE] = item[PENDING_CHECKPOINT_STATE]
    completed = item.get(SHARDFLOW_COMPLETED, {}).get("B")
    if SHARDFLOW_COMPLETED in item and completed is None:
        # Not ours to judge: kept untouched, and no records are skipped because of it.
        extra[SHARDFLOW_COMPLETED] = item[SHARDFLOW_COMPLETED]
    try:
        hash_range = HashKeyRange(int(start), int(end)) if start and end else None
        return Lease(
            lease_key=key,
            lease_owner=_get(item, LEASE_OWNER, "S"),
            lease_counter=_int(item, LEASE_COUNTER, default=None),
            owner_switches_since_checkpoint=_int(item, OWNER_SWITCHES, default=None),
            checkpoint=ExtendedSequenceNumber(checkpoint, _int(item, CHECKPOINT_SUB, default=0)),
            pending_checkpoint=(
                ExtendedSequenceNumber(pending, _int(item, PENDING_CHECKPOINT_SUB, default=0))
                if pending
                else None
            ),
            pending_checkpoint_state=bytes(state) if state is not None else None,
            completed_state=bytes(completed) if completed is not None else None,
            parent_shard_ids=frozenset(_get(item, PARENT_SHARD_IDS, "SS") or ()),
            child_shard_ids=frozenset(_get(item, CHILD_SHARD_IDS, "SS") or ()),
            hash_range=hash_range,
            checkpoint_owner=_get(item, CHECKPOINT_OWNER, "S"),
            throughput_kbps=float(throughput) if throughput is not None else None,
            stream_name=_get(item, STREAM_NAME, "S"),
            shard_id=_get(item, SHARD_ID, "S") or "",
            extra=extra,
        )
    except ValueError as exc:
        raise MalformedLeaseError(key, str(exc)) from None


def lease_to_item(lease: Lease) -> Item:
    """The whole item for ``lease``, as KCL writes a new lease (PutItem), extras included."""
    item: Item = {name: dict(value) for name, value in lease.extra.items()}
    item.update(
        {
            LEASE_KEY: s(lease.lease_key),
            LEASE_COUNTER: n(lease.lease_counter),
            OWNER_SWITCHES: n(lease.owner_switches_since_checkpoint),
            CHECKPOINT: s(lease.checkpoint.sequence_number),
            CHECKPOINT_SUB: n(lease.checkpoint.sub_sequence_number),
        }
    )
    if lease.lease_owner is not None:
        item[LEASE_OWNER] = s(lease.lease_owner)
    if lease.pending_checkpoint is not None:
        item[PENDING_CHECKPOINT] = s(lease.pending_checkpoint.sequence_number)
        item[PENDING_CHECKPOINT_SUB] = n(lease.pending_checkpoint.sub_sequence_number)
    if lease.pending_checkpoint_state is not None:
        item[PENDING_CHECKPOINT_STATE] = b(lease.pending_checkpoint_state)
    if lease.completed_state is not None:
        item[SHARDFLOW_COMPLETED] = b(lease.completed_state)
    if lease.parent_shard_ids:
        item[PARENT_SHARD_IDS] = ss(lease.parent_shard_ids)
    if lease.child_shard_ids:
        item[CHILD_SHARD_IDS] = ss(lease.child_shard_ids)
    if lease.hash_range is not None:
        item.update(hash_range_attributes(lease.hash_range))
    if lease.throughput_kbps is not None:
        item[THROUGHPUT_KBPS] = n(lease.throughput_kbps)
    if lease.checkpoint_owner is not None:
        item[CHECKPOINT_OWNER] = s(lease.checkpoint_owner)
    if lease.stream_name is not None:
        item[STREAM_NAME] = s(lease.stream_name)
        item[SHARD_ID] = s(lease.shard_id)
    return item


def hash_range_attributes(hash_range: HashKeyRange) -> Item:
    return {STARTING_HASH_KEY: s(str(hash_range.start)), ENDING_HASH_KEY: s(str(hash_range.end))}


def key_of(lease_key: str) -> Item:
    """The primary key of a lease item."""
    return {LEASE_KEY: s(lease_key)}
