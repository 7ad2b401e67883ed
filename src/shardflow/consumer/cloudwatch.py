"""The consumer's metrics under the KCL's CloudWatch names (``ConsumerSettings(metrics=
CloudWatch())``): what a KCL dashboard or alarm reads keeps working after a migration.

:class:`KclMetrics` turns what the consumer already observes into the KCL's metrics: its typed
events (leases renewed, taken, lost; checkpoints; shard ends and failures), one call per batch
of records handed to delivery (:meth:`KclMetrics.batch`: ``ProcessTask``), and at each send a
snapshot of the consumer's gauges (``CurrentLeases``, ``MillisBehindLatest`` of idle shards,
and shardflow's own metrics under ``Operation = Shardflow``). The operations guide has the
table, metric by metric.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardflow.events import (
    CheckpointWritten,
    DiagnosticEvent,
    FetchThrottled,
    HandlerOverrun,
    LeaseAcquired,
    LeaseLost,
    LeaseReleased,
    LeaseRenewed,
    ShardEnded,
    ShardFailed,
    WorkerJoined,
    WorkerLeft,
)
from shardflow.metrics import ConsumerMetricsSnapshot
from shardflow.metrics.cloudwatch import CloudWatchPublisher, MetricBuffer

PROCESS_TASK = "ProcessTask"
RENEW_ALL_LEASES = "RenewAllLeases"
TAKE_LEASES = "TakeLeases"
SHUTDOWN_TASK = "ShutdownTask"
SHARDFLOW = "Shardflow"
"""The operation of the metrics shardflow adds (none of the KCL's has this name)."""


class KclMetrics:
    """Feeds a :class:`CloudWatchPublisher` with the KCL's metrics of one consumer (on its
    event loop)."""

    def __init__(
        self,
        publisher: CloudWatchPublisher,
        *,
        worker_id: str,
        streams: list[str],
        snapshot: Callable[[], ConsumerMetricsSnapshot],
        held_leases: Callable[[], int],
    ) -> None:
        self.publisher = publisher
        publisher.collect = self.collect
        self.worker_id = worker_id
        # The KCL adds StreamId in multi-stream mode only.
        self._multi_stream = len(streams) > 1
        self._snapshot = snapshot
        self._held_leases = held_leases
        self._peers: set[str] = set()
        self._taken = 0
        self._lost = 0
        self._overruns = 0
        self._reported: set[tuple[str, str]] = set()
        self._dead_letters: dict[str, int] = {}
        self._last_dropped = 0

    def _stream_id(self, stream: str) -> str | None:
        return stream if self._multi_stream else None

    @property
    def _buffer(self) -> MetricBuffer:
        return self.publisher.buffer

    # --- per batch (ProcessTask) -------------------------------------------------------------

    def batch(
        self,
        stream: str,
        shard_id: str,
        records: int,
        size: int,
        seconds: float,
        millis_behind_latest: int | None,
    ) -> None:
        """One batch of a shard's records was handed to delivery and taken (``seconds``)."""
        add = self._buffer.add
        dims = {"Operation": PROCESS_TASK, "ShardId": shard_id, "StreamId": self._stream_id(stream)}
        add("RecordsProcessed", records, "Count", "SUMMARY", **dims)
        add("DataBytesProcessed", size, "Bytes", "SUMMARY", **dims)
        add("Time", seconds * 1000.0, "Milliseconds", "SUMMARY", **dims)
        add("Success", 1, "Count", "SUMMARY", **dims)
        if millis_behind_latest is not None:
            add("MillisBehindLatest", millis_behind_latest, "Milliseconds", "SUMMARY", **dims)
            self._reported.add((stream, shard_id))

    # --- events ------------------------------------------------------------------------------

    def observe(self, event: DiagnosticEvent) -> None:
        """Count what the consumer's events report (subscribed to its event emitter)."""
        add = self._buffer.add
        worker = {"WorkerIdentifier": self.worker_id}
        match event:
            case LeaseRenewed():
                ms = event.duration * 1000.0
                dims = {"Operation": RENEW_ALL_LEASES, **worker}
                add("Success", 1, "Count", "SUMMARY", **dims)
                add("Time", ms, "Milliseconds", "SUMMARY", **dims)
                add("RenewLease.Success", 1, "Count", "DETAILED", **dims)
                add("RenewLease.Time", ms, "Milliseconds", "DETAILED", **dims)
            case LeaseAcquired():
                self._taken += 1
                dims = {"Operation": TAKE_LEASES, **worker}
                add("TakeLease.Success", 1, "Count", "DETAILED", **dims)
            case LeaseLost():
                self._lost += 1
                if event.why == "expired":
                    add("Success", 0, "Count", "SUMMARY", Operation=RENEW_ALL_LEASES, **worker)
                self._shutdown(event.stream, event.shard_id)
            case LeaseReleased() | ShardEnded():
                self._shutdown(event.stream, event.shard_id)
            case ShardFailed():
                add(
                    "Success",
                    0,
                    "Count",
                    "SUMMARY",
                    Operation=PROCESS_TASK,
                    ShardId=event.shard_id,
                    StreamId=self._stream_id(event.stream),
                )
            case CheckpointWritten():
                shard: dict[str, str | None] = {
                    "Operation": PROCESS_TASK,
                    "ShardId": event.shard_id,
                    "StreamId": self._stream_id(event.stream),
                }
                add("UpdateLease.Success", 1, "Count", "DETAILED", **shard)
                add(
                    "UpdateLease.Time", event.duration * 1000.0, "Milliseconds", "DETAILED", **shard
                )
            case FetchThrottled():
                add(
                    "KinesisDataFetcher.getRecords.Success",
                    0,
                    "Count",
                    "DETAILED",
                    Operation=PROCESS_TASK,
                    ShardId=event.shard_id,
                    StreamId=self._stream_id(event.stream),
                )
            case HandlerOverrun():
                self._overruns += 1
            case WorkerJoined():
                self._peers.add(event.peer_id)
            case WorkerLeft():
                self._peers.discard(event.peer_id)
            case _:
                pass

    def _shutdown(self, stream: str, shard_id: str) -> None:
        self._buffer.add(
            "Success",
            1,
            "Count",
            "SUMMARY",
            Operation=SHUTDOWN_TASK,
            ShardId=shard_id,
            StreamId=self._stream_id(stream),
        )

    # --- at each send ------------------------------------------------------------------------

    def collect(self, buffer: MetricBuffer) -> None:
        """Add the interval's counts and the gauges of now to ``buffer`` (before its send)."""
        worker = {"WorkerIdentifier": self.worker_id}
        add = buffer.add
        add(
            "CurrentLeases",
            self._held_leases(),
            "Count",
            "SUMMARY",
            Operation=RENEW_ALL_LEASES,
            **worker,
        )
        add("LostLeases", self._lost, "Count", "SUMMARY", Operation=RENEW_ALL_LEASES, **worker)
        add("TakenLeases", self._taken, "Count", "SUMMARY", Operation=TAKE_LEASES, **worker)
        add("NumWorkers", len(self._peers) + 1, "Count", "SUMMARY", Operation=TAKE_LEASES, **worker)
        self._taken = self._lost = 0
        snapshot = self._snapshot()
        for (stream, shard_id), shard in snapshot.shards.items():
            dims: dict[str, Any] = {
                "Operation": PROCESS_TASK,
                "ShardId": shard_id,
                "StreamId": self._stream_id(stream),
            }
            if (stream, shard_id) not in self._reported and shard.millis_behind_latest is not None:
                # A shard with nothing to hand out this interval (caught up): the KCL still
                # runs ProcessTask on its empty fetches and reports how far behind it is.
                add(
                    "MillisBehindLatest",
                    shard.millis_behind_latest,
                    "Milliseconds",
                    "SUMMARY",
                    **dims,
                )
            extra = {**dims, "Operation": SHARDFLOW}
            add("CheckpointLag", shard.checkpoint_lag, "Count", "DETAILED", **extra)
            if shard.checkpoint_age is not None:
                add(
                    "CheckpointAge",
                    shard.checkpoint_age * 1000.0,
                    "Milliseconds",
                    "DETAILED",
                    **extra,
                )
        self._reported.clear()
        self._collect_streams(buffer, snapshot.streams)
        dropped = self.publisher.dropped
        add(
            "MetricsDropped",
            dropped - self._last_dropped,
            "Count",
            "SUMMARY",
            Operation=SHARDFLOW,
            **worker,
        )
        self._last_dropped = dropped

    def _collect_streams(self, buffer: MetricBuffer, streams: Mapping[str, Any]) -> None:
        add = buffer.add
        worker = {"WorkerIdentifier": self.worker_id}
        overruns, self._overruns = self._overruns, 0
        add("HandlerOverruns", overruns, "Count", "SUMMARY", Operation=SHARDFLOW, **worker)
        for name, stream in streams.items():
            dims = {"Operation": SHARDFLOW, "StreamId": self._stream_id(name), **worker}
            before = self._dead_letters.get(name, 0)
            self._dead_letters[name] = stream.dead_letters
            add("DeadLetters", stream.dead_letters - before, "Count", "SUMMARY", **dims)
            add("ParkedShards", stream.parked_shards, "Count", "SUMMARY", **dims)
            add("OverrunningShards", stream.overrunning_shards, "Count", "SUMMARY", **dims)
