"""What ``consumer.metrics()`` and ``producer.metrics()`` return: frozen copies, one shape.

Both snapshots cover a window (``started_at`` / ``ended_at``, wall-clock seconds) and hold
counters (ints, since the window started), gauges (now) and :class:`Histogram` distributions
(seconds for durations). Counters keep their name from start to export: ``records`` here is
``shardflow_consumer_records_total`` in Prometheus.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, TypeVar

from shardflow.metrics.recording import BYTES, COUNT, SECONDS, Histogram

T = TypeVar("T")


def _seconds() -> Histogram:
    return Histogram(SECONDS)


def _bytes() -> Histogram:
    return Histogram(BYTES)


def _count() -> Histogram:
    return Histogram(COUNT)


def copy_fields(live: object, snapshot_type: type[T], **given: Any) -> T:
    """A ``snapshot_type`` (a dataclass) from ``given`` and, for every other field, the
    attribute of ``live`` of the same name: how both sides turn live counters into snapshots."""
    values = {
        f.name: given[f.name] if f.name in given else getattr(live, f.name)
        for f in dataclasses.fields(snapshot_type)  # type: ignore[arg-type]
    }
    return snapshot_type(**values)


# --- the consumer ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamMetrics:
    """One stream in one consumer: counters since it started, gauges as of the snapshot."""

    records: int = 0
    """Records handed to handlers."""
    bytes: int = 0
    """Bytes (data + partition key) handed to handlers."""
    records_per_second: float = 0.0
    """Records handed to handlers per second over the last 10 s."""
    handler_latency: Histogram = field(default_factory=_seconds)
    """Seconds per handler call (one call per record, or per batch)."""
    checkpoints: int = 0
    """Checkpoints written."""
    shard_failures: int = 0
    """Shards stopped by an error (a handler's, or one retrying cannot fix)."""
    parked_shards: int = 0
    """Shards parked now (a handler failure under ``on_error="stop-shard"``)."""
    handler_overruns: int = 0
    """Handler calls found still running ``drain_timeout`` after their shard stopped here."""
    overrunning_shards: int = 0
    """Shards with such a call running now (not started again here until it returns)."""
    fetch_throttles: int = 0
    """Reads (GetRecords, SubscribeToShard) Kinesis throttled, each retried after a wait."""
    subscription_renewals: int = 0
    """Enhanced fan-out subscriptions opened again after a shard's first one."""
    dead_letters: int = 0
    """Records written to the dead letters (acknowledged without being handled)."""
    out_of_range_delivered: int = 0
    """Aggregated sub-records outside their shard's hash key range, delivered anyway."""
    out_of_range_dropped: int = 0
    """Aggregated sub-records outside their shard's hash key range, dropped."""
    owned_shards: int = 0
    """Shards of the stream this consumer processes now."""


@dataclass(frozen=True, slots=True)
class ShardMetrics:
    """One shard the consumer owns, as of the snapshot."""

    millis_behind_latest: int | None
    """How far the last fetched batch was behind the tip of the shard (None: nothing fetched)."""
    checkpoint_age: float | None
    """Seconds since this worker last wrote the shard's checkpoint (None: not yet)."""
    checkpoint_lag: int
    """Records delivered but not covered by the checkpoint."""
    unacked: int
    """Records delivered, not yet acknowledged."""
    prefetch_records: int
    """Records fetched and not yet handled."""
    prefetch_bytes: int
    """Bytes fetched and not yet handled."""


@dataclass(frozen=True, slots=True)
class ConsumerMetricsSnapshot:
    """Everything one consumer measured since it started, as a consistent copy
    (``Consumer.metrics()``)."""

    started_at: float
    ended_at: float
    streams: Mapping[str, StreamMetrics] = field(default_factory=dict)
    """By stream name."""
    shards: Mapping[tuple[str, str], ShardMetrics] = field(default_factory=dict)
    """By (stream, shard id), for the shards owned now."""

    @property
    def elapsed(self) -> float:
        return max(self.ended_at - self.started_at, 0.0)


# --- the producer ------------------------------------------------------------------------------

DISTRIBUTIONS: Final = (
    "latency",
    "attempts",
    "record_bytes",
    "request_bytes",
    "request_records",
    "records_per_kinesis_record",
)
"""The names of a producer snapshot's distributions (its :class:`Histogram` fields)."""

COUNTERS: Final = (
    "records_put",
    "records_succeeded",
    "records_failed",
    "bytes_succeeded",
    "put_records_calls",
    "put_records_calls_failed",
    "entries_succeeded",
    "entries_failed",
    "entries_throttled",
    "retries",
)
"""The producer snapshot's counters that its recorder keeps as they are (``shard_map_refreshes``
is asked of the shard map)."""


@dataclass(frozen=True, slots=True)
class ProducerMetricsSnapshot:
    """Counters and distributions of one producer (or several, merged) over a time window
    (``producer.metrics()`` since start; ``on_metrics`` per interval)."""

    stream: str
    started_at: float
    ended_at: float
    records_put: int = 0
    """User records accepted."""
    records_succeeded: int = 0
    """User records written."""
    records_failed: int = 0
    """User records that failed (by error code in ``failures``)."""
    bytes_succeeded: int = 0
    """Bytes of user records written."""
    failures: Mapping[str, int] = field(default_factory=dict)
    """Failed user records by the error code they failed with."""
    put_records_calls: int = 0
    put_records_calls_failed: int = 0
    """Calls that failed as a whole (the records in them were retried or failed)."""
    entries_succeeded: int = 0
    entries_failed: int = 0
    entries_throttled: int = 0
    """Kinesis records (entries of PutRecords) refused with ProvisionedThroughputExceeded."""
    retries: int = 0
    """User records sent again after a failed attempt."""
    shard_map_refreshes: int = 0
    """Listings of the stream's shards."""
    latency: Histogram = field(default_factory=_seconds)
    """Seconds from put to result, per delivered user record."""
    attempts: Histogram = field(default_factory=_count)
    """PutRecords attempts per finished user record."""
    record_bytes: Histogram = field(default_factory=_bytes)
    """Size of each accepted user record."""
    request_bytes: Histogram = field(default_factory=_bytes)
    """Size of each PutRecords request."""
    request_records: Histogram = field(default_factory=_count)
    """Kinesis records per PutRecords request."""
    records_per_kinesis_record: Histogram = field(default_factory=_count)
    """User records per Kinesis record (above 1 when aggregating)."""

    @property
    def elapsed(self) -> float:
        return max(self.ended_at - self.started_at, 0.0)

    @property
    def throughput(self) -> float:
        """Records delivered per second over the window."""
        return self.records_succeeded / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def success_rate(self) -> float:
        """Delivered records over finished records (1.0 when nothing finished)."""
        finished = self.records_succeeded + self.records_failed
        return self.records_succeeded / finished if finished else 1.0

    @property
    def distributions(self) -> Mapping[str, Histogram]:
        """Every distribution (``Histogram`` field) by its name: ``latency``, ``attempts``,
        ``record_bytes``, ``request_bytes``, ``request_records``,
        ``records_per_kinesis_record``."""
        return MappingProxyType({name: getattr(self, name) for name in DISTRIBUTIONS})

    def distribution(self, name: str) -> Histogram:
        """The distribution ``name`` (as in :attr:`distributions`)."""
        if name not in DISTRIBUTIONS:
            raise KeyError(name)
        histogram: Histogram = getattr(self, name)
        return histogram

    def percentile(self, name: str, percentile: float) -> float:
        """The value at ``percentile`` (0-100) of a distribution; 0 if it is empty.

        ``"latency_ms"`` (deprecated: use ``latency``, in seconds) answers in milliseconds.
        """
        if name == "latency_ms":
            warnings.warn(
                '"latency_ms" is deprecated: the "latency" distribution is in seconds',
                DeprecationWarning,
                stacklevel=2,
            )
            return self.latency.percentile(percentile) * 1000
        return self.distribution(name).percentile(percentile)

    def merge(self, other: ProducerMetricsSnapshot) -> ProducerMetricsSnapshot:
        """A snapshot covering both (counters added, distributions combined, window spanned)."""
        failures = dict(self.failures)
        for code, count in other.failures.items():
            failures[code] = failures.get(code, 0) + count
        counters = {
            name: getattr(self, name) + getattr(other, name)
            for name in (*COUNTERS, "shard_map_refreshes")
        }
        distributions = {
            name: getattr(self, name).merge(getattr(other, name)) for name in DISTRIBUTIONS
        }
        return ProducerMetricsSnapshot(
            stream=self.stream if self.stream == other.stream else "*",
            started_at=min(self.started_at, other.started_at),
            ended_at=max(self.ended_at, other.ended_at),
            failures=MappingProxyType(failures),
            **counters,
            **distributions,
        )

    def summary(self) -> dict[str, float | int | str]:
        """A flat view for logs and dashboards (latencies in milliseconds)."""
        return {
            "stream": self.stream,
            "elapsed_s": round(self.elapsed, 3),
            "records_put": self.records_put,
            "records_succeeded": self.records_succeeded,
            "records_failed": self.records_failed,
            "throughput_rps": round(self.throughput, 1),
            "success_rate": round(self.success_rate, 6),
            "latency_p50_ms": round(self.latency.percentile(50) * 1000, 3),
            "latency_p99_ms": round(self.latency.percentile(99) * 1000, 3),
            "latency_max_ms": round(self.latency.max * 1000, 3),
            "attempts_max": int(self.attempts.max),
            "put_records_calls": self.put_records_calls,
            "put_records_calls_failed": self.put_records_calls_failed,
            "entries_throttled": self.entries_throttled,
            "retries": self.retries,
        }
