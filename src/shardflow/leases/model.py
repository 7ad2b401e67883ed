"""The lease: one shard's ownership and progress, as one item of the KCL lease table holds it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

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
    its encoded base equals :attr:`checkpoint` (see :mod:`shardflow.consumer.checkpointing.completed`).

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
