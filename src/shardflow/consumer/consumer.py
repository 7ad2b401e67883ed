"""The consumer: leases from the coordinator, a worker per owned shard, records to user code.

::

    consumer = Consumer("orders", "billing", settings=ConsumerSettings(deserializer=as_json))

    async def handle(record: ConsumedRecord[dict]) -> None:
        ...

    await consumer.consume(handle)          # until consumer.close() (or run() with signals)

or, to drive each shard yourself::

    async with contextlib.aclosing(consumer.shards()) as sessions:
        async for shard_id, batches, checkpointer in sessions:
            ...  # start a task per shard; iterate batches; ack / stage / checkpoint

Lifecycle: start creates the lease table if needed, lists shards for a new application and
takes leases at once. Each lease taken starts a shard (after its parents reached SHARD_END).
At a shard's end: SHARD_END is checkpointed once every record is handled, children's leases
are created, the lease is released. ``stop()``: fetching stops, records in the handlers
finish, every shard writes a final checkpoint, then every lease is released (others take them
at once, no failover wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

from shardflow.aws.clients import ClientFactory, OpenClients
from shardflow.aws.persistence import Persistence
from shardflow.aws.settings import AwsSettings
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.checkpoint import FINAL_WRITE_PATIENCE
from shardflow.consumer.connections import Connections
from shardflow.consumer.dead_letter_log import ObservedSink
from shardflow.consumer.dispatch.contracts import DeadLetterSink
from shardflow.consumer.dispatch.dead_letters import DeadLetters, as_sink
from shardflow.consumer.dispatch.drive import DispatchedShards, dispatched_driver
from shardflow.consumer.failures import failure_kind
from shardflow.consumer.handlers import Handler, HandlerAdapter
from shardflow.consumer.metrics import ConsumerMetrics, MetricsSnapshot
from shardflow.consumer.session import ShardSession
from shardflow.consumer.settings import ConsumerSettings, default_worker_id
from shardflow.consumer.shard_worker import (
    ShardResult,
    ShardWorker,
    StopReason,
)
from shardflow.consumer.signals import install_stop_signals
from shardflow.consumer.status import ConsumerStatus, ShardStatus
from shardflow.errors import AwsError
from shardflow.events import EventCallback, EventEmitter, ShardFailed, ShardStarted
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import StreamSpec
from shardflow.leases.store import LeaseStore
from shardflow.shards import HashKeyRange
from shardflow.waits import first_of

log = logging.getLogger("shardflow.consumer")

ErrorCallback = Callable[[str, str, BaseException], None]
"""Called with (stream, shard id, error) when a shard stops because of an error."""

ShardDriver = Callable[[ShardWorker], Awaitable[ShardResult]]

T = TypeVar("T")


class Consumer:
    """A KCL-compatible consumer of one or more streams (see the module doc).

    ``stream``: a name or ARN, or several (leases then use KCL's multi-stream keys).
    ``application_name``: the lease table's name; workers of one application share the shards.
    ``aws``: where to connect (default: the standard AWS configuration). ``clients``: where
    AWS clients come from instead, as for :class:`~shardflow.producer.Producer` (e.g.
    :class:`~shardflow.aws.OpenClients` with an open client or
    :class:`shardflow.testing.MemoryKinesis`). ``kinesis=`` (deprecated): an open Kinesis
    client, the same as ``clients=OpenClients(aws, kinesis=...)``.
    ``lease_store``: the lease table to use instead of DynamoDB's table ``application_name``.
    ``on_event``: receives :mod:`~shardflow.events` (quick, must not raise).
    ``on_error``: called when a shard stops because of a handler or decoding error.
    """

    def __init__(
        self,
        stream: str | Sequence[str],
        application_name: str,
        *,
        settings: ConsumerSettings | None = None,
        aws: AwsSettings | None = None,
        clients: ClientFactory | None = None,
        lease_store: LeaseStore | None = None,
        on_event: EventCallback | None = None,
        on_error: ErrorCallback | None = None,
        clock: Clock = SYSTEM_CLOCK,
        kinesis: Any | None = None,
    ) -> None:
        streams = [stream] if isinstance(stream, str) else list(stream)
        if not streams or not all(streams):
            raise ValueError("a consumer needs at least one stream name or ARN")
        if len(set(streams)) != len(streams):
            raise ValueError("a stream is listed twice")
        if not application_name:
            raise ValueError("a consumer needs an application name (the lease table's name)")
        self.streams = streams
        self.application_name = application_name
        self.settings = settings or ConsumerSettings()
        self.worker_id = self.settings.worker_id or default_worker_id()
        if kinesis is not None:
            warnings.warn(
                "Consumer(kinesis=...) is deprecated: pass clients=OpenClients(kinesis=...)",
                DeprecationWarning,
                stacklevel=2,
            )
            clients = OpenClients(aws, kinesis=kinesis)
        self._clients = clients or ClientFactory(aws)
        self._metrics = ConsumerMetrics(clock)
        self._lease_store = lease_store
        self._events = EventEmitter(
            self.worker_id, clock=clock, subscribers=[self._metrics.observe, on_event]
        )
        self._on_error = on_error
        self._clock = clock
        self._active = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stop_early = False
        self._workers: dict[str, ShardWorker] = {}
        self._shard_tasks: set[asyncio.Task[None]] = set()
        self._parked: dict[str, BaseException] = {}
        self._failed: dict[str, BaseException] = {}
        self._coordinator: LeaseCoordinator | None = None
        self._fatal: BaseException | None = None
        self._connections: Connections | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._dispatched: DispatchedShards | None = None

    # --- public API --------------------------------------------------------------------------

    async def consume(
        self,
        handler: Handler,
        *,
        batch: bool = False,
        auto_ack: bool = True,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        """Hand every record of every owned shard to ``handler`` until :meth:`stop`.

        ``handler`` takes one :class:`~shardflow.consumer.records.ConsumedRecord` (or, with
        ``batch``, a list of them); ``async def`` handlers are awaited, plain ones run in a
        thread pool. Records of one shard arrive in order, one call at a time; shards run
        concurrently. A record is acknowledged when the call that got it returns, unless
        ``auto_ack`` is False (then call ``record.ack()``). Raises the error that stopped the
        consumer under ``on_error="stop_consumer"``.

        With ``settings.dispatch`` (see :class:`~shardflow.consumer.dispatch.DispatchSettings`)
        records are dispatched per its ordering mode, retried, and finally failed ones go to
        ``dead_letters`` or stop the shard; the handler then takes single records and the
        consumer acknowledges them (``batch`` and ``auto_ack=False`` are refused).
        ``dead_letters`` is a :class:`~shardflow.deadletter.DeadLetterDestination` (e.g.
        :class:`~shardflow.deadletter.JsonLinesDestination`,
        :class:`~shardflow.deadletter.KinesisDestination`; the caller closes it) or a
        :class:`~shardflow.consumer.dispatch.DeadLetterSink` of one's own. A record is
        acknowledged only after its letter was written; a failed write stops the shard.
        """
        dispatch = self.settings.dispatch
        if dispatch is not None:
            if batch or not auto_ack:
                raise ValueError("dispatch settings need a per-record handler with automatic acks")
            if dispatch.needs_dead_letters and dead_letters is None:
                raise ValueError(f"on_failure={dispatch.on_failure!r} needs dead_letters")
        async with self._running() as coordinator:
            drive: ShardDriver
            if dispatch is None:
                adapter = HandlerAdapter(
                    handler, batch=batch, auto_ack=auto_ack, executor=self._executor
                )
                drive = lambda worker: worker.run(adapter)  # noqa: E731
            else:
                drive = self._dispatched = dispatched_driver(
                    handler,  # type: ignore[arg-type]  # a record handler, as refused above
                    dispatch,
                    sink=self._observed(as_sink(dead_letters, dispatch)),
                    executor=self._executor,
                    clock=self._clock,
                )
            try:
                await self._dispatch(coordinator, drive)
            finally:
                self._dispatched = None
        if self._fatal is not None:
            raise self._fatal

    def _observed(self, sink: DeadLetterSink[Any] | None) -> DeadLetterSink[Any] | None:
        """Every stored dead letter counted in the metrics and logged (rate-limited)."""
        if sink is None:
            return None
        return ObservedSink(sink, self._metrics.dead_lettered, clock=self._clock)

    async def shards(self) -> AsyncIterator[ShardSession]:
        """Each shard this worker comes to own, as a :class:`ShardSession`, until :meth:`stop`.

        Iterate every session's ``batches`` (typically in a task per session). Leaving the
        loop stops the consumer; close the iterator (``contextlib.aclosing``) if you may leave
        it early.
        """
        sessions: asyncio.Queue[ShardSession] = asyncio.Queue()

        async def drive(worker: ShardWorker) -> ShardResult:
            session = ShardSession(worker)
            await sessions.put(session)
            await session.wait_closed(self._stop_requested, self.settings.drain_timeout)
            return await worker.finish()

        async with self._running() as coordinator:
            dispatch = asyncio.create_task(self._dispatch(coordinator, drive))
            try:
                while True:
                    getter = asyncio.ensure_future(sessions.get())
                    await first_of(getter, dispatch)
                    if not getter.done():
                        getter.cancel()
                        break
                    yield getter.result()
            finally:
                self.request_stop()
                await dispatch
        if self._fatal is not None:
            raise self._fatal

    def request_stop(self) -> None:
        """Ask the consumer to stop gracefully, without waiting; safe from any thread."""
        loop = self._loop
        if loop is None or not self._active:
            self._stop_early = True
            return
        if threading.get_ident() == self._loop_thread:
            self._stop_requested.set()
        else:
            loop.call_soon_threadsafe(self._stop_requested.set)

    async def close(self) -> None:
        """Stop gracefully and wait until done: final checkpoints, leases released. Nothing
        happens if it is not running.

        From inside a handler use :meth:`request_stop` (the stop waits for handlers).
        """
        self.request_stop()
        if self._active and asyncio.current_task() not in self._shard_tasks:
            await self._stopped.wait()

    async def stop(self) -> None:
        """Deprecated: :meth:`close`."""
        warnings.warn("Consumer.stop() is Consumer.close()", DeprecationWarning, stacklevel=2)
        await self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Leaving the block closes the consumer (as :meth:`close`), as a producer's does."""
        await self.close()

    def metrics(self, timeout: float = 5.0) -> MetricsSnapshot:
        """Everything measured since start (a consistent copy), from any thread.

        Raises TimeoutError if the consumer's event loop does not answer within ``timeout``.
        """
        snapshot = self._metrics.snapshot_threadsafe(timeout)
        if snapshot is None:
            raise TimeoutError("the consumer's event loop did not answer for a metrics snapshot")
        return snapshot

    def run(
        self,
        handler: Handler,
        *,
        batch: bool = False,
        auto_ack: bool = True,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        """Blocking :meth:`consume` on a new event loop in the current thread.

        SIGTERM and SIGINT stop it gracefully (a second one at once; the run then raises
        :class:`asyncio.CancelledError`). Signals are only installed from the main thread.
        """

        async def main() -> None:
            uninstall = install_stop_signals(self.request_stop)
            try:
                await self.consume(
                    handler, batch=batch, auto_ack=auto_ack, dead_letters=dead_letters
                )
            finally:
                uninstall()

        asyncio.run(main())

    def release_key(
        self, key: str, *, stream: str | None = None, shard_id: str | None = None
    ) -> int:
        """Unblock ``key`` (blocked by the ``block-key`` failure policy): its records read after
        this are handled again. Returns on how many shards the key was blocked (0: nowhere).

        ``stream`` / ``shard_id`` limit the release to those shards. Safe from any thread.
        Blocked keys live in this process, per shard: a key blocked on a shard that moved to
        another worker (or before a restart) is not blocked there.
        """
        return self._on_loop(
            lambda: self._dispatched_call(
                lambda shards: shards.release(key, stream=stream, shard_id=shard_id), 0
            )
        )

    def blocked_keys(self) -> dict[tuple[str, str], frozenset[str]]:
        """Keys blocked now by the ``block-key`` policy, per (stream, shard id). Any thread."""
        return self._on_loop(
            lambda: self._dispatched_call(lambda shards: shards.blocked_keys(), {})
        )

    def _dispatched_call(self, call: Callable[[DispatchedShards], T], empty: T) -> T:
        shards = self._dispatched
        return empty if shards is None else call(shards)

    def _on_loop(self, call: Callable[[], T]) -> T:
        """``call()`` on the consumer's event loop, waiting for it when called from elsewhere."""
        loop = self._loop
        if loop is None or not self._active or threading.get_ident() == self._loop_thread:
            return call()

        async def on_loop() -> T:
            return call()

        return asyncio.run_coroutine_threadsafe(on_loop(), loop).result()

    @property
    def running(self) -> bool:
        return self._active

    def status(self) -> ConsumerStatus:
        """What every owned shard is doing (call on the consumer's event loop)."""
        shards = []
        for worker in list(self._workers.values()):
            checkpointer = worker.checkpointer
            shards.append(
                ShardStatus(
                    stream=worker.stream,
                    shard_id=worker.shard_id,
                    lease_key=worker.lease.lease_key,
                    checkpoint=checkpointer.last_written,
                    pending=checkpointer.pending,
                    millis_behind_latest=worker.millis_behind_latest,
                    caught_up=worker.caught_up,
                    error=worker.failure,
                )
            )
        coordinator = self._coordinator
        mode = coordinator.fleet_mode if coordinator is not None else "standalone"
        return ConsumerStatus(
            self.worker_id, tuple(shards), dict(self._parked), dict(self._failed), fleet_mode=mode
        )

    # --- running -----------------------------------------------------------------------------

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[LeaseCoordinator]:
        if self._active:
            raise RuntimeError("this consumer is already running")
        self._active = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._metrics.loop = self._loop
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        if self._stop_early:
            self._stop_requested.set()
        self._fatal = None
        self._parked = {}
        self._failed = {}
        threads = self.settings.handler_threads or min(32, (os.cpu_count() or 1) + 4)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="shardflow-handler")
        try:
            async with AsyncExitStack() as stack:
                coordinator = await self._open(stack)
                try:
                    yield coordinator
                finally:
                    await coordinator.stop(release=True)
                    self._connections = None
        finally:
            self._executor.shutdown(wait=False)
            self._active = False
            self._stop_early = False
            self._stopped.set()

    async def _open(self, stack: AsyncExitStack) -> LeaseCoordinator:
        """Clients, lease store, fan-out registrations and the started coordinator."""
        connections = Connections(
            self.settings,
            self.application_name,
            self.streams,
            clients=self._clients,
            lease_store=self._lease_store,
            clock=self._clock,
        )
        kinesis, store = await connections.open(stack)
        self._connections = connections
        coordinator = LeaseCoordinator(
            store,
            worker_id=self.worker_id,
            streams=[StreamSpec(stream) for stream in self.streams],
            kinesis=kinesis,
            settings=self.settings.leases,
            initial_position=self.settings.initial_position,
            clock=self._clock,
            events=self._events,
            lease_streams=connections.lease_streams,
        )
        await coordinator.start()
        self._coordinator = coordinator
        log.info(
            "consumer %s of %s started as worker %s (fleet mode %s)",
            self.application_name,
            ", ".join(self.streams),
            self.worker_id,
            coordinator.fleet_mode,
        )
        return coordinator

    async def _dispatch(self, coordinator: LeaseCoordinator, drive: ShardDriver) -> None:
        """Start a shard task for every lease taken, until a stop; then let them finish."""

        async def accept() -> None:
            async for owned in coordinator.acquisitions():
                if self._stop_requested.is_set():
                    continue  # the coordinator releases it at stop
                task = asyncio.create_task(
                    self._shard(coordinator, owned, drive), name=f"shardflow-shard-{owned.shard_id}"
                )
                self._shard_tasks.add(task)
                task.add_done_callback(self._shard_tasks.discard)

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
            for worker in list(self._workers.values()):
                worker.request_stop()
            tasks = list(self._shard_tasks)
            if not graceful:
                for task in tasks:
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- one shard ---------------------------------------------------------------------------

    async def _shard(
        self, coordinator: LeaseCoordinator, owned: OwnedLease, drive: ShardDriver
    ) -> None:
        key = owned.lease_key
        worker: ShardWorker | None = None
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
                )
                self._workers[key] = worker
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
            if not owned.ended and key not in self._parked:
                # Never a lease held with nothing processing it.
                with contextlib.suppress(Exception):
                    await coordinator.release(owned, why="requested")
        finally:
            if worker is not None and self._workers.get(key) is worker:
                del self._workers[key]

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
        parked shard, which keeps it until the consumer stops or the lease is asked for."""
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
        """Per :mod:`~shardflow.consumer.failures`: a handler failure parks the shard
        (``stop_shard``) or stops the consumer; a failure that may pass releases the lease (the
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
        parked = kind == "handler" and self.settings.on_error == "stop_shard"
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
        )
        if self._on_error is not None:
            try:
                self._on_error(owned.stream, owned.shard_id, error)
            except Exception:
                log.exception("on_error callback failed")
        if not parked:
            if kind == "fatal":
                self._failed[owned.lease_key] = error
                # Nothing processes the shard any more: let another worker (or a restart
                # after the fix) have it at once rather than renewing it for nobody.
                await coordinator.release(owned, why="requested")
            if self._fatal is None:
                self._fatal = error
            self._stop_requested.set()
            return
        # Parked: keep the lease (renewed by the coordinator) so the shard does not bounce
        # between workers repeating the failure; it is released at stop or when asked for.
        self._parked[owned.lease_key] = error
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
            'on_error="stop_consumer" (--on-error stop-consumer) stops the worker; '
            'dispatch with retries and on_failure="skip" and dead letters '
            "(--ordering shard --on-failure skip --dead-letters file:PATH) moves past the record."
        )
    return (
        'The consumer stops (on_error="stop_consumer"); a restart starts from the last '
        'checkpoint. on_error="stop_shard" (--on-error stop-shard) parks only the shard.'
    )
