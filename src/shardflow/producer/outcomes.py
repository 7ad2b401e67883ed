"""What becomes of each record once its PutRecords call is answered: a result, a retry, an error.

Every accepted record ends here exactly once with a :class:`PutResult` or a
:class:`~shardflow.errors.RecordDeliveryError`. Failures that may pass (throttling, 5xx,
timeouts, dropped connections, a record that landed outside its aggregate's shard) go back to
the head of their lane, after a jittered pause, while the attempt budget and deadline allow;
the others fail at once with the typed AWS error as the cause.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

from shardflow.aws import error_class_for_code, redact
from shardflow.errors import AwsError, RecordDeliveryError, ThrottledError, TransientError
from shardflow.metrics.recording import KEPT_BITS, SMALL_VALUES
from shardflow.producer.batching import Aggregate, Lane, Pending, Request
from shardflow.producer.buffer import RecordBuffer
from shardflow.producer.metrics import MetricsRecorder
from shardflow.producer.results import PutResult
from shardflow.producer.settings import ProducerSettings
from shardflow.producer.shard_router import ShardRouter

log = logging.getLogger("shardflow.producer")

THROTTLED_CODE: Final = "ProvisionedThroughputExceededException"
WRONG_SHARD_CODE: Final = "WrongShard"

# (what failed, error code, message, retryable, the typed error if the whole call failed)
Failure = tuple[Pending | Aggregate, str, str, bool, AwsError | None]
# An aggregate written to another shard than predicted, with that shard and sequence number.
WrongShard = tuple[Aggregate, str, str]

# PutResult's fields given in full, without the Python frame of the named tuple's __new__:
# one result is built per record.
_new_result = tuple.__new__


class Outcomes:
    """Settles records from PutRecords answers; ``lane_for`` finds a retry's lane."""

    def __init__(
        self,
        *,
        stream: str,
        settings: ProducerSettings,
        router: ShardRouter,
        buffer: RecordBuffer,
        metrics: MetricsRecorder,
        lane_for: Callable[[int], Lane],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._stream = stream
        self._settings = settings
        self._router = router
        self._buffer = buffer
        self._metrics = metrics
        self._lane_for = lane_for
        self._retryable_codes: dict[str, bool] = {}
        self.retries_allowed = True  # False once the producer cannot send any more

    def call_failed(self, request: Request, error: AwsError) -> None:
        now = self._loop.time()
        self._metrics.put_records_calls_failed += 1
        if isinstance(error, ThrottledError):
            for lane in request.lanes:
                lane.limiter.on_throttled(request.sent_at, now)
        code = error.code or type(error).__name__
        log.debug("PutRecords to %s failed: %s", self._stream, error)
        self.settle_failures(
            [(member, code, str(error), error.retryable, error) for member in request.members], now
        )

    def answered(self, request: Request, response: dict[str, Any]) -> list[WrongShard]:
        """Settle a PutRecords answer; returns aggregates that landed on an unexpected shard."""
        results = response.get("Records") or []
        members = request.members
        if len(results) != len(members):
            self.call_failed(
                request,
                TransientError(
                    f"PutRecords answered {len(results)} results for {len(members)} records",
                    operation="PutRecords",
                    code="RecordCountMismatch",
                    stream=self._stream,
                ),
            )
            return []
        now = self._loop.time()
        metrics = self._metrics
        latency = metrics.latency.counts  # whole microseconds, see shardflow.metrics.recording
        attempts_tally = metrics.attempts.counts
        failures: list[Failure] = []
        throttled: set[Lane] = set()
        wrong_shard: list[WrongShard] = []
        stale = False
        delivered = 0
        delivered_bytes = 0
        first_tries = 0
        # This loop runs once per record at hundreds of thousands of records per second: what
        # Outcomes.succeed and RecordBuffer.release do is written out here, and counts that
        # are the same for many records (first attempts, the buffer's totals) are added once.
        for member, result in zip(members, results, strict=True):
            sequence_number = result.get("SequenceNumber")
            if not sequence_number:
                code = result.get("ErrorCode") or ""
                if code == THROTTLED_CODE:
                    throttled.add(_lane_of(member))
                # An entry with neither a sequence number nor an error code: treat as transient.
                retryable = self._retryable(code) if code else True
                message = result.get("ErrorMessage") or code or "no sequence number returned"
                failures.append(_failure(member, code or "UnknownError", message, retryable))
                continue
            shard_id = result.get("ShardId", "")
            group: tuple[Pending] | list[Pending]
            if type(member) is Pending:
                group = (member,)
                aggregated = False
                lane = member.lane
                if lane is None or shard_id != lane.shard_id:
                    stale = True
            else:
                assert isinstance(member, Aggregate)
                if shard_id != member.lane.shard_id:
                    stale = True
                    wrong_shard.append((member, shard_id, sequence_number))
                    continue
                group = member.records
                aggregated = True
            index = 0
            for record in group:
                attempts = record.attempts + 1
                target = record if record.sink is None else record.sink
                if not target.done():
                    target.set_result(
                        _new_result(
                            PutResult, (shard_id, sequence_number, attempts, index, aggregated)
                        )
                    )
                index += 1
                record.data = b""
                record.epoch.pending -= 1
                delivered_bytes += record.size
                micros = int((now - record.accepted_at) * 1_000_000)
                if micros >= SMALL_VALUES:
                    shift = micros.bit_length() - KEPT_BITS
                    micros = (micros >> shift) << shift
                latency[micros] = latency.get(micros, 0) + 1
                if attempts == 1:
                    first_tries += 1
                else:
                    attempts_tally[attempts] = attempts_tally.get(attempts, 0) + 1
            delivered += index
        if first_tries:
            attempts_tally[1] = attempts_tally.get(1, 0) + first_tries
        self._buffer.released(delivered, delivered_bytes)
        metrics.records_succeeded += delivered
        metrics.bytes_succeeded += delivered_bytes
        metrics.entries_succeeded += len(members) - len(failures)
        metrics.entries_failed += len(failures)
        for lane in request.lanes:
            if lane in throttled:
                lane.limiter.on_throttled(request.sent_at, now)
            else:
                lane.limiter.on_success(now)
        if throttled:
            metrics.entries_throttled += sum(1 for f in failures if f[1] == THROTTLED_CODE)
        if stale:
            log.debug("records of %s landed on unpredicted shards; refreshing", self._stream)
            self._router.request_refresh(now)
        if failures:
            self.settle_failures(failures, now)
        return wrong_shard

    async def settle_wrong_shard(self, wrong_shard: list[WrongShard]) -> None:
        """Aggregates that landed on another shard than predicted (the stream was resharded).

        A consumer (the KCL) drops user records of an aggregate whose hash key lies outside
        the shard's range, so those are sent again once the new shard map is known; the others
        were delivered. The aggregates carry the re-send mark (``AggregateBuilder``'s
        ``resends_out_of_range``), so shardflow's consumer skips the out-of-range copies
        instead of handling those records twice.
        """
        cancelled = False
        try:
            await asyncio.shield(self._router.request_refresh(self._loop.time()))
        except asyncio.CancelledError:
            cancelled = True  # settle below as far as we can tell, then stop
        now = self._loop.time()
        failures: list[Failure] = []
        for aggregate, shard_id, sequence_number in wrong_shard:
            shard = self._router.shards_by_id.get(shard_id)
            for index, record in enumerate(aggregate.records):
                if cancelled or shard is None or record.hash_key in shard.hash_range:
                    self.succeed(
                        record,
                        PutResult(shard_id, sequence_number, record.attempts + 1, index, True),
                        now,
                    )
                else:
                    failures.append(
                        _failure(
                            record,
                            WRONG_SHARD_CODE,
                            f"aggregated record landed on {shard_id}, whose hash key range "
                            "does not cover this record",
                            True,
                        )
                    )
        if failures:
            self.settle_failures(failures, now)
        if cancelled:
            raise asyncio.CancelledError

    def succeed(self, record: Pending, result: PutResult, now: float) -> None:
        metrics = self._metrics
        record.settle(result)
        self._buffer.release(record.epoch, record.size)
        metrics.records_succeeded += 1
        metrics.bytes_succeeded += record.size
        metrics.latency.add(now - record.accepted_at)
        metrics.attempts.add(result.attempts)

    def settle_failures(self, failures: list[Failure], now: float) -> None:
        """Retry what may be retried (at the head of its lane, after a pause); fail the rest."""
        settings = self._settings
        policy = settings.retry
        ttl = settings.record_ttl
        retry: dict[Lane, list[Pending]] = {}
        pause_attempts: dict[Lane, int] = {}
        errors = self._metrics.errors_by_code
        for member, code, message, retryable, error in failures:
            # Once per Kinesis record and attempt, as the KPL counts ErrorsByCode.
            errors[code] = errors.get(code, 0) + 1
            records = [member] if type(member) is Pending else _records_of(member)
            for record in records:
                record.attempts += 1
                if (
                    retryable
                    and self.retries_allowed
                    and policy.allows(record.attempts)
                    and (ttl is None or now - record.accepted_at < ttl)
                ):
                    lane = self._lane_for(record.hash_key)
                    retry.setdefault(lane, []).append(record)
                    pause_attempts[lane] = max(pause_attempts.get(lane, 0), record.attempts)
                else:
                    self.fail(record, code, message, error)
        for lane, records in retry.items():
            lane.push_front(records)
            pause = policy.delay(pause_attempts[lane] - 1)
            lane.resume_at = max(lane.resume_at, now + pause)
            self._metrics.retries += len(records)

    def fail(self, record: Pending, code: str, message: str, error: AwsError | None) -> None:
        failure = RecordDeliveryError(
            f"record not delivered: {redact(message)}",
            code=code,
            attempts=record.attempts,
            stream=self._stream,
        )
        failure.__cause__ = error
        record.settle(failure)
        self._buffer.release(record.epoch, record.size)
        self._metrics.failed(code)
        self._metrics.attempts.add(max(record.attempts, 1))

    def fail_queued(self, lanes: list[Lane], code: str, message: str) -> None:
        """Fail every record still queued in ``lanes``."""
        for lane in lanes:
            while lane.queue:
                record = lane.queue.popleft()
                lane.queued_bytes -= record.size
                self.fail(record, code, message, None)
        self._buffer.wake()

    def _retryable(self, code: str) -> bool:
        known = self._retryable_codes.get(code)
        if known is None:
            known = self._retryable_codes[code] = error_class_for_code(code).retryable
        return known


def _failure(member: Pending | Aggregate, code: str, message: str, retryable: bool) -> Failure:
    return (member, code, message, retryable, None)


def _lane_of(member: Pending | Aggregate) -> Lane:
    lane = member.lane
    assert lane is not None
    return lane


def _records_of(member: Pending | Aggregate) -> list[Pending]:
    assert isinstance(member, Aggregate)
    return member.records
