"""One owned shard, from fetch to checkpoint.

fetch (polling or fan-out) -> :mod:`~shardflow.read.intake` (de-aggregate, resume filter,
hash-range rule) -> :mod:`~shardflow.consumer.reading.reader` (bounded in records and bytes) ->
deliver (register with the ack tracker, deserialize) -> the user's code -> acks -> the
:class:`~shardflow.consumer.checkpointing.checkpoint.Checkpointer` -> the lease's checkpoint writer.

Rules the worker keeps:

- Records are delivered only while the lease is valid. Once it is lost (or its deadline passed)
  delivery stops at once, a handler call in flight is cancelled (an ``async def`` one; a
  thread cannot be stopped and is counted in :attr:`ShardWorker.calls` until it returns) and
  the worker never writes a checkpoint again.
- On stop or when the lease is given up: fetching stops, records already delivered may finish
  (at most ``drain_timeout`` seconds; then an ``async def`` call is cancelled), then the
  handled prefix is checkpointed. The last checkpoint of a handoff hands the lease over, so
  it waits until no handler call of the shard runs any more, threads included
  (:meth:`ShardWorker.finish`): the next owner never starts while one still does.
- At the shard's end: once every delivered record is handled, SHARD_END is written.
- A record the deserializer rejects is delivered as a :class:`Rejected` in its place: a failure
  of that record, which the delivery engine's failure policy settles (dead letter, or stop
  the shard with its :class:`~shardflow.errors.DeserializationError`, what was handled before
  it checkpointed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.checkpointing.acks import build_undelivered
from shardflow.consumer.checkpointing.checkpoint import Checkpointer, CheckpointWriter
from shardflow.consumer.delivery.calls import RunningCalls
from shardflow.consumer.metrics import ConsumerMetrics, ShardGauges
from shardflow.consumer.reading.reader import FetcherFactory, PrefetchBuffer, ShardReader
from shardflow.consumer.settings import ConsumerSettings
from shardflow.errors import ShardLeaseLostError
from shardflow.events import SILENT, ShardEmitter
from shardflow.leases.model import Lease
from shardflow.positions import StartPosition
from shardflow.read.intake import RecordIntake, ResumePlan, resume_filter
from shardflow.records import ExtendedSequenceNumber
from shardflow.shards import ChildShard, HashKeyRange
from shardflow.waits import first_of

__all__ = [
    "FetcherFactory",
    "ShardLease",
    "ShardResult",
    "ShardWorker",
    "StopReason",
]

log = logging.getLogger("shardflow.consumer")


MIB: Final = 1024 * 1024


class ShardLease(Protocol):
    """What a worker needs of the lease it processes (the coordinator's ``OwnedLease``)."""

    @property
    def lease_key(self) -> str: ...

    @property
    def stream(self) -> str: ...

    @property
    def shard_id(self) -> str: ...

    @property
    def lease(self) -> Lease: ...

    @property
    def lost(self) -> asyncio.Event: ...

    @property
    def giving_up(self) -> asyncio.Event: ...

    def valid(self) -> bool: ...

    def remaining(self) -> float:
        """Seconds left before the lease's deadline (<= 0: past it)."""
        ...

    @property
    def checkpoint(self) -> ExtendedSequenceNumber: ...

    @property
    def completed_state(self) -> bytes | None:
        """Records handled beyond the checkpoint, as stored (None: none)."""
        ...

    @property
    def hash_range(self) -> HashKeyRange | None: ...

    @property
    def writer(self) -> CheckpointWriter: ...


class StopReason(StrEnum):
    """Why a shard worker ended."""

    SHARD_END = "shard_end"
    """Every record handled; SHARD_END written."""
    ALREADY_ENDED = "already_ended"
    """The stored checkpoint was SHARD_END already: nothing to read."""
    STOPPED = "stopped"
    """The consumer is stopping."""
    GIVEN_UP = "given_up"
    """The coordinator asked for the lease back."""
    LOST = "lost"
    """The lease was lost: no checkpoint was written after that."""
    FAILED = "failed"
    """Reading, decoding or handling failed; ``error`` says why."""


@dataclass(frozen=True, slots=True)
class ShardResult:
    """How a shard worker ended and the checkpoint it left."""

    reason: StopReason
    checkpoint: ExtendedSequenceNumber | None
    children: tuple[ChildShard, ...] = ()
    """Child shards GetRecords reported at the shard's end (may be empty: list the stream)."""
    error: BaseException | None = None
    handler_running: bool = False
    """A handler call of the shard still ran when the consumer stopped, ``drain_timeout`` after
    the stop: the lease must not be let go (released or handed over), nobody else may start
    the shard while that call runs; it is left to expire instead."""


class ShardWorker:
    """Reads one owned shard and delivers its records in order (see the module doc).

    Use: :meth:`start`, iterate :meth:`batches` (one reader) handing records to user code, then
    :meth:`finish` for the final checkpoint and the :class:`ShardResult`.
    """

    def __init__(
        self,
        lease: ShardLease,
        fetchers: FetcherFactory,
        *,
        settings: ConsumerSettings | None = None,
        hash_range: HashKeyRange | None = None,
        stream_name: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        metrics: ConsumerMetrics | None = None,
        events: ShardEmitter = SILENT,
        calls: RunningCalls | None = None,
    ) -> None:
        self.lease = lease
        self.calls = calls if calls is not None else RunningCalls()
        """The shard's handler calls that have not really ended (threads included)."""
        self.settings = settings or ConsumerSettings()
        self.shard_id = lease.shard_id
        self.stream = stream_name or lease.stream
        self._clock = clock
        self.metrics = metrics
        """Where the shard's measurements go (None: nowhere)."""
        self.plan: ResumePlan = resume_filter(lease.checkpoint, lease.completed_state)
        self.intake = RecordIntake(
            plan=self.plan,
            hash_range=hash_range if hash_range is not None else lease.hash_range,
            out_of_range=self.settings.out_of_range_sub_records,
            on_malformed=self.settings.on_malformed_aggregate,
            stream=self.stream,
            shard_id=self.shard_id,
            build=build_undelivered,
        )
        self.buffer = PrefetchBuffer(self.settings.prefetch_records, self.settings.prefetch_bytes)
        self.checkpointer = Checkpointer(
            lease.writer,
            shard_id=self.shard_id,
            settings=self.settings.checkpoint,
            clock=clock,
            initial=lease.checkpoint,
            events=events,
        )
        self._stop_reason: StopReason | None = None
        self._stop_requested = asyncio.Event()  # wakes the watcher: stop, failure or finish
        self._stop_called = asyncio.Event()  # request_stop only
        self._stopped_at: float | None = None  # monotonic, when request_stop was first called
        self._all_acked = asyncio.Event()
        self._failure: BaseException | None = None
        self._end_reached = False
        self.reader = ShardReader(
            fetchers, self.intake, self.buffer, stream=self.stream, metrics=metrics
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._progress = (0, clock.monotonic())  # (records handled, first seen at)
        self._tracker = self.checkpointer.tracker
        self._tracker.add_listener(self._on_ack)

    # --- state ---------------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """The lease is lost, or its deadline passed, or a checkpoint write was refused."""
        lease = self.lease
        return lease.lost.is_set() or not lease.valid() or self.checkpointer.lease_lost

    def may_deliver(self) -> bool:
        """Whether records may still be handed to user code (asked before every record)."""
        return (
            self._stop_reason is None
            and self._failure is None
            and not self.lease.giving_up.is_set()
            and not self.lost
        )

    @property
    def caught_up(self) -> bool:
        """The last fetch found nothing more to read, and every delivered record is handled."""
        return (
            (self.reader.caught_up or self._end_reached or self.plan.kind == "SHARD_END")
            and self.buffer.idle
            and self.checkpointer.tracker.all_acked
        )

    @property
    def millis_behind_latest(self) -> int | None:
        return self.reader.millis_behind_latest

    @property
    def end_reached(self) -> bool:
        """The reader handed out the shard's last record (its end was read)."""
        return self._end_reached

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def idle_for(self) -> float:
        """Seconds since a record of the shard was first seen handled at the current count (a
        lower bound of the time since the last one was handled: counted when asked)."""
        now = self._clock.monotonic()
        pending = self.checkpointer.pending
        handled = pending.delivered - pending.unacked
        if handled != self._progress[0]:
            self._progress = (handled, now)
        return now - self._progress[1]

    @property
    def clock(self) -> Clock:
        return self._clock

    def gauges(self) -> ShardGauges:
        pending = self.checkpointer.pending
        return ShardGauges(
            millis_behind_latest=self.reader.millis_behind_latest,
            checkpoint_age=self.checkpointer.last_written_age,
            checkpoint_lag=pending.lag,
            unacked=pending.unacked,
            prefetch_records=self.buffer.records_in_use,
            prefetch_bytes=self.buffer.bytes_in_use,
        )

    # --- control -------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin fetching (on the running loop) and the automatic checkpoint flushes."""
        if self._started:
            return
        self._started = True
        self.checkpointer.start()
        self._tasks.append(
            asyncio.create_task(self._watch(), name=f"shardflow-watch-{self.shard_id}")
        )
        start = self._start_position()
        if start is None:
            self._tasks.append(asyncio.create_task(self.buffer.finish()))
            return
        checkpoint = self.lease.checkpoint
        if checkpoint.sequence_number.isdigit():
            log.info(
                "shard %s (stream %s): resuming after checkpoint %s (records up to it and "
                "including it are not handled again)",
                self.shard_id,
                self.stream,
                checkpoint,
            )
        else:
            log.info("shard %s (stream %s): starting at %s", self.shard_id, self.stream, start)
        self.reader.start(start)
        if self.metrics is not None:
            self.metrics.track_shard(self.stream, self.shard_id, self.gauges)

    def _start_position(self) -> StartPosition | None:
        try:
            return self.plan.start_position(self.settings.initial_position.timestamp)
        except ValueError:
            # An AT_TIMESTAMP lease made by a worker configured with a moment this one does
            # not know: reading from the horizon loses nothing (it repeats older records).
            log.warning(
                "shard %s has checkpoint AT_TIMESTAMP but no initial timestamp is configured: "
                "reading from TRIM_HORIZON",
                self.shard_id,
            )
            return StartPosition.trim_horizon()

    def request_stop(self, reason: StopReason = StopReason.STOPPED) -> None:
        """Stop delivering (the consumer is stopping); :meth:`finish` then checkpoints."""
        if self._stop_reason is None:
            self._stop_reason = reason
        if self._stopped_at is None:
            self._stopped_at = self._clock.monotonic()
        self._stop_called.set()
        self._stop_requested.set()

    async def wait_stop_requested(self) -> None:
        """Return once :meth:`request_stop` was called."""
        await self._stop_called.wait()

    def fail(self, error: BaseException) -> None:
        """Stop the shard because of ``error`` (a handler failure); the first error wins."""
        if self._failure is None:
            self._failure = error
        self._stop_requested.set()

    # --- delivery ------------------------------------------------------------------------------

    def reading_ended(self) -> None:
        """The reader handed out the shard's last record (its end was read): SHARD_END
        follows once every record is handled."""
        self._end_reached = self.may_deliver()

    async def settle(self, work: asyncio.Future[Any], *stops: Any) -> bool:
        """The shard's drain policy, for user code working on its records (``work``): once the
        shard stops, is handed over, or one of ``stops`` (events, awaitables) fires, ``work``
        gets ``drain_timeout`` more seconds; once the lease is lost, none: the shard may be
        someone else's. True if ``work`` ended; else it is cancelled (a stop must end even
        when a handler hangs; a handler's thread runs on, counted in :attr:`calls`)."""
        lease = self.lease
        await first_of(work, lease.lost, self._stop_called, lease.giving_up, *stops)
        if not work.done() and not self.lost:
            await first_of(work, lease.lost, timeout=self.settings.drain_timeout)
        if work.done():
            return True
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        if self.lost:
            log.warning("shard %s: lease lost; the handler call was cancelled", self.shard_id)
        else:
            log.warning(
                "shard %s: handler still running %.1fs after the stop; abandoned it",
                self.shard_id,
                self.settings.drain_timeout,
            )
        return False

    # --- background ----------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Wake the delivery side at once when the lease is lost or given up, or on stop."""
        lease = self.lease
        await first_of(lease.lost, lease.giving_up, self._stop_requested)
        if lease.lost.is_set():
            # The renewal side knows before any write fails: stop the automatic flushes now.
            await self.checkpointer.stop()
        await self.buffer.close()

    def _acked_all(self) -> asyncio.Event:
        """The event set once every delivered record is acknowledged, cleared first when some
        are not: records delivered after a moment when all were acknowledged do not clear it
        themselves (only acknowledgements do), and a wait on it set would return at once, a
        loop around it spinning without yielding until the lease lapsed."""
        if not self._tracker.all_acked:
            self._all_acked.clear()
        return self._all_acked

    def _on_ack(self) -> None:
        if self._tracker.all_acked:
            self._all_acked.set()
        else:
            self._all_acked.clear()

    # --- the end -------------------------------------------------------------------------------

    async def finish(self, *, drain_timeout: float | None = None) -> ShardResult:
        """End the shard's processing: stop fetching, final checkpoint, the result.

        ``drain_timeout`` (default: the settings') bounds the wait for delivered records to be
        acknowledged before the checkpoint on stop; pass 0 when no record can be acknowledged
        any more (automatic acks after the handler returned).
        """
        drain = self.settings.drain_timeout if drain_timeout is None else drain_timeout
        self._stop_requested.set()
        await self._cancel_tasks()
        if self.metrics is not None:
            self.metrics.untrack_shard(self.stream, self.shard_id)
        reason = self._final_reason()
        if reason is StopReason.LOST:
            await self.checkpointer.stop()
            log.warning("shard %s: lease lost; stopped without checkpointing", self.shard_id)
            return ShardResult(reason, self.checkpointer.last_written)
        if reason is StopReason.ALREADY_ENDED:
            await self.checkpointer.stop()
            return ShardResult(reason, self.checkpointer.last_written)
        try:
            if reason is StopReason.SHARD_END:
                try:
                    reason = await self._finish_shard_end(drain)
                except _HandlerStillRuns:
                    return await self._left_running(self._stop_reason or StopReason.STOPPED)
            else:
                if reason is not StopReason.FAILED:
                    await self._drain(drain)
                if not await self._handlers_ended():
                    return await self._left_running(reason)
                await self.checkpointer.final(shard_end=False)
        except ShardLeaseLostError:
            return ShardResult(StopReason.LOST, self.checkpointer.last_written)
        except Exception as exc:
            log.error("shard %s: final checkpoint failed: %r", self.shard_id, exc)
            return ShardResult(StopReason.FAILED, self.checkpointer.last_written, error=exc)
        return ShardResult(
            reason,
            self.checkpointer.last_written,
            children=self.reader.children if reason is StopReason.SHARD_END else (),
            error=self._failure,
        )

    def _final_reason(self) -> StopReason:
        if self.lost:
            return StopReason.LOST
        if self._failure is not None:
            return StopReason.FAILED
        if self.plan.kind == "SHARD_END":
            return StopReason.ALREADY_ENDED
        if self._end_reached:
            return StopReason.SHARD_END
        if self.lease.giving_up.is_set() and self._stop_reason is None:
            return StopReason.GIVEN_UP
        return self._stop_reason or StopReason.STOPPED

    async def _finish_shard_end(self, drain: float) -> StopReason:
        """Wait until every delivered record is handled, then write SHARD_END.

        With manual acks this may take long; a stop request or the lease being given up limit
        the wait to ``drain_timeout`` and a plain checkpoint is written instead.
        """
        tracker = self.checkpointer.tracker
        while not tracker.all_acked:
            if self._stop_reason is not None or self.lease.giving_up.is_set():
                await self._drain(drain)
                break
            if self.lost:
                raise ShardLeaseLostError(self.shard_id)
            await first_of(
                self._acked_all(), self.lease.giving_up, self.lease.lost, self._stop_called
            )
        if self.lost:
            raise ShardLeaseLostError(self.shard_id)
        if not await self._handlers_ended():
            raise _HandlerStillRuns
        shard_end = tracker.all_acked
        await self.checkpointer.final(shard_end=shard_end)
        if shard_end:
            log.info("shard %s (stream %s): SHARD_END checkpointed", self.shard_id, self.stream)
            return StopReason.SHARD_END
        return self._stop_reason or StopReason.GIVEN_UP

    async def _handlers_ended(self) -> bool:
        """Before the last checkpoint, which lets the lease go (to the next owner of a handoff,
        or to anyone): wait until no handler call of the shard runs, threads included.

        While the lease is held and the consumer goes on, as long as it takes (the lease is
        renewed meanwhile; the consumer reports a call that outlives ``drain_timeout``): the
        next owner must not start while one runs. At a stop, until ``drain_timeout`` after it at
        most; False if a call still runs then.
        """
        calls = self.calls
        while not calls.idle:
            if self.lost:
                raise ShardLeaseLostError(self.shard_id)
            if self._stop_called.is_set():
                stopped_at = self._stopped_at or self._clock.monotonic()
                left = stopped_at + self.settings.drain_timeout - self._clock.monotonic()
                return await calls.wait_idle(max(left, 0.0))
            log.info(
                "shard %s: %d handler call(s) still running; the lease is let go once they end",
                self.shard_id,
                calls.running,
            )
            await first_of(calls.wait_idle(), self.lease.lost, self._stop_called)
        return True

    async def _left_running(self, reason: StopReason) -> ShardResult:
        """A handler call still runs at a stop: checkpoint what was handled, keep the lease
        (it expires; nobody takes it before then) and say so."""
        log.warning(
            "shard %s: %d handler call(s) still running %.1fs after the stop; the lease is "
            "left to expire rather than let go, so that no one starts the shard meanwhile",
            self.shard_id,
            self.calls.running,
            self.settings.drain_timeout,
        )
        with contextlib.suppress(Exception):
            await self.checkpointer.flush()
        await self.checkpointer.stop()
        return ShardResult(
            reason, self.checkpointer.last_written, error=self._failure, handler_running=True
        )

    async def _drain(self, seconds: float) -> None:
        """Give delivered records up to ``seconds`` to be acknowledged."""
        if self.checkpointer.tracker.all_acked or seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while not self.checkpointer.tracker.all_acked and not self.lost:
                    await first_of(self._acked_all(), self.lease.lost)
        if not self.checkpointer.tracker.all_acked:
            log.warning(
                "shard %s: %d delivered records not acknowledged after %.1fs; checkpointing %s",
                self.shard_id,
                self.checkpointer.pending.unacked,
                seconds,
                self.checkpointer.tracker.safe_position,
            )

    async def _cancel_tasks(self) -> None:
        await self.reader.stop()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _HandlerStillRuns(Exception):
    """A handler call outlived the stop: the last checkpoint must not let the lease go."""
