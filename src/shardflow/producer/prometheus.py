"""Producer metrics for prometheus-client: a collector to register on a registry.

::

    from prometheus_client import REGISTRY
    REGISTRY.register(ProducerCollector(producer))

Each scrape takes a fresh snapshot. Scrapes usually run in another thread (the HTTP server's);
the snapshot is then taken on the producer's event loop, so nothing is read mid-update.
Producers of the same stream are merged; the ``stream`` label tells streams apart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from shardflow.producer.metrics import ProducerMetricsSnapshot
from shardflow.producer.producer import Producer
from shardflow.producer.sync import SyncProducer

Source = Producer | SyncProducer | Callable[[], ProducerMetricsSnapshot]

# Bucket bounds, in the unit of each distribution.
_LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
_ATTEMPT_BUCKETS = (1, 2, 3, 5, 10, 20)
_SIZE_BUCKETS = (100, 1000, 10_000, 100_000, 1_048_576, 5_242_880)


class ProducerCollector(Collector):
    """Exports the metrics of one or more producers (or snapshot functions)."""

    def __init__(
        self, *sources: Source, namespace: str = "shardflow_producer", timeout: float = 5.0
    ) -> None:
        self._sources = sources
        self._namespace = namespace
        self._timeout = timeout

    def collect(self) -> Iterator[Any]:
        by_stream: dict[str, ProducerMetricsSnapshot] = {}
        for source in self._sources:
            snapshot = self._snapshot(source)
            if snapshot is None:
                continue
            earlier = by_stream.get(snapshot.stream)
            by_stream[snapshot.stream] = snapshot if earlier is None else earlier.merge(snapshot)
        yield from self._families(by_stream)

    def _snapshot(self, source: Source) -> ProducerMetricsSnapshot | None:
        if isinstance(source, SyncProducer):
            return source.metrics(self._timeout) if source.loop is not None else None
        if isinstance(source, Producer):
            loop = source.loop
            if loop is None:
                return None
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                return source.metrics()

            async def take() -> ProducerMetricsSnapshot:
                return source.metrics()

            try:
                return asyncio.run_coroutine_threadsafe(take(), loop).result(self._timeout)
            except (concurrent.futures.TimeoutError, RuntimeError):
                return None  # the loop is busy or gone: skip this scrape
        return source()

    def _families(self, snapshots: dict[str, ProducerMetricsSnapshot]) -> Iterator[Any]:
        ns = self._namespace
        labels = ["stream"]

        def counter(name: str, doc: str, value: Callable[[ProducerMetricsSnapshot], int]) -> Any:
            family = CounterMetricFamily(f"{ns}_{name}", doc, labels=labels)
            for stream, snapshot in snapshots.items():
                family.add_metric([stream], value(snapshot))
            return family

        yield counter("records_put", "User records accepted.", lambda s: s.records_put)
        yield counter("records_succeeded", "User records written.", lambda s: s.records_succeeded)
        yield counter(
            "bytes_succeeded", "Bytes of user records written.", lambda s: s.bytes_succeeded
        )
        failed = CounterMetricFamily(
            f"{ns}_records_failed",
            "User records that failed, by error code.",
            labels=[*labels, "code"],
        )
        for stream, snapshot in snapshots.items():
            for code, count in snapshot.failures.items():
                failed.add_metric([stream, code], count)
        yield failed
        yield counter("put_records_calls", "PutRecords calls.", lambda s: s.put_records_calls)
        yield counter(
            "put_records_calls_failed",
            "PutRecords calls that failed as a whole.",
            lambda s: s.put_records_calls_failed,
        )
        entries = CounterMetricFamily(
            f"{ns}_put_records_entries",
            "Kinesis records sent in PutRecords calls, by result.",
            labels=[*labels, "result"],
        )
        for stream, snapshot in snapshots.items():
            entries.add_metric([stream, "succeeded"], snapshot.entries_succeeded)
            entries.add_metric([stream, "failed"], snapshot.entries_failed)
            entries.add_metric([stream, "throttled"], snapshot.entries_throttled)
        yield entries
        yield counter("retries", "User records sent again.", lambda s: s.retries)
        yield counter(
            "shard_map_refreshes",
            "Listings of the stream's shards.",
            lambda s: s.shard_map_refreshes,
        )
        yield self._histogram(
            "record_latency_seconds",
            "Time from put to result per user record.",
            snapshots,
            "latency_ms",
            _LATENCY_BUCKETS_MS,
            scale=1000.0,
        )
        yield self._histogram(
            "record_attempts",
            "PutRecords attempts per finished record.",
            snapshots,
            "attempts",
            _ATTEMPT_BUCKETS,
        )
        yield self._histogram(
            "record_size_bytes",
            "Size of accepted user records.",
            snapshots,
            "record_bytes",
            _SIZE_BUCKETS,
        )
        yield self._histogram(
            "request_size_bytes",
            "Size of PutRecords requests.",
            snapshots,
            "request_bytes",
            _SIZE_BUCKETS,
        )

    def _histogram(
        self,
        name: str,
        doc: str,
        snapshots: dict[str, ProducerMetricsSnapshot],
        distribution: str,
        bounds: tuple[int, ...],
        scale: float = 1.0,
    ) -> Any:
        family = HistogramMetricFamily(f"{self._namespace}_{name}", doc, labels=["stream"])
        for stream, snapshot in snapshots.items():
            histogram = snapshot.distribution(distribution)
            cumulative = [0] * len(bounds)
            total = 0
            value_sum = 0.0
            for item in histogram.get_recorded_iterator():
                value, count = item.value_iterated_to, item.count_at_value_iterated_to
                total += count
                value_sum += value * count
                for i, bound in enumerate(bounds):
                    if value <= bound:
                        cumulative[i] += count
            buckets = [
                (_bound(bound / scale), float(c))
                for bound, c in zip(bounds, cumulative, strict=True)
            ]
            buckets.append(("+Inf", float(total)))
            family.add_metric([stream], buckets, sum_value=value_sum / scale)
        return family


def _bound(value: float) -> str:
    return f"{value:g}"
