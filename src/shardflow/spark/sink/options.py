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
from shardflow.spark.connection import StreamConnection, lookup, stream_connection

DEFAULT_FLUSH_TIMEOUT = 600.0
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


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
    settings = ProducerSettings()
    changes: dict[str, object] = {}
    flag_options = {"aggregate": "aggregate", "preserveKeyOrder": "preserve_key_order"}
    for option, field in flag_options.items():
        flag = _flag(options, option)
        if flag is not None:
            changes[field] = flag
    attempts = _int(options, "maxAttempts")
    if attempts is not None:
        changes["retry"] = replace(settings.retry, max_attempts=attempts)
    ttl = _seconds(options, "recordTtl")
    if ttl is not None:
        changes["record_ttl"] = ttl
    linger = _seconds(options, "linger", allow_zero=True)
    if linger is not None:
        changes["linger"] = linger
    concurrency = _int(options, "maxConcurrentRequests")
    if concurrency is not None:
        changes["max_concurrent_requests"] = concurrency
    rate_options = {
        "shardRecordsPerSecond": "shard_records_per_second",
        "shardBytesPerSecond": "shard_bytes_per_second",
    }
    for option, field in rate_options.items():
        rate = _rate(options, option)
        if rate is not None:
            changes[field] = rate
    flush_timeout = _seconds(options, "flushTimeout")
    try:
        producer = replace(settings, **changes)  # type: ignore[arg-type]
    except ValueError as exc:  # a combination the producer refuses
        raise SparkOptionError("producer settings", str(exc)) from exc
    return SinkOptions(
        connection=stream_connection(options),
        producer=producer,
        flush_timeout=DEFAULT_FLUSH_TIMEOUT if flush_timeout is None else flush_timeout,
    )


def _flag(options: Mapping[str, str], name: str) -> bool | None:
    raw = lookup(options, name)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SparkOptionError(name, f"expected true or false, got {raw!r}")


def _int(options: Mapping[str, str], name: str) -> int | None:
    raw = lookup(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise SparkOptionError(name, f"expected a whole number, got {raw!r}") from None
    if value <= 0:
        raise SparkOptionError(name, f"must be > 0, got {raw!r}")
    return value


def _seconds(options: Mapping[str, str], name: str, *, allow_zero: bool = False) -> float | None:
    raw = lookup(options, name)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        raise SparkOptionError(name, f"expected a number of seconds, got {raw!r}") from None
    if not (value >= 0 if allow_zero else value > 0) or value == float("inf"):
        raise SparkOptionError(name, f"must be {'>= 0' if allow_zero else '> 0'}, got {raw!r}")
    return value


def _rate(options: Mapping[str, str], name: str) -> float | None:
    raw = lookup(options, name)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        raise SparkOptionError(name, f"expected a number per second, got {raw!r}") from None
    if not value > 0:
        raise SparkOptionError(name, f"must be > 0, got {raw!r}")
    return value
