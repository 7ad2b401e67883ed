"""Per-shard supervision: a task per lease taken, its worker, and what the shard's end means.

The :class:`~shardflow.consumer.Consumer` wires things up (clients, lease coordinator,
executor) and owns the lifecycle; for one run it hands every lease the coordinator takes to a
:class:`ShardSupervisor`, which waits for the shard's parents, builds its
:class:`~shardflow.consumer.lifecycle.shard.ShardWorker`, runs it through the delivery path
(``drive``), and concludes: SHARD_END (children's leases), released (stop, handoff), or
failed per :mod:`~shardflow.consumer.lifecycle.failures` (parked, released to be taken again, or the
consumer stopped). It remembers parked and failed shards and the error that stops the
consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from shardflow.aws.persistence import Persistence
from shardflow.clock import Clock
from shardflow.consumer.checkpointing.checkpoint import FINAL_WRITE_PATIENCE
from shardflow.consumer.delivery.calls import RunningCalls
from shardflow.consumer.lifecycle.connections import Connections
from shardflow.consumer.lifecycle.failures import failure_kind
from shardflow.consumer.lifecycle.shard import ShardResult, ShardWorker, StopReason
from shardflow.consumer.metrics import ConsumerMetrics
from shardflow.consumer.settings import ConsumerSettings
from shardflow.errors import AwsError
from shardflow.events import EventEmitter, HandlerOverrun, ShardFailed, ShardStarted
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.owned import OwnedLease
from shardflow.shards import HashKeyRange
from shardflow.waits import first_of

log = logging.getLogger("shardflow.consumer")

ErrorCallback = Callable[[str, str, BaseException], None]
"""Called with (stream, shard id, error) when a shard stops because of an error."""

ShardDriver = Callable[[ShardWorker], Awaitable[ShardResult]]
"""The delivery path of one shard: runs its worker to the end (shard order or dispatch)."""

OVERRUN_GRACE: Final = 0.5
"""Seconds past ``drain_timeout`` before a handler call still running is reported: the worker
cancels an ``async def`` call at ``drain_timeout`` itself, and that takes a moment."""


@dataclass(frozen=True, slots=True)
class _Run:
    """One run of a lease in this process: its task and its handler calls (which may outlive
    the task: a plain handler's thread runs on after the wait for it was cancelled)."""

    task: asyncio.Task[None]
    calls: RunningCalls

    @property
    def over(self) -> bool:
        return self.task.done() and self.calls.idle


class ShardSupervisor:
    """Runs every shard a consumer comes to own during one run (see the module doc)."""

    def __init__(
        self,
        connections: Connections,
        *,
        settings: ConsumerSettings,
        stop_requested: asyncio.Event,
        events: EventEmitter,
        metrics: ConsumerMetrics,
        clock: Clock,
        on_error: ErrorCallback | None,
    ) -> None:
        self._connections = connections
        self.settings = settings
        self._stop_requested = stop_requested
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._on_error = on_error
        self.workers: dict[str, ShardWorker] = {}
        """The shards being processed now, by lease key."""
        self.parked: dict[str, BaseException] = {}
        """Shards parked by a handler failure (``stop-shard``), by lease key."""
        self.failed: dict[str, BaseException] = {}
        """Shards stopped by an error retrying cannot fix, by lease key."""
        self.fatal: BaseException | None = None
        """The error that stops the consumer, if one did."""
        self.overrunning: dict[str, int] = {}
        """Shards whose handler calls outlived ``drain_timeout`` after the shard stopped here,
        by lease key: how many still run."""
        self._shard_tasks: set[asyncio.Task[None]] = set()
        self._shard_runs: dict[str, _Run] = {}  # by lease key: the latest run
        self._watchers: set[asyncio.Task[None]] = set()

    def is_shard_task(self, task: asyncio.Task[object] | None) -> bool:
        """Whether ``task`` runs one of the shards (a handler calling ``close()``, say)."""
        return task in self._shard_tasks

    async def run(self, coordinator: LeaseCoordinator, drive: ShardDriver) -> None:
        """Start a shard task for every lease taken, until a stop; then let them finish."""

        async def accept() -> None:
            async for owned in coordinator.acquisitions():
                if self._stop_requested.is_set():
                    continue  # the coordinator releases it at stop
                previous = self._shard_runs.get(owned.lease_key)
                calls = RunningCalls()
                task = asyncio.create_task(
                    self._shard_after(previous, coordinator, owned, drive, calls),
                    name=f"shardflow-shard-{owned.shard_id}",
                )
                run = _Run(task, calls)
                self._shard_runs[owned.lease_key] = run
                self._shard_tasks.add(task)
                task.add_done_callback(self._shard_tasks.discard)
                task.add_done_callback(self._forget_run(owned.lease_key, run))

        acceptor = asyncio.create_task(accept(), name="shardflow-accept")
        graceful = False
        try:
            await first_of(acceptor, self._stop_requested)
            graceful = True
        finally:
            acceptor.cancel()
            await asyncio.gather(acceptor, return_exceptions=True)
            self._stop_requested.set()
            if graceful:
                # Hand the leases over first: each shard then drains, checkpoints and
                # releases, which completes its handoff; the next owner starts right after.
                try:
                    await coordinator.leave()
                except Exception:
                    log.exception("handing leases over at stop failed; they are released")
            for worker in list(self.workers.values()):
                worker.request_stop()
            tasks = list(self._shard_tasks)
            if not graceful:
                for task in tasks:
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            watchers = list(self._watchers)
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    # --- one shard ---------------------------------------------------------------------------

    def _forget_run(self, key: str, run: _Run) -> Callable[[asyncio.Task[None]], None]:
        def forget() -> None:
            if self._shard_runs.get(key) is run:
                del self._shard_runs[key]

        return lambda _task: run.calls.when_idle(forget)

    async def _shard_after(
        self,
        previous: _Run | None,
        coordinator: LeaseCoordinator,
        owned: OwnedLease,
        drive: ShardDriver,
        calls: RunningCalls,
    ) -> None:
        """:meth:`_shard`, once the previous run of the same lease in this process has ended,
        its handler calls included.

        One shard, one running handler: a lease lost and taken again at once must not start
        a second worker while the first one's handler (a thread, a batch) still runs. A call
        that outlives ``drain_timeout`` is reported (:meth:`_watch_calls`); the wait goes on,
        until the call returns, the lease is lost, or the consumer stops: then the lease, held
        while that call still runs, is left to expire (released, another worker could start
        the shard at once).
        """
        if previous is not None and not previous.over:
            log.info("shard %s: waiting for its previous worker here to end", owned.shard_id)
            await asyncio.wait({previous.task})
            if not previous.calls.idle:
                log.warning(
                    "shard %s: a handler call of its previous worker here still runs; the "
                    "shard starts again only once it returns",
                    owned.shard_id,
                )
            while not previous.calls.idle and not owned.lost.is_set():
                if self._stop_requested.is_set():
                    owned.let_expire()
                    return
                await first_of(previous.calls.wait_idle(), owned.lost, self._stop_requested)
        await self._shard(coordinator, owned, drive, calls)

    def _watch_calls(self, owned: OwnedLease, calls: RunningCalls, run_over: asyncio.Event) -> None:
        """Report handler calls still running ``drain_timeout`` after the shard stopped here
        (lease lost or given up, the consumer stopping, or the worker ended): a
        :class:`~shardflow.events.HandlerOverrun` event, the ``overrunning_shards`` metric and
        :attr:`overrunning` (in ``Consumer.status()``) until they return."""

        async def watch() -> None:
            await first_of(owned.lost, owned.giving_up, self._stop_requested, run_over)
            patience = self.settings.drain_timeout
            if await calls.wait_idle(patience + OVERRUN_GRACE):
                return
            key = owned.lease_key
            lost = owned.lost.is_set() and not owned.released
            log.error(
                "shard %s (stream %s): %d handler call(s) still running %.1fs after the shard "
                "stopped here (%s); the shard is not started again here%s until they return",
                owned.shard_id,
                owned.stream,
                calls.running,
                patience,
                "its lease lost" if lost else "stopping",
                "" if lost else ", nor its lease let go,",
            )
            self._events.for_shard(owned.stream, owned.shard_id).emit(
                HandlerOverrun,
                lease_key=key,
                running=calls.running,
                waited=patience,
                lease_lost=lost,
            )
            self._metrics.shard_overrunning(owned.stream, +1)
            try:
                while not calls.idle:
                    self.overrunning[key] = calls.running
                    await calls.wait_idle(1.0)
            finally:
                self.overrunning.pop(key, None)
                self._metrics.shard_overrunning(owned.stream, -1)
            log.info("shard %s: its overrunning handler call(s) ended", owned.shard_id)

        task = asyncio.create_task(watch(), name=f"shardflow-calls-{owned.shard_id}")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _shard(
        self,
        coordinator: LeaseCoordinator,
        owned: OwnedLease,
        drive: ShardDriver,
        calls: RunningCalls,
    ) -> None:
        key = owned.lease_key
        worker: ShardWorker | None = None
        run_over = asyncio.Event()
        self._watch_calls(owned, calls, run_over)
        try:
            if owned.parent_shard_ids and not await self._parents_done(coordinator, owned):
                return
            connections = self._connections
            if self._stop_requested.is_set() or not owned.valid() or connections is None:
                return
            events = self._events.for_shard(owned.stream, owned.shard_id)
            try:
                worker = ShardWorker(
                    owned,
                    connections.fetchers(owned.stream, owned.shard_id, events),
                    settings=self.settings,
                    hash_range=await self._hash_range(owned),
                    clock=self._clock,
                    metrics=self._metrics,
                    events=events,
                    calls=calls,
                )
                self.workers[key] = worker
                events.emit(ShardStarted, position=str(owned.checkpoint))
                result = await drive(worker)
            except Exception as exc:
                # A bug, or an AWS failure outside the worker's own handling: the shard stops
                # under the error policy like any other failure, never silently.
                log.exception("shard %s (stream %s) failed", owned.shard_id, owned.stream)
                if worker is not None:
                    worker.fail(exc)
                    with contextlib.suppress(Exception):
                        await worker.finish(drain_timeout=0.0)  # ends its tasks
                result = ShardResult(StopReason.FAILED, None, error=exc)
            log.info("shard %s (stream %s): %s", owned.shard_id, owned.stream, result.reason)
            await self._conclude(coordinator, owned, result)
        except Exception:
            log.exception("ending shard %s (stream %s) failed", owned.shard_id, owned.stream)
            if not owned.ended and key not in self.parked:
                # Never a lease held with nothing processing it.
                with contextlib.suppress(Exception):
                    await coordinator.release(owned, why="requested")
        finally:
            run_over.set()
            if worker is not None and self.workers.get(key) is worker:
                del self.workers[key]

    async def _parents_done(self, coordinator: LeaseCoordinator, owned: OwnedLease) -> bool:
        """Wait for the parents' SHARD_END; False if stopped or the lease ended meanwhile."""
        waiting = asyncio.ensure_future(coordinator.wait_parents_done(owned))
        try:
            await first_of(waiting, self._stop_requested)
        finally:
            if not waiting.done():
                waiting.cancel()
        return waiting.done() and not waiting.cancelled() and waiting.result()

    async def _conclude(
        self, coordinator: LeaseCoordinator, owned: OwnedLease, result: ShardResult
    ) -> None:
        """What a shard's end means for its lease. Every way out lets the lease go, except a
        parked shard, which keeps it until the consumer stops or the lease is asked for; and a
        lease whose shard's handler still ran at the stop, which is left to expire (nobody may
        start the shard while that handler runs)."""
        if result.handler_running:
            owned.let_expire()
        reason = result.reason
        if reason in (StopReason.SHARD_END, StopReason.ALREADY_ENDED):
            try:
                await self._record_shard_end(coordinator, owned, result)
            finally:
                await coordinator.release(owned, why="shard_done")
        elif reason in (StopReason.GIVEN_UP, StopReason.STOPPED):
            # Released as soon as its final checkpoint is written, not after every shard
            # stopped: a handoff completes, a free lease is picked up, at once.
            handed = owned.lease.handoff_pending
            await coordinator.release(owned, why="handoff" if handed else "shutdown")
        elif reason is StopReason.FAILED:
            await self._shard_failed(coordinator, owned, result.error)

    async def _record_shard_end(
        self, coordinator: LeaseCoordinator, owned: OwnedLease, result: ShardResult
    ) -> None:
        """The children's leases, retried through a brownout of the lease table while the
        lease is held (the next owner does it otherwise: SHARD_END is checkpointed)."""
        persistence = Persistence(FINAL_WRITE_PATIENCE, clock=self._clock)
        while True:
            try:
                await coordinator.shard_ended(owned, result.children)
                return
            except AwsError as error:
                pause = persistence.pause(error)
                if not owned.valid():
                    raise
                log.warning(
                    "creating the child leases of shard %s failed (%s); retry in %.2fs",
                    owned.shard_id,
                    error.code or type(error).__name__,
                    pause,
                )
                await self._clock.sleep(pause)

    async def _shard_failed(
        self, coordinator: LeaseCoordinator, owned: OwnedLease, error: BaseException | None
    ) -> None:
        """Per :mod:`~shardflow.consumer.lifecycle.failures`: a handler failure parks the shard
        (``stop-shard``) or stops the consumer; a failure that may pass releases the lease (the
        shard is taken again); anything else releases it and stops the consumer."""
        error = error or RuntimeError("shard failed")
        kind = failure_kind(error)
        if kind == "passing":
            log.warning(
                "shard %s (stream %s) stopped by %s; lease released to be taken again",
                owned.shard_id,
                owned.stream,
                error,
            )
            await coordinator.release(owned, why="requested")
            return
        parked = kind == "handler" and self.settings.on_error == "stop-shard"
        log.error(
            "shard %s (stream %s) stopped%s: %s. %s",
            owned.shard_id,
            owned.stream,
            " and parked" if parked else "",
            error,
            _what_next(kind, parked),
            exc_info=error if kind == "handler" else None,  # the handler's file and line, once
        )
        self._events.for_shard(owned.stream, owned.shard_id).emit(
            ShardFailed,
            lease_key=owned.lease_key,
            error_type=type(error).__name__,
            message=str(error),
            parked=parked,
            error=error,
        )
        if self._on_error is not None:
            try:
                self._on_error(owned.stream, owned.shard_id, error)
            except Exception:
                log.exception("on_error callback failed")
        if not parked:
            if kind == "fatal":
                self.failed[owned.lease_key] = error
                # Nothing processes the shard any more: let another worker (or a restart
                # after the fix) have it at once rather than renewing it for nobody.
                await coordinator.release(owned, why="requested")
            if self.fatal is None:
                self.fatal = error
            self._stop_requested.set()
            return
        # Parked: keep the lease (renewed by the coordinator) so the shard does not bounce
        # between workers repeating the failure; it is released at stop or when asked for.
        self.parked[owned.lease_key] = error
        self._metrics.shard_parked(owned.stream, +1)
        try:
            await first_of(owned.lost, owned.giving_up, self._stop_requested)
            if owned.giving_up.is_set() and not self._stop_requested.is_set():
                await coordinator.release(owned, why="handoff")
        finally:
            self._metrics.shard_parked(owned.stream, -1)

    # --- wiring ------------------------------------------------------------------------------

    async def _hash_range(self, owned: OwnedLease) -> HashKeyRange | None:
        """The shard's hash-key range: from the lease, else from a listing (KCL leases may
        lack it)."""
        if owned.hash_range is not None or self._connections is None:
            return owned.hash_range
        return await self._connections.hash_range(owned.stream, owned.shard_id)


def _what_next(kind: str, parked: bool) -> str:
    """What a handler failure leads to, and the settings that choose otherwise."""
    if kind != "handler":
        return "The lease is released and the consumer stops."
    if parked:
        return (
            "This worker reads no more of the shard until it restarts, then from the last "
            "checkpoint (the failed record included); other shards go on. Otherwise: "
            'on_error="stop-consumer" (--on-error stop-consumer) stops the worker; '
            'dispatch with retries and on_failure="skip" and dead letters '
            "(--ordering shard --on-failure skip --dead-letters file:PATH) moves past the record."
        )
    return (
        'The consumer stops (on_error="stop-consumer"); a restart starts from the last '
        'checkpoint. on_error="stop-shard" (--on-error stop-shard) parks only the shard.'
    )
