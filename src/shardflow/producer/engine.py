"""The producer's moving part: one background task that sends, and one task per request.

Accepted records go to the lane of their predicted shard (:meth:`Engine.add`). The pump task
sleeps until a request is worth sending (a full request is ready, the oldest record has
lingered, a flush or close is waiting, a paused or rate-limited lane may go again), sends as
many requests as the concurrency limits allow, and sleeps again: there is no polling. Each
request runs in its own task, which hands every record a result or puts it back at the head
of its lane for a retry after a jittered pause.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from collections.abc import Callable
from typing import Any, Final

from shardflow.aws import classify
from shardflow.aws.kinesis import stream_ref
from shardflow.producer.batching import Builder, Lane, Pending, Request, RequestAssembler
from shardflow.producer.buffer import RecordBuffer
from shardflow.producer.metrics import MetricsRecorder
from shardflow.producer.outcomes import Outcomes
from shardflow.producer.ratelimit import ShardRateLimiter
from shardflow.producer.settings import ProducerSettings
from shardflow.producer.shard_router import ShardRouter

log = logging.getLogger("shardflow.producer")

_INF: Final = float("inf")


class Engine:
    """Routes accepted records to lanes, sends PutRecords requests, settles their results."""

    def __init__(
        self,
        *,
        kinesis: Any,
        stream: str,
        settings: ProducerSettings,
        router: ShardRouter,
        buffer: RecordBuffer,
        metrics: MetricsRecorder,
        builder_factory: Callable[[int], Builder] | None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._kinesis = kinesis
        self._stream = stream
        self._stream_params = stream_ref(stream)
        self._settings = settings
        self._router = router
        self._buffer = buffer
        self._metrics = metrics
        self._linger = settings.linger
        self._max_request_records = settings.max_request_records
        self._max_request_bytes = settings.max_request_bytes
        self._key_order = settings.preserve_key_order
        self._assembler = RequestAssembler(
            max_records=settings.max_request_records,
            max_bytes=settings.max_request_bytes,
            shard_concurrency=settings.shard_concurrency,
            key_order=settings.preserve_key_order,
            aggregation_max_bytes=settings.aggregation_max_bytes if settings.aggregate else None,
            builder_factory=builder_factory,
        )
        self._lanes: dict[str, Lane] = {}
        # Lanes of shards that closed while requests of theirs were in flight.
        self._retired: list[Lane] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests_in_flight = 0
        # Waking the pump: it sleeps on _waiter until _sleep_until (inf: until woken; -inf: it
        # is awake, and looks at every lane before it sleeps again).
        self._waiter: asyncio.Future[None] | None = None
        self._sleep_until = -_INF
        self._added_since_wake = 0
        self._bytes_since_wake = 0
        self._reroute_pending = False
        self._stopping = False
        self._aborted = False
        self._pump_task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        self._outcomes = Outcomes(
            stream=stream,
            settings=settings,
            router=router,
            buffer=buffer,
            metrics=metrics,
            lane_for=self._lane_for,
        )

    # --- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._pump_task = self._loop.create_task(self._pump(), name="shardflow-producer-pump")

    async def stop(self) -> None:
        """Send everything without lingering and return once every record has its result."""
        self._stopping = True
        self.wake()
        if self._pump_task is None:
            return
        try:
            await asyncio.shield(self._pump_task)
        except asyncio.CancelledError:
            if not (self._aborted and self._pump_task.cancelled()):
                raise

    async def abort(self) -> None:
        """Stop at once: requests in flight are cancelled, records without a result fail."""
        self._stopping = True
        self._aborted = True
        tasks = list(self._tasks)
        if self._pump_task is not None:
            tasks.append(self._pump_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._outcomes.retries_allowed = False
        self._outcomes.fail_queued(
            [*self._lanes.values(), *self._retired],
            "ProducerAborted",
            "the producer was aborted before the record was sent",
        )

    def on_map_change(self) -> None:
        """The router found new open shards: records of vanished shards move at the next turn."""
        self._reroute_pending = True
        self.wake()

    def wake(self) -> None:
        self._sleep_until = -_INF
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- accepting ---------------------------------------------------------------------------

    def add(self, record: Pending) -> None:
        """Queue an accepted record on the lane of its predicted shard."""
        router = self._router
        hash_key = record.hash_key
        i = bisect_right(router.starts, hash_key) - 1
        shard_id = router.ids[i] if i >= 0 and hash_key <= router.ends[i] else ""
        lane = self._lanes.get(shard_id)
        if lane is None:
            lane = self._open_lane(shard_id)
        # (Lane.append, inlined: this runs once per record)
        record.lane = lane
        lane.queue.append(record)
        size = record.size
        lane.queued_bytes += size
        if not shard_id:
            router.request_refresh(record.accepted_at)
        if self._sleep_until == -_INF:
            return  # the pump is awake and will see this record before it sleeps again
        self._added_since_wake += 1
        self._bytes_since_wake += size
        # Wake the pump only when it would otherwise sleep past this record's linger, or when
        # a full request's worth arrived since it went to sleep: not once per record.
        if (
            self._sleep_until > record.accepted_at + self._linger
            or self._added_since_wake >= self._max_request_records
            or self._bytes_since_wake >= self._max_request_bytes
        ):
            self.wake()

    def _open_lane(self, shard_id: str) -> Lane:
        lane = Lane(shard_id, ShardRateLimiter(self._settings.rate, self._loop.time()))
        self._lanes[shard_id] = lane
        return lane

    def _lane_for(self, hash_key: int) -> Lane:
        shard_id = self._router.shard_id_for(hash_key)
        if not shard_id:
            self._router.request_refresh(self._loop.time())
        return self._lanes.get(shard_id) or self._open_lane(shard_id)

    # --- the pump ----------------------------------------------------------------------------

    async def _pump(self) -> None:
        loop = self._loop
        try:
            while True:
                if self._reroute_pending:
                    self._reroute()
                wake_at = self._dispatch(loop.time())
                if self._stopping and self._buffer.records == 0 and not self._requests_in_flight:
                    return
                await self._sleep(wake_at)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: fail loudly rather than leave records hanging
            log.exception("the producer's send loop of %s failed", self._stream)
            self.failure = exc
            self._outcomes.retries_allowed = False
            self._outcomes.fail_queued(
                [*self._lanes.values(), *self._retired],
                "InternalError",
                f"the producer's send loop failed: {exc!r}",
            )

    def _dispatch(self, now: float) -> float | None:
        """Send what may go now; the time to look again (None: when something finishes)."""
        if self._retired:
            self._retired = [lane for lane in self._retired if lane.in_flight]
            if self._retired and self._key_order:
                # Keys of a closed shard move to its children only after its requests finish,
                # or a retry there could land behind a newer record of the same key.
                return None
        force = self._stopping or self._buffer.flushing
        lanes = list(self._lanes.values())
        while self._requests_in_flight < self._settings.max_concurrent_requests:
            survey = self._assembler.survey(lanes, now, self._linger, force)
            if not survey.ready:
                return survey.wake_at
            request = self._assembler.assemble(survey.eligible, now, self._router.generation)
            if request is None:  # cannot happen for eligible lanes; never spin if it does
                return now + 0.01
            self._launch(request)
        return None

    async def _sleep(self, until: float | None) -> None:
        loop = self._loop
        waiter = loop.create_future()
        self._waiter = waiter
        self._added_since_wake = 0
        self._bytes_since_wake = 0
        handle = None
        if until is None:
            self._sleep_until = _INF
        else:
            self._sleep_until = until
            handle = loop.call_at(until, self.wake)
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def _reroute(self) -> None:
        """Move the records of lanes whose shard is no longer open to the lanes of the new map."""
        self._reroute_pending = False
        open_ids = {shard.shard_id for shard in self._router.shard_map.shards}
        gone = [lane for shard_id, lane in self._lanes.items() if shard_id not in open_ids]
        for lane in gone:
            del self._lanes[lane.shard_id]
            if lane.in_flight:
                self._retired.append(lane)
        for lane in gone:
            queued, lane.queue = list(lane.queue), type(lane.queue)()
            lane.queued_bytes = 0
            for record in queued:  # in order, so every key keeps its order in its new lane
                self._lane_for(record.hash_key).append(record)

    # --- one request -------------------------------------------------------------------------

    def _launch(self, request: Request) -> None:
        metrics = self._metrics
        metrics.put_records_calls += 1
        metrics.request_bytes.add(request.nbytes)
        metrics.request_records.add(len(request.payload))
        metrics.records_per_kinesis_record.add(
            request.user_records // len(request.payload), len(request.payload)
        )
        metrics.user_records_per_request.add(request.user_records)
        self._requests_in_flight += 1
        task = self._loop.create_task(self._send(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, request: Request) -> None:
        try:
            started = self._loop.time()
            try:
                async with asyncio.timeout(self._settings.request_timeout):
                    response = await self._kinesis.put_records(
                        Records=request.payload, **self._stream_params
                    )
                self._metrics.request_time.add(self._loop.time() - started)
            except asyncio.CancelledError:
                self._outcomes.settle_failures(
                    [
                        (member, "Cancelled", "the request was cancelled", False, None)
                        for member in request.members
                    ],
                    self._loop.time(),
                )
                raise
            except Exception as exc:
                self._outcomes.call_failed(
                    request, classify(exc, operation="PutRecords", stream=self._stream)
                )
            else:
                wrong_shard = self._outcomes.answered(request, response)
                if wrong_shard:
                    await self._outcomes.settle_wrong_shard(wrong_shard)
        finally:
            self._requests_in_flight -= 1
            for lane in request.lanes:
                lane.in_flight -= 1
            self._buffer.wake()
            self.wake()
