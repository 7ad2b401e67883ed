"""Diagnostic events of a consumer: what happened to leases, shards and fetches, as typed values.

Every event names the worker that saw it (``worker_id``) and carries the wall-clock time it
happened (``at``, epoch seconds); events about one shard also name its ``stream`` (the name
the consumer was given) and ``shard_id``. :data:`DiagnosticEvent` is their union: handle them
with ``match`` or ``isinstance``. Callbacks receiving them must be quick and must not raise
(exceptions are logged and dropped).

Observations flow one way, through one :class:`EventEmitter` per worker: the lease
coordinator emits LeaseAcquired, LeaseRenewed, HeartbeatBeat, LeaseLost, LeaseReleased,
ShardEnded, WorkerJoined and WorkerLeft; the fetchers FetchThrottled and SubscriptionRenewed; the
checkpointer CheckpointWritten; the consumer ShardStarted, ShardFailed and HandlerOverrun.
Subscribers (the consumer's metrics, the user's ``on_event``) receive every event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.records import ExtendedSequenceNumber

log = logging.getLogger("shardflow.events")

RenewalReason = Literal["renew_due", "closed", "silent", "failed", "interrupted"]
"""Why the fan-out subscription before a renewed one ended: it reached ``renew_after``; the
service ended its stream; no event came within ``event_timeout``; its stream failed
(connection lost, throttled...); a read of it was cancelled."""

AcquiredHow = Literal["free", "expired", "stolen", "resumed", "handoff"]
"""Why a lease could be taken: nobody held it, its holder stopped renewing, balancing, or it
already named this worker (a restart with the same worker id picks its leases up at once), or
its previous owner handed it to this worker (planned handoff)."""

LostWhy = Literal["taken", "expired", "deleted", "handoff"]
"""How a lease was lost: another worker wrote it, it could no longer be renewed in time, its
item disappeared, or a graceful handoff to another worker completed without us."""

ReleasedWhy = Literal["shutdown", "shard_done", "handoff", "requested"]

BeatOutcome = Literal["written", "failed", "refused"]
"""What became of a heartbeat beat: the table took it (every held lease it covers is extended);
no answer (leases are renewed one by one until a beat is written again); or the item had been
fenced or changed by a peer (nothing is extended, the heartbeat is registered again)."""

WriteReason = Literal["checkpoint", "flush", "count", "interval", "final", "shard_end"]
"""What made a checkpointer write: asked by user code (``checkpoint``, ``flush``), the
automatic triggers (``count``, ``interval``), the last write before a lease is let go
(``final``), or the end of the shard (``shard_end``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Event:
    worker_id: str
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class _ShardEvent(_Event):
    stream: str
    shard_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseAcquired(_ShardEvent):
    """This worker took a lease; ``previous_owner`` held it before (None: it was free)."""

    lease_key: str
    how: AcquiredHow
    previous_owner: str | None
    checkpoint: ExtendedSequenceNumber


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRenewed(_ShardEvent):
    """A held lease was renewed; ``duration`` is the seconds the write took."""

    lease_key: str
    counter: int
    duration: float


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatBeat(_Event):
    """This worker's heartbeat (the ``heartbeat`` lease mode) was beaten: one write for all
    its leases, in place of their renewals. ``late`` is how many seconds after it was due the
    beat was sent (one ``renew_interval`` after the previous beat was sent; 0 for the first),
    ``duration`` the seconds the write took, ``leases`` how many held leases it extended
    (0 while the heartbeat is not yet known to every peer, or on a beat not written)."""

    counter: int
    outcome: BeatOutcome
    late: float
    duration: float
    leases: int


@dataclass(frozen=True, slots=True)
class Lapse:
    """Why a held lease ran out here (``LeaseLost`` with why ``expired``), as the worker saw
    it at its deadline: the operator's first question is whether the lease table was slow
    or the worker never asked.

    ``since_write``: seconds since the last write of the lease that landed was sent (its
    deadline is that plus the usable time). ``in_flight``: a write of the lease (a renewal or
    a checkpoint) sent this many seconds before and still unanswered (None: none was).
    ``failed``: the last renewal's error, when it failed and no write landed after it."""

    since_write: float
    in_flight: float | None = None
    failed: str | None = None

    def __str__(self) -> str:
        parts = [f"last write that landed sent {self.since_write:.1f} s before"]
        if self.in_flight is not None:
            parts.append(f"a write unanswered for {self.in_flight:.1f} s")
        if self.failed is not None:
            parts.append(f"the last renewal failed: {self.failed}")
        if self.in_flight is None and self.failed is None:
            parts.append("no write in flight")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseLost(_ShardEvent):
    """A lease is no longer this worker's: stop processing the shard, do not checkpoint.

    ``lapse`` says what the worker saw when the lease ran out (why ``expired``; else None)."""

    lease_key: str
    why: LostWhy
    new_owner: str | None
    lapse: Lapse | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseReleased(_ShardEvent):
    """This worker gave a lease up on purpose; others may take it at once."""

    lease_key: str
    why: ReleasedWhy


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardStarted(_ShardEvent):
    """Processing of a shard began at ``position`` (a checkpoint or an initial position)."""

    position: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardEnded(_ShardEvent):
    """A shard was read to its end and checkpointed; leases for its children exist."""

    child_shard_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardFailed(_ShardEvent):
    """A shard stopped because of an error.

    ``parked``: a handler failure under ``on_error="stop-shard"``; the lease is kept and
    nothing more of the shard is delivered until a restart. Otherwise the error is one that
    retrying cannot fix (the stream deleted, access denied for too long): the lease was
    released and the consumer stops. ``error_type`` and ``message`` describe the error;
    ``error`` is the exception itself (not compared, not in the repr).
    """

    lease_key: str
    error_type: str
    message: str
    parked: bool
    error: BaseException | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerOverrun(_ShardEvent):
    """A handler call of the shard still runs ``waited`` seconds (``drain_timeout``) after this
    worker stopped handing out the shard's records (its lease lost, handed over or released,
    or the consumer stopping): a plain handler's thread, which cannot be interrupted
    (``async def`` handlers are cancelled).

    ``running``: such calls now. Until they return this process does not start the shard
    again, and a lease still held is not let go (a handoff completes only then), so that no
    other worker starts it meanwhile. A lease already lost is another worker's now: its
    handler may run at the same time as this one.
    """

    lease_key: str
    running: int
    waited: float
    lease_lost: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointWritten(_ShardEvent):
    """A checkpoint was stored for the shard: ``position``, after ``previous`` (None: none
    written before); ``records`` newly covered by it; ``lag``: records delivered but not
    covered, right after the write; ``duration``: seconds the write took."""

    position: ExtendedSequenceNumber
    records: int
    reason: WriteReason
    previous: ExtendedSequenceNumber | None = None
    lag: int = 0
    duration: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchThrottled(_ShardEvent):
    """Kinesis refused a read for exceeding a limit; the fetcher waits ``delay`` seconds.

    ``operation``: ``"GetRecords"`` (polling) or ``"SubscribeToShard"`` (enhanced fan-out).
    """

    operation: str
    delay: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionRenewed(_ShardEvent):
    """An enhanced fan-out subscription was opened again (they last at most 5 minutes); sent
    when the new subscription delivers its first event.

    ``consumer_name``: the registered stream consumer; ``position``: where the new
    subscription resumed reading; ``reason``: why the previous one was replaced (routinely
    ``"renew_due"``; see :data:`~shardflow.fetch.RenewalReason`).
    """

    consumer_name: str
    position: str | None
    reason: RenewalReason


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerJoined(_Event):
    """Another worker (``peer_id``) appeared in the lease table holding live leases."""

    peer_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerLeft(_Event):
    """A worker (``peer_id``) no longer holds any live lease (it stopped, crashed or released)."""

    peer_id: str


DiagnosticEvent = (
    LeaseAcquired
    | LeaseRenewed
    | HeartbeatBeat
    | LeaseLost
    | LeaseReleased
    | ShardStarted
    | ShardEnded
    | ShardFailed
    | HandlerOverrun
    | CheckpointWritten
    | FetchThrottled
    | SubscriptionRenewed
    | WorkerJoined
    | WorkerLeft
)
"""Every diagnostic event."""

EventCallback = Callable[[DiagnosticEvent], None]
"""Receives diagnostic events; must be quick and should not raise."""


# --- the channel --------------------------------------------------------------------------------

E = TypeVar("E", bound=_Event)


class EventEmitter:
    """The one channel of a worker's diagnostic events: components emit, subscribers receive.

    Bound to the worker: :meth:`emit` fills in ``worker_id`` and ``at`` (the clock's wall
    time), :meth:`for_shard` binds ``stream`` and ``shard_id`` as well. Subscribers are called
    in order, on the emitting task; one that raises is logged and the others still run. With
    no subscriber no event is built at all.
    """

    def __init__(
        self,
        worker_id: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        subscribers: Iterable[EventCallback | None] = (),
    ) -> None:
        self.worker_id = worker_id
        self._clock = clock
        self._subscribers = [callback for callback in subscribers if callback is not None]

    def subscribe(self, callback: EventCallback) -> None:
        """Hand every event emitted from now on to ``callback`` too."""
        self._subscribers.append(callback)

    def emit(self, kind: type[E], /, **fields: Any) -> None:
        """Build a ``kind`` event of this worker, now, from ``fields``, and hand it out."""
        if not self._subscribers:
            return
        event: Any = kind(worker_id=self.worker_id, at=self._clock.wall(), **fields)
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:
                log.exception("event subscriber failed on %s", kind.__name__)

    def for_shard(self, stream: str, shard_id: str) -> ShardEmitter:
        """This emitter, bound to one shard as well."""
        return ShardEmitter(self, stream, shard_id)


class ShardEmitter:
    """An :class:`EventEmitter` bound to one shard: :meth:`emit` adds ``stream`` and
    ``shard_id``."""

    __slots__ = ("_emitter", "shard_id", "stream")

    def __init__(self, emitter: EventEmitter, stream: str, shard_id: str) -> None:
        self._emitter = emitter
        self.stream = stream
        self.shard_id = shard_id

    def emit(self, kind: type[E], /, **fields: Any) -> None:
        """Build a ``kind`` event of this shard, now, from ``fields``, and hand it out."""
        self._emitter.emit(kind, stream=self.stream, shard_id=self.shard_id, **fields)


SILENT: Final = ShardEmitter(EventEmitter("", subscribers=()), "", "")
"""Emits nothing (for fetchers and checkpointers used outside a consumer)."""
