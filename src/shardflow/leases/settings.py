"""How the lease coordinator paces itself, and which streams it coordinates.

Defaults match KCL 2.x where a user would compare them (failover 10 s, renew every 3.308 s,
take cycle every 20.05 s, shard sync every 60 s, parent poll every 10 s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardflow.leases.keys import StreamIdentifier
from shardflow.positions import PositionKind, StartPosition

KCL_TIMING_SLACK = 0.025
"""The 25 ms KCL subtracts from (renew) or adds to (take) its intervals."""

PickupMode = Literal["auto", "stream", "poll", "off"]
"""How a worker learns of lease changes between take cycles (see :class:`LeaseSettings`)."""

_PICKUP_MODES = frozenset({"auto", "stream", "poll", "off"})

_INITIAL_KINDS = frozenset(
    {PositionKind.TRIM_HORIZON, PositionKind.LATEST, PositionKind.AT_TIMESTAMP}
)


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Timing and limits of lease coordination (seconds).

    Deploys and scaling: see the guide "Deploys and scaling" (``handoff``, ``pickup``).
    """

    failover_time: float = 10.0
    """A lease whose counter has not changed for this long, as another worker sees it, may be
    taken by that worker (KCL ``failoverTimeMillis``)."""
    renew_interval: float | None = None
    """How often held leases are renewed; None: failover/3 - 25 ms (KCL)."""
    take_interval: float | None = None
    """How often the table is scanned to take free, expired or surplus leases; None:
    (failover + 25 ms) * 2 (KCL 2.x). The first take happens at start, without waiting."""
    max_leases_per_worker: int | None = None
    """Never hold more leases than this (None: no limit)."""
    max_leases_to_steal_at_once: int = 1
    """Leases taken from a busier live worker per take cycle. With ``handoff`` (where a
    "steal" is a request answered by a graceful handoff): the requests open at once during a
    worker's first ``failover_time`` in a running fleet; after that up to
    ``renew_concurrency``."""
    shard_sync_interval: float = 60.0
    """How often shards are listed to create leases for new shards (by one worker of the
    fleet, the live worker with the lowest id; every other worker lists them every 10
    intervals, in case that one cannot)."""
    parent_poll_interval: float = 10.0
    """How often a child shard re-reads its parents' leases."""
    safety_margin: float | None = None
    """A lease is used only until this long before it could expire for another worker (covers
    clock-rate differences and the time it takes to stop); None: failover/10."""
    renew_concurrency: int = 32
    """Lease writes (renewals, takes, creations) in flight at once."""
    cleanup_finished_leases: bool = True
    """Delete a finished parent's lease once all its children started (as KCL does); the lease
    table then only holds shards with work left."""
    handoff: bool = True
    """Move leases by planned handoff (KCL 3.x ``checkpointOwner``): a leaving worker hands its
    leases to live peers, a joining worker asks busy workers for leases instead of stealing
    them, and the owner drains and checkpoints before the next owner starts. False: KCL 2.x
    behaviour (release at shutdown, steal to balance)."""
    handoff_timeout: float = 30.0
    """A handoff request not honoured after this long falls back to a steal (e.g. the owner is
    a KCL worker, which ignores requests). A handoff under way is never taken over on a
    timeout: its next owner waits for the old owner to complete it (once no handler call of
    the shard runs there) or for the lease to expire (the old owner stopped renewing it)."""
    successor_wait: float = 0.0
    """How long a leaving worker keeps its shards going while it has nobody to hand them to
    but was part of a fleet lately (every peer it knows is leaving too: a deploy that stops
    the old workers as the new ones start). It hands each lease over as soon as a live worker
    shows (asks for a lease, takes or renews one); what is still held after this long is
    released. A worker that was alone lately releases at once. 0 (the default): release at
    once; a whole fleet that is stopped for good would otherwise wait this long. Keep
    ``successor_wait + drain_timeout`` inside the platform's grace period (Kubernetes:
    ``terminationGracePeriodSeconds``)."""
    pickup: PickupMode = "auto"
    """How lease changes are noticed between take cycles (a released or handed-over lease
    picked up, a handoff request seen, an expired lease taken when it expires): ``"stream"``
    reads the lease table's DynamoDB stream (enabled at start if missing), ``"poll"`` scans
    the table every ``pickup_poll_interval``, ``"auto"`` uses the stream when the table has
    one and polls otherwise, ``"off"`` waits for take cycles (KCL)."""
    pickup_poll_interval: float = 0.25
    """Seconds between scans (``"poll"``) or stream reads (``"stream"``)."""

    def __post_init__(self) -> None:
        if self.pickup not in _PICKUP_MODES:
            raise ValueError(f"pickup must be one of {sorted(_PICKUP_MODES)}, got {self.pickup!r}")
        if self.successor_wait < 0:
            raise ValueError(f"successor_wait must not be negative, got {self.successor_wait}")
        for name in ("handoff_timeout", "pickup_poll_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.failover_time > 0:
            raise ValueError(f"failover_time must be positive, got {self.failover_time}")
        for name in ("renew_interval", "take_interval", "safety_margin"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        for name in ("shard_sync_interval", "parent_poll_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_leases_per_worker is not None and self.max_leases_per_worker < 1:
            raise ValueError(
                f"max_leases_per_worker must be >= 1, got {self.max_leases_per_worker}"
            )
        if self.max_leases_to_steal_at_once < 0:
            raise ValueError("max_leases_to_steal_at_once must not be negative")
        if self.renew_concurrency < 1:
            raise ValueError(f"renew_concurrency must be >= 1, got {self.renew_concurrency}")
        usable = self.failover_time - self.margin
        if usable <= 0:
            raise ValueError(
                f"safety_margin {self.margin}s leaves nothing of failover_time {self.failover_time}s"
            )
        if self.renew_every >= usable:
            # A lease would lapse between two renewals even when every renewal succeeds.
            raise ValueError(
                f"renew interval {self.renew_every}s must be shorter than failover_time minus "
                f"safety_margin ({usable}s)"
            )

    @property
    def renew_every(self) -> float:
        """The renew interval in effect."""
        if self.renew_interval is not None:
            return self.renew_interval
        return self.failover_time / 3 - KCL_TIMING_SLACK

    @property
    def take_every(self) -> float:
        """The take interval in effect."""
        if self.take_interval is not None:
            return self.take_interval
        return (self.failover_time + KCL_TIMING_SLACK) * 2

    @property
    def margin(self) -> float:
        """The safety margin in effect."""
        if self.safety_margin is not None:
            return self.safety_margin
        return self.failover_time / 10

    @property
    def usable_time(self) -> float:
        """How long after a successful renewal was sent the lease may still be used."""
        return self.failover_time - self.margin


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """A stream whose shards the coordinator leases."""

    name: str
    """The stream's name or ARN, as Kinesis calls take it."""
    identifier: StreamIdentifier | None = None
    """Its KCL multi-stream identifier (``account:name:creation-epoch``), which prefixes lease
    keys when the coordinator handles several streams; None: looked up with
    DescribeStreamSummary at start when needed."""
    initial_position: StartPosition | None = None
    """Overrides the coordinator's initial position for this stream."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a stream needs a name or ARN")
        if self.initial_position is not None:
            check_initial_position(self.initial_position)


def check_initial_position(position: StartPosition) -> StartPosition:
    """``position`` if it can start a new lease (TRIM_HORIZON, LATEST, AT_TIMESTAMP)."""
    if position.kind not in _INITIAL_KINDS:
        raise ValueError(
            f"an initial position must be TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {position}"
        )
    return position
