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
are created, the lease is released. ``close()``: fetching stops, records in the handlers
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
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any, Self, TypeVar

from shardflow.aws.clients import ClientFactory, OpenClients
from shardflow.aws.settings import AwsSettings
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.consumer.cloudwatch import KclMetrics
from shardflow.consumer.delivery.calls import Handler
from shardflow.consumer.delivery.dead_letters import (
    DeadLetters,
    DeadLetterSink,
    ObservedSink,
    as_sink,
)
from shardflow.consumer.delivery.engine import DispatchedShards
from shardflow.consumer.delivery.settings import DEFAULT_DELIVERY
from shardflow.consumer.lifecycle.connections import Connections
from shardflow.consumer.lifecycle.health import STALL_AFTER, Health, readiness
from shardflow.consumer.lifecycle.session import ShardSession
from shardflow.consumer.lifecycle.shard import (
    ShardResult,
    ShardWorker,
)
from shardflow.consumer.lifecycle.signals import install_stop_signals
from shardflow.consumer.lifecycle.status import ConsumerStatus, ShardStatus
from shardflow.consumer.lifecycle.supervisor import ErrorCallback, ShardDriver, ShardSupervisor
from shardflow.consumer.metrics import ConsumerMetrics
from shardflow.consumer.settings import ConsumerSettings, default_worker_id
from shardflow.deadletter.destination import DeadLetterDestination
from shardflow.events import EventCallback, EventEmitter
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.settings import StreamSpec
from shardflow.leases.store import LeaseStore
from shardflow.metrics import ConsumerMetricsSnapshot
from shardflow.metrics.cloudwatch import CloudWatchPublisher, cloudwatch_put
from shardflow.waits import first_of

log = logging.getLogger("shardflow.consumer")

FINAL_FLUSH_TIMEOUT = 10.0
"""Seconds the last CloudWatch send may take when the consumer stops."""


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
    ``on_event``: receives :mod:`~shardflow.events` (quick, must not raise); a shard stopped by
    an error is a :class:`~shardflow.events.ShardFailed` event, the exception its ``error``.
    ``on_error`` (deprecated: ``ConsumerSettings.on_error`` is the policy of that name; use
    ``on_event``): called with (stream, shard id, error) when a shard stops because of an error.
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
        if on_error is not None:
            warnings.warn(
                "Consumer(on_error=callback) is deprecated (ConsumerSettings.on_error is the "
                "policy of that name): a shard stopped by an error is a ShardFailed event to "
                "on_event, the exception its .error",
                DeprecationWarning,
                stacklevel=2,
            )
        self._on_error = on_error
        self._clock = clock
        self._active = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stop_early = False
        self._coordinator: LeaseCoordinator | None = None
        self._supervisor: ShardSupervisor | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._dispatched: DispatchedShards | None = None
        # Opened by start() (or by the first run): clients, lease table, fan-out registrations.
        self._opened: tuple[AsyncExitStack, Connections, Any, LeaseStore] | None = None
        self._cloudwatch: KclMetrics | None = None
        if self.settings.metrics is not None:
            publisher = CloudWatchPublisher(
                self.settings.metrics,
                self.settings.metrics.namespace or application_name,
                now=clock.wall,
            )
            self._cloudwatch = KclMetrics(
                publisher,
                worker_id=self.worker_id,
                streams=self.streams,
                snapshot=self._metrics.snapshot,
                held_leases=self._held_leases,
            )
            self._events.subscribe(self._cloudwatch.observe)
            self._metrics.batch_observer = self._cloudwatch.batch

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the clients and the lease table (created if needed) and check every stream;
        raises if one cannot be used (a wrong name, missing permissions). Takes no lease yet:
        :meth:`consume` or :meth:`shards` do. ``async with consumer`` calls it, as a
        producer's does; :meth:`consume` calls it if nobody did."""
        if self._opened is not None:
            return
        stack = AsyncExitStack()
        connections = Connections(
            self.settings,
            self.application_name,
            self.streams,
            clients=self._clients,
            lease_store=self._lease_store,
            clock=self._clock,
        )
        try:
            kinesis, store = await connections.open(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._opened = (stack, connections, kinesis, store)

    async def _release(self) -> None:
        """Close what :meth:`start` opened."""
        opened, self._opened = self._opened, None
        if opened is not None:
            await opened[0].aclose()

    # --- public API --------------------------------------------------------------------------

    async def consume(
        self,
        handler: Handler,
        *,
        batch: bool = False,
        auto_ack: bool = True,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        """Hand every record of every owned shard to ``handler`` until :meth:`close`.

        ``handler`` takes one :class:`~shardflow.ConsumedRecord` (or, with ``batch``, the list
        of a chunk's records); ``async def`` handlers are awaited, plain ones run in a thread
        pool. Records of one shard arrive in order, one call at a time; shards run
        concurrently. A record is acknowledged when the call that got it returns, unless
        ``auto_ack`` is False (then call ``record.ack()``). Raises the error that stopped the
        consumer under ``on_error="stop-consumer"``.

        ``settings.dispatch`` (:class:`~shardflow.DispatchSettings`) chooses the ordering mode
        (shard, key, unordered; a batch handler takes shard order), retries, and where records
        that failed for good go: ``dead_letters`` or a stopped shard. Without it: shard order,
        no retries, a failure stops the shard. A record the deserializer rejects is such a
        failure too, without a handler call. ``dead_letters`` is a
        :class:`~shardflow.deadletter.DeadLetterDestination` (e.g.
        :class:`~shardflow.JsonLinesDestination`, :class:`~shardflow.KinesisDestination`; the
        caller closes it). A record is acknowledged only after its letter was written; a failed
        write stops the shard.
        """
        dispatch = self.settings.dispatch
        if dispatch is not None and dispatch.needs_dead_letters and dead_letters is None:
            raise ValueError(f"on_failure={dispatch.on_failure!r} needs dead_letters")
        settings = dispatch or DEFAULT_DELIVERY
        if batch:
            settings.check_batch_handler()
        if dead_letters is not None and not isinstance(dead_letters, DeadLetterDestination):
            warnings.warn(
                "dead_letters= takes a DeadLetterDestination (write(letters), close()); a sink "
                "with dead_letter(record, error, attempts) works until the next release",
                DeprecationWarning,
                stacklevel=2,
            )
        async with self._running() as coordinator:
            shards = DispatchedShards(
                handler,
                settings,
                sink=self._observed(as_sink(dead_letters, settings)),
                executor=self._executor,
                clock=self._clock,
                batch=batch,
                auto_ack=auto_ack,
                metrics=self._metrics,
            )
            self._dispatched = shards
            try:
                await self._supervise(coordinator, shards)
            finally:
                self._dispatched = None
        self._raise_fatal()

    def _observed(self, sink: DeadLetterSink[Any] | None) -> DeadLetterSink[Any] | None:
        """Every stored dead letter counted in the metrics and logged (rate-limited)."""
        if sink is None:
            return None
        return ObservedSink(sink, self._metrics.dead_lettered, clock=self._clock)

    async def shards(self) -> AsyncIterator[ShardSession]:
        """Each shard this worker comes to own, as a :class:`ShardSession`, until :meth:`close`.

        Iterate every session's ``batches`` (typically in a task per session). Leaving the
        loop stops the consumer; close the iterator (``contextlib.aclosing``) if you may leave
        it early.
        """
        sessions: asyncio.Queue[ShardSession] = asyncio.Queue()

        async def drive(worker: ShardWorker) -> ShardResult:
            session = ShardSession(worker)
            await sessions.put(session)
            await session.wait_closed(self._stop_requested)
            return await worker.finish()

        async with self._running() as coordinator:
            dispatch = asyncio.create_task(self._supervise(coordinator, drive))
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
        self._raise_fatal()

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

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Stop gracefully and wait until done: final checkpoints, leases released, clients
        closed. Nothing happens if it is not running.

        With ``timeout``, waits at most that many seconds and raises TimeoutError (the stop
        goes on). From inside a handler use :meth:`request_stop` (the stop waits for handlers).
        """
        self.request_stop()
        supervisor = self._supervisor
        shard_task = supervisor is not None and supervisor.is_shard_task(asyncio.current_task())
        if self._active and not shard_task:
            async with asyncio.timeout(timeout):
                await self._stopped.wait()
        if not self._active:
            await self._release()

    async def stop(self) -> None:
        """Deprecated: :meth:`close`."""
        warnings.warn("Consumer.stop() is Consumer.close()", DeprecationWarning, stacklevel=2)
        await self.close()

    async def __aenter__(self) -> Self:
        """Start the consumer (:meth:`start`), as a producer's ``async with`` does."""
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Leaving the block closes the consumer (as :meth:`close`), as a producer's does."""
        await self.close()

    def metrics(self, timeout: float = 5.0) -> ConsumerMetricsSnapshot:
        """Everything measured since start (a consistent copy), from any thread.

        Raises TimeoutError if the consumer's event loop does not answer within ``timeout``.
        """
        return self._metrics.snapshot_threadsafe(timeout)

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
        supervisor = self._supervisor
        workers = list(supervisor.workers.values()) if supervisor is not None else []
        usable = self.settings.leases.usable_time
        for worker in workers:
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
                    unrenewed_for=max(0.0, usable - worker.lease.remaining()),
                    idle_for=worker.idle_for(),
                )
            )
        coordinator = self._coordinator
        mode = coordinator.fleet_mode if coordinator is not None else "standalone"
        lease_mode = coordinator.lease_mode if coordinator is not None else "per-lease"
        parked = dict(supervisor.parked) if supervisor is not None else {}
        failed = dict(supervisor.failed) if supervisor is not None else {}
        overrunning = dict(supervisor.overrunning) if supervisor is not None else {}
        return ConsumerStatus(
            self.worker_id,
            tuple(shards),
            parked,
            failed,
            overrunning=overrunning,
            fleet_mode=mode,
            lease_mode=lease_mode,
        )

    def health(self, timeout: float = 5.0, *, stall_after: float = STALL_AFTER) -> Health:
        """Live and ready, as a probe asks (see :mod:`~shardflow.consumer.lifecycle.health`);
        from any thread. Not live when the event loop does not answer within ``timeout``."""
        loop = self._loop
        if loop is None or not self._active:
            return readiness(None, renew_every=self.settings.leases.renew_every)

        def on_loop() -> Health:
            return readiness(
                self.status() if self._active else None,
                renew_every=self.settings.leases.renew_every,
                stall_after=stall_after,
            )

        if threading.get_ident() == self._loop_thread:
            return on_loop()

        async def ask() -> Health:
            return on_loop()

        try:
            return asyncio.run_coroutine_threadsafe(ask(), loop).result(timeout)
        except TimeoutError:
            return Health(
                live=False,
                ready=False,
                reasons=(f"the event loop did not answer within {timeout:g} s",),
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
        self._supervisor = None
        threads = self.settings.handler_threads or min(32, (os.cpu_count() or 1) + 4)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="shardflow-handler")
        started_here = self._opened is None
        publishing = AsyncExitStack()
        try:
            await publishing.enter_async_context(self._publishing())
            await self.start()
            coordinator = await self._open()
            try:
                yield coordinator
            finally:
                await coordinator.stop(release=True)
        finally:
            if started_here:
                await self._release()
            await publishing.aclose()
            self._executor.shutdown(wait=False)
            self._active = False
            self._stop_early = False
            self._stopped.set()

    def _held_leases(self) -> int:
        coordinator = self._coordinator
        return len(coordinator.owned()) if coordinator is not None else 0

    @asynccontextmanager
    async def _publishing(self) -> AsyncIterator[None]:
        """Metrics sent to CloudWatch in the background while the consumer runs (the last
        interval at the end); a client that cannot be opened leaves the consumer running
        without them (logged)."""
        cloudwatch = self._cloudwatch
        if cloudwatch is None or cloudwatch.publisher.settings.level == "NONE":
            yield
            return
        settings = cloudwatch.publisher.settings
        async with AsyncExitStack() as stack:
            clients = self._clients
            if settings.endpoint_url is not None:
                clients = ClientFactory(
                    replace(clients.settings, endpoint_url=settings.endpoint_url)
                )
            try:
                client = await stack.enter_async_context(clients.cloudwatch())
            except Exception as exc:
                log.warning("no CloudWatch metrics: the client cannot be opened (%s)", exc)
                yield
                return
            cloudwatch.publisher.put = cloudwatch_put(client)
            task = asyncio.create_task(cloudwatch.publisher.run(), name="shardflow-cloudwatch")
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                try:
                    await asyncio.wait_for(cloudwatch.publisher.flush(), FINAL_FLUSH_TIMEOUT)
                except TimeoutError:
                    log.warning(
                        "the last CloudWatch metrics were not sent within %g s", FINAL_FLUSH_TIMEOUT
                    )
                cloudwatch.publisher.put = None

    async def _open(self) -> LeaseCoordinator:
        """The supervisor and the started coordinator, over what :meth:`start` opened."""
        assert self._opened is not None
        _, connections, kinesis, store = self._opened
        self._supervisor = ShardSupervisor(
            connections,
            settings=self.settings,
            stop_requested=self._stop_requested,
            events=self._events,
            metrics=self._metrics,
            clock=self._clock,
            on_error=self._on_error,
        )
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

    async def _supervise(self, coordinator: LeaseCoordinator, drive: ShardDriver) -> None:
        assert self._supervisor is not None  # made by _open
        await self._supervisor.run(coordinator, drive)

    def _raise_fatal(self) -> None:
        supervisor = self._supervisor
        if supervisor is not None and supervisor.fatal is not None:
            raise supervisor.fatal
