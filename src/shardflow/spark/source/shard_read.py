"""Reading one shard for one Spark task: from a start position to a bound, in order.

A read either runs *fresh* (stops at the tip, at a row budget, at an arrival-time cutoff or at
the shard's end, and says where it stopped) or *up to* a known end (a recorded micro-batch
end, or the end of a batch read), stopping exactly there. Both detect records that vanished
(past retention): a position naming a record is read AT that record, which must still be the
first one returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shardflow.errors import DataLossError, InvalidArgumentError, SourceMetadataError
from shardflow.fetch.batch import FetchedBatch
from shardflow.fetch.fanout import FanOut, FanOutFetcher
from shardflow.fetch.polling import GET_RECORDS_LIMIT, Polling, PollingFetcher
from shardflow.positions import StartPosition
from shardflow.read.intake import HashRangeRule
from shardflow.records import Record
from shardflow.shards import HashKeyRange
from shardflow.spark.source.metadata import DataLoss, ShardBatchEnd, StopReason
from shardflow.spark.source.positions import Kind, ShardPosition
from shardflow.spark.source.rows import Rows

log = logging.getLogger("shardflow.spark.source")

# A read up to a recorded end that finds the shard caught up before reaching it polls again
# this many times (the records were there when the end was recorded) before giving up.
_MISSING_END_POLLS = 20
_MISSING_END_PAUSE = 0.2
# Loop turns given to a GetRecords call asked for ahead, for it to send its request before
# the current chunk is handed out (the event loop stands still while Spark takes the chunk).
_SEND_TURNS = 3


@dataclass(frozen=True, slots=True)
class ShardReadPlan:
    """What one task reads of one shard. Picklable: it travels inside an InputPartition.

    ``until`` makes the read stop exactly at a known end: ``AFTER:S`` includes every
    sub-record of record S, ``AFTER:S/k`` sub-records up to k, ``SHARD_END`` everything, and a
    position equal to ``start`` nothing. Without it the read is fresh and stops at the tip,
    after ``budget`` rows, before the first record that arrived after ``cutoff_ms``, or at the
    shard's end.

    ``hash_range`` is the shard's hash-key range: a sub-record outside it, in an aggregate whose
    producer (shardflow's) says it put such sub-records again on the right shard after a
    reshard, is skipped (its copy there is read), as the consumer does. A skipped sub-record is
    no row, but the read's end moves past it.
    """

    stream: str
    stream_label: str
    shard_id: str
    start: ShardPosition
    until: ShardPosition | None = None
    budget: int | None = None
    cutoff_ms: int | None = None
    deaggregate: bool = True
    fail_on_data_loss: bool = True
    consumer_arn: str | None = None
    hash_range: HashKeyRange | None = None


class _Fetcher(Protocol):
    def __aiter__(self) -> AsyncIterator[FetchedBatch]: ...


FetcherFactory = Callable[[StartPosition, int], Any]
"""Makes the fetcher of a plan's shard at a position, asking for at most n records a call."""


def fetcher_factory(plan: ShardReadPlan, kinesis: Any) -> FetcherFactory:
    """Polling (GetRecords) or, with a consumer ARN, enhanced fan-out (SubscribeToShard)."""
    if plan.consumer_arn is not None:
        arn = plan.consumer_arn
        return lambda start, _limit: FanOutFetcher(
            kinesis,
            plan.stream,
            plan.shard_id,
            start,
            consumer_arn=arn,
            settings=FanOut(denied_for=0.0),
        )
    return lambda start, limit: PollingFetcher(
        kinesis,
        plan.stream,
        plan.shard_id,
        start,
        # No idle wait: a task stops at the tip instead of waiting there. Access denied fails
        # the task at once: a consumer holding a lease waits for credentials to come back, but
        # here Spark reports the failure and retries the task (or the query) itself.
        Polling(max_records=limit, idle_time=0.0, denied_for=0.0),
    )


class ShardRead:
    """One read of a plan. Iterate :meth:`chunks`; afterwards :attr:`outcome` says how it ended."""

    def __init__(self, plan: ShardReadPlan, make_fetcher: FetcherFactory) -> None:
        self.plan = plan
        self._make_fetcher = make_fetcher
        self.outcome: ShardBatchEnd | None = None
        self._rows = 0
        self._skipped = 0
        self._range_rule = HashRangeRule(plan.hash_range)
        self._last: Record | None = None
        self._lost: DataLoss | None = None

    # --- the read --------------------------------------------------------------------------

    async def chunks(self) -> AsyncIterator[Rows]:
        """Rows in shard order, a chunk per fetched batch; empty chunks are not yielded."""
        plan = self.plan
        nothing_to_read = plan.until is not None and (
            plan.until == plan.start or plan.until.kind not in (Kind.AFTER, Kind.SHARD_END)
        )
        if plan.start.kind is Kind.SHARD_END or nothing_to_read:
            self.outcome = self._finish("until")
            return
        limit = min(GET_RECORDS_LIMIT, plan.budget or GET_RECORDS_LIMIT)
        fetcher = self._make_fetcher(plan.start.iterator_start(), limit)
        checked = not plan.start.names_record
        empty_tip_polls = 0
        polling = plan.consumer_arn is None
        ahead: asyncio.Task[FetchedBatch | None] | None = None
        try:
            while True:
                try:
                    if ahead is not None:
                        fetched, ahead = await ahead, None
                    else:
                        fetched = await _next(fetcher)
                    if fetched is None:
                        self.outcome = self._finish("end", ended=True)
                        return
                    batch = fetched
                except InvalidArgumentError:
                    if checked:
                        raise
                    # The emulator or service refuses a sequence number it no longer knows.
                    await _close(fetcher)
                    fetcher = self._make_fetcher(StartPosition.trim_horizon(), limit)
                    self._data_lost(None, refused=True)
                    checked = True
                    continue
                raw = batch.records
                if raw and self._lost is not None and self._lost.resumed_at is None:
                    self._lost = DataLoss(self._lost.after, raw[0].sequence_number)
                if not checked and (raw or batch.shard_ended or batch.caught_up):
                    checked = True
                    if not raw or raw[0].sequence_number != plan.start.sequence_number:
                        self._data_lost(raw[0] if raw else None)
                chunk, stop = self._take(raw)
                if (
                    polling
                    and checked
                    and stop is None
                    and not batch.shard_ended
                    and not _at_tip(batch, limit, polling=True)
                ):
                    # More is there and will be read: ask for it now, so that the service
                    # works on the next batch while this chunk becomes Arrow and goes to Spark.
                    ahead = asyncio.ensure_future(_next(fetcher))
                    for _ in range(_SEND_TURNS):
                        await asyncio.sleep(0)
                if chunk:
                    yield chunk
                if stop is not None:
                    self.outcome = self._finish(stop)
                    return
                if batch.shard_ended:
                    self.outcome = self._finish("end", ended=True)
                    return
                if plan.until is not None:
                    if _at_tip(batch, limit, polling=plan.consumer_arn is None):
                        empty_tip_polls += 1
                        if empty_tip_polls > _MISSING_END_POLLS:
                            raise SourceMetadataError(
                                f"shard {plan.shard_id}: the recorded end {plan.until} was not "
                                f"found after {self._last_text()}"
                            )
                        await asyncio.sleep(_MISSING_END_PAUSE)
                    continue
                if _at_tip(batch, limit, polling=plan.consumer_arn is None):
                    self.outcome = self._finish("tip")
                    return
        finally:
            if ahead is not None:
                ahead.cancel()  # a batch asked for ahead and not needed after all
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await ahead
            await _close(fetcher)

    def _take(self, raw: list[Record]) -> tuple[Rows, StopReason | None]:
        """The rows of one fetched batch to hand out, and why to stop after them if so."""
        plan = self.plan
        cut = at_start = False
        if plan.until is None and plan.cutoff_ms is not None:
            # Sub-records carry their aggregate's arrival time: the cutoff is found among the
            # Kinesis records, and those after it are not unpacked at all.
            cutoff_ms = plan.cutoff_ms
            for index, record in enumerate(raw):
                if _arrived_after(record, cutoff_ms):
                    # The start record, read again, is kept to be skipped; nothing after it.
                    at_start = index == 0 and _is_start(plan.start, record)
                    raw, cut = raw[: 1 if at_start else index], True
                    break
        rows = Rows()
        # Only records that look like KPL aggregates are unpacked (plain ones as they are).
        rows.extend(raw, unpack=plan.deaggregate)
        sequence_numbers, sub_sequence_numbers = rows.sequence_number, rows.sub_sequence_number
        count = len(rows)
        first = 0
        if plan.start.kind is Kind.AFTER:
            # Read AT the start record: its sub-records up to the start come first.
            skips = plan.start.skips
            while first < count and skips(sequence_numbers[first], sub_sequence_numbers[first]):
                first += 1
        if at_start:
            count = first
        resent = self._resent(rows, first, count)
        until, budget = plan.until, plan.budget
        stop: StopReason | None = None
        end = count  # the rows looked at are first .. end - 1
        if until is not None:
            for index in range(first, count):
                sequence, sub = sequence_numbers[index], sub_sequence_numbers[index]
                if _beyond(sequence, sub, until):
                    stop, end = "until", index
                    break
                if _reaches(sequence, sub, rows.last_sub_sequence_number[index], until):
                    stop, end = "until", index + 1
                    break
        elif budget is not None and self._rows + (count - first - len(resent)) >= budget:
            wanted = budget - self._rows
            for index in range(first, count):
                if index not in resent:
                    wanted -= 1
                    if wanted <= 0:
                        stop, end = "budget", index + 1
                        break
        looked_at = range(first, end)
        skipped = sum(1 for index in resent if index < end)
        taken = rows.select(looked_at if not skipped else [i for i in looked_at if i not in resent])
        if stop is None and cut:
            stop = "cutoff"
        self._rows += len(taken)
        self._skipped += skipped
        if end > first:
            self._last = rows.record(end - 1)
        return taken, stop

    def _resent(self, rows: Rows, first: int, count: int) -> set[int]:
        """Indexes of the sub-records to skip: outside the shard's hash-key range, in
        aggregates whose producer (shardflow's) put such sub-records again on the right shard
        (the read core's :class:`~shardflow.read.intake.HashRangeRule`, asked per row)."""
        marked = rows.resent_if_out_of_range
        if self.plan.hash_range is None or not any(marked[first:count]):
            return set()
        inside = self._range_rule.inside
        keys, explicit_keys = rows.partition_key, rows.explicit_hash_key
        # Usually every key lies inside the range (the producer aggregated per shard): asked
        # once per distinct key instead of once per row (a tenth of a task of small
        # aggregated records went to asking per row).
        if not any(explicit_keys[first:count]) and all(
            inside(key, None) for key in set(keys[first:count])
        ):
            return set()
        return {
            index
            for index in range(first, count)
            if marked[index] and not inside(keys[index], explicit_keys[index])
        }

    # --- endings ---------------------------------------------------------------------------

    def _finish(self, stopped: StopReason, *, ended: bool = False) -> ShardBatchEnd:
        plan = self.plan
        if ended:
            end = ShardPosition.shard_end()
        elif self._last is not None:
            last = self._last
            whole = (
                last.sub_sequence_number >= last.last_sub_sequence_number or not plan.deaggregate
            )
            end = ShardPosition.after(
                last.sequence_number, None if whole else last.sub_sequence_number
            )
        elif self._lost is not None and self._lost.resumed_at is None:
            # Everything after the start is gone and nothing newer came: start over at the oldest.
            end = ShardPosition.trim_horizon()
        else:
            end = plan.start
        if self._skipped:
            log.info(
                "shard %s of %s: skipped %d sub-record(s) outside the shard's hash-key range that "
                "their producer put again on the right shard (after a reshard)",
                plan.shard_id,
                plan.stream_label,
                self._skipped,
            )
        return ShardBatchEnd(
            end=end.to_text(),
            rows=self._rows,
            stopped=stopped,
            lost=self._lost,
            start=plan.start.to_text(),
        )

    def _data_lost(self, first: Record | None, *, refused: bool = False) -> None:
        plan = self.plan
        resumed_at = None if first is None else first.sequence_number
        if plan.fail_on_data_loss:
            raise DataLossError(
                stream=plan.stream_label,
                shard_id=plan.shard_id,
                after=str(plan.start),
                resumed_at=resumed_at,
            )
        log.warning(
            "data loss on shard %s of %s: %s is gone%s; skipping ahead to %s (failOnDataLoss=false)",
            plan.shard_id,
            plan.stream_label,
            plan.start,
            " (sequence number refused)" if refused else "",
            resumed_at or "the oldest record left",
        )
        self._lost = DataLoss(after=str(plan.start), resumed_at=resumed_at)

    def _last_text(self) -> str:
        last = self._last
        if last is None:
            return str(self.plan.start)
        return f"{last.sequence_number}/{last.sub_sequence_number}"


async def _next(fetcher: Any) -> FetchedBatch | None:
    """The fetcher's next batch, None once it has no more (the shard ended)."""
    try:
        batch: FetchedBatch = await anext(aiter(fetcher))
    except StopAsyncIteration:
        return None
    return batch


def _at_tip(batch: FetchedBatch, limit: int, *, polling: bool) -> bool:
    """Whether this batch shows the shard caught up: an empty batch at the tip, or (GetRecords)
    fewer records than asked for with nothing behind them."""
    if batch.caught_up:
        return True
    if batch.millis_behind_latest != 0:
        return False
    return not polling or len(batch.records) < limit


def _beyond(sequence_number: str, sub_sequence_number: int, until: ShardPosition) -> bool:
    """Whether the row at this position lies past ``until``."""
    if until.kind is Kind.SHARD_END or until.sequence_number is None:
        return False
    seq, bound = int(sequence_number), int(until.sequence_number)
    if seq != bound:
        return seq > bound
    return until.sub_sequence_number is not None and sub_sequence_number > until.sub_sequence_number


def _reaches(
    sequence_number: str, sub_sequence_number: int, last_sub: int, until: ShardPosition
) -> bool:
    """Whether the row at this position (``last_sub``: its aggregate's last) is ``until``."""
    if until.kind is Kind.SHARD_END or sequence_number != until.sequence_number:
        return False
    if until.sub_sequence_number is not None:
        return sub_sequence_number >= until.sub_sequence_number
    return sub_sequence_number >= last_sub


def _is_start(start: ShardPosition, record: Record) -> bool:
    """Whether ``record`` is the one an AFTER start names (read again, then skipped)."""
    return start.kind is Kind.AFTER and record.sequence_number == start.sequence_number


def _arrived_after(record: Record, cutoff_ms: int) -> bool:
    arrived = record.approximate_arrival_timestamp
    return arrived is not None and arrived.timestamp() * 1000 > cutoff_ms


async def _close(fetcher: Any) -> None:
    close = getattr(fetcher, "aclose", None)
    if close is not None:
        await close()
