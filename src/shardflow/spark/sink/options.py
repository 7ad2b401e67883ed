"""The sink's options: where to write and how the producer on each task behaves.

=====================  =========  =========================================================
option                 default    meaning
=====================  =========  =========================================================
streamName/streamARN   required   the stream written to
region, endpointUrl    SDK's      where the stream is
aggregate              false      pack records into KPL aggregates (fewer, fuller requests)
preserveKeyOrder       false      keep each partition key's rows in order, even across retries
maxAttempts            10         PutRecords attempts per record before the task fails
recordTtl              120        seconds a failing record is retried before the task fails
linger                 0.05       seconds a record waits for its request to fill
maxConcurrentRequests  16         PutRecords calls in flight per task
shardRecordsPerSecond  1000       records/s a task's producer sends to one shard at most
shardBytesPerSecond    1048576    bytes/s a task's producer sends to one shard at most
flushTimeout           600        seconds a task waits for its last results before failing
=====================  =========  =========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from shardflow.errors import SparkOptionError
from shardflow.producer import ProducerSettings
from shardflow.spark.connection import CONNECTION_OPTIONS, StreamConnection, stream_connection
from shardflow.spark.option_values import flag, number, reject_unknown, whole_number

DEFAULT_FLUSH_TIMEOUT = 600.0

SINK_OPTIONS = (
    *CONNECTION_OPTIONS,
    "aggregate",
    "preserveKeyOrder",
    "maxAttempts",
    "recordTtl",
    "linger",
    "maxConcurrentRequests",
    "shardRecordsPerSecond",
    "shardBytesPerSecond",
    "flushTimeout",
)
"""Every option the sink reads; any other is refused (a typo would be ignored otherwise)."""
# What Spark passes to every streaming sink along with the user's options.
_SPARK_ADDS = ("checkpointLocation", "queryName")


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Everything a write task needs, picklable (it travels to the executors)."""

    connection: StreamConnection
    producer: ProducerSettings
    flush_timeout: float

    @property
    def stream(self) -> str:
        """What the producer is given: the ARN when there is one, else the name."""
        stream = self.connection.stream_arn or self.connection.stream_name
        assert stream is not None
        return stream


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Parse Spark's options; raises :class:`SparkOptionError` naming a bad one."""
    reject_unknown(options, SINK_OPTIONS, where="sink", spark_adds=_SPARK_ADDS)
    settings = ProducerSettings()
    changes: dict[str, object] = {}
    flag_options = {"aggregate": "aggregate", "preserveKeyOrder": "preserve_key_order"}
    for option, field in flag_options.items():
        given = flag(options, option)
        if given is not None:
            changes[field] = given
    attempts = whole_number(options, "maxAttempts")
    if attempts is not None:
        changes["retry"] = replace(settings.retry, max_attempts=attempts)
    ttl = number(options, "recordTtl", unit=" of seconds", finite=True)
    if ttl is not None:
        changes["record_ttl"] = ttl
    linger = number(options, "linger", unit=" of seconds", allow_zero=True, finite=True)
    if linger is not None:
        changes["linger"] = linger
    concurrency = whole_number(options, "maxConcurrentRequests")
    if concurrency is not None:
        changes["max_concurrent_requests"] = concurrency
    rate_options = {
        "shardRecordsPerSecond": "shard_records_per_second",
        "shardBytesPerSecond": "shard_bytes_per_second",
    }
    for option, field in rate_options.items():
        rate = number(options, option, unit=" per second")
        if rate is not None:
            changes[field] = rate
    flush_timeout = number(options, "flushTimeout", unit=" of seconds", finite=True)
    try:
        producer = replace(settings, **changes)  # type: ignore[arg-type]
    except ValueError as exc:  # a combination the producer refuses
        raise SparkOptionError("producer settings", str(exc)) from exc
    return SinkOptions(
        connection=stream_connection(options),
        producer=producer,
        flush_timeout=DEFAULT_FLUSH_TIMEOUT if flush_timeout is None else flush_timeout,
    )
