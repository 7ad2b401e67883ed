"""Checkpointing one shard: stage handled records, write the safe position.

A checkpoint means "every record up to and including this position is handled" (sub-sequence
numbers included), exactly as in the KCL lease table, so a table shared with KCL workers
behaves the same. The :class:`Checkpointer` writes the contiguous handled prefix that its
:class:`~shardflow.consumer.checkpointing.acks.AckTracker` allows, through a :class:`CheckpointWriter`
(the lease store), one write at a time; it never moves backwards and never writes again after
the lease was lost. Where a restart reads again is :mod:`shardflow.read.intake`'s part.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Final, Protocol

from shardflow.aws.persistence import Patience, Persistence
from shardflow.backoff import Backoff
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.checkpointing.acks import AckTracker, PendingCounts
from shardflow.errors import AwsError, ShardLeaseLostError
from shardflow.events import SILENT, CheckpointWritten, ShardEmitter, WriteReason
from shardflow.read.completed import (
    DEFAULT_MAX_COMPLETED_BYTES,
    CompletedState,
    encode_completed,
)
from shardflow.records import SHARD_END, ExtendedSequenceNumber, Record

log = logging.getLogger("shardflow.consumer.checkpoint")

SHARD_END_POSITION: Final = ExtendedSequenceNumber(SHARD_END)

FINAL_WRITE_PATIENCE: Final = Patience(
    throttle_backoff=Backoff(base=0.1, cap=1.0, max_attempts=None),
    error_backoff=Backoff(base=0.05, cap=1.0, max_attempts=None),
)
"""Retries of the final (and SHARD_END) checkpoint: quick, as the lease's deadline bounds them."""


class CheckpointWriter(Protocol):
    """Stores a shard's checkpoint (the lease store implements it)."""

    async def write(
        self,
        position: ExtendedSequenceNumber,
        *,
        completed_state: bytes | None = None,
        final: bool = False,
    ) -> None:
        """Store ``position`` as the checkpoint, conditional on still holding the lease.

        ``completed_state`` (from :func:`~shardflow.read.completed.encode_completed`) lists records
        handled beyond ``position``; None means there are none, and any earlier state must be
        cleared. ``final`` marks the last write before the lease is let go (a lease store may
        fold a pending handoff into it). Raises :class:`~shardflow.errors.ShardLeaseLostError` if
        another worker owns the lease.
        """
        ...


@dataclass(frozen=True, slots=True)
class CheckpointSettings:
    """When a :class:`Checkpointer` writes on its own; by default only when asked (like KCL)."""

    every_n: int | None = None
    """Write once this many records were handled since the last write (None: not by count)."""
    interval: float | None = None
    """Write handled records at most this many seconds after they became safe (None: not by
    time)."""
    store_completed: bool = False
    """Also store records handled beyond the first unhandled one, so a restart can skip them;
    writes then also happen when only that set grew."""
    max_completed_bytes: int = DEFAULT_MAX_COMPLETED_BYTES
    """The most bytes the stored set of handled records may take (compactly encoded)."""

    def __post_init__(self) -> None:
        if self.every_n is not None and self.every_n < 1:
            raise ValueError(f"every_n must be at least 1, got {self.every_n}")
        if self.interval is not None and not self.interval > 0:
            raise ValueError(f"interval must be positive, got {self.interval}")


class Checkpointer:
    """Checkpoints one shard for user code: ``stage``, ``checkpoint``, ``flush``, ``final``.

    The consumer delivers each record to :attr:`tracker` before user code sees it; user code then
    acknowledges records one by one (``handle.ack()``) or stages prefixes (``stage(record)``).
    Call :meth:`start` on the event loop to run the automatic flushes of ``settings``, and
    :meth:`final` at shutdown, before the lease is given up, and at shard end. Exactly one write
    is in flight at a time; callers that arrive meanwhile are served by the next write, which
    takes the latest safe position.

    Example::

        checkpointer = Checkpointer(lease_store_writer, shard_id=shard_id,
                                    settings=CheckpointSettings(every_n=500, interval=10.0))
        checkpointer.start()
        for record in batch:
            handle = checkpointer.tracker.deliver(record)
            ...  # handle.ack() when done, from any task or thread
        await checkpointer.final(shard_end=batch_was_last)
    """

    def __init__(
        self,
        writer: CheckpointWriter,
        *,
        shard_id: str = "",
        tracker: AckTracker | None = None,
        settings: CheckpointSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        initial: ExtendedSequenceNumber | None = None,
        events: ShardEmitter = SILENT,
    ) -> None:
        """``initial`` is the checkpoint already stored: nothing at or before it is written.
        ``events`` hears of every write (:class:`~shardflow.events.CheckpointWritten`)."""
        self.shard_id = shard_id or (tracker.shard_id if tracker else "")
        self._writer = writer
        self._tracker = tracker if tracker is not None else AckTracker(self.shard_id)
        self._settings = settings or CheckpointSettings()
        self._clock = clock
        self._events = events
        self._written = initial
        self._written_state: bytes | None = None
        self._written_at: float | None = None
        self._written_acked = 0
        self._lost: ShardLeaseLostError | None = None
        self._last_error: Exception | None = None
        self._lock = asyncio.Lock()
        self._count_due = asyncio.Event()
        self._handled = asyncio.Event()
        """Set by the first ack while the interval loop waits for one (see _flush_by_interval)."""
        self._interval_idle = False
        self._handled_at: float | None = None
        self._background: list[asyncio.Task[None]] = []
        self._tracker.add_listener(self._on_ack)

    # --- user API ------------------------------------------------------------------------------

    @property
    def tracker(self) -> AckTracker:
        return self._tracker

    def stage(self, record: Record) -> None:
        """Mark ``record`` and every record before it as handled, without writing.

        Raises :class:`ShardLeaseLostError` once the lease is known to be lost, so handlers stop early.
        """
        self._raise_if_lost()
        self._tracker.ack_through(record)

    async def checkpoint(self, record: Record | None = None) -> ExtendedSequenceNumber | None:
        """Write up to and including ``record`` (None: everything safe so far); returns the checkpoint."""
        self._raise_if_lost()
        if record is not None:
            self._tracker.ack_through(record)
        return await self._write("checkpoint")

    async def flush(self) -> ExtendedSequenceNumber | None:
        """Write what is staged or acknowledged, if anything new; returns the checkpoint."""
        return await self._write("flush")

    async def final(self, *, shard_end: bool) -> ExtendedSequenceNumber | None:
        """Stop the automatic flushes and write what was handled: at shutdown, before the lease
        is given up, or at the end of the shard.

        With ``shard_end`` and every delivered record handled, writes SHARD_END (the caller
        asserts that the shard's last record was delivered); otherwise the safe position.
        """
        await self.stop()
        if shard_end and self._tracker.all_acked:
            return await self._persist("shard_end", shard_end=True)
        if shard_end:
            log.warning(
                "shard %s ended with %d unhandled records: checkpointing %s, not SHARD_END",
                self.shard_id,
                self._tracker.pending.unacked,
                self._tracker.safe_position,
            )
        return await self._persist("final")

    async def _persist(
        self, reason: WriteReason, *, shard_end: bool = False
    ) -> ExtendedSequenceNumber | None:
        """A last write that a brownout of the lease table does not stop: failures that may
        pass are retried until the write succeeds or the lease is lost (the writer then raises
        :class:`ShardLeaseLostError`); only what waiting cannot fix is raised."""
        persistence = Persistence(FINAL_WRITE_PATIENCE, clock=self._clock)
        while True:
            try:
                return await self._write(reason, shard_end=shard_end)
            except AwsError as error:
                pause = persistence.pause(error)  # raises what waiting cannot fix
                log.warning(
                    "final checkpoint of shard %s failed (%s); retry %d in %.2fs",
                    self.shard_id,
                    error.code or type(error).__name__,
                    persistence.failures,
                    pause,
                )
                await self._clock.sleep(pause)

    # --- observation ---------------------------------------------------------------------------

    @property
    def last_written(self) -> ExtendedSequenceNumber | None:
        """The checkpoint last written (or the initial one)."""
        return self._written

    @property
    def last_written_age(self) -> float | None:
        """Seconds since the last write by this checkpointer (None: none yet)."""
        return None if self._written_at is None else self._clock.monotonic() - self._written_at

    @property
    def lag(self) -> int:
        """Records delivered but not covered by the last written checkpoint."""
        return self._tracker.pending.lag

    @property
    def pending(self) -> PendingCounts:
        return self._tracker.pending

    @property
    def lease_lost(self) -> bool:
        return self._lost is not None

    @property
    def last_error(self) -> Exception | None:
        """The last error of an automatic flush (they are retried at the next trigger)."""
        return self._last_error

    # --- automatic flushes ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the automatic flushes of the settings on the running loop (idempotent)."""
        if self._background:
            return
        self._tracker.bind_loop()
        if self._settings.every_n is not None:
            self._background.append(asyncio.create_task(self._flush_by_count()))
        if self._settings.interval is not None:
            self._background.append(asyncio.create_task(self._flush_by_interval()))

    async def stop(self) -> None:
        """Stop the automatic flushes without writing; a write in progress completes."""
        tasks, self._background = self._background, []
        current = asyncio.current_task()
        for task in tasks:
            if task is not current:
                task.cancel()
        for task in tasks:
            if task is not current:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _on_ack(self) -> None:
        every_n = self._settings.every_n
        if every_n is not None and self._unwritten() >= every_n:
            self._count_due.set()
        if self._interval_idle:  # a flag, not a call per ack: this runs for every record
            self._interval_idle = False
            self._handled_at = self._clock.monotonic()
            self._handled.set()

    def _unwritten(self) -> int:
        """Handled records the next write would add to what is stored."""
        tracker = self._tracker
        if self._settings.store_completed:
            return tracker.acked_count - self._written_acked
        return tracker.prefix_count - tracker.checkpointed_count

    async def _flush_by_count(self) -> None:
        every_n = self._settings.every_n or 1
        while self._lost is None:
            await self._count_due.wait()
            self._count_due.clear()
            if self._unwritten() >= every_n:
                await self._flush_in_background("count")

    async def _flush_by_interval(self) -> None:
        """Write what was handled every ``interval`` seconds, on a grid from the start; a
        shard with nothing unwritten keeps no timer until its next ack (1,000 idle shards at
        the default 5 s woke 200 times a second for nothing)."""
        interval = self._settings.interval or 1.0
        clock = self._clock
        origin = clock.monotonic()
        while self._lost is None:
            if self._unwritten() == 0:
                self._handled.clear()
                self._interval_idle = True
                try:
                    await self._handled.wait()
                finally:
                    self._interval_idle = False
                continue
            # The first tick of the grid after the ack that woke the loop (or after now), as
            # a loop sleeping a whole interval each time would have written it: at most
            # ``interval`` after the ack.
            since, self._handled_at = self._handled_at, None
            since = clock.monotonic() if since is None else since
            tick = origin + ((since - origin) // interval + 1) * interval
            await clock.sleep(max(tick - clock.monotonic(), 0.0))
            if self._unwritten() > 0:
                await self._flush_in_background("interval")

    async def _flush_in_background(self, reason: WriteReason) -> None:
        # Shielded, so that stop() cancelling this task never abandons a write half-way.
        write = asyncio.ensure_future(self._write(reason))
        write.add_done_callback(_log_unobserved_failure)
        try:
            await asyncio.shield(write)
        except ShardLeaseLostError:
            pass  # the loops stop by themselves: _lost is set
        except Exception as exc:
            self._last_error = exc
            log.warning("automatic checkpoint of shard %s failed: %r", self.shard_id, exc)

    # --- writing -------------------------------------------------------------------------------

    def _raise_if_lost(self) -> None:
        if self._lost is not None:
            raise ShardLeaseLostError(self._lost.shard_id, owner=self._lost.owner)

    async def _write(
        self, reason: WriteReason, *, shard_end: bool = False
    ) -> ExtendedSequenceNumber | None:
        """Write the latest safe position (or SHARD_END) if it is ahead of what is stored."""
        async with self._lock:
            self._raise_if_lost()
            tracker = self._tracker
            # Read at write time, not call time: the one write serves every caller that waited.
            position = SHARD_END_POSITION if shard_end else tracker.safe_position
            covered = tracker.delivered_count if shard_end else tracker.prefix_count
            acked = tracker.acked_count
            written = self._written
            if position is None or (written is not None and position < written):
                return written
            state = None if shard_end else self._completed_state(position)
            if position == written and state == self._written_state:
                return written
            started = self._clock.monotonic()
            try:
                await self._writer.write(position, completed_state=state, final=reason == "final")
            except ShardLeaseLostError as exc:
                self._lost = exc
                self._count_due.set()  # wake the loops so that they see the loss and end
                self._handled.set()
                log.warning("shard %s: lease lost, checkpointing stops (%s)", self.shard_id, exc)
                raise
            before = tracker.checkpointed_count
            self._written, self._written_state, self._written_acked = position, state, acked
            self._written_at = self._clock.monotonic()
            tracker.mark_checkpointed(covered)
            self._events.emit(
                CheckpointWritten,
                position=position,
                previous=written,
                reason=reason,
                records=tracker.checkpointed_count - before,
                lag=tracker.pending.lag,
                duration=self._written_at - started,
            )
            return position

    def _completed_state(self, position: ExtendedSequenceNumber) -> bytes | None:
        if not self._settings.store_completed:
            return None
        completed = self._tracker.completed_beyond_prefix()
        if not completed:
            return None
        return encode_completed(
            CompletedState(position, tuple(completed)),
            max_bytes=self._settings.max_completed_bytes,
        )


def _log_unobserved_failure(task: asyncio.Future[ExtendedSequenceNumber | None]) -> None:
    """Retrieve a background write's error even when nobody awaits it any more (after stop)."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("background checkpoint write failed: %r", task.exception())
