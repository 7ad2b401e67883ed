"""The asyncio producer: ``put`` records, get a future of where each landed.

::

    async with Producer("orders", settings=ProducerSettings(aggregate=True)) as producer:
        future = await producer.put(b"...", "customer-42")
        result = await future          # PutResult, or raises RecordDeliveryError
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Self

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import stream_name_of
from shardflow.errors import ProducerClosedError, ProducerError
from shardflow.metrics.cloudwatch import CloudWatchPublisher, cloudwatch_put
from shardflow.metrics.recording import SMALL_VALUES, on_loop, rounded
from shardflow.metrics.snapshots import ProducerMetricsSnapshot
from shardflow.producer.batching import Builder, Pending, new_pending
from shardflow.producer.buffer import Epoch, RecordBuffer
from shardflow.producer.cloudwatch import KplMetrics
from shardflow.producer.engine import Engine
from shardflow.producer.metrics import MetricsRecorder
from shardflow.producer.results import PutResult, ResultSink
from shardflow.producer.settings import ProducerSettings
from shardflow.producer.shard_router import ShardRouter
from shardflow.producer.validation import Prepared, RecordInput, prepare, prepare_input

log = logging.getLogger("shardflow.producer")

MetricsCallback = Callable[[ProducerMetricsSnapshot], None]

KPL_NAMESPACE = "KinesisProducerLibrary"
"""The KPL's default CloudWatch namespace (``CloudWatch(namespace=...)`` overrides it)."""
FINAL_FLUSH_TIMEOUT = 10.0
"""Seconds ``close`` waits for the last CloudWatch send."""


class Producer:
    """Writes records to one Kinesis stream: batched, paced per shard, retried, optionally aggregated.

    Use as ``async with Producer(...) as producer`` or call :meth:`start` and :meth:`close`.
    ``put`` returns once the record is accepted into the bounded buffer (it waits while the
    buffer is full); the returned future resolves to a :class:`PutResult` or raises
    :class:`~shardflow.errors.RecordDeliveryError`. Invalid records raise at ``put``.
    ``on_metrics`` receives a snapshot of each ``settings.metrics_interval`` (and of the last
    stretch at close), called on the event loop: keep it quick.

    ``start`` lists the stream's shards: a wrong stream name fails there with
    :class:`~shardflow.errors.ResourceNotFoundError`.
    """

    def __init__(
        self,
        stream: str,
        *,
        settings: ProducerSettings | None = None,
        aws: AwsSettings | None = None,
        clients: ClientFactory | None = None,
        on_metrics: MetricsCallback | None = None,
    ) -> None:
        self.stream = stream
        self.settings = settings or ProducerSettings()
        self._clients = clients or ClientFactory(aws)
        self._on_metrics = on_metrics
        self._max_record_bytes = self.settings.max_record_bytes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit = AsyncExitStack()
        self._engine: Engine | None = None
        self._buffer: RecordBuffer | None = None
        self._router: ShardRouter | None = None
        self._recorder: MetricsRecorder | None = None
        self._metrics_task: asyncio.Task[None] | None = None
        self._kpl: KplMetrics | None = None
        self._kpl_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Future[None] | None = None

    # --- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the client and list the stream's shards; raises if the stream cannot be used."""
        if self._loop is not None:
            raise ProducerError("the producer was already started")
        self._loop = loop = asyncio.get_running_loop()
        settings = self.settings
        try:
            pool = max(
                self._clients.settings.max_pool_connections, settings.max_concurrent_requests
            )
            # Records are checked at put; botocore's own walk over every entry would cost
            # more CPU per record than the rest of the producer.
            kinesis = await self._exit.enter_async_context(
                self._clients.kinesis(
                    stream=self.stream, max_pool_connections=pool, parameter_validation=False
                )
            )
            self._recorder = MetricsRecorder(
                stream_name_of(self.stream),
                refreshes=lambda: self._router.refreshes if self._router else 0,
            )
            self._buffer = RecordBuffer(settings.buffer_max_records, settings.buffer_max_bytes)
            self._router = router = ShardRouter(
                kinesis,
                self.stream,
                interval=settings.shard_refresh_interval,
                min_interval=settings.min_shard_refresh_interval,
            )
            await router.load()
            self._engine = engine = Engine(
                kinesis=kinesis,
                stream=self.stream,
                settings=settings,
                router=router,
                buffer=self._buffer,
                metrics=self._recorder,
                builder_factory=_aggregate_builder() if settings.aggregate else None,
            )
        except BaseException:
            await self._exit.aclose()
            # Back to "not started": nothing may be accepted, and start may be tried again.
            self._exit = AsyncExitStack()
            self._loop = None
            self._buffer = self._router = self._recorder = self._engine = None
            raise
        router.on_change = engine.on_map_change
        engine.start()
        router.start_periodic()
        await self._start_cloudwatch()
        if self._on_metrics is not None:
            self._metrics_task = loop.create_task(self._report_metrics())

    async def close(self, timeout: float | None = None, *, grace: float | None = None) -> None:  # noqa: ASYNC109
        """Send everything accepted, wait for every result, then release the client.

        Accepted records are never dropped: each gets a result or a RecordDeliveryError.
        ``put`` calls still waiting for buffer room fail with ProducerClosedError. With
        ``timeout``, records still without a result after that many seconds fail with
        ``RecordDeliveryError`` (code ``ProducerAborted`` or ``Cancelled``) and requests in
        flight are abandoned. (``grace=`` is the first spelling of ``timeout=``: deprecated.)
        """
        if grace is not None:
            warnings.warn(
                "Producer.close(grace=) is Producer.close(timeout=)", DeprecationWarning, 2
            )
            timeout = grace if timeout is None else timeout
        if self._loop is None or self._engine is None:
            return
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._shutdown())
        if timeout is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._close_task), timeout)
            except TimeoutError:
                log.warning("closing the producer of %s timed out; aborting", self.stream)
                await self._engine.abort()
        await asyncio.shield(self._close_task)

    async def _shutdown(self) -> None:
        assert self._engine is not None
        assert self._buffer is not None
        assert self._router is not None
        self._buffer.close()
        try:
            await self._engine.stop()
        finally:
            await self._router.close()
            if self._metrics_task is not None:
                self._metrics_task.cancel()
                await asyncio.gather(self._metrics_task, return_exceptions=True)
                self._deliver_metrics()
            await self._stop_cloudwatch()
            await self._exit.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._close_task is not None

    # --- writing -----------------------------------------------------------------------------

    async def put(
        self, data: bytes | str, partition_key: str, explicit_hash_key: str | None = None
    ) -> asyncio.Future[PutResult]:
        """Accept one record; returns the future of its result.

        Raises at once :class:`~shardflow.errors.InvalidPartitionKeyError`,
        :class:`~shardflow.errors.RecordTooLargeError` or ProducerClosedError. Waits while
        the buffer is full. ``str`` data is sent UTF-8 encoded.
        """
        buffer = self._buffer
        engine = self._engine
        if (
            buffer is None
            or engine is None
            or engine.failure is not None
            or self._close_task is not None
        ):
            buffer = self._running_buffer()  # raises the reason
        payload, size, hash_key = prepare(
            data, partition_key, explicit_hash_key, self._max_record_bytes
        )
        epoch = buffer.try_reserve(size)
        if epoch is None:
            epoch = await buffer.reserve(size)
        return self._accept(payload, partition_key, explicit_hash_key, hash_key, size, epoch)

    async def put_many(self, records: Iterable[RecordInput]) -> list[asyncio.Future[PutResult]]:
        """Accept many records, in order; returns their futures.

        Every record is checked before any is accepted: on invalid input nothing is accepted.
        """
        buffer = self._running_buffer()
        prepared = [prepare_input(item, self._max_record_bytes) for item in records]
        futures: list[asyncio.Future[PutResult]] = []
        for payload, size, hash_key, partition_key, explicit_hash_key in prepared:
            epoch = buffer.try_reserve(size)
            if epoch is None:
                epoch = await buffer.reserve(size)
            futures.append(
                self._accept(payload, partition_key, explicit_hash_key, hash_key, size, epoch)
            )
        return futures

    async def flush(self) -> None:
        """Wait until every record accepted so far has its result (sent without lingering)."""
        if self._buffer is None or self._engine is None:
            return
        await asyncio.shield(self._begin_flush())

    def _running_buffer(self) -> RecordBuffer:
        if self._close_task is not None:
            raise ProducerClosedError(f"the producer of {self.stream} is closed")
        if self._buffer is None or self._engine is None:
            raise ProducerError("start the producer first (or use `async with`)")
        if self._engine is not None and self._engine.failure is not None:
            raise ProducerError(
                f"the producer of {self.stream} stopped after an internal error"
            ) from self._engine.failure
        return self._buffer

    def _accept(
        self,
        data: bytes,
        partition_key: str,
        explicit_hash_key: str | None,
        hash_key: int,
        size: int,
        epoch: Epoch,
        sink: ResultSink | None = None,
    ) -> Pending:
        loop = self._loop
        engine = self._engine
        recorder = self._recorder
        assert loop is not None
        assert engine is not None
        assert recorder is not None
        record = new_pending(
            loop, data, partition_key, explicit_hash_key, hash_key, size, epoch, loop.time(), sink
        )
        engine.add(record)
        recorder.records_put += 1
        sizes = recorder.record_bytes.counts  # (Tally.add, inlined: it runs once per record)
        kept = size if size < SMALL_VALUES else rounded(size)
        sizes[kept] = sizes.get(kept, 0) + 1
        return record

    # --- for the sync facade: records checked (and hashed) in the caller's thread ------------

    def _submit_nowait(self, prepared: Prepared, sink: ResultSink) -> bool:
        """Accept a prepared record if the buffer has room now; False if it is full."""
        payload, size, hash_key, partition_key, explicit_hash_key = prepared
        epoch = self._running_buffer().try_reserve(size)
        if epoch is None:
            return False
        self._accept(payload, partition_key, explicit_hash_key, hash_key, size, epoch, sink)
        return True

    async def _submit(self, prepared: Prepared, sink: ResultSink) -> None:
        """Accept a prepared record, waiting for buffer room."""
        payload, size, hash_key, partition_key, explicit_hash_key = prepared
        epoch = await self._running_buffer().reserve(size)
        self._accept(payload, partition_key, explicit_hash_key, hash_key, size, epoch, sink)

    def _begin_flush(self) -> asyncio.Future[None]:
        """Like :meth:`flush`, but the set of records waited for is fixed now, synchronously."""
        assert self._buffer is not None
        assert self._engine is not None
        done = self._buffer.flush()
        self._engine.wake()
        return done

    # --- metrics -----------------------------------------------------------------------------

    @property
    def cloudwatch_dropped(self) -> int:
        """CloudWatch metric values dropped so far (sends that failed, or more values than
        ``CloudWatch.max_datums``); 0 without ``ProducerSettings.metrics``."""
        return self._kpl.publisher.dropped if self._kpl is not None else 0

    async def _start_cloudwatch(self) -> None:
        """The KPL's metrics sent in the background; a CloudWatch client that cannot be opened
        leaves the producer running without them (logged)."""
        cloudwatch = self.settings.metrics
        if cloudwatch is None or cloudwatch.level == "NONE":
            return
        assert self._recorder is not None
        assert self._buffer is not None
        clients = self._clients
        if cloudwatch.endpoint_url is not None:
            clients = ClientFactory(replace(clients.settings, endpoint_url=cloudwatch.endpoint_url))
        try:
            client = await self._exit.enter_async_context(clients.cloudwatch())
        except Exception as exc:
            log.warning("no CloudWatch metrics: the client cannot be opened (%s)", exc)
            return
        buffer = self._buffer
        publisher = CloudWatchPublisher(
            cloudwatch, cloudwatch.namespace or KPL_NAMESPACE, cloudwatch_put(client)
        )
        self._kpl = KplMetrics(
            publisher,
            self._recorder,
            stream_name=stream_name_of(self.stream),
            pending=lambda: buffer.records,
        )
        self._kpl_task = asyncio.get_running_loop().create_task(
            publisher.run(), name="shardflow-producer-cloudwatch"
        )

    async def _stop_cloudwatch(self) -> None:
        """Stop the background sends; send the last interval (at most FINAL_FLUSH_TIMEOUT)."""
        task, kpl = self._kpl_task, self._kpl
        if task is None or kpl is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        try:
            await asyncio.wait_for(kpl.publisher.flush(), FINAL_FLUSH_TIMEOUT)
        except TimeoutError:
            log.warning(
                "the last CloudWatch metrics were not sent within %g s", FINAL_FLUSH_TIMEOUT
            )
        kpl.publisher.put = None

    def metrics(self, timeout: float | None = 5.0) -> ProducerMetricsSnapshot:
        """Everything measured since start (a consistent copy), from any thread: taken on the
        producer's event loop. Raises TimeoutError if the loop does not answer in ``timeout``."""
        recorder = self._recorder
        if recorder is None:
            raise ProducerError("start the producer first")
        return on_loop(self._loop, recorder.snapshot, timeout)

    def _metrics_as_is(self) -> ProducerMetricsSnapshot:
        """The snapshot read from this thread without the loop (its thread has ended)."""
        if self._recorder is None:
            raise ProducerError("start the producer first")
        return self._recorder.snapshot()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the producer runs on (None before start)."""
        return self._loop

    async def _report_metrics(self) -> None:
        while True:
            await asyncio.sleep(self.settings.metrics_interval)
            self._deliver_metrics()

    def _deliver_metrics(self) -> None:
        if self._on_metrics is None or self._recorder is None:
            return
        try:
            self._on_metrics(self._recorder.interval_snapshot())
        except Exception:
            log.exception("the metrics callback of the producer of %s failed", self.stream)

    def predict_shard(self, partition_key: str, explicit_hash_key: str | None = None) -> str | None:
        """The open shard the producer currently predicts for a key (None: no shard known)."""
        if self._router is None:
            raise ProducerError("start the producer first")
        _, _, hash_key = prepare(b"", partition_key, explicit_hash_key, self._max_record_bytes)
        return self._router.shard_id_for(hash_key) or None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running" if self._engine else "new"
        return f"Producer(stream={self.stream!r}, {state})"


def _aggregate_builder() -> Callable[[int], Builder]:
    # Imported on demand: the protobuf schema costs start-up time producers without
    # aggregation need not pay.
    from shardflow.aggregation import AggregateBuilder

    # This producer sends records that land outside their shard's range again (outcomes.py);
    # the mark tells shardflow's consumer to skip those copies.
    return partial(AggregateBuilder, resends_out_of_range=True)
