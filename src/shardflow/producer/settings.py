"""How a producer batches, paces, retries and buffers: one frozen value with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from shardflow.backoff import Backoff
from shardflow.metrics.cloudwatch import CloudWatch
from shardflow.producer.ratelimit import (
    SHARD_BYTES_PER_SECOND,
    SHARD_RECORDS_PER_SECOND,
    RateSettings,
)

MiB: Final = 1024 * 1024

# Kinesis' PutRecords limits (default record size; streams may opt in to larger records).
MAX_REQUEST_RECORDS: Final = 500
MAX_REQUEST_BYTES: Final = 5 * MiB
MAX_RECORD_BYTES: Final = MiB
MAX_PARTITION_KEY_CHARS: Final = 256


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """Everything that shapes a :class:`~shardflow.producer.Producer`'s behaviour.

    Defaults follow the KPL where a user would compare (500 records / 5 MiB per request,
    1,000 records/s and 1 MiB/s per shard); ``linger`` is shorter than the KPL's 100 ms
    ``RecordMaxBufferedTime`` because a Python service usually prefers latency.
    """

    # --- batching
    linger: float = 0.05
    """Longest time (s) a record waits for its request to fill before it is sent anyway."""
    max_request_records: int = MAX_REQUEST_RECORDS
    """Records in one PutRecords request at most (Kinesis allows 500)."""
    max_request_bytes: int = MAX_REQUEST_BYTES
    """Bytes in one PutRecords request at most (Kinesis allows 5 MiB)."""
    max_record_bytes: int = MAX_RECORD_BYTES
    """Limit for one record's data plus UTF-8 partition key (raise for streams that opted in)."""

    # --- aggregation (KPL format)
    aggregate: bool = False
    """Pack user records of one predicted shard into KPL aggregated records."""
    aggregation_max_bytes: int = MAX_RECORD_BYTES
    """Largest aggregated record (data plus partition key); at most ``max_record_bytes``."""

    # --- ordering and concurrency
    preserve_key_order: bool = False
    """Write records of one partition key in the order they were put, even across retries.

    Costs throughput: at most one request per shard in flight, and (unless aggregating) a key
    appears at most once per request.
    """
    max_concurrent_requests: int = 16
    """PutRecords calls in flight at once, all shards together."""
    max_in_flight_per_shard: int = 4
    """Requests holding records of one shard in flight at once (1 when preserving key order)."""

    # --- pacing (per shard; AIMD adaption to throttling)
    shard_records_per_second: float = SHARD_RECORDS_PER_SECOND
    """Records per second written to one shard at most (Kinesis allows 1,000)."""
    shard_bytes_per_second: float = SHARD_BYTES_PER_SECOND
    """Bytes per second written to one shard at most (Kinesis allows 1 MiB)."""
    rate_burst_seconds: float = 0.25
    """Seconds' worth of a shard's rate that may be sent at once after an idle spell.

    Whatever the burst, what is sent to a shard within any one second stays under its rate,
    as Kinesis counts (so a producer alone on a stream is not throttled)."""
    throttle_decrease: float = 0.7
    """Factor applied to a shard's rate on ProvisionedThroughputExceeded."""
    throttle_recovery_per_second: float = 0.1
    """Share of the maximum rate regained per second while a shard's writes succeed."""
    throttle_floor: float = 0.05
    """Lowest share of the maximum rate a shard is slowed down to."""

    # --- retries
    retry: Backoff = field(default_factory=lambda: Backoff(base=0.1, cap=2.0, max_attempts=10))
    """PutRecords attempts per record before it fails with RecordDeliveryError
    (``max_attempts``; None: no bound but ``record_ttl``), and the jittered pause of a shard's
    records after a failed attempt."""
    record_ttl: float | None = 120.0
    """Seconds after put after which a failing record is not retried again (None: no deadline)."""
    request_timeout: float = 60.0
    """Upper bound (s) on one PutRecords call, on top of the client's own timeouts."""

    # --- buffer
    buffer_max_records: int = 50_000
    """Records accepted but without a result yet; ``put`` waits while this many are pending."""
    buffer_max_bytes: int = 64 * MiB
    """Bytes accepted but without a result yet; ``put`` waits while this many are pending."""

    # --- shard map and metrics
    shard_refresh_interval: float = 60.0
    """Seconds between routine re-listings of the stream's shards."""
    min_shard_refresh_interval: float = 1.0
    """Shortest time between two re-listings triggered by mispredicted shards."""
    metrics_interval: float = 10.0
    """Seconds between metrics snapshots handed to the ``on_metrics`` callback."""
    metrics: CloudWatch | None = None
    """Publish the producer's metrics to CloudWatch under the KPL's names (``CloudWatch()``:
    namespace ``KinesisProducerLibrary``, every minute, in the background; a CloudWatch outage
    drops metrics, logged and counted, never records). None: not published."""

    def __post_init__(self) -> None:
        if self.linger < 0:
            raise ValueError(f"linger must be >= 0, got {self.linger}")
        if not 1 <= self.max_request_records <= MAX_REQUEST_RECORDS:
            raise ValueError(
                f"max_request_records must be in 1..{MAX_REQUEST_RECORDS}, "
                f"got {self.max_request_records}"
            )
        _positive("max_record_bytes", self.max_record_bytes)
        if self.max_request_bytes < self.max_record_bytes:
            raise ValueError("max_request_bytes must be at least max_record_bytes")
        if not 0 < self.aggregation_max_bytes <= self.max_record_bytes:
            raise ValueError("aggregation_max_bytes must be in 1..max_record_bytes")
        _positive("max_concurrent_requests", self.max_concurrent_requests)
        _positive("max_in_flight_per_shard", self.max_in_flight_per_shard)
        if self.record_ttl is not None:
            _positive("record_ttl", self.record_ttl)
        _positive("request_timeout", self.request_timeout)
        _positive("buffer_max_records", self.buffer_max_records)
        if self.buffer_max_bytes < self.max_record_bytes:
            raise ValueError("buffer_max_bytes must be at least max_record_bytes")
        _positive("shard_refresh_interval", self.shard_refresh_interval)
        if self.min_shard_refresh_interval < 0:
            raise ValueError("min_shard_refresh_interval must be >= 0")
        _positive("metrics_interval", self.metrics_interval)
        if self.metrics is not None and not isinstance(self.metrics, CloudWatch):
            raise TypeError(f"metrics must be CloudWatch(...) or None, got {self.metrics!r}")
        _ = self.rate  # building it validates the pacing settings

    @property
    def rate(self) -> RateSettings:
        """The per-shard pacing settings as the rate limiter takes them."""
        return RateSettings(
            records_per_second=self.shard_records_per_second,
            bytes_per_second=self.shard_bytes_per_second,
            burst_seconds=self.rate_burst_seconds,
            decrease=self.throttle_decrease,
            recovery_per_second=self.throttle_recovery_per_second,
            floor=self.throttle_floor,
        )

    @property
    def shard_concurrency(self) -> int:
        """Requests per shard allowed in flight, after the ordering constraint."""
        return 1 if self.preserve_key_order else self.max_in_flight_per_shard


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")
