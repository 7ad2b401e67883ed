"""A snapshot of what a consumer is doing, shard by shard (for tools, tests and health checks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shardflow.consumer.checkpointing.acks import PendingCounts
from shardflow.records import ExtendedSequenceNumber


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One shard being processed by this worker."""

    stream: str
    shard_id: str
    lease_key: str
    checkpoint: ExtendedSequenceNumber | None
    """The checkpoint last written (or found when the lease was taken)."""
    pending: PendingCounts
    """Delivered / unacknowledged / acknowledged-not-checkpointed / checkpointed records."""
    millis_behind_latest: int | None
    caught_up: bool
    """Nothing more to read right now and every delivered record handled."""
    error: BaseException | None = None
    unrenewed_for: float | None = None
    """Seconds since the lease was last renewed (or taken)."""
    idle_for: float | None = None
    """Seconds since this worker last saw a record of the shard handled (as of the last status
    asked for: a lower bound)."""


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    """Every shard this worker processes now, and the shards stopped by an error."""

    worker_id: str
    shards: tuple[ShardStatus, ...]
    parked: Mapping[str, BaseException] = field(default_factory=dict)
    """Lease keys of shards stopped by a handler failure (``on_error="stop-shard"``; their
    leases are kept), with the error."""
    failed: Mapping[str, BaseException] = field(default_factory=dict)
    """Lease keys of shards stopped by an error retrying cannot fix (the stream deleted, access
    denied for too long), with the error; their leases were released and the consumer stops."""
    overrunning: Mapping[str, int] = field(default_factory=dict)
    """Lease keys of shards whose handler calls (plain handlers' threads) still run
    ``drain_timeout`` after the shard stopped here, with how many: the shard is not started
    again here, nor its lease let go, until they return (see
    :class:`~shardflow.events.HandlerOverrun`)."""
    fleet_mode: str = "standalone"
    """How this worker shares the lease table: "standalone" (shardflow's own rules, also with
    KCL 2.x workers), "kcl3" (a KCL 3.x leader assigns leases; this worker defers) or
    "kcl3-takeover" (a KCL 3.x application whose KCL workers are all gone)."""
    lease_mode: str = "per-lease"
    """How this worker keeps its leases now: "per-lease" (each renewed on its own) or
    "heartbeat" (one heartbeat item keeps them all; the application's lease mode, see the
    guide "Deploys and scaling")."""

    @property
    def caught_up(self) -> bool:
        """Every shard processed here is caught up (True when there are none)."""
        return all(shard.caught_up for shard in self.shards)
