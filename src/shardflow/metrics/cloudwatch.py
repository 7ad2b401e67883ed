"""Publishing to Amazon CloudWatch as the KCL and the KPL do: statistic sets per interval, sent
in the background, never in the way of records.

A client's recorder adds values to a :class:`MetricBuffer` (a dict update each: a statistic set
per metric name and dimensions, kept on the client's event loop); a :class:`CloudWatchPublisher`
swaps the buffer every ``interval`` (60 s by default, the KCL's and KPL's) and sends what it
held with ``PutMetricData``, in calls within the service's limits (1,000 values and 1 MB per
call). A failed call drops its metrics: it is logged (once a minute at most) and counted
(:attr:`CloudWatchPublisher.dropped`), never raised into the client.

The consumer publishes the KCL's metric names (namespace: the application name), the producer
the KPL's (namespace ``KinesisProducerLibrary``); the operations guide lists them, metric by
metric. Levels are the KCL's: a metric of level ``DETAILED`` is sent only when the configured
level is ``DETAILED`` (the default), one of level ``SUMMARY`` at ``SUMMARY`` or above, and
nothing at ``NONE``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

log = logging.getLogger("shardflow.metrics.cloudwatch")

MetricsLevel = Literal["NONE", "SUMMARY", "DETAILED"]
"""How much is sent: nothing, the summary metrics, or every metric (the default)."""

Dimension = Literal[
    "Operation", "ShardId", "WorkerIdentifier", "StreamId", "StreamName", "ErrorCode"
]
"""The KCL's dimensions (``StreamId`` only when a consumer reads several streams, as the KCL
adds it in multi-stream mode) and the KPL's (``StreamName``, ``ErrorCode``)."""

Unit = Literal["Count", "Milliseconds", "Bytes", "None"]

LEVELS: Final[Mapping[str, int]] = {"NONE": 0, "SUMMARY": 1, "DETAILED": 2}

MAX_DATUMS_PER_CALL: Final = 1_000
"""PutMetricData's limit of metric values per call."""

MAX_BYTES_PER_CALL: Final = 1_000_000
"""PutMetricData's limit of request size (1 MB); batches stay well under it (see
:func:`batches`)."""

KCL_DIMENSIONS: Final[frozenset[str]] = frozenset(
    {"Operation", "ShardId", "WorkerIdentifier", "StreamId"}
)
KPL_DIMENSIONS: Final[frozenset[str]] = frozenset({"StreamName", "ErrorCode"})
"""The producer's (the KPL's ``StreamName`` and ``ErrorCode``; its ``ShardId`` level is not
published: see the operations guide)."""
ALL_DIMENSIONS: Final[frozenset[str]] = KCL_DIMENSIONS | KPL_DIMENSIONS


@dataclass(frozen=True, slots=True)
class CloudWatch:
    """Publish a client's metrics to CloudWatch (``ConsumerSettings(metrics=CloudWatch())``,
    ``ProducerSettings(metrics=CloudWatch())``).

    The client's AWS settings (region, endpoint, credentials) are used for the CloudWatch
    client too; ``endpoint_url`` sends to another endpoint (an emulator of CloudWatch alone).
    """

    namespace: str | None = None
    """The metrics' namespace (default: the consumer's application name, as the KCL's; the
    producer's ``KinesisProducerLibrary``, as the KPL's)."""
    level: MetricsLevel = "DETAILED"
    """``NONE``, ``SUMMARY`` or ``DETAILED`` (the KCL's ``metricsLevel``; default DETAILED)."""
    dimensions: frozenset[str] = ALL_DIMENSIONS
    """Dimensions sent (the KCL's ``metricsEnabledDimensions``; default all: the consumer's
    ``Operation``, ``ShardId``, ``WorkerIdentifier`` and, with several streams, ``StreamId``;
    the producer's ``StreamName`` and ``ErrorCode``). ``Operation`` is always sent. A metric
    whose dimension is left out is aggregated over it (without ``StreamName`` the producer
    sends its metrics at the KPL's ``GLOBAL`` granularity only)."""
    interval: float = 60.0
    """Seconds each statistic set covers, and between sends (the KCL's
    ``metricsBufferTimeMillis``: 60 s)."""
    max_datums: int = 10_000
    """Most metric values (statistic sets) kept for one send; more are dropped and counted (the
    KCL's ``metricsMaxQueueSize``: 10,000)."""
    endpoint_url: str | None = None
    """CloudWatch's endpoint, when it is not the client's own ``AwsSettings.endpoint_url``."""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be NONE, SUMMARY or DETAILED, got {self.level!r}")
        unknown = set(self.dimensions) - ALL_DIMENSIONS
        if unknown:
            raise ValueError(f"unknown dimensions {sorted(unknown)}: use {sorted(ALL_DIMENSIONS)}")
        object.__setattr__(self, "dimensions", frozenset(self.dimensions) | {"Operation"})
        if not self.interval > 0:
            raise ValueError("interval must be positive")
        if self.max_datums < 1:
            raise ValueError("max_datums must be at least 1")
        if self.namespace is not None and not self.namespace:
            raise ValueError("namespace must not be empty (None picks the default)")

    def sends(self, level: MetricsLevel) -> bool:
        """Whether a metric of ``level`` is sent at the configured level."""
        return LEVELS[level] <= LEVELS[self.level] and self.level != "NONE"


class StatisticSet:
    """SampleCount, Sum, Minimum and Maximum of the values of one metric in one interval."""

    __slots__ = ("count", "maximum", "minimum", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value

    def merge(self, count: int, total: float, minimum: float, maximum: float) -> None:
        """Add ``count`` values summing to ``total``, between ``minimum`` and ``maximum``."""
        self.count += count
        self.total += total
        if minimum < self.minimum:
            self.minimum = minimum
        if maximum > self.maximum:
            self.maximum = maximum

    def as_dict(self) -> dict[str, float]:
        return {
            "SampleCount": float(self.count),
            "Sum": self.total,
            "Minimum": self.minimum,
            "Maximum": self.maximum,
        }


Key = tuple[str, str, tuple[tuple[str, str], ...]]
"""(metric name, unit, dimensions as sorted (name, value) pairs)."""


class MetricBuffer:
    """Statistic sets of one interval, by metric name, unit and dimensions.

    :meth:`add` filters by level and by the enabled dimensions, so that callers name every
    dimension a metric has in the KCL and the settings decide what is sent.
    """

    def __init__(self, settings: CloudWatch) -> None:
        self.settings = settings
        self._sets: dict[Key, StatisticSet] = {}
        self.overflowed = 0
        """Values not kept because :attr:`CloudWatch.max_datums` sets were full."""

    def __len__(self) -> int:
        return len(self._sets)

    def add(
        self,
        name: str,
        value: float,
        unit: Unit,
        level: MetricsLevel,
        /,
        **dimensions: str | None,
    ) -> None:
        """Add one value of metric ``name`` with ``dimensions`` (None: not applicable)."""
        stats = self._set_of(name, unit, level, dimensions)
        if stats is not None:
            stats.add(value)

    def add_set(
        self,
        name: str,
        unit: Unit,
        level: MetricsLevel,
        values: tuple[int, float, float, float],
        /,
        **dimensions: str | None,
    ) -> None:
        """Add ``values`` (count, sum, minimum, maximum: what a histogram or counters of the
        interval hold) to metric ``name``; nothing when the count is 0."""
        count, total, minimum, maximum = values
        if count <= 0:
            return
        stats = self._set_of(name, unit, level, dimensions)
        if stats is not None:
            stats.merge(count, total, minimum, maximum)

    def _set_of(
        self, name: str, unit: Unit, level: MetricsLevel, dimensions: Mapping[str, str | None]
    ) -> StatisticSet | None:
        settings = self.settings
        if not settings.sends(level):
            return None
        enabled = settings.dimensions
        dims = tuple(
            sorted((k, v) for k, v in dimensions.items() if v is not None and k in enabled)
        )
        key = (name, unit, dims)
        stats = self._sets.get(key)
        if stats is None:
            if len(self._sets) >= settings.max_datums:
                self.overflowed += 1
                return None
            stats = self._sets[key] = StatisticSet()
        return stats

    def items(self) -> Iterator[tuple[Key, StatisticSet]]:
        return iter(self._sets.items())

    def get(self, name: str, **dimensions: str) -> StatisticSet | None:
        """The statistic set of ``name`` with exactly ``dimensions`` (for tests and readers)."""
        dims = tuple(sorted(dimensions.items()))
        for unit in ("Count", "Milliseconds", "Bytes", "None"):
            found = self._sets.get((name, unit, dims))
            if found is not None:
                return found
        return None


def datums(buffer: MetricBuffer, timestamp: datetime) -> list[dict[str, Any]]:
    """The buffer as PutMetricData's ``MetricData`` entries (statistic sets at ``timestamp``)."""
    return [
        {
            "MetricName": name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in dims],
            "Timestamp": timestamp,
            "StatisticValues": stats.as_dict(),
            "Unit": unit,
        }
        for (name, unit, dims), stats in buffer.items()
        if stats.count
    ]


def _size(datum: Mapping[str, Any]) -> int:
    """An upper bound of a datum's size in a request (any protocol: names, values, keys)."""
    dims = sum(len(d["Name"]) + len(d["Value"]) + 48 for d in datum["Dimensions"])
    return len(datum["MetricName"]) + dims + 320


def batches(
    entries: Iterable[dict[str, Any]],
    *,
    max_count: int = MAX_DATUMS_PER_CALL,
    max_bytes: int = MAX_BYTES_PER_CALL // 2,
) -> Iterator[list[dict[str, Any]]]:
    """``entries`` in lists for one PutMetricData call each: at most ``max_count`` values and
    about ``max_bytes`` (half the service's 1 MB, whatever the wire protocol's overhead)."""
    batch: list[dict[str, Any]] = []
    size = 0
    for entry in entries:
        entry_size = _size(entry)
        if batch and (len(batch) >= max_count or size + entry_size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += entry_size
    if batch:
        yield batch


Put = Callable[[str, list[dict[str, Any]]], Awaitable[Any]]
"""Sends one batch: ``put(namespace, metric_data)`` (a PutMetricData call)."""

Collect = Callable[[MetricBuffer], None]
"""Adds the values known only when asked (gauges of a snapshot) just before a send."""

LOG_EVERY: Final = 60.0
"""Seconds between two warnings about failed sends (the rest are counted)."""


class CloudWatchPublisher:
    """Sends a client's :class:`MetricBuffer` every ``interval`` in the background.

    The recorder adds to :attr:`buffer` on the client's event loop; :meth:`run` (a task of that
    loop) swaps it for an empty one, calls ``collect`` on the full one, and sends it. A send
    that fails drops what it held: logged (once per :data:`LOG_EVERY`) and counted, never
    raised. :meth:`flush` sends what was gathered so far (the last partial interval at stop).
    """

    def __init__(
        self,
        settings: CloudWatch,
        namespace: str,
        put: Put | None = None,
        *,
        collect: Collect | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.namespace = namespace
        self.buffer = MetricBuffer(settings)
        self.put = put
        """Sends one batch (None: not connected yet; a send drops what it has, counted)."""
        self.collect = collect
        """Called with each full buffer before its send (gauges known only when asked)."""
        self._now = now
        self._last_warning: float | None = None
        self.sent = 0
        """Metric values (statistic sets) accepted by CloudWatch."""
        self.calls = 0
        """PutMetricData calls that succeeded."""
        self.failed_calls = 0
        """PutMetricData calls that failed (their values dropped)."""
        self.dropped = 0
        """Metric values dropped: in failed calls, or over :attr:`CloudWatch.max_datums`."""

    async def run(self) -> None:
        """Send every ``interval`` until cancelled (then the caller :meth:`flush`-es)."""
        if self.settings.level == "NONE":
            return
        while True:
            await asyncio.sleep(self.settings.interval)
            await self.flush()

    async def flush(self) -> None:
        """Send what was gathered since the last send; never raises but cancellation."""
        full, self.buffer = self.buffer, MetricBuffer(self.settings)
        if self.settings.level == "NONE":
            return
        if self.collect is not None:
            try:
                self.collect(full)
            except Exception:
                log.exception("collecting CloudWatch metrics failed")
        self.dropped += full.overflowed
        stamp = datetime.fromtimestamp(self._now(), UTC)
        put = self.put
        for batch in batches(datums(full, stamp)):
            if put is None:
                self.dropped += len(batch)
                continue
            try:
                await put(self.namespace, batch)
            except asyncio.CancelledError:
                self.dropped += len(batch)
                raise
            except Exception as exc:
                self.failed_calls += 1
                self.dropped += len(batch)
                self._warn(exc, len(batch))
            else:
                self.calls += 1
                self.sent += len(batch)

    def _warn(self, exc: Exception, count: int) -> None:
        now = self._now()
        if self._last_warning is not None and now - self._last_warning < LOG_EVERY:
            return
        self._last_warning = now
        log.warning(
            "CloudWatch PutMetricData failed (%s: %s): %d metric values of namespace %s dropped "
            "(%d dropped so far; this warning is repeated once a minute at most)",
            type(exc).__name__,
            exc,
            count,
            self.namespace,
            self.dropped,
        )


def cloudwatch_put(client: Any) -> Put:
    """A :data:`Put` through an aiobotocore CloudWatch client."""

    async def put(namespace: str, metric_data: list[dict[str, Any]]) -> None:
        await client.put_metric_data(Namespace=namespace, MetricData=metric_data)

    return put
