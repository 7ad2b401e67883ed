"""The per-shard dispatcher: records in, handler calls out per the ordering mode, acks after.

:class:`ShardDispatcher` takes the records of one shard in shard order (:meth:`submit`), each
already delivered to the shard's :class:`~shardflow.consumer.checkpointing.acks.AckTracker`, and runs the
handler on them:

- ``shard`` mode: one lane, one record at a time;
- ``key`` mode: a lane per key present; a lane lives only while it has records, so memory
  follows the records in flight, not the keys ever seen;
- ``unordered`` (and records whose key is None in ``key`` mode): a task per record.

A record is acknowledged only when its handler succeeded or the dead-letter sink stored it, so
the tracker's safe position (the contiguous acknowledged prefix) never passes a record that is
not finished and a crash replays at most the unfinished window. :meth:`submit` waits while
``max_in_flight_per_shard`` records are unfinished: the caller (the fetch side) is held back.

On ``stop-shard`` or a failed dead-letter write the dispatcher stops: records not started are
dropped unacknowledged, running ones may finish, and :meth:`submit` and :meth:`drain` raise the
:class:`~shardflow.errors.DispatchStoppedError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.checkpointing.acks import (
    AckTracker,
    ConsumedRecord,
    Rejected,
    ack_run,
    bind_delivered,
)
from shardflow.consumer.delivery.calls import (
    Attempts,
    Handler,
    Latencies,
    RetryingCall,
    RunningCalls,
    handler_error,
)
from shardflow.consumer.delivery.dead_letters import DeadLetterSink, WorkerLimit
from shardflow.consumer.delivery.settings import DispatchSettings
from shardflow.errors import (
    BatchResultError,
    DeadLetteringFailedError,
    DeserializationError,
    DispatchStoppedError,
    HandlerError,
    KeyBlockedError,
    KeyFunctionError,
    RecordExpiredError,
    RetriesExhaustedError,
)
from shardflow.read.intake import Intake, Settled
from shardflow.records import Deserializer, ExtendedSequenceNumber, Record
from shardflow.turns import Turns
from shardflow.waits import first_of

if TYPE_CHECKING:
    from shardflow.consumer.lifecycle.shard import ShardResult, ShardWorker
    from shardflow.consumer.metrics import ConsumerMetrics


R = TypeVar("R", bound=Record)

log = logging.getLogger("shardflow.consumer.delivery")

_SHARD_LANE: Final = "\x00shard"
"""The one lane of ``shard`` mode (other modes never use it: lanes there are user keys)."""


@dataclass(frozen=True, slots=True)
class DispatchCounts:
    """What a dispatcher did so far, counted per record."""

    handled: int
    """Records whose handler succeeded (acknowledged)."""
    dead_lettered: int
    """Records the sink stored (acknowledged)."""
    abandoned: int
    """Records dropped unacknowledged because dispatching stopped."""
    duplicates: int
    """Records the idempotency guard knew as handled before (acknowledged without a call)."""
    in_flight: int
    """Records accepted and not finished."""
    blocked_keys: int
    """Keys blocked by ``block-key`` and not released."""
    expired: int = 0
    """Records older than ``max_record_age`` when their turn came (dead-lettered, acknowledged)."""


class ShardDispatcher(Generic[R]):
    """Runs a handler over one shard's records per :class:`DispatchSettings` (see the module doc).

    ``worker_limit`` (an :class:`asyncio.Semaphore`, say) is shared by the dispatchers of all
    shards of a worker and bounds handler calls running at once; ``executor`` runs synchronous
    handlers (default: the loop's). ``sink`` is required by the ``skip`` and ``block-key``
    policies. ``on_stop`` is called once, at once, when dispatching stops (so a caller waiting
    for more records learns of it). ``lease_held`` is asked right before every handler call:
    once it says no (the shard's lease lost or past its deadline) no record starts, not even
    one that passed every earlier check before a wait. Handler calls are counted in ``calls``
    until they have really ended (a thread outlives :meth:`abort`). Use from one event loop.

    The shape of the handler: ``batch`` (it takes the records of a chunk as one list; shard
    ordering only, retried as a whole, a batch that fails for good goes record by record to
    the dead letters) and ``auto_ack`` (False: the handler acknowledges records itself; a
    dead-lettered record is acknowledged by the dispatcher). In shard ordering without an
    idempotency guard or ``block-key`` (:attr:`takes_runs`), a chunk is submitted whole
    (:meth:`submit_run`) and runs in one go, one handler call per record (a plain handler's
    records in one thread hop), with a failed record retried alone; ``may_deliver`` is asked
    between its records (False once the shard is stopping: the rest of the run is left
    unacknowledged; it implies ``lease_held``). ``on_latencies`` is told how long handler
    calls took.
    """

    def __init__(
        self,
        handler: Handler,
        tracker: AckTracker,
        settings: DispatchSettings | None = None,
        *,
        sink: DeadLetterSink[R] | None = None,
        worker_limit: WorkerLimit | None = None,
        executor: Executor | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        shard_id: str | None = None,
        on_stop: Callable[[BaseException], None] | None = None,
        lease_held: Callable[[], bool] | None = None,
        calls: RunningCalls | None = None,
        batch: bool = False,
        auto_ack: bool = True,
        may_deliver: Callable[[], bool] | None = None,
        on_latencies: Latencies | None = None,
    ) -> None:
        self.settings = settings = settings or DispatchSettings()
        if settings.needs_dead_letters and sink is None:
            raise ValueError(f"on_failure={settings.on_failure!r} needs a dead-letter sink")
        if batch:
            settings.check_batch_handler()
        self.batch = batch
        self.auto_ack = auto_ack
        self.takes_runs = batch or (
            settings.ordering == "shard"
            and settings.idempotency is None
            and settings.on_failure != "block-key"
        )
        self._may_deliver = may_deliver
        self._clock = clock
        self._rng = rng
        self.shard_id = tracker.shard_id if shard_id is None else shard_id
        self._tracker = tracker
        self._sink = sink
        self._on_stop = on_stop
        self._lease_held = lease_held
        self._lease_gone = False
        """Latched once ``lease_held`` said no: see :meth:`_may_go_on`."""
        self._call: RetryingCall[Any] = RetryingCall(
            handler,
            retry=settings.retry,
            clock=clock,
            executor=executor,
            worker_limit=worker_limit,
            rng=rng,
            idempotency=settings.idempotency,
            calls=calls,
            on_latencies=on_latencies,
        )
        self._key_function = settings.key_function
        self._needs_key = settings.ordering == "key" or settings.on_failure == "block-key"
        self._max = settings.max_in_flight_per_shard
        # Lane -> records waiting for their turn; present exactly while the lane's task runs.
        self._lanes: dict[str, deque[tuple[R, str | None, BaseException | None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Blocked key -> the record that blocked it ("seq/sub").
        self._blocked: dict[str, str] = {}
        self._in_flight = 0
        self._room = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._failure: DispatchStoppedError | None = None
        self._stopped = asyncio.Event()
        self._closed = False
        self._handled = 0
        self._dead_lettered = 0
        self._abandoned = 0
        self._duplicates = 0
        self._expired_count = 0

    # --- state ---------------------------------------------------------------------------------

    @property
    def failure(self) -> DispatchStoppedError | None:
        """Why dispatching stopped, or None while it goes on."""
        return self._failure

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def blocked_keys(self) -> frozenset[str]:
        return frozenset(self._blocked)

    @property
    def counts(self) -> DispatchCounts:
        return DispatchCounts(
            handled=self._handled,
            dead_lettered=self._dead_lettered,
            abandoned=self._abandoned,
            duplicates=self._duplicates,
            in_flight=self._in_flight,
            blocked_keys=len(self._blocked),
            expired=self._expired_count,
        )

    # --- input ---------------------------------------------------------------------------------

    async def submit(self, record: R, *, rejected: BaseException | None = None) -> None:
        """Accept the shard's next record (already delivered to the tracker).

        Waits while ``max_in_flight_per_shard`` records are unfinished. Raises the
        :class:`DispatchStoppedError` once dispatching stopped (the record is not accepted), and
        :class:`KeyFunctionError` if the key function fails on it.
        """
        if self._closed:
            raise RuntimeError(f"dispatcher of shard {self.shard_id} is closed")
        self._raise_if_stopped()
        key = self._key_of(record) if self._needs_key else None
        while self._in_flight >= self._max and self._failure is None and not self._closed:
            self._room.clear()
            await self._room.wait()
        self._raise_if_stopped()
        if self._closed:
            raise RuntimeError(f"dispatcher of shard {self.shard_id} is closed")
        self._in_flight += 1
        self._idle.clear()
        lane = self._lane_of(key)
        if lane is None:
            self._spawn(self._process(record, key, rejected))
            return
        waiting = self._lanes.get(lane)
        if waiting is not None:
            waiting.append((record, key, rejected))
        else:
            self._lanes[lane] = deque([(record, key, rejected)])
            self._spawn(self._run_lane(lane))

    async def submit_run(self, records: Sequence[R]) -> None:
        """Accept a chunk of the shard's records (already delivered to the tracker) as one
        run, when :attr:`takes_runs` (else record by record, as :meth:`submit`).

        One run at a time: waits until the previous one finished. Raises as :meth:`submit`.
        """
        if not self.takes_runs:
            for record in records:
                await self.submit(record)
            return
        if self._closed:
            raise RuntimeError(f"dispatcher of shard {self.shard_id} is closed")
        self._raise_if_stopped()
        while self._in_flight and self._failure is None and not self._closed:
            await self._idle.wait()
        self._raise_if_stopped()
        if self._closed:
            raise RuntimeError(f"dispatcher of shard {self.shard_id} is closed")
        if not records:
            return
        self._in_flight += len(records)
        self._idle.clear()
        self._spawn(self._process_run(list(records)))

    async def submit_rejected(self, record: R, error: BaseException) -> None:
        """Accept the shard's next record (delivered to the tracker) as failed already, without
        a handler call (the deserializer rejected it): the failure policy settles it, in its
        key's turn. Raises as :meth:`submit`."""
        if self.takes_runs:
            await self.submit_run([])  # waits for the run before it
            self._in_flight += 1
            self._idle.clear()
            self._spawn(self._process(record, None, error))
            return
        await self.submit(record, rejected=error)

    async def settled(self) -> None:
        """Return once every accepted record is finished, or dispatching stopped."""
        await first_of(self._idle, self._stopped)

    def release(self, key: str) -> bool:
        """Unblock ``key``: its records after this are handled again. False if it was not blocked."""
        return self._blocked.pop(key, None) is not None

    async def drain(self) -> None:
        """Wait until every accepted record is finished (or dropped after a stop).

        Raises the :class:`DispatchStoppedError` if dispatching stopped.
        """
        await self._idle.wait()
        if self._tasks:
            # Every record is finished; let their tasks end too (no task outlives a drain).
            await asyncio.wait(list(self._tasks))
        self._raise_if_stopped()

    async def wait_stopped(self) -> None:
        """Return once dispatching stopped (:attr:`failure` says why)."""
        await self._stopped.wait()

    async def abort(self) -> None:
        """Cancel running handler calls and drop waiting records, all unacknowledged.

        For a lost lease or a drain that timed out. A synchronous handler already running in a
        thread cannot be interrupted; it is no longer waited for here (it stays counted in
        ``calls`` until it returns). Later :meth:`submit` calls raise :class:`RuntimeError`.
        """
        self._closed = True
        self._room.set()
        # Let tasks created but not yet started take their first step: a task cancelled before
        # it starts never runs its cleanup, and its record would stay counted as in flight.
        await asyncio.sleep(0)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- lanes ---------------------------------------------------------------------------------

    def _key_of(self, record: R) -> str | None:
        try:
            return self._key_function(record)
        except Exception as exc:
            raise KeyFunctionError(shard_id=self.shard_id, position=_name(record)) from exc

    def _lane_of(self, key: str | None) -> str | None:
        ordering = self.settings.ordering
        if ordering == "shard":
            return _SHARD_LANE
        if ordering == "key":
            return key
        return None

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"shardflow-dispatch-{self.shard_id}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            # A bug or misuse (a record never delivered to the tracker): stop rather than lose it.
            log.error("shard %s: dispatch failed", self.shard_id, exc_info=error)
            stopped = DispatchStoppedError(
                f"dispatch failed: {type(error).__name__}: {error}",
                shard_id=self.shard_id,
                position="?",
            )
            stopped.__cause__ = error
            self._stop(stopped)

    async def _run_lane(self, lane: str) -> None:
        waiting = self._lanes[lane]
        try:
            while waiting and self._may_go_on():
                record, key, rejected = waiting.popleft()
                await self._process(record, key, rejected)
        finally:
            # No await between the emptiness check and this removal: submit() never appends
            # to a lane whose task has ended.
            del self._lanes[lane]
            while waiting:
                waiting.popleft()
                self._abandoned += 1
                self._finish()

    def _may_go_on(self) -> bool:
        if self._failure is not None or self._closed or self._lease_gone:
            return False
        if self._lease_held is None or self._lease_held():
            return True
        # For good: a lane that saw the lease gone abandons the records it holds (unacked), so
        # a later record of its key must never run, even if the lease looks held again (a
        # renewal answered after the deadline moved it: records ran out of key order, and the
        # checkpoint stuck behind the abandoned ones until the lease moved, on a loaded
        # machine in the chaos soak).
        self._lease_gone = True
        return False

    # --- one record ----------------------------------------------------------------------------

    async def _process(
        self, record: R, key: str | None, rejected: BaseException | None = None
    ) -> None:
        try:
            if not self._may_go_on():
                self._abandoned += 1
                return
            blocked_by = self._blocked.get(key) if key is not None else None
            if blocked_by is not None:
                await self._dead_letter(
                    record, KeyBlockedError(key or "", blocked_by=blocked_by), 0
                )
                return
            expired = self._expired(record) if rejected is None else None
            if expired is not None:
                # Too old to handle, whatever the failure policy: to the dead letters.
                self._expired_count += 1
                await self._dead_letter(record, expired, 0)
                return
            if rejected is not None:
                attempts = Attempts(0, rejected)  # nothing a handler call could change
            else:
                attempts = await self._call.run(record, self._may_go_on)
            await self._conclude(record, key, attempts)
        except asyncio.CancelledError:
            self._abandoned += 1
            raise
        finally:
            self._finish()

    async def _conclude(self, record: R, key: str | None, attempts: Attempts) -> None:
        """After a record's calls: acknowledge it, or apply the failure policy."""
        if attempts.succeeded:
            if self.auto_ack:
                self._tracker.ack(record)
            if attempts.skipped:
                self._duplicates += 1
            else:
                self._handled += 1
            return
        if attempts.abandoned or attempts.error is None:
            self._abandoned += 1
            return
        policy = self.settings.on_failure
        if policy == "stop-shard":
            self._abandoned += 1
            self._stop_for(record, attempts)
            return
        if policy == "block-key" and key is not None:
            self._blocked.setdefault(key, _name(record))
            log.warning("shard %s: key %r blocked by record %s", self.shard_id, key, _name(record))
        await self._dead_letter(record, attempts.error, attempts.calls)

    def _stop_for(self, record: R, attempts: Attempts) -> None:
        """Policy ``stop-shard``: stop with a :class:`~shardflow.errors.RetriesExhaustedError`
        caused by the record's last failure."""
        stopped = RetriesExhaustedError(
            shard_id=self.shard_id, position=_name(record), attempts=attempts.calls
        )
        stopped.__cause__ = attempts.error
        self._stop(stopped)

    def _run_may_go_on(self) -> bool:
        """Between the records of a run: also False once the shard is stopping. (Asked per
        record: ``may_deliver`` covers the lease's validity, ``lease_held`` is not asked too.)"""
        may_deliver = self._may_deliver
        if may_deliver is None:
            return self._may_go_on()
        return self._failure is None and not self._closed and may_deliver()

    async def _process_run(self, records: list[R]) -> None:
        """A chunk in shard order: one pass of calls, a failed record retried alone (then the
        failure policy), and on with the next one."""
        if self.batch:
            await self._process_batch(records)
            return
        run: list[Any] = records
        done = 0
        try:
            if self.settings.max_record_age is not None:
                run = await self._without_expired(records)
            while done < len(run) and self._run_may_go_on():
                outcome = await self._call.each(
                    run, done, self._run_may_go_on, ack=self._ack_run if self.auto_ack else None
                )
                self._handled += outcome.handled
                done += outcome.handled
                if outcome.error is None:
                    break
                record = records[done]
                attempts = await self._call.run(
                    record, self._may_go_on, spent=1, last=outcome.error
                )
                await self._conclude(record, None, attempts)
                done += 1
                if self._failure is not None:
                    break
        finally:
            left = len(run) - done
            self._abandoned += left
            self._finish(len(records))

    def _ack_run(self, records: Sequence[R], start: int, end: int) -> None:
        """Acknowledge ``records[start:end]``: in one step for a consumer's chunk (slots of one
        tracker), else one by one."""
        if start >= end:
            return
        first = records[start]
        if isinstance(first, ConsumedRecord) and first._tracker is self._tracker:
            ack_run(records, start, end)  # type: ignore[arg-type]
            return
        for record in records[start:end]:
            self._tracker.ack(record)

    async def _process_batch(self, records: list[R]) -> None:
        """A chunk through a batch handler: expired records out first, then the batch (see
        :meth:`_handle_batch`)."""
        try:
            batch = records
            if self.settings.max_record_age is not None:
                batch = await self._without_expired(records)
            if batch:
                await self._handle_batch(batch)
        finally:
            self._finish(len(records))

    async def _handle_batch(self, batch: list[R]) -> None:
        """Call the batch handler until the batch is handled or settled by the policy.

        A call that raises is retried (``retry``), or with ``bisect_on_error`` the batch is
        split in two and each half handled on its own. A call that returns records of the batch
        (partial batch failure reporting) acknowledges those before the first one returned and
        retries from there; once retries are spent, the records the last call returned go to
        the failure policy and the others count as handled.
        """
        retry = self.settings.retry
        calls = 0
        try:
            while batch:
                if calls:
                    await self._clock.sleep(retry.delay(calls - 1, self._rng))
                if not self._may_go_on():
                    self._abandoned += len(batch)
                    return
                calls += 1
                try:
                    ran, result = await self._call.once(batch, self._may_go_on)
                    failed = [] if not ran else _failed_in(batch, result)
                except HandlerError as error:
                    if self.settings.bisect_on_error and len(batch) > 1:
                        half = len(batch) // 2
                        await self._handle_batch(batch[:half])
                        if self._failure is None:
                            await self._handle_batch(batch[half:])
                        else:
                            self._abandoned += len(batch) - half
                        return
                    if retry.allows(calls):
                        continue
                    await self._batch_failed(batch, Attempts(calls, error))
                    return
                if not ran:
                    self._abandoned += len(batch)
                    return
                first = failed[0] if failed else len(batch)
                if self.auto_ack:
                    self._ack_run(batch, 0, first)
                self._handled += first
                if not failed:
                    return
                if retry.allows(calls):
                    batch = batch[first:]  # retried from the first record that failed
                    continue
                reported = set(failed)
                why = _reported_failure(batch[first])
                rest = [record for index, record in enumerate(batch) if index not in reported]
                if self.settings.on_failure != "stop-shard":
                    # Handled by the last call: done. (Under stop-shard they come again with
                    # the failed record after a restart, as the shard's order wants.)
                    if self.auto_ack:
                        for record in rest[first:]:
                            self._tracker.ack(record)
                    self._handled += len(rest) - first
                await self._batch_failed([batch[i] for i in failed], Attempts(calls, why))
                return
        except asyncio.CancelledError:
            self._abandoned += len(batch)
            raise

    async def _batch_failed(self, records: list[R], attempts: Attempts) -> None:
        """Records of a batch that failed for good: the failure policy, record by record."""
        if self.settings.on_failure == "stop-shard":
            self._abandoned += len(records)
            self._stop_for(records[0], attempts)
            return
        assert attempts.error is not None
        for record in records:
            if self._failure is not None:
                self._abandoned += 1
                continue
            await self._dead_letter(record, attempts.error, attempts.calls)

    def _expired(self, record: R) -> RecordExpiredError | None:
        """Why ``record`` may not be handled any more: older than ``max_record_age``."""
        max_age = self.settings.max_record_age
        arrived = record.approximate_arrival_timestamp
        if max_age is None or arrived is None:
            return None
        age = self._clock.wall() - arrived.timestamp()
        return RecordExpiredError(age=age, max_age=max_age) if age > max_age else None

    async def _without_expired(self, records: list[R]) -> list[R]:
        """``records`` less the expired ones, which go to the dead letters first (acknowledged
        once stored; a failed write stops dispatching and leaves the rest unhandled)."""
        kept: list[R] = []
        for record in records:
            expired = self._expired(record)
            if expired is None:
                kept.append(record)
                continue
            if self._failure is None:
                self._expired_count += 1
                await self._dead_letter(record, expired, 0)
        if self._failure is not None:
            self._abandoned += len(kept)
            return []
        return kept

    async def _dead_letter(self, record: R, error: BaseException, attempts: int) -> None:
        sink = self._sink
        assert sink is not None  # checked in __init__ for the policies that get here
        try:
            await sink.dead_letter(record, error, attempts)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._abandoned += 1
            stopped = DeadLetteringFailedError(shard_id=self.shard_id, position=_name(record))
            stopped.__cause__ = exc
            self._stop(stopped)
            return
        self._tracker.ack(record)
        self._dead_lettered += 1

    # --- bookkeeping ---------------------------------------------------------------------------

    def _finish(self, records: int = 1) -> None:
        self._in_flight -= records
        self._room.set()
        if self._in_flight == 0:
            self._idle.set()

    def _stop(self, error: DispatchStoppedError) -> None:
        if self._failure is None:
            self._failure = error
            self._stopped.set()
            # Logged once, with its traceback, where the consumer decides what follows.
            log.debug("shard %s: %s", self.shard_id, error)
            if self._on_stop is not None:
                try:
                    self._on_stop(error)
                except Exception:
                    log.exception("shard %s: on_stop callback failed", self.shard_id)
        self._room.set()

    def _raise_if_stopped(self) -> None:
        if self._failure is not None:
            raise self._failure


def _name(record: Record) -> str:
    return f"{record.sequence_number}/{record.sub_sequence_number}"


async def deliver(
    items: Sequence[Intake], tracker: AckTracker, deserializer: Deserializer[Any]
) -> list[list[ConsumedRecord[Any]] | Rejected]:
    """A chunk's records as delivered: each registered with the shard's tracker (in shard
    order), deserialized, and made a :class:`ConsumedRecord` (the one place a record is
    wrapped). A record the deserializer rejects becomes a :class:`Rejected` in its place,
    splitting the chunk; a settled one (already handled, or dropped by the intake) is
    acknowledged at once. A chunk of thousands: the loop gets its turns meanwhile."""
    register = tracker.register
    pieces: list[list[ConsumedRecord[Any]] | Rejected] = []
    out: list[ConsumedRecord[Any]] = []
    append = out.append
    turns = Turns()
    for item in items:
        if turns.due:
            await turns.take()
        if isinstance(item, Settled):
            tracker.ack_index(register(item.record))
            continue
        try:
            value = deserializer(item)
        except Exception as exc:
            if out:
                pieces.append(out)
                out = []
                append = out.append
            error = deserialization_error(exc, item)
            pieces.append(Rejected(bind_delivered(item, None, tracker, register(item)), error))
            continue
        append(bind_delivered(item, value, tracker, register(item)))
    if out:
        pieces.append(out)
    return pieces


async def delivered(
    worker: ShardWorker,
) -> AsyncGenerator[list[ConsumedRecord[Any]] | Rejected, None]:
    """``worker``'s records from its reader, delivered (:func:`deliver`), while it may deliver;
    at the shard's end it hears so (``reading_ended``), and a failed read fails it."""
    worker.start()
    reader, tracker = worker.reader, worker.checkpointer.tracker
    deserializer, metrics, stream = worker.settings.deserializer, worker.metrics, worker.stream
    clock = worker.clock
    try:
        async with contextlib.aclosing(reader.chunks(worker.may_deliver)) as chunks:
            async for chunk in chunks:
                pieces = await deliver(chunk.items, tracker, deserializer)
                chunk_records, chunk_size = len(chunk.items), chunk.size
                # Nothing here names a chunk or a piece while the next chunk is awaited: it
                # would keep a handled batch of records alive until then (see reader.chunks).
                del chunk
                pieces.reverse()
                while pieces:
                    piece = pieces.pop()
                    timed: tuple[int, int, float] | None = None
                    if metrics is not None and isinstance(piece, list):
                        # The chunk's own count when the piece is all of it (the usual case).
                        whole = len(piece) == chunk_records
                        size = chunk_size if whole else sum(r.size for r in piece)
                        metrics.records_handled(stream, len(piece), size)
                        if metrics.batch_observer is not None:
                            timed = (len(piece), size, clock.monotonic())
                    yield piece
                    del piece
                    if timed is not None and metrics is not None:
                        observe = metrics.batch_observer
                        if observe is not None:
                            count, size, started = timed
                            elapsed = clock.monotonic() - started
                            behind = reader.millis_behind_latest
                            observe(stream, worker.shard_id, count, size, elapsed, behind)
                    if not worker.may_deliver():
                        return
    except Exception as exc:
        log.error("shard %s: reading failed: %s", worker.shard_id, exc)
        worker.fail(exc)
        return
    if reader.ended:
        worker.reading_ended()


async def run_dispatched(
    worker: ShardWorker, dispatcher: ShardDispatcher[ConsumedRecord[Any]]
) -> ShardResult:
    """Feed ``worker``'s records to ``dispatcher`` until the shard ends, stops, fails or is lost.

    Build the dispatcher with ``on_stop=worker.fail`` so that its stop fails the shard. Records
    in flight at a stop, a handoff or a failure get ``drain_timeout`` seconds, none once the
    lease is lost (:meth:`ShardWorker.settle`); then they are abandoned, unacknowledged.
    """
    failed = asyncio.Event()
    work = asyncio.ensure_future(_feed_and_drain(worker, dispatcher, failed))
    try:
        if await worker.settle(work, dispatcher.wait_stopped(), failed):
            work.result()
        else:
            await dispatcher.abort()
    finally:
        work.cancel()
    # Acknowledged by the handler itself: records handed out may still be, until the drain.
    return await worker.finish(drain_timeout=0.0 if dispatcher.auto_ack else None)


async def _feed_and_drain(
    worker: ShardWorker,
    dispatcher: ShardDispatcher[ConsumedRecord[Any]],
    failed: asyncio.Event,
) -> None:
    try:
        async for records in delivered(worker):
            if isinstance(records, Rejected):
                await dispatcher.submit_rejected(records.record, records.error)
                continue
            if dispatcher.takes_runs:
                # The chunk's room in the prefetch buffer is given back when the next one is
                # asked for: only once it is handled, so the buffer bounds what is unhandled.
                await dispatcher.submit_run(records)
                await dispatcher.settled()
                continue
            for record in records:
                if not worker.may_deliver():
                    break
                await dispatcher.submit(record)
    except DispatchStoppedError:
        pass  # the worker heard of it through on_stop
    except KeyFunctionError as exc:
        worker.fail(exc)
        failed.set()
    with contextlib.suppress(DispatchStoppedError):
        await dispatcher.drain()


class DispatchedShards:
    """What the consumer runs per owned shard (call it with the shard's worker): a dispatcher
    of its own per shard, one worker-wide limit; and the running dispatchers, for releasing
    keys blocked by the ``block-key`` policy. ``batch`` and ``auto_ack``: the handler's shape
    (see :class:`ShardDispatcher`); ``metrics`` hears handler latencies per stream."""

    def __init__(
        self,
        handler: Handler,
        settings: DispatchSettings,
        *,
        sink: DeadLetterSink[ConsumedRecord[Any]] | None,
        executor: Executor | None,
        clock: Clock,
        batch: bool = False,
        auto_ack: bool = True,
        metrics: ConsumerMetrics | None = None,
    ) -> None:
        if settings.needs_dead_letters and sink is None:
            raise ValueError(f"on_failure={settings.on_failure!r} needs a dead-letter destination")
        self._batch = batch
        self._auto_ack = auto_ack
        self._metrics = metrics
        self._handler = handler
        self._settings = settings
        self._sink = sink
        self._executor = executor
        self._clock = clock
        per_worker = settings.max_in_flight_per_worker
        self._limit = asyncio.Semaphore(per_worker) if per_worker is not None else None
        # (stream, shard id) -> the dispatcher of a shard being processed now.
        self._running: dict[tuple[str, str], ShardDispatcher[ConsumedRecord[Any]]] = {}

    async def __call__(self, worker: ShardWorker) -> ShardResult:
        dispatcher: ShardDispatcher[ConsumedRecord[Any]] = ShardDispatcher(
            self._handler,
            worker.checkpointer.tracker,
            self._settings,
            sink=self._sink,
            worker_limit=self._limit,
            executor=self._executor,
            clock=self._clock,
            on_stop=lambda error: worker.fail(_reason(error)),
            lease_held=lambda: not worker.lost,
            calls=worker.calls,
            batch=self._batch,
            auto_ack=self._auto_ack,
            may_deliver=worker.may_deliver,
            on_latencies=self._latencies(worker.stream),
        )
        where = (worker.stream, worker.shard_id)
        self._running[where] = dispatcher
        try:
            return await run_dispatched(worker, dispatcher)
        finally:
            if self._running.get(where) is dispatcher:
                del self._running[where]

    def _latencies(self, stream: str) -> Latencies | None:
        metrics = self._metrics
        if metrics is None:
            return None
        return lambda latencies: metrics.handler_latencies(stream, latencies)

    def blocked_keys(self) -> dict[tuple[str, str], frozenset[str]]:
        """Keys blocked now, per (stream, shard id) of the shards processed here."""
        return {
            where: dispatcher.blocked_keys
            for where, dispatcher in self._running.items()
            if dispatcher.blocked_keys
        }

    def release(self, key: str, *, stream: str | None = None, shard_id: str | None = None) -> int:
        """Unblock ``key`` on every matching shard processed here; how many shards had it."""
        released = 0
        for (shard_stream, shard), dispatcher in list(self._running.items()):
            if stream is not None and shard_stream != stream:
                continue
            if shard_id is not None and shard != shard_id:
                continue
            released += dispatcher.release(key)
        return released


def _reason(error: BaseException) -> BaseException:
    """Why a shard stops, as the consumer reports it: after a record's only call (no retries
    allowed) the handler's own :class:`~shardflow.errors.HandlerError`, and for a record the
    deserializer rejected its :class:`~shardflow.errors.DeserializationError`, not the wrapper."""
    if isinstance(error, RetriesExhaustedError) and error.attempts <= 1:
        cause = error.__cause__
        if isinstance(cause, HandlerError | DeserializationError):
            return cause
    return error


def deserialization_error(exc: Exception, record: Record) -> DeserializationError:
    """``exc``, raised by a deserializer on ``record``, as the DeserializationError naming it."""
    if isinstance(exc, DeserializationError):
        return exc
    error = DeserializationError(
        f"{type(exc).__name__}: {exc}",
        shard_id=record.shard_id,
        sequence_number=record.sequence_number,
        sub_sequence_number=record.sub_sequence_number,
    )
    error.__cause__ = exc
    return error


def _failed_in(batch: Sequence[Record], result: Any) -> list[int]:
    """Indexes of the records a batch handler reported as failed (partial batch failure
    reporting: it returns records of the batch, or their positions); [] for None."""
    if result is None:
        return []
    index_of = {record.position: index for index, record in enumerate(batch)}
    try:
        items = list(result)
    except TypeError:
        items = None
    found: set[int] = set()
    for item in items if items is not None else [result]:
        position = getattr(item, "position", item)
        index = index_of.get(position) if isinstance(position, ExtendedSequenceNumber) else None
        if items is None or index is None:
            error = BatchResultError(
                f"a batch handler returns None or the records of its batch that failed, got "
                f"{type(result).__name__} holding {item!r}"
            )
            raise handler_error(error, batch[0]) from error
        found.add(index)
    return sorted(found)


def _reported_failure(record: Record) -> HandlerError:
    """The error a record carries that its batch handler reported as failed."""
    reported = RuntimeError("the batch handler reported this record as failed")
    return handler_error(reported, record)
