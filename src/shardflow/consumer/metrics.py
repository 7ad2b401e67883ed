"""Consumer metrics: counters kept on the event loop, exported through prometheus-client.

::

    from prometheus_client import REGISTRY, start_http_server
    REGISTRY.register(ConsumerCollector(consumer))
    start_http_server(9100, addr="127.0.0.1")

Exported (namespace ``shardflow_consumer``): ``records_total`` and ``bytes_total`` handed to
handlers, ``records_per_second`` over the last 10 s, ``out_of_range_sub_records_total`` by
action, ``checkpoints_total``, ``shard_failures_total``, ``parked_shards`` (now),
``handler_overruns_total`` and ``overrunning_shards`` (now: shards whose handler call outlived
``drain_timeout`` after the shard was stopped here), ``fetch_throttles_total`` (reads
Kinesis throttled), ``subscription_renewals_total`` (fan-out subscriptions opened again),
``handler_latency_seconds`` (histogram, one observation per handler call) per stream; per
owned shard ``millis_behind_latest``, ``checkpoint_age_seconds`` (since this worker last wrote
the shard's checkpoint), ``checkpoint_lag_records`` (delivered but not covered by the
checkpoint), ``unacked_records`` and ``prefetch_records`` / ``prefetch_bytes``.

Everything is updated on the consumer's event loop. A scrape from another thread takes its
snapshot on that loop, so it never sees a half-made update.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.events import (
    CheckpointWritten,
    DiagnosticEvent,
    FetchThrottled,
    HandlerOverrun,
    ShardFailed,
    SubscriptionRenewed,
)

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
)
"""Upper bounds (seconds) of the handler latency histogram."""

RATE_WINDOW: Final = 10.0
"""Seconds over which ``records_per_second`` is averaged."""


@dataclass(frozen=True, slots=True)
class ShardGauges:
    """The current state of one owned shard."""

    millis_behind_latest: int | None
    checkpoint_age: float | None
    checkpoint_lag: int
    unacked: int
    prefetch_records: int
    prefetch_bytes: int


class _RateMeter:
    """Events per second over a sliding window, in one-second buckets."""

    def __init__(self, clock: Clock, window: float = RATE_WINDOW) -> None:
        self._clock = clock
        self._window = window
        self._buckets: deque[list[float]] = deque()  # [second, count]

    def add(self, count: int) -> None:
        second = math.floor(self._clock.monotonic())
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += count
        else:
            self._buckets.append([second, count])
        self._trim()

    def _trim(self) -> None:
        horizon = self._clock.monotonic() - self._window
        while self._buckets and self._buckets[0][0] + 1 <= horizon:
            self._buckets.popleft()

    def rate(self) -> float:
        self._trim()
        return sum(count for _, count in self._buckets) / self._window


@dataclass(slots=True)
class _Histogram:
    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        running = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            buckets.append((f"{bound:g}", float(running)))
        buckets.append(("+Inf", float(self.count)))
        return buckets


@dataclass(slots=True)
class StreamCounters:
    """Totals of one stream since the consumer started."""

    records: int = 0
    bytes: int = 0
    out_of_range_delivered: int = 0
    out_of_range_dropped: int = 0
    checkpoints: int = 0
    shard_failures: int = 0
    parked_shards: int = 0
    """Shards parked now (a handler failure under ``on_error="stop-shard"``)."""
    handler_overruns: int = 0
    """Handler calls found still running ``drain_timeout`` after their shard stopped here."""
    overrunning_shards: int = 0
    """Shards with such a call running now (not started again here until it returns)."""
    fetch_throttles: int = 0
    subscription_renewals: int = 0
    dead_letters: int = 0
    """Records written to the dead letters (acknowledged without being handled)."""
    records_per_second: float = 0.0
    latency: _Histogram = field(default_factory=_Histogram)


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """A consistent copy of every metric."""

    streams: dict[str, StreamCounters]
    shards: dict[tuple[str, str], ShardGauges]
    """By (stream, shard id), for shards owned now."""


GaugeSource = Callable[[], ShardGauges]


class ConsumerMetrics:
    """The consumer's metrics; updated by its shard workers on the event loop."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._streams: dict[str, StreamCounters] = {}
        self._rates: dict[str, _RateMeter] = {}
        self._shards: dict[tuple[str, str], GaugeSource] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def _stream(self, stream: str) -> StreamCounters:
        counters = self._streams.get(stream)
        if counters is None:
            counters = self._streams[stream] = StreamCounters()
            self._rates[stream] = _RateMeter(self._clock)
        return counters

    # --- updates -------------------------------------------------------------------------------

    def records_handled(self, stream: str, count: int, size: int) -> None:
        counters = self._stream(stream)
        counters.records += count
        counters.bytes += size
        self._rates[stream].add(count)

    def handler_latencies(self, stream: str, latencies: Iterable[float]) -> None:
        histogram = self._stream(stream).latency
        for latency in latencies:
            histogram.observe(latency)

    def out_of_range(self, stream: str, *, delivered: int, dropped: int) -> None:
        counters = self._stream(stream)
        counters.out_of_range_delivered += delivered
        counters.out_of_range_dropped += dropped

    def observe(self, event: DiagnosticEvent) -> None:
        """Count what the consumer's events report (subscribed to its event emitter)."""
        match event:
            case CheckpointWritten():
                self._stream(event.stream).checkpoints += 1
            case ShardFailed():
                self._stream(event.stream).shard_failures += 1
            case HandlerOverrun():
                self._stream(event.stream).handler_overruns += 1
            case FetchThrottled():
                self._stream(event.stream).fetch_throttles += 1
            case SubscriptionRenewed():
                self._stream(event.stream).subscription_renewals += 1
            case _:
                pass

    def shard_parked(self, stream: str, change: int) -> None:
        """A shard was parked (+1) or let go after being parked (-1)."""
        self._stream(stream).parked_shards += change

    def shard_overrunning(self, stream: str, change: int) -> None:
        """A shard's handler call outlived ``drain_timeout`` (+1), or it has ended since (-1)."""
        self._stream(stream).overrunning_shards += change

    def dead_lettered(self, stream: str) -> None:
        self._stream(stream).dead_letters += 1

    def track_shard(self, stream: str, shard_id: str, gauges: GaugeSource) -> None:
        """Report ``gauges()`` for a shard while it is owned."""
        self._stream(stream)
        self._shards[(stream, shard_id)] = gauges

    def untrack_shard(self, stream: str, shard_id: str) -> None:
        self._shards.pop((stream, shard_id), None)

    # --- reading -------------------------------------------------------------------------------

    def snapshot(self) -> MetricsSnapshot:
        """A copy of every metric; call on the consumer's loop (see :meth:`snapshot_threadsafe`)."""
        streams: dict[str, StreamCounters] = {}
        for name, counters in self._streams.items():
            latency = _Histogram(counters.latency.bounds, list(counters.latency.counts))
            latency.total = counters.latency.total
            streams[name] = StreamCounters(
                records=counters.records,
                bytes=counters.bytes,
                out_of_range_delivered=counters.out_of_range_delivered,
                out_of_range_dropped=counters.out_of_range_dropped,
                checkpoints=counters.checkpoints,
                shard_failures=counters.shard_failures,
                parked_shards=counters.parked_shards,
                handler_overruns=counters.handler_overruns,
                overrunning_shards=counters.overrunning_shards,
                fetch_throttles=counters.fetch_throttles,
                subscription_renewals=counters.subscription_renewals,
                dead_letters=counters.dead_letters,
                records_per_second=self._rates[name].rate(),
                latency=latency,
            )
        shards = {key: source() for key, source in self._shards.items()}
        return MetricsSnapshot(streams, shards)

    def snapshot_threadsafe(self, timeout: float = 5.0) -> MetricsSnapshot | None:
        """:meth:`snapshot` from any thread (None if the loop is busy or gone)."""
        loop = self.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or loop.is_closed():
            return self.snapshot()

        async def take() -> MetricsSnapshot:
            return self.snapshot()

        try:
            return asyncio.run_coroutine_threadsafe(take(), loop).result(timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            return None


class HasMetrics(Protocol):
    """A consumer: ``metrics()`` gives a snapshot (TimeoutError when its loop is busy)."""

    def metrics(self, timeout: float = ...) -> MetricsSnapshot: ...


class ConsumerCollector(Collector):
    """Exports the metrics of one or more consumers to prometheus-client."""

    def __init__(
        self, *sources: HasMetrics | ConsumerMetrics, namespace: str = "shardflow_consumer"
    ) -> None:
        self._sources = sources
        self._namespace = namespace

    def collect(self) -> Iterator[Any]:
        snapshots = []
        for source in self._sources:
            if isinstance(source, ConsumerMetrics):
                snapshot = source.snapshot_threadsafe()
            else:
                try:
                    snapshot = source.metrics()
                except TimeoutError:
                    snapshot = None
            if snapshot is not None:
                snapshots.append(snapshot)
        yield from self._stream_families(snapshots)
        yield from self._shard_families(snapshots)

    def _stream_families(self, snapshots: list[MetricsSnapshot]) -> Iterator[Any]:
        ns = self._namespace
        streams = [(name, c) for s in snapshots for name, c in s.streams.items()]

        def counter(name: str, doc: str, value: Callable[[StreamCounters], int]) -> Any:
            family = CounterMetricFamily(f"{ns}_{name}", doc, labels=["stream"])
            for stream, counters in streams:
                family.add_metric([stream], value(counters))
            return family

        yield counter("records", "Records handed to handlers.", lambda c: c.records)
        yield counter(
            "bytes", "Bytes (data + partition key) handed to handlers.", lambda c: c.bytes
        )
        yield counter("checkpoints", "Checkpoints written.", lambda c: c.checkpoints)
        yield counter(
            "shard_failures",
            "Shards stopped by an error (a handler's, or one retrying cannot fix).",
            lambda c: c.shard_failures,
        )
        yield counter(
            "handler_overruns",
            "Handler calls still running drain_timeout after their shard stopped here.",
            lambda c: c.handler_overruns,
        )
        yield counter(
            "dead_letters",
            "Records written to the dead letters (acknowledged without being handled).",
            lambda c: c.dead_letters,
        )
        yield counter(
            "fetch_throttles",
            "Reads (GetRecords, SubscribeToShard) Kinesis throttled, each retried after a wait.",
            lambda c: c.fetch_throttles,
        )
        yield counter(
            "subscription_renewals",
            "Enhanced fan-out subscriptions opened again after a shard's first one.",
            lambda c: c.subscription_renewals,
        )
        rate = GaugeMetricFamily(
            f"{ns}_records_per_second",
            f"Records handed to handlers per second over the last {RATE_WINDOW:g} s.",
            labels=["stream"],
        )
        out_of_range = CounterMetricFamily(
            f"{ns}_out_of_range_sub_records",
            "Aggregated sub-records whose hash key lies outside their shard's range.",
            labels=["stream", "action"],
        )
        parked = GaugeMetricFamily(
            f"{ns}_parked_shards",
            "Shards parked now: stopped by a handler failure, lease kept (on_error=stop-shard).",
            labels=["stream"],
        )
        overrunning = GaugeMetricFamily(
            f"{ns}_overrunning_shards",
            "Shards whose handler call outlived drain_timeout after the shard stopped here "
            "(not started again, nor let go, until it returns).",
            labels=["stream"],
        )
        latency = HistogramMetricFamily(
            f"{ns}_handler_latency_seconds",
            "Duration of handler calls (one per record, or one per batch).",
            labels=["stream"],
        )
        for stream, counters in streams:
            rate.add_metric([stream], counters.records_per_second)
            parked.add_metric([stream], counters.parked_shards)
            overrunning.add_metric([stream], counters.overrunning_shards)
            out_of_range.add_metric([stream, "delivered"], counters.out_of_range_delivered)
            out_of_range.add_metric([stream, "dropped"], counters.out_of_range_dropped)
            latency.add_metric(
                [stream], counters.latency.cumulative(), sum_value=counters.latency.total
            )
        yield rate
        yield parked
        yield overrunning
        yield out_of_range
        yield latency

    def _shard_families(self, snapshots: list[MetricsSnapshot]) -> Iterator[Any]:
        ns = self._namespace
        shards = [(key, g) for s in snapshots for key, g in s.shards.items()]

        def gauge(name: str, doc: str, value: Callable[[ShardGauges], float | None]) -> Any:
            family = GaugeMetricFamily(f"{ns}_{name}", doc, labels=["stream", "shard"])
            for (stream, shard_id), gauges in shards:
                measured = value(gauges)
                if measured is not None:
                    family.add_metric([stream, shard_id], measured)
            return family

        yield gauge(
            "millis_behind_latest",
            "How far the last fetched batch was behind the tip of the shard.",
            lambda g: g.millis_behind_latest,
        )
        yield gauge(
            "checkpoint_age_seconds",
            "Seconds since this worker last wrote the shard's checkpoint.",
            lambda g: g.checkpoint_age,
        )
        yield gauge(
            "checkpoint_lag_records",
            "Records delivered but not covered by the checkpoint.",
            lambda g: g.checkpoint_lag,
        )
        yield gauge(
            "unacked_records", "Records delivered, not yet acknowledged.", lambda g: g.unacked
        )
        yield gauge(
            "prefetch_records",
            "Records fetched and not yet handled.",
            lambda g: g.prefetch_records,
        )
        yield gauge(
            "prefetch_bytes", "Bytes fetched and not yet handled.", lambda g: g.prefetch_bytes
        )
        owned = GaugeMetricFamily(
            f"{ns}_owned_shards", "Shards this worker processes.", labels=["stream"]
        )
        per_stream: dict[str, int] = {}
        for (stream, _), _gauges in shards:
            per_stream[stream] = per_stream.get(stream, 0) + 1
        for stream, count in per_stream.items():
            owned.add_metric([stream], count)
        yield owned
