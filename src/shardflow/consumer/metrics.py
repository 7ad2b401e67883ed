"""The consumer's live metrics: counters per stream and gauges per owned shard, kept on its
event loop by its shard workers and the events they emit.

The snapshot types, the histogram and the Prometheus collector are shared with the producer in
:mod:`shardflow.metrics`. Counters are plain ints named as the fields of
:class:`~shardflow.metrics.StreamMetrics`; handler latencies go into a :class:`Tally` (one dict
update per call) and become a :class:`~shardflow.metrics.Histogram` when a snapshot is taken.
A snapshot from another thread is taken on the consumer's loop, so it never sees a half-made
update.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from types import MappingProxyType

from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.deprecation import renamed
from shardflow.events import (
    CheckpointWritten,
    DiagnosticEvent,
    FetchThrottled,
    HandlerOverrun,
    ShardFailed,
    SubscriptionRenewed,
)
from shardflow.metrics.recording import SECONDS, RateMeter, Tally, on_loop
from shardflow.metrics.snapshots import (
    ConsumerMetricsSnapshot,
    ShardMetrics,
    StreamMetrics,
    copy_fields,
)

ShardGauges = ShardMetrics
"""What a shard worker reports of its shard (the name its call site uses)."""

GaugeSource = Callable[[], ShardMetrics]

BatchObserver = Callable[[str, str, int, int, float, int | None], None]
"""Told of each batch of a shard's records handed to delivery: ``(stream, shard_id, records,
bytes, seconds until delivery asked for more, millis behind latest)`` (CloudWatch's
``ProcessTask``)."""

__getattr__ = renamed(
    __name__, {"MetricsSnapshot": "ConsumerMetricsSnapshot", "StreamCounters": "StreamMetrics"}
)


class _Stream:
    """The live counters of one stream (named as :class:`StreamMetrics`' fields)."""

    __slots__ = (
        "bytes",
        "checkpoints",
        "dead_letters",
        "fetch_throttles",
        "handler_latency",
        "handler_overruns",
        "out_of_range_delivered",
        "out_of_range_dropped",
        "overrunning_shards",
        "parked_shards",
        "rate",
        "records",
        "shard_failures",
        "subscription_renewals",
    )

    def __init__(self, clock: Clock) -> None:
        self.records = 0
        self.bytes = 0
        self.checkpoints = 0
        self.shard_failures = 0
        self.parked_shards = 0
        self.handler_overruns = 0
        self.overrunning_shards = 0
        self.fetch_throttles = 0
        self.subscription_renewals = 0
        self.dead_letters = 0
        self.out_of_range_delivered = 0
        self.out_of_range_dropped = 0
        self.handler_latency = Tally(SECONDS)
        self.rate = RateMeter(clock)


class ConsumerMetrics:
    """The consumer's metrics; updated by its shard workers on the event loop."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._started_at = clock.wall()
        self._streams: dict[str, _Stream] = {}
        self._shards: dict[tuple[str, str], GaugeSource] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.batch_observer: BatchObserver | None = None
        """Set while metrics are published to CloudWatch (None: batches are not timed)."""

    def _stream(self, stream: str) -> _Stream:
        counters = self._streams.get(stream)
        if counters is None:
            counters = self._streams[stream] = _Stream(self._clock)
        return counters

    # --- updates -------------------------------------------------------------------------------

    def records_handled(self, stream: str, count: int, size: int) -> None:
        counters = self._stream(stream)
        counters.records += count
        counters.bytes += size
        counters.rate.add(count)

    def handler_latencies(self, stream: str, latencies: Iterable[float]) -> None:
        """Seconds each handler call took (called per call, or per run of calls)."""
        self._stream(stream).handler_latency.add_all(latencies)

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

    def snapshot(self) -> ConsumerMetricsSnapshot:
        """A copy of every metric; call on the consumer's loop (see :meth:`snapshot_threadsafe`)."""
        owned: dict[str, int] = {}
        for stream, _ in self._shards:
            owned[stream] = owned.get(stream, 0) + 1
        streams = {
            name: copy_fields(
                live,
                StreamMetrics,
                records_per_second=live.rate.rate(),
                handler_latency=live.handler_latency.snapshot(),
                owned_shards=owned.get(name, 0),
            )
            for name, live in self._streams.items()
        }
        shards = {key: source() for key, source in self._shards.items()}
        return ConsumerMetricsSnapshot(
            started_at=self._started_at,
            ended_at=self._clock.wall(),
            streams=MappingProxyType(streams),
            shards=MappingProxyType(shards),
        )

    def snapshot_threadsafe(self, timeout: float | None = 5.0) -> ConsumerMetricsSnapshot:
        """:meth:`snapshot` from any thread (TimeoutError if the loop does not answer)."""
        return on_loop(self.loop, self.snapshot, timeout)
