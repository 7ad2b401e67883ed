"""The per-shard dispatcher: records in, handler calls out per the ordering mode, acks after.

:class:`ShardDispatcher` takes the records of one shard in shard order (:meth:`submit`), each
already delivered to the shard's :class:`~shardflow.consumer.acks.AckTracker`, and runs the
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
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.acks import AckTracker
from shardflow.consumer.dispatch.contracts import DeadLetterSink, WorkerLimit
from shardflow.consumer.dispatch.invoke import RecordHandler, RetryingCall
from shardflow.consumer.dispatch.settings import DispatchSettings
from shardflow.consumer.running import RunningCalls
from shardflow.errors import (
    DeadLetteringFailedError,
    DispatchStoppedError,
    KeyBlockedError,
    KeyFunctionError,
    RetriesExhaustedError,
)
from shardflow.records import Record

R = TypeVar("R", bound=Record)

log = logging.getLogger("shardflow.consumer.dispatch")

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
    """

    def __init__(
        self,
        handler: RecordHandler[R],
        tracker: AckTracker,
        settings: DispatchSettings | None = None,
        *,
        sink: DeadLetterSink[R] | None = None,
        worker_limit: WorkerLimit | None = None,
        executor: Executor | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        shard_id: str | None = None,
        on_stop: Callable[[DispatchStoppedError], None] | None = None,
        lease_held: Callable[[], bool] | None = None,
        calls: RunningCalls | None = None,
    ) -> None:
        self.settings = settings = settings or DispatchSettings()
        if settings.needs_dead_letters and sink is None:
            raise ValueError(f"on_failure={settings.on_failure!r} needs a dead-letter sink")
        self.shard_id = tracker.shard_id if shard_id is None else shard_id
        self._tracker = tracker
        self._sink = sink
        self._on_stop = on_stop
        self._lease_held = lease_held
        self._call = RetryingCall(
            handler,
            retry=settings.retry,
            clock=clock,
            executor=executor,
            worker_limit=worker_limit,
            rng=rng,
            idempotency=settings.idempotency,
            calls=calls,
        )
        self._key_function = settings.key_function
        self._needs_key = settings.ordering == "key" or settings.on_failure == "block-key"
        self._max = settings.max_in_flight_per_shard
        # Lane -> records waiting for their turn; present exactly while the lane's task runs.
        self._lanes: dict[str, deque[tuple[R, str | None]]] = {}
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
        )

    # --- input ---------------------------------------------------------------------------------

    async def submit(self, record: R) -> None:
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
            self._spawn(self._process(record, key))
            return
        waiting = self._lanes.get(lane)
        if waiting is not None:
            waiting.append((record, key))
        else:
            self._lanes[lane] = deque([(record, key)])
            self._spawn(self._run_lane(lane))

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
                record, key = waiting.popleft()
                await self._process(record, key)
        finally:
            # No await between the emptiness check and this removal: submit() never appends
            # to a lane whose task has ended.
            del self._lanes[lane]
            while waiting:
                waiting.popleft()
                self._abandoned += 1
                self._finish()

    def _may_go_on(self) -> bool:
        if self._failure is not None or self._closed:
            return False
        return self._lease_held is None or self._lease_held()

    # --- one record ----------------------------------------------------------------------------

    async def _process(self, record: R, key: str | None) -> None:
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
            attempts = await self._call.run(record, self._may_go_on)
            if attempts.succeeded:
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
                stopped = RetriesExhaustedError(
                    shard_id=self.shard_id, position=_name(record), attempts=attempts.calls
                )
                stopped.__cause__ = attempts.error
                self._stop(stopped)
                return
            if policy == "block-key" and key is not None:
                self._blocked.setdefault(key, _name(record))
                log.warning(
                    "shard %s: key %r blocked by record %s", self.shard_id, key, _name(record)
                )
            await self._dead_letter(record, attempts.error, attempts.calls)
        except asyncio.CancelledError:
            self._abandoned += 1
            raise
        finally:
            self._finish()

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

    def _finish(self) -> None:
        self._in_flight -= 1
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
