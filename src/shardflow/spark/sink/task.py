"""One Spark task's write: its rows through the process's producer, every result in before it ends.

The task returns only once every record it put has been written (the producer flushed), so a
task that Spark counts as successful never leaves records behind. The producer is borrowed
from :mod:`shardflow.spark.sink.producers` and kept for the next task. A record the producer gives
up on fails the task with :class:`~shardflow.errors.SparkSinkWriteError` (Spark then retries
the task, or fails the job with that message); a retried task writes its rows again, so the
sink is at-least-once.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql.datasource import WriterCommitMessage

from shardflow.errors import ShardflowError, SparkSinkSchemaError, SparkSinkWriteError
from shardflow.producer import PutResult
from shardflow.spark.sink.columns import SinkColumns
from shardflow.spark.sink.options import SinkOptions
from shardflow.spark.sink.producers import borrowed_producer

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("shardflow.spark.sink")


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What one task wrote (picklable); Spark hands these to the driver's ``commit``."""

    records: int
    retried: int
    records_per_shard: dict[str, int] = field(default_factory=dict)
    producer: str = ""
    """The name of the producer the task wrote through (``host/pid#n``, see producers)."""


class _Outcomes:
    """Counts the records' results as they settle (on the producer's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.written = 0
        self.retried = 0
        self.per_shard: Counter[str] = Counter()
        self.failed = 0
        self.first_failure: BaseException | None = None

    def settle(self, future: concurrent.futures.Future[PutResult]) -> None:
        error = None if future.cancelled() else future.exception()
        with self._lock:
            if future.cancelled() or error is not None:
                self.failed += 1
                if self.first_failure is None:
                    self.first_failure = error or concurrent.futures.CancelledError()
                return
            result = future.result()
            self.written += 1
            self.retried += result.attempts > 1
            self.per_shard[result.shard_id] += 1

    def raise_if_failed(self, stream: str) -> None:
        with self._lock:
            failure, failed, written = self.first_failure, self.failed, self.written
        if failure is not None:
            raise SparkSinkWriteError(
                stream,
                f"{failed} record(s) could not be written ({written} were); first: {failure}",
                failed=failed,
                written=written,
            ) from failure


def write_rows(
    batches: Iterator[pa.RecordBatch], columns: SinkColumns, options: SinkOptions
) -> SinkCommitMessage:
    """Write every row of ``batches``; returns the counts once all of them are in Kinesis."""
    stream = options.stream
    outcomes = _Outcomes()
    rows_before = 0
    with borrowed_producer(options) as pooled:
        producer = pooled.producer
        put = producer.put
        settle = outcomes.settle
        for batch in batches:
            payloads, keys, hash_keys = _rows(batch, columns, stream, rows_before)
            for row, (data, key, hash_key) in enumerate(
                zip(payloads, keys, hash_keys, strict=True), start=rows_before
            ):
                try:
                    future = put(data, key, hash_key)
                except ShardflowError as exc:  # invalid record: too large, bad key
                    raise SparkSinkWriteError(
                        stream, f"row {row} of this task cannot be a Kinesis record: {exc}"
                    ) from exc
                future.add_done_callback(settle)
            rows_before += batch.num_rows
            # Stop early once the producer gave up on a record: the task fails anyway.
            outcomes.raise_if_failed(stream)
        # Every record of this task has its result before the task reports success.
        try:
            producer.flush(options.flush_timeout)
        except TimeoutError:
            raise SparkSinkWriteError(
                stream,
                f"records still had no result after flushTimeout={options.flush_timeout:g}s",
                written=outcomes.written,
            ) from None
        outcomes.raise_if_failed(stream)
    log.debug("task wrote %d records to %s", outcomes.written, stream)
    return SinkCommitMessage(
        records=outcomes.written,
        retried=outcomes.retried,
        records_per_shard=dict(outcomes.per_shard),
        producer=pooled.name,
    )


def _rows(
    batch: pa.RecordBatch, columns: SinkColumns, stream: str, first_row: int
) -> tuple[list[bytes | str], list[str], list[str | None]]:
    try:
        return columns.rows(batch, first_row)
    except SparkSinkSchemaError as exc:
        raise SparkSinkWriteError(stream, f"{exc} of this task") from exc
