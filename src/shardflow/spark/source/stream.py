"""The driver side of ``spark.readStream.format("shardflow")``: offsets and partitions.

Per micro-batch Spark calls :meth:`latestOffset` (what the next batch reads), then
:meth:`partitions` (a task per ``shardsPerTask`` shards), then ``read`` on executors. The batch's start
positions come from the ends the previous batch recorded in the metadata store; a shard
joins once its parents are fully read (resharding keeps per-key order); shards are probed
so that no batch is planned when nothing is new.

Under Trigger.AvailableNow a shard is probed at most once per run: the records that count
arrived by the run's cutoff, so a shard the last batch read to its tip or to the cutoff (in
this run), or a probe found caught up, holds none still to read, and the trigger that ends the
run asks Kinesis nothing. The first plan of a busy stream probes a sample of its shards and
reads them all (:func:`~shardflow.spark.source.probe.probe_or_sample`).

Kinesis, S3 and DynamoDB have bad minutes. Every call is retried for a few seconds; when
planning a batch still fails with an error that passes (500s, throttling, a dropped
connection), the trigger plans no batch and the next trigger tries again, for up to
``_PLANNING_PATIENCE_S`` of failing in a row: an outage delays batches instead of failing the
query on the driver (where Spark retries nothing), while a lasting one still fails it. Under
Trigger.AvailableNow no batch planned means "done", so there the error fails the query.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from botocore.exceptions import BotoCoreError, ClientError
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from shardflow.aws.classify import classify
from shardflow.aws.kinesis import list_shards
from shardflow.backoff import Backoff
from shardflow.errors import AwsError, MetadataOutOfStepError, SourceMetadataError
from shardflow.fetch.registration import register_consumer
from shardflow.shards import HashKeyRange, ShardInfo
from shardflow.spark.source.admission import shard_budgets
from shardflow.spark.source.execute import read_partition
from shardflow.spark.source.lineage import parents_of, readable_shards
from shardflow.spark.source.metadata import ShardBatchEnd
from shardflow.spark.source.metadata_store import FIX_OUT_OF_STEP, BatchEndStore
from shardflow.spark.source.offsets import UNLIMITED, SourceOffset
from shardflow.spark.source.options import ConsumerType, SourceOptions, shards_per_task_for
from shardflow.spark.source.partition import BatchSlot, ShardPartition, tasks_of
from shardflow.spark.source.positions import LATEST, Kind, ShardPosition
from shardflow.spark.source.probe import ProbeIterators, probe_or_sample
from shardflow.spark.source.runtime import runner
from shardflow.spark.source.shard_read import ShardReadPlan
from shardflow.spark.source.stores import open_store

log = logging.getLogger("shardflow.spark.source")

# Batch ends kept behind the last committed batch (only the latest one or two are ever needed).
_KEPT_BATCHES = 10
# How long planning may keep failing with errors that pass before the query fails.
_PLANNING_PATIENCE_S = 300.0
# Pauses between listings of the shards for a batch already planned (see _ranges_of): the
# deadline bounds the tries, and half-jitter keeps drivers of many queries out of step.
_LIST_BACKOFF = Backoff(base=0.5, cap=10.0, max_attempts=None, jitter="half")


def now_ms() -> int:
    return int(time.time() * 1000)


def passes(error: BaseException) -> bool:
    """Whether ``error`` is one a later try may not meet: a retryable AWS error, or the
    metadata store's error about one."""
    if isinstance(error, AwsError):
        return error.retryable
    cause = error.__cause__
    if isinstance(error, SourceMetadataError) and isinstance(cause, ClientError | BotoCoreError):
        return classify(cause, operation="").retryable
    return False


class ShardflowStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Kinesis as a Structured Streaming source with deterministic, replayable micro-batches."""

    def __init__(self, options: SourceOptions) -> None:
        # Plain data only: Spark pickles this reader to run read() on executors.
        self.options = options
        self._cutoff_ms: int | None = None
        self._initial: dict[str, Any] | None = None
        self._listing: list[ShardInfo] | None = None
        self._listed_at = 0.0
        self._consumer_arn: str | None = None
        self._probe_iterators: ProbeIterators | None = None
        # Under AvailableNow: the shards a probe of this run found caught up, at that position.
        self._caught_up: dict[str, ShardPosition] = {}
        self._store_prepared = False
        # The ends read for the last planned batch: (run, batch) -> shard -> end.
        self._ends_seen: tuple[tuple[str, int], dict[str, ShardBatchEnd]] | None = None
        # Since when (monotonic) planning has failed with errors that pass; None: it has not.
        self._failing_since: float | None = None

    # --- offsets ---------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks twice for a new query's first batch (to plan it, then to read it): the
        # same answer both times, without listing the shards again.
        if self._initial is None:
            self._initial = self._first_offset()
        return self._initial

    def _first_offset(self) -> dict[str, Any]:
        listing = self._list(force=True)
        starting = self.options.starting
        moment = now_ms()
        shards: dict[str, ShardPosition] = {}
        for shard in listing:
            wanted = starting.for_shard(shard.shard_id)
            if wanted == LATEST:
                # LATEST pinned to the query's start, so a replayed first batch reads the same.
                wanted = (
                    ShardPosition.at_timestamp_ms(moment)
                    if shard.is_open
                    else ShardPosition.shard_end()
                )
            assert isinstance(wanted, ShardPosition)
            shards[shard.shard_id] = wanted
        offset = SourceOffset(run=uuid.uuid4().hex, batch=-1, shards=shards)
        log.info("shardflow source for %s starts with %d shards", self._label, len(shards))
        return offset.to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        # Records that arrive after this moment belong to the next run.
        self._cutoff_ms = now_ms()
        self._caught_up = {}
        log.info("AvailableNow: reading records that arrived by %d ms", self._cutoff_ms)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        try:
            latest = self._plan(start, limit)
        except Exception as error:
            if self._cutoff_ms is not None or not passes(error):
                raise
            return self._plan_nothing(start, error)
        self._failing_since = None
        return latest

    def _plan_nothing(self, start: dict[str, Any], error: Exception) -> dict[str, Any]:
        """No batch this trigger (the next one plans again), or ``error`` once planning has
        failed for longer than ``_PLANNING_PATIENCE_S``."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        failing = now - self._failing_since
        if failing >= _PLANNING_PATIENCE_S:
            raise error
        log.warning(
            "planning the next batch of %s failed (%s); no batch this trigger, the next one "
            "tries again (failing for %.0f s; the query fails after %.0f s)",
            self._label,
            error,
            failing,
            _PLANNING_PATIENCE_S,
        )
        return start

    def _plan(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        previous = SourceOffset.from_dict(start)
        positions, more, lost, ended = self._after(previous)
        listing = self._list(force=ended)
        listed = {shard.shard_id for shard in listing}
        for shard_id in sorted(listed - positions.keys()):
            positions[shard_id] = ShardPosition.trim_horizon()  # new since: read from its start
        for shard_id in sorted(positions.keys() - listed):
            if positions[shard_id].kind is not Kind.SHARD_END:
                log.warning(
                    "shard %s is gone from %s before it was read to its end", shard_id, self._label
                )
            del positions[shard_id]
        readable = readable_shards(positions, parents_of(listing))
        cutoff = self._cutoff_ms
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        known = [s for s in readable if s in more]
        done = self._read_out(previous, positions)
        probed = runner().run(
            probe_or_sample(
                self._kinesis(),
                self.options.stream,
                {s: positions[s] for s in readable if s not in more and s not in done},
                cutoff,
                self._iterators(),
                # A row limit shares its rows among the shards read: sampling would spread
                # them over shards that may hold nothing.
                sample=cutoff is not None and max_rows is None,
            )
        )
        if cutoff is not None:
            self._caught_up.update((s, positions[s]) for s in probed.caught_up)
        to_read = sorted({*known, *probed.to_read})
        if not to_read and not lost:
            return start
        budgets = shard_budgets(
            to_read,
            max_rows,
            self.options.max_records_per_shard_per_trigger,
            previous.batch + 1,
        )
        offset = SourceOffset(
            run=previous.run,
            batch=previous.batch + 1,
            shards=positions,
            read=budgets,
            until_ms=cutoff,
            data_loss_events=previous.data_loss_events + len(lost),
            # Shown in the query's progress (endOffset): an empty batch is planned for it if need be.
            data_lost=lost,
        )
        return offset.to_dict()

    def _after(
        self, previous: SourceOffset
    ) -> tuple[dict[str, ShardPosition], set[str], dict[str, str], bool]:
        """Where each shard stands after ``previous``'s batch: positions, the shards known to
        have more records, the shards that lost data (and what), and whether any shard ended."""
        positions = dict(previous.shards)
        more: set[str] = set()
        lost: dict[str, str] = {}
        ended = False
        if previous.batch < 0:
            return positions, more, lost, ended
        for shard_id, end in self._ends_of(previous).items():
            positions[shard_id] = end.position
            if end.stopped == "budget":
                more.add(shard_id)
            if end.shard_ended:
                ended = True
            if end.lost is not None:
                lost[shard_id] = (
                    f"after {end.lost.after}, resumed at {end.lost.resumed_at or 'the oldest record'}"
                )
                log.warning(
                    "batch %d lost records of shard %s of %s: after %s, resumed at %s",
                    previous.batch,
                    shard_id,
                    self._label,
                    end.lost.after,
                    end.lost.resumed_at or "the oldest record",
                )
        return positions, more, lost, ended

    def _read_out(self, previous: SourceOffset, positions: Mapping[str, ShardPosition]) -> set[str]:
        """Under AvailableNow, the shards with nothing left that arrived by the cutoff: those
        the previous batch of this run read to the tip or to the cutoff (it ran after the
        cutoff was fixed), and those a probe of this run found caught up where they stand.
        A new run (a restarted query) has a new cutoff and probes them again."""
        cutoff = self._cutoff_ms
        if cutoff is None:
            return set()
        done = {s for s, at in self._caught_up.items() if positions.get(s) == at}
        if previous.batch >= 0 and previous.until_ms == cutoff:
            done.update(
                shard_id
                for shard_id, end in self._ends_of(previous).items()
                if end.stopped in ("tip", "cutoff")
            )
        return done

    def _ends_of(self, offset: SourceOffset) -> dict[str, ShardBatchEnd]:
        """The recorded ends of ``offset``'s batch for every shard it read (cached per batch)."""
        key = (offset.run, offset.batch)
        if self._ends_seen is None or self._ends_seen[0] != key:
            store = self._store(offset.run)
            ends = store.require_many(offset.batch, sorted(offset.read))
            self._ends_seen = (key, ends)
        return self._ends_seen[1]

    def _check_in_step(self, previous: SourceOffset, offset: SourceOffset) -> None:
        """Fail unless ``offset`` starts every shard where ``previous``'s batch recorded its end.

        After a restart Spark plans a logged batch from the checkpoint alone; a metadataPath
        that lost, or never had, the previous batch's ends would otherwise go unnoticed.
        """
        if previous.batch < 0 or previous.run != offset.run:
            return
        for shard_id, recorded in self._ends_of(previous).items():
            planned = offset.shards.get(shard_id)
            if planned is not None and planned != recorded.position:
                raise MetadataOutOfStepError(
                    f"the checkpoint starts shard {shard_id} at {planned} in batch "
                    f"{offset.batch}, but batch {previous.batch} recorded its end at "
                    f"{recorded.end} under {self._store(offset.run).where}. " + FIX_OUT_OF_STEP
                )

    # --- planning --------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        offset = SourceOffset.from_dict(end)
        self._check_in_step(SourceOffset.from_dict(start), offset)
        metadata = self.options.metadata
        assert metadata is not None
        slot = BatchSlot(metadata, offset.run, offset.batch)
        consumer_arn = self._efo_consumer_arn()
        ranges = self._ranges_of(offset.read.keys())
        aws = self.options.connection.aws_settings()
        plans = [
            ShardReadPlan(
                stream=self.options.stream,
                stream_label=self._label,
                shard_id=shard_id,
                start=offset.shards[shard_id],
                budget=None if budget == UNLIMITED else budget,
                cutoff_ms=offset.until_ms,
                deaggregate=self.options.deaggregate,
                fail_on_data_loss=self.options.fail_on_data_loss,
                consumer_arn=consumer_arn,
                hash_range=ranges.get(shard_id),
            )
            for shard_id, budget in sorted(offset.read.items())
        ]
        # Shards grouped into tasks: which task reads a shard changes nothing of what it reads
        # (its start, budget and recorded end are its own), so a replay may group otherwise.
        return [
            ShardPartition(group, aws, slot)
            for group in tasks_of(
                plans, shards_per_task_for(len(plans), self.options.shards_per_task)
            )
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ShardPartition)
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        offset = SourceOffset.from_dict(end)
        if offset.batch <= _KEPT_BATCHES:
            return
        try:
            self._store(offset.run).forget_before(offset.batch - _KEPT_BATCHES)
        except SourceMetadataError as error:
            # Housekeeping: the next commit forgets everything older too.
            if not passes(error):
                raise
            log.warning("old batch ends of %s stay until the next commit: %s", self._label, error)

    def stop(self) -> None:
        """Nothing to release: clients belong to the thread's runner (Spark may not call this)."""

    # --- helpers ---------------------------------------------------------------------------

    @property
    def _label(self) -> str:
        return self.options.connection.stream_label

    def _store(self, run_id: str) -> BatchEndStore:
        metadata = self.options.metadata
        assert metadata is not None
        store = open_store(metadata, run_id)
        if not self._store_prepared:
            store.prepare()  # the bucket exists, the table is there (created if missing)
            self._store_prepared = True
        return store

    def _kinesis(self) -> Any:
        return runner().kinesis(self.options.connection.aws_settings())

    def _list(self, *, force: bool) -> list[ShardInfo]:
        due = time.monotonic() - self._listed_at >= self.options.shard_sync_interval_s
        if self._listing is None or force or due:
            self._listing = runner().run(list_shards(self._kinesis(), self.options.stream))
            self._listed_at = time.monotonic()
        return self._listing

    def _ranges_of(self, shard_ids: Iterable[str]) -> Mapping[str, HashKeyRange | None]:
        """The hash-key ranges of a planned batch's shards. A shard's range never changes, so
        the listing held serves when it names them all; else (a driver started again replays
        its last batch before it plans one) the shards are listed, and through errors that
        pass for up to ``_PLANNING_PATIENCE_S``: the batch is planned already, this call
        cannot plan none instead, and Spark retries nothing here (a 20 s Kinesis brownout
        failed the query, found by ``bench/chaos_spark.py``)."""
        wanted = set(shard_ids)
        if self._listing is not None:
            held = {shard.shard_id: shard.hash_range for shard in self._listing}
            if held.keys() >= wanted:
                return held
        deadline = time.monotonic() + _PLANNING_PATIENCE_S
        attempt = 0
        while True:
            try:
                listing = self._list(force=True)
                return {shard.shard_id: shard.hash_range for shard in listing}
            except Exception as error:
                pause = _LIST_BACKOFF.delay(attempt)
                if not passes(error) or time.monotonic() + pause > deadline:
                    raise
                log.warning(
                    "listing the shards of %s for a planned batch failed (%s); again in %.1f s",
                    self._label,
                    error,
                    pause,
                )
            time.sleep(pause)
            attempt += 1

    def _iterators(self) -> ProbeIterators:
        # Made on first use on the driver: the reader Spark pickles for executors has none.
        if self._probe_iterators is None:
            self._probe_iterators = ProbeIterators()
        return self._probe_iterators

    def _efo_consumer_arn(self) -> str | None:
        options = self.options
        if options.consumer_type is not ConsumerType.EFO:
            return None
        if self._consumer_arn is None:
            assert options.consumer_name is not None
            consumer = runner().run(
                register_consumer(self._kinesis(), options.stream, options.consumer_name)
            )
            self._consumer_arn = consumer.arn
        return self._consumer_arn


def stream_reader_for(options: Mapping[str, str]) -> ShardflowStreamReader:
    from shardflow.spark.source.options import parse_options

    return ShardflowStreamReader(parse_options(options, streaming=True))
