"""Consumers and producers exported to prometheus-client: one table of metrics per snapshot
type, one way to turn a table into metric families.

Each scrape takes a fresh snapshot of every source. A scrape runs in the HTTP server's thread;
``metrics()`` takes the snapshot on the source's event loop, so nothing is read mid-update,
and a source whose loop does not answer within ``timeout`` is left out of that scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, Literal, Protocol, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from shardflow.errors import ShardflowError
from shardflow.metrics.recording import RATE_WINDOW, Histogram
from shardflow.metrics.snapshots import (
    ConsumerMetricsSnapshot,
    ProducerMetricsSnapshot,
    ShardMetrics,
    StreamMetrics,
)

log = logging.getLogger("shardflow.metrics")

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)

LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Upper bounds (seconds) of every exported latency histogram."""
ATTEMPT_BUCKETS: Final = (1.0, 2.0, 3.0, 5.0, 10.0, 20.0)
SIZE_BUCKETS: Final = (100.0, 1000.0, 10_000.0, 100_000.0, 1_048_576.0, 5_242_880.0)
"""Upper bounds (bytes) of the exported size histograms."""


class HasMetrics(Protocol[S_co]):
    """A consumer or a producer: ``metrics(timeout)`` gives a snapshot from any thread
    (TimeoutError when its event loop does not answer in time)."""

    def metrics(self, timeout: float = ...) -> S_co: ...


Source = HasMetrics[S] | Callable[[], S]
"""What a collector reads: a consumer or producer, or a function returning a snapshot."""


@dataclass(frozen=True, slots=True)
class Exported(Generic[S]):
    """One exported metric family: ``kind``, name (after the namespace; a counter gets
    ``_total``), help text, and how to read it from a snapshot row. With ``by``, ``read``
    returns values by that extra label's value. A gauge read as None is left out."""

    kind: Literal["counter", "gauge", "histogram"]
    name: str
    doc: str
    read: Callable[[S], Any]
    by: str | None = None
    buckets: tuple[float, ...] = ()


def families(
    namespace: str,
    table: Sequence[Exported[S]],
    labels: Sequence[str],
    rows: Sequence[tuple[Sequence[str], S]],
) -> Iterator[Any]:
    """The metric families of ``table`` over ``rows`` (label values, snapshot row)."""
    for metric in table:
        names = [*labels, metric.by] if metric.by else list(labels)
        full = f"{namespace}_{metric.name}"
        family: Any
        if metric.kind == "counter":
            family = CounterMetricFamily(full, metric.doc, labels=names)
        elif metric.kind == "gauge":
            family = GaugeMetricFamily(full, metric.doc, labels=names)
        else:
            family = HistogramMetricFamily(full, metric.doc, labels=names)
        for values, row in rows:
            value = metric.read(row)
            if value is None:
                continue
            if metric.by:
                for key, number in value.items():
                    family.add_metric([*values, key], number)
            elif metric.kind == "histogram":
                family.add_metric(
                    list(values), _buckets(value, metric.buckets), sum_value=value.sum
                )
            else:
                family.add_metric(list(values), value)
        yield family


def _buckets(histogram: Histogram, bounds: Sequence[float]) -> list[tuple[str, float]]:
    counts = histogram.cumulative_counts(bounds)
    buckets = [(f"{bound:g}", float(count)) for bound, count in zip(bounds, counts, strict=True)]
    buckets.append(("+Inf", float(histogram.count)))
    return buckets


def take(source: Source[S], timeout: float) -> S | None:
    """A snapshot of ``source``; None when it cannot give one now (not started, loop busy)."""
    try:
        metrics = getattr(source, "metrics", None)
        if metrics is not None:
            snapshot: S = metrics(timeout=timeout)
            return snapshot
        assert callable(source)
        return source()
    except (TimeoutError, ShardflowError) as exc:
        log.debug("no metrics from %r in this scrape: %s", source, exc)
        return None


class SnapshotCollector(Collector, Generic[S]):
    """What both collectors share: their sources, namespace and timeout, and one snapshot per
    source and scrape (those that cannot give one now left out)."""

    default_namespace: ClassVar[str]

    def __init__(
        self, *sources: Source[S], namespace: str | None = None, timeout: float = 5.0
    ) -> None:
        self._sources = sources
        self._namespace = namespace or self.default_namespace
        self._timeout = timeout

    def snapshots(self) -> list[S]:
        taken = (take(source, self._timeout) for source in self._sources)
        return [snapshot for snapshot in taken if snapshot is not None]


# --- the consumer ------------------------------------------------------------------------------

STREAM_METRICS: Final[tuple[Exported[StreamMetrics], ...]] = (
    Exported("counter", "records", "Records handed to handlers.", lambda m: m.records),
    Exported(
        "counter", "bytes", "Bytes (data + partition key) handed to handlers.", lambda m: m.bytes
    ),
    Exported("counter", "checkpoints", "Checkpoints written.", lambda m: m.checkpoints),
    Exported(
        "counter",
        "shard_failures",
        "Shards stopped by an error (a handler's, or one retrying cannot fix).",
        lambda m: m.shard_failures,
    ),
    Exported(
        "counter",
        "handler_overruns",
        "Handler calls still running drain_timeout after their shard stopped here.",
        lambda m: m.handler_overruns,
    ),
    Exported(
        "counter",
        "dead_letters",
        "Records written to the dead letters (acknowledged without being handled).",
        lambda m: m.dead_letters,
    ),
    Exported(
        "counter",
        "fetch_throttles",
        "Reads (GetRecords, SubscribeToShard) Kinesis throttled, each retried after a wait.",
        lambda m: m.fetch_throttles,
    ),
    Exported(
        "counter",
        "subscription_renewals",
        "Enhanced fan-out subscriptions opened again after a shard's first one.",
        lambda m: m.subscription_renewals,
    ),
    Exported(
        "counter",
        "out_of_range_sub_records",
        "Aggregated sub-records whose hash key lies outside their shard's range.",
        lambda m: {"delivered": m.out_of_range_delivered, "dropped": m.out_of_range_dropped},
        by="action",
    ),
    Exported(
        "gauge",
        "records_per_second",
        f"Records handed to handlers per second over the last {RATE_WINDOW:g} s.",
        lambda m: m.records_per_second,
    ),
    Exported(
        "gauge",
        "parked_shards",
        "Shards parked now: stopped by a handler failure, lease kept (on_error=stop-shard).",
        lambda m: m.parked_shards,
    ),
    Exported(
        "gauge",
        "overrunning_shards",
        "Shards whose handler call outlived drain_timeout after the shard stopped here "
        "(not started again, nor let go, until it returns).",
        lambda m: m.overrunning_shards,
    ),
    Exported("gauge", "owned_shards", "Shards this worker processes.", lambda m: m.owned_shards),
    Exported(
        "histogram",
        "handler_latency_seconds",
        "Duration of handler calls (one per record, or one per batch).",
        lambda m: m.handler_latency,
        buckets=LATENCY_BUCKETS,
    ),
)
"""Per stream (label ``stream``), in namespace ``shardflow_consumer``."""

SHARD_METRICS: Final[tuple[Exported[ShardMetrics], ...]] = (
    Exported(
        "gauge",
        "millis_behind_latest",
        "How far the last fetched batch was behind the tip of the shard.",
        lambda m: m.millis_behind_latest,
    ),
    Exported(
        "gauge",
        "checkpoint_age_seconds",
        "Seconds since this worker last wrote the shard's checkpoint.",
        lambda m: m.checkpoint_age,
    ),
    Exported(
        "gauge",
        "checkpoint_lag_records",
        "Records delivered but not covered by the checkpoint.",
        lambda m: m.checkpoint_lag,
    ),
    Exported(
        "gauge", "unacked_records", "Records delivered, not yet acknowledged.", lambda m: m.unacked
    ),
    Exported(
        "gauge",
        "prefetch_records",
        "Records fetched and not yet handled.",
        lambda m: m.prefetch_records,
    ),
    Exported(
        "gauge", "prefetch_bytes", "Bytes fetched and not yet handled.", lambda m: m.prefetch_bytes
    ),
)
"""Per owned shard (labels ``stream``, ``shard``), in namespace ``shardflow_consumer``."""


class ConsumerCollector(SnapshotCollector[ConsumerMetricsSnapshot]):
    """Exports the metrics of one or more consumers to prometheus-client.

    ``sources``: consumers (anything with ``metrics(timeout)``), or functions returning a
    :class:`ConsumerMetricsSnapshot`. ``namespace``: ``shardflow_consumer`` unless given.
    """

    default_namespace = "shardflow_consumer"

    def collect(self) -> Iterator[Any]:
        snapshots = self.snapshots()
        streams = [((name,), m) for s in snapshots for name, m in s.streams.items()]
        shards = [(key, m) for s in snapshots for key, m in s.shards.items()]
        yield from families(self._namespace, STREAM_METRICS, ("stream",), streams)
        yield from families(self._namespace, SHARD_METRICS, ("stream", "shard"), shards)


# --- the producer ------------------------------------------------------------------------------


def _entries(s: ProducerMetricsSnapshot) -> Mapping[str, int]:
    return {
        "succeeded": s.entries_succeeded,
        "failed": s.entries_failed,
        "throttled": s.entries_throttled,
    }


PRODUCER_METRICS: Final[tuple[Exported[ProducerMetricsSnapshot], ...]] = (
    Exported("counter", "records_put", "User records accepted.", lambda s: s.records_put),
    Exported(
        "counter", "records_succeeded", "User records written.", lambda s: s.records_succeeded
    ),
    Exported(
        "counter",
        "bytes_succeeded",
        "Bytes of user records written.",
        lambda s: s.bytes_succeeded,
    ),
    Exported(
        "counter",
        "records_failed",
        "User records that failed, by error code.",
        lambda s: s.failures,
        by="code",
    ),
    Exported("counter", "put_records_calls", "PutRecords calls.", lambda s: s.put_records_calls),
    Exported(
        "counter",
        "put_records_calls_failed",
        "PutRecords calls that failed as a whole.",
        lambda s: s.put_records_calls_failed,
    ),
    Exported(
        "counter",
        "put_records_entries",
        "Kinesis records sent in PutRecords calls, by result.",
        _entries,
        by="result",
    ),
    Exported("counter", "retries", "User records sent again.", lambda s: s.retries),
    Exported(
        "counter",
        "shard_map_refreshes",
        "Listings of the stream's shards.",
        lambda s: s.shard_map_refreshes,
    ),
    Exported(
        "histogram",
        "record_latency_seconds",
        "Time from put to result per user record.",
        lambda s: s.latency,
        buckets=LATENCY_BUCKETS,
    ),
    Exported(
        "histogram",
        "record_attempts",
        "PutRecords attempts per finished record.",
        lambda s: s.attempts,
        buckets=ATTEMPT_BUCKETS,
    ),
    Exported(
        "histogram",
        "record_size_bytes",
        "Size of accepted user records.",
        lambda s: s.record_bytes,
        buckets=SIZE_BUCKETS,
    ),
    Exported(
        "histogram",
        "request_size_bytes",
        "Size of PutRecords requests.",
        lambda s: s.request_bytes,
        buckets=SIZE_BUCKETS,
    ),
)
"""Per stream (label ``stream``), in namespace ``shardflow_producer``."""


class ProducerCollector(SnapshotCollector[ProducerMetricsSnapshot]):
    """Exports the metrics of one or more producers to prometheus-client; producers of the same
    stream are merged.

    ``sources``: producers (``Producer`` or ``SyncProducer``: anything with
    ``metrics(timeout)``), or functions returning a :class:`ProducerMetricsSnapshot`.
    ``namespace``: ``shardflow_producer`` unless given.
    """

    default_namespace = "shardflow_producer"

    def collect(self) -> Iterator[Any]:
        by_stream: dict[str, ProducerMetricsSnapshot] = {}
        for snapshot in self.snapshots():
            earlier = by_stream.get(snapshot.stream)
            by_stream[snapshot.stream] = snapshot if earlier is None else earlier.merge(snapshot)
        rows = [((stream,), snapshot) for stream, snapshot in by_stream.items()]
        yield from families(self._namespace, PRODUCER_METRICS, ("stream",), rows)
