"""A lease this worker holds: renewing it, checkpointing through it, letting it go.

One :class:`OwnedLease` is shared by the coordinator (which renews it) and the shard's
checkpointer (which writes through :attr:`OwnedLease.writer`). Every write to the lease goes
through its lock, one at a time, conditional on the counter last written, and updates
:attr:`OwnedLease.lease` in place.

The deadline is what keeps two workers from processing one shard at once after a failure:
another worker takes the lease only when its counter has not changed for ``failover_time``
since *that* worker saw it, which is after our last successful write was sent. So this worker
may use the lease until ``send time of the last successful write + failover_time -
safety_margin`` and not a moment longer, whatever its own renewals are doing; past it
:meth:`OwnedLease.valid` is False, ``lost`` is set and the writer refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Literal

from shardflow.clock import Clock
from shardflow.errors import AwsError, ShardLeaseLostError
from shardflow.events import Lapse, LostWhy, ReleasedWhy
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.leases.model import Lease
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.store import LeaseStore
from shardflow.records import ExtendedSequenceNumber
from shardflow.shards import HashKeyRange

log = logging.getLogger("shardflow.leases")

RenewOutcome = Literal["renewed", "failed", "lost", "handoff", "gone"]
"""What a renewal attempt did: renewed; failed for now (retried next round); lost the lease;
found a graceful handoff away from this worker begun (keeps renewing, ``giving_up`` set);
the lease had already ended here."""


class OwnedLease:
    """A lease this worker holds; shared by the renewer and the shard's checkpointer.

    Create through :class:`~shardflow.leases.coordinator.LeaseCoordinator` (it takes leases);
    ``acquired_at`` is the monotonic time the successful take was sent.
    """

    def __init__(
        self,
        lease: Lease,
        *,
        stream: str,
        store: LeaseStore,
        worker_id: str,
        settings: LeaseSettings,
        clock: Clock,
        acquired_at: float,
        on_end: Callable[[OwnedLease], None] | None = None,
    ) -> None:
        self._lease = lease
        self.stream = stream
        """The stream's name (or ARN) as the consumer was given it: what fetchers call."""
        self._store = store
        self._worker_id = worker_id
        self._settings = settings
        self._clock = clock
        self._deadline = acquired_at + settings.usable_time
        self._on_end = on_end
        self._lock = asyncio.Lock()
        self._bounds: dict[asyncio.Timeout, None] = {}
        # (an ordered set: bounds moved together are rescheduled in the order they began, so
        # timers of equal deadline fire in the same order in every run of bench/simulate.py)
        self._in_doubt: ExtendedSequenceNumber | None = None
        self._landed_sent = acquired_at
        """When the last write that landed was sent (the take, at first)."""
        self._writing_since: float | None = None
        self._renewal_failed: str | None = None
        self._lapsed = False
        """Seen past its deadline (see :meth:`valid`)."""
        self.lapse: Lapse | None = None
        """What this worker saw when the lease ran out here (set with ``ended_why`` expired)."""
        self.lost = asyncio.Event()
        """Set once the lease is no longer this worker's (lost, expired, or released)."""
        self.giving_up = asyncio.Event()
        """Set when the coordinator wants the shard let go: checkpoint, then release."""
        self.ended_why: LostWhy | ReleasedWhy | None = None
        self.released = False
        """True when the lease ended by :meth:`release` (not lost)."""
        self.new_owner: str | None = None
        """Who holds the lease after it was lost, when known."""
        self.left_to_expire = False
        """Ended by :meth:`let_expire`: this worker must not claim it again nor release it."""
        self.writer = LeaseCheckpointWriter(self)
        """The shard's :class:`~shardflow.consumer.checkpointing.checkpoint.CheckpointWriter`."""

    # --- what it is ---------------------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The lease as this worker last wrote or read it."""
        return self._lease

    @property
    def lease_key(self) -> str:
        return self._lease.lease_key

    @property
    def shard_id(self) -> str:
        return self._lease.shard_id

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def checkpoint(self) -> ExtendedSequenceNumber:
        """The stored checkpoint, as of acquisition or this worker's last write."""
        return self._lease.checkpoint

    @property
    def completed_state(self) -> bytes | None:
        """Records handled beyond the checkpoint, as the writer stored them (None: none).

        Stored in ``shardflowCompleted``; the prepared-checkpoint form of earlier versions is
        still read (see :attr:`Lease.completed_state_or_legacy`).
        """
        return self._lease.completed_state_or_legacy

    @property
    def parent_shard_ids(self) -> frozenset[str]:
        return self._lease.parent_shard_ids

    @property
    def hash_range(self) -> HashKeyRange | None:
        return self._lease.hash_range

    @property
    def deadline(self) -> float:
        """Monotonic time after which the lease must not be used (see the module docstring)."""
        return self._deadline

    @property
    def ended(self) -> bool:
        return self.ended_why is not None

    def valid(self) -> bool:
        """Whether the shard may still be processed: held, and the deadline not passed.

        Seen past its deadline, the lease is lost for good (``expired``): a write in flight
        that lands later would move the deadline back into the future, and whoever stopped
        using the lease at the deadline must not find it valid again. Safe from any thread
        (a handler thread asks before its call): off the event loop it only latches, and the
        renewer marks the lease lost on the loop."""
        if self.ended:
            return False
        if not self._lapsed:
            if self._clock.monotonic() < self._deadline:
                return True
            self._lapsed = True
        if _on_event_loop():
            self.mark_lost("expired")
        return False

    def remaining(self) -> float:
        """Seconds left before the deadline (<= 0: past it)."""
        return self._deadline - self._clock.monotonic()

    def ensure_valid(self) -> None:
        """Raise :class:`ShardLeaseLostError` unless :meth:`valid`."""
        if self.ended:
            raise ShardLeaseLostError(self.shard_id, owner=self.new_owner)
        if not self.valid():
            self.mark_lost("expired")
            raise ShardLeaseLostError(self.shard_id)

    def __repr__(self) -> str:
        state = self.ended_why or f"valid for {self.remaining():.1f}s"
        return f"OwnedLease({self.lease_key!r}, counter={self._lease.lease_counter}, {state})"

    # --- writes -------------------------------------------------------------------------------

    async def renew(self) -> RenewOutcome:
        """Renew once; never raises for AWS failures (a failed renewal is retried next round).

        The lease is lost when the write finds it changed by someone else, or when its
        deadline passes first (the wait for the lock and the write are bounded by it).
        """
        if self.ended:
            return "gone"
        if self.remaining() <= 0:
            self.mark_lost("expired")
            return "lost"
        try:
            async with self._until_deadline(), self._lock:
                if self.ended:
                    return "gone"
                sent = self._clock.monotonic()
                known = self._lease
                try:
                    renewed = await self._attempt(
                        lambda lease: self._store.renew(lease, self._worker_id),
                        lands_as=known.checkpoint,
                    )
                except LeaseConditionFailedError as exc:
                    return self._after_conflict(exc)
                self._confirm(renewed, sent)
                return "renewed"
        except TimeoutError:
            if self.remaining() > 0:  # the deadline moved just as the bound fired
                return "failed"
            self.mark_lost("expired")
            return "lost"
        except AwsError as exc:
            log.warning("renewing lease %s failed, retried next round: %s", self.lease_key, exc)
            self._renewal_failed = type(exc).__name__
            if self.remaining() <= 0:
                self.mark_lost("expired")
                return "lost"
            return "failed"

    async def write_checkpoint(
        self,
        position: ExtendedSequenceNumber,
        *,
        completed_state: bytes | None = None,
        final: bool = False,
    ) -> None:
        """Store ``position`` (and optionally the completed-record state) as the checkpoint.

        ``final`` marks the shard's last checkpoint before it is let go. During a handoff from
        this worker that write also hands the lease over (see :meth:`_hand_over`).

        Raises :class:`ShardLeaseLostError` if the lease is lost or past its deadline, before or
        during the write.
        """
        self.ensure_valid()
        if final and self._lease.checkpoint_owner == self._worker_id:
            await self._hand_over(position, completed_state)
            return

        def write(lease: Lease) -> Awaitable[Lease]:
            # The prepared checkpoint (of earlier versions' completed state) is cleared.
            return self._store.checkpoint(
                lease, self._worker_id, position, completed_state=completed_state
            )

        try:
            async with self._until_deadline(), self._lock:
                self.ensure_valid()
                sent = self._clock.monotonic()
                self._confirm(await self._conditional(write, lands_as=position), sent)
        except TimeoutError:
            self.mark_lost("expired")
            raise ShardLeaseLostError(self.shard_id) from None
        except LeaseConditionFailedError as exc:
            self.mark_lost("taken", exc.current_owner)
            raise exc.as_lease_lost() from exc

    async def _hand_over(
        self, position: ExtendedSequenceNumber, completed_state: bytes | None
    ) -> None:
        """The last checkpoint of a handoff and the handover itself in one conditional write.

        The next owner starts from exactly the checkpoint this write stores; there is no
        window between "checkpointed" and "handed over" in which a crash leaves the lease
        waiting for the handoff timeout.
        """

        def write(lease: Lease) -> Awaitable[Lease]:
            return self._store.release(
                lease, self._worker_id, final_checkpoint=position, completed_state=completed_state
            )

        try:
            async with self._until_deadline(), self._lock:
                self.ensure_valid()
                sent = self._clock.monotonic()
                handed = await self._conditional(write, lands_as=position)
                took = self._clock.monotonic() - sent
        except TimeoutError:
            self.mark_lost("expired")
            raise ShardLeaseLostError(self.shard_id) from None
        except LeaseConditionFailedError as exc:
            self.mark_lost("taken", exc.current_owner)
            raise exc.as_lease_lost() from exc
        self._lease = handed
        # With the write's own time, as a claim logs it: drain and table told apart.
        log.info(
            "lease %s handed over to %s at checkpoint %s (write %.3f s)",
            self.lease_key,
            handed.lease_owner,
            position,
            took,
        )
        self._end("handoff", released=True)

    async def release(self, why: ReleasedWhy = "requested") -> bool:
        """Let the lease go so that another worker may take it at once; True if released.

        During a graceful handoff this passes the lease to its next owner. When the lease was
        already lost (or the write finds it changed) nothing is written. A failed write leaves
        the lease to expire; either way this worker stops using it.
        """
        async with self._lock:
            if self.ended:
                return False
            try:
                released = await self._conditional(
                    lambda lease: self._store.release(lease, self._worker_id),
                    lands_as=self._lease.checkpoint,
                )
            except LeaseConditionFailedError as exc:
                self.mark_lost("taken", exc.current_owner)
                return False
            except AwsError as exc:
                log.warning("releasing lease %s failed; it will expire: %s", self.lease_key, exc)
                self._end(why, released=True)
                return False
            self._lease = released
            if why == "handoff":
                log.info("lease %s handed over to %s", self.lease_key, released.lease_owner)
            self._end(why, released=True)
            return True

    async def begin_handoff(self, to_worker: str) -> bool:
        """Start a planned handoff of this lease to ``to_worker``; True if it began.

        One conditional write makes ``to_worker`` the lease owner and this worker the
        checkpoint owner (KCL 3.x ``checkpointOwner``): this worker keeps renewing and must
        now stop, checkpoint and :meth:`release`, which completes the handoff; the next owner
        starts only then. Sets ``giving_up``. Not begun on a lease past its deadline, and
        abandoned when the write outlives it (a landed write shows on the next renewal).
        """
        try:
            async with self._until_deadline(), self._lock:
                if (
                    self.ended
                    or not self.valid()
                    or self.giving_up.is_set()
                    or self._lease.handoff_pending
                ):
                    return False
                try:
                    lease = await self._store.handoff(self._lease, self._worker_id, to_worker)
                except LeaseConditionFailedError as exc:
                    self._after_conflict(exc)
                    return False
                self._lease = lease
                self.giving_up.set()
        except (AwsError, TimeoutError) as exc:
            log.warning("handing lease %s to %s failed: %r", self.lease_key, to_worker, exc)
            return False
        log.info("handing lease %s over to %s", self.lease_key, to_worker)
        return True

    async def record_children(self, child_shard_ids: Iterable[str]) -> None:
        """Record the child shards of this ended shard on its lease (KCL ``childShardIds``).

        Not conditional on the counter (as KCL), so it works even after the lease was lost.
        """
        children = frozenset(child_shard_ids)
        if not children:
            return
        async with self._lock:
            updated = await self._store.update_children(self._lease, children)
            if updated.lease_counter == self._lease.lease_counter:
                self._lease = updated

    # --- state changes (used by the coordinator) ----------------------------------------------

    def mark_lost(self, why: LostWhy, new_owner: str | None = None) -> None:
        """The lease is no longer ours: set ``lost`` and tell the coordinator (idempotent)."""
        if self.ended:
            return
        self.new_owner = new_owner
        if why == "expired":
            self.lapse = self._lapse()
            log.warning("lease %s lost (expired): %s", self.lease_key, self.lapse)
        else:
            log.warning(
                "lease %s lost (%s)%s", self.lease_key, why, f" to {new_owner}" if new_owner else ""
            )
        self._end(why, released=False)

    def _lapse(self) -> Lapse:
        now = self._clock.monotonic()
        writing = self._writing_since
        return Lapse(
            since_write=round(now - self._landed_sent, 3),
            in_flight=None if writing is None else round(now - writing, 3),
            failed=self._renewal_failed,
        )

    def let_expire(self) -> None:
        """Stop using the lease without letting it go: nothing is written and renewals stop,
        so others take it only once it expired (``failover_time`` after this worker's last
        write as they saw it; a handoff under way is then taken over). For a shard whose
        handler still runs when the consumer stops: released or handed over, the lease would
        let another worker start the shard at once."""
        if self.ended:
            return
        self.left_to_expire = True
        log.warning(
            "lease %s left to expire: a handler of shard %s still runs",
            self.lease_key,
            self.shard_id,
        )
        self._end("expired", released=False)

    def _end(self, why: LostWhy | ReleasedWhy, *, released: bool) -> None:
        self.ended_why = why
        self.released = released
        self.lost.set()
        if self._on_end is not None:
            self._on_end(self)

    def extend(self, sent: float) -> None:
        """This worker's heartbeat sent at ``sent`` succeeded: in the heartbeat lease mode it
        keeps the lease as a renewal would (others judge expiry by it, see
        :mod:`~shardflow.leases.expiry`). Nothing changes once the lease ended or lapsed: a
        lease past its deadline stays lost."""
        if self.ended or not self.valid():
            return
        self._confirm(self._lease, sent)

    def _confirm(self, lease: Lease, sent: float) -> None:
        """A write sent at ``sent`` succeeded: others restart their expiry clocks after it."""
        self._lease = lease
        self._landed_sent = max(self._landed_sent, sent)
        self._renewal_failed = None
        self._deadline = max(self._deadline, sent + self._settings.usable_time)
        if self._bounds:
            when = asyncio.get_running_loop().time() + self.remaining()
            for bound in self._bounds:
                if not bound.expired():
                    bound.reschedule(when)

    @contextlib.asynccontextmanager
    async def _until_deadline(self) -> AsyncIterator[None]:
        """Bound a wait for the lock and the write after it by the deadline, following the
        deadline when another write moves it meanwhile: a renewal queued behind a checkpoint
        write must not give the lease up at the deadline that write has just pushed back
        (under load, with writes taking most of a second, this lost valid leases)."""
        async with asyncio.timeout(self.remaining()) as bound:
            self._bounds[bound] = None
            try:
                yield
            finally:
                self._bounds.pop(bound, None)

    async def _conditional(
        self, write: Callable[[Lease], Awaitable[Lease]], *, lands_as: ExtendedSequenceNumber
    ) -> Lease:
        """``write(lease)``; once more when a refusal shows the lease is still ours."""
        try:
            return await self._attempt(write, lands_as=lands_as)
        except LeaseConditionFailedError as exc:
            if self._after_conflict(exc) in ("lost", "gone"):
                raise
        return await self._attempt(write, lands_as=lands_as)

    async def _attempt(
        self, write: Callable[[Lease], Awaitable[Lease]], *, lands_as: ExtendedSequenceNumber
    ) -> Lease:
        """One write of the lease as known. Without an answer (error, timeout, cancellation)
        the write may still have landed, leaving the checkpoint ``lands_as``: remembered, so
        that the next refusal can be recognised as our own write (see _after_conflict)."""
        self._writing_since = self._clock.monotonic()
        try:
            result = await write(self._lease)
        except LeaseConditionFailedError:
            self._writing_since = None
            raise
        except asyncio.CancelledError:
            # Cut off unanswered (the deadline's bound, as a rule): _writing_since stays, so
            # the lapse that follows can tell a slow table from a write never sent.
            self._in_doubt = lands_as
            raise
        except BaseException:
            self._writing_since = None
            self._in_doubt = lands_as
            raise
        self._writing_since = None
        self._in_doubt = None
        return result

    def _after_conflict(self, exc: LeaseConditionFailedError) -> RenewOutcome:
        """Make sense of a refused write: our own lost answer, a handoff, or a lost lease."""
        current = exc.current
        mine = self._worker_id
        known = self._lease
        if current is None:
            self.mark_lost("deleted")
            return "lost"
        in_doubt, self._in_doubt = self._in_doubt, None
        if (
            in_doubt is not None
            and current.lease_owner == mine
            and current.checkpoint_owner is None
            and current.lease_counter == known.lease_counter + 1
            and current.checkpoint == in_doubt
        ):
            # Our last write went unanswered and the item shows exactly what it would have
            # written: it landed, the lease is still ours. (Without such a write the same
            # picture means another instance with our worker id took it: lost.) The deadline
            # stays: we do not know when that write happened.
            self._lease = current
            return "renewed"
        if current.checkpoint_owner == mine and current.lease_owner not in (None, mine):
            # A KCL 3.x graceful handoff to another worker has begun: we keep the lease (and
            # renew it as checkpoint owner) until the consumer checkpoints and releases it.
            self._lease = current
            self.giving_up.set()
            return "handoff"
        why: LostWhy = "handoff" if known.checkpoint_owner == mine else "taken"
        self.mark_lost(why, current.actual_owner)
        return "lost"


class LeaseCheckpointWriter:
    """The :class:`~shardflow.consumer.checkpointing.checkpoint.CheckpointWriter` of one held lease.

    Refuses (:class:`ShardLeaseLostError`) once the lease is lost or past its deadline; otherwise
    writes through the store, conditional on the lease's current counter, serialized with
    renewals. ``completed_state`` is stored in the lease's ``shardflowCompleted`` attribute;
    None clears it.
    """

    def __init__(self, owned: OwnedLease) -> None:
        self._owned = owned

    @property
    def owned(self) -> OwnedLease:
        return self._owned

    async def write(
        self,
        position: ExtendedSequenceNumber,
        *,
        completed_state: bytes | None = None,
        final: bool = False,
    ) -> None:
        await self._owned.write_checkpoint(position, completed_state=completed_state, final=final)


def _on_event_loop() -> bool:
    """Whether the caller runs on an event loop (not in a handler thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
