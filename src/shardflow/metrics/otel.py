"""Consumers and producers exported to OpenTelemetry: observable instruments over the same
tables the Prometheus collectors export (:mod:`shardflow.metrics.prometheus`), with the same
names and labels (attributes), so dashboards read the same series either way.

Needs the ``otel`` extra (``pip install 'shardflow[otel]'``); ``shardflow.metrics`` itself does
not import opentelemetry.

Mapping (no per-record work: every callback reads a snapshot when a reader collects):

* a counter is an observable counter with the Prometheus name without ``_total`` (an
  OpenTelemetry exporter to Prometheus adds it back);
* a gauge is an observable gauge (left out while its value is None);
* a histogram is two observable counters, ``<name>_count`` and ``<name>_sum``, since
  OpenTelemetry has no observable histogram and a synchronous one would need every value
  again. Rate of sum over rate of count is the mean; percentiles stay with ``metrics()`` or
  the Prometheus collector, which exports the buckets.

Units are given the OpenTelemetry way (``s``, ``By``, ``1``) and the names keep their
Prometheus suffix (``_seconds``, ``_bytes``), which the OpenTelemetry Prometheus exporter does
not append twice.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "shardflow.metrics.otel needs OpenTelemetry: pip install 'shardflow[otel]'"
    ) from exc

from shardflow.errors import ConfigurationError
from shardflow.metrics.prometheus import (
    PRODUCER_METRICS,
    SHARD_METRICS,
    STREAM_METRICS,
    Exported,
    Source,
    take,
)
from shardflow.metrics.recording import Histogram
from shardflow.metrics.snapshots import (
    ConsumerMetricsSnapshot,
    ProducerMetricsSnapshot,
    ShardMetrics,
    StreamMetrics,
)

S = TypeVar("S")
R = TypeVar("R")

Rows = Callable[[Sequence[S]], Iterable[tuple[Sequence[str], R]]]
"""The rows of the snapshots taken: (label values, the row an :class:`Exported` reads)."""

SCOPE = "shardflow"
"""The instrumentation scope of the meter taken from a ``MeterProvider`` (or the global one)."""

_taken: weakref.WeakKeyDictionary[Meter, set[str]] = weakref.WeakKeyDictionary()
"""The namespaces instrumented on each meter: OpenTelemetry keeps the first instrument of a
name and drops the callbacks of a second, so a second registration would report nothing."""


class AlreadyInstrumentedError(ConfigurationError):
    """This meter already has this namespace's instruments: instrument every source in one call,
    or use another meter (``provider.get_meter("...")``) or namespace."""


def _unit(name: str) -> str:
    if name.endswith("_seconds"):
        return "s"
    if name.endswith("bytes"):
        return "By"
    return "1"


class Instrumented(Generic[S]):
    """The instruments registered for some consumers or producers. ``close()`` makes every
    callback report nothing (OpenTelemetry's API cannot take an instrument back off a meter, so
    the names stay taken on that meter).

    One snapshot per source and collection: the first instrument's callback takes them, the
    others read them (the SDK calls a meter's callbacks in the order the instruments were
    made; were it not so, a callback would read the previous collection's)."""

    def __init__(self, sources: Sequence[Source[S]], timeout: float) -> None:
        self._sources = sources
        self._timeout = timeout
        self._lock = threading.Lock()
        self._snapshots: list[S] | None = None
        self._made = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    def _read(self, fresh: bool) -> list[S]:
        if self._closed:
            return []
        with self._lock:
            if fresh or self._snapshots is None:
                taken = (take(source, self._timeout) for source in self._sources)
                self._snapshots = [snapshot for snapshot in taken if snapshot is not None]
            return self._snapshots

    def register(
        self,
        meter: Meter,
        namespace: str,
        table: Sequence[Exported[R]],
        labels: Sequence[str],
        rows_of: Rows[S, R],
    ) -> None:
        """Instruments for ``table`` on ``meter``, named ``<namespace>_<name>``."""
        for metric in table:
            name = f"{namespace}_{metric.name}"
            if metric.kind == "histogram":
                for part, read in (("count", _count), ("sum", _sum)):
                    unit = _unit(metric.name) if part == "sum" else "1"
                    callback = self._callback(metric, labels, rows_of, read)
                    meter.create_observable_counter(
                        f"{name}_{part}", [callback], unit=unit, description=metric.doc
                    )
            else:
                make = (
                    meter.create_observable_counter
                    if metric.kind == "counter"
                    else meter.create_observable_gauge
                )
                callback = self._callback(metric, labels, rows_of, float)
                make(name, [callback], unit=_unit(metric.name), description=metric.doc)

    def _callback(
        self,
        metric: Exported[R],
        labels: Sequence[str],
        rows_of: Rows[S, R],
        read: Callable[[Any], float],
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        fresh = self._made == 0
        self._made += 1

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            for values, row in rows_of(self._read(fresh)):
                value = metric.read(row)
                if value is None:
                    continue
                attributes = dict(zip(labels, values, strict=True))
                if metric.by:
                    for key, number in value.items():
                        yield Observation(number, {**attributes, metric.by: key})
                else:
                    yield Observation(read(value), attributes)

        return observe


def _count(histogram: Histogram) -> float:
    return float(histogram.count)


def _sum(histogram: Histogram) -> float:
    return histogram.sum


def _meter(meter: Meter | MeterProvider | None, namespace: str) -> Meter:
    if meter is None:
        meter = otel_metrics.get_meter(SCOPE)
    elif isinstance(meter, MeterProvider):
        meter = meter.get_meter(SCOPE)
    namespaces = _taken.setdefault(meter, set())
    if namespace in namespaces:
        raise AlreadyInstrumentedError(
            f"{namespace} is already instrumented on meter {meter.name!r}: instrument every "
            "source in one call, or use another meter or namespace"
        )
    namespaces.add(namespace)
    return meter


def _streams(
    snapshots: Sequence[ConsumerMetricsSnapshot],
) -> list[tuple[Sequence[str], StreamMetrics]]:
    return [((name,), m) for s in snapshots for name, m in s.streams.items()]


def _shards(
    snapshots: Sequence[ConsumerMetricsSnapshot],
) -> list[tuple[Sequence[str], ShardMetrics]]:
    return [(key, m) for s in snapshots for key, m in s.shards.items()]


def _by_stream(
    snapshots: Sequence[ProducerMetricsSnapshot],
) -> list[tuple[Sequence[str], ProducerMetricsSnapshot]]:
    """Producers of one stream merged, as the Prometheus collector merges them."""
    by_stream: dict[str, ProducerMetricsSnapshot] = {}
    for snapshot in snapshots:
        earlier = by_stream.get(snapshot.stream)
        by_stream[snapshot.stream] = snapshot if earlier is None else earlier.merge(snapshot)
    return [((stream,), snapshot) for stream, snapshot in by_stream.items()]


def instrument_consumer(
    *consumers: Source[ConsumerMetricsSnapshot],
    meter: Meter | MeterProvider | None = None,
    namespace: str = "shardflow_consumer",
    timeout: float = 5.0,
) -> Instrumented[ConsumerMetricsSnapshot]:
    """Registers consumers' metrics on ``meter`` (a ``Meter``, a ``MeterProvider``, or None
    for the global provider): per stream (attribute ``stream``) and per owned shard
    (``stream``, ``shard``). ``consumers``: anything with ``metrics(timeout)``, or functions
    returning a :class:`ConsumerMetricsSnapshot`; one that cannot answer within ``timeout``
    reports nothing in that collection. Raises :class:`AlreadyInstrumentedError` when
    ``namespace`` is already instrumented on that meter."""
    handle: Instrumented[ConsumerMetricsSnapshot] = Instrumented(consumers, timeout)
    target = _meter(meter, namespace)
    handle.register(target, namespace, STREAM_METRICS, ("stream",), _streams)
    handle.register(target, namespace, SHARD_METRICS, ("stream", "shard"), _shards)
    return handle


def instrument_producer(
    *producers: Source[ProducerMetricsSnapshot],
    meter: Meter | MeterProvider | None = None,
    namespace: str = "shardflow_producer",
    timeout: float = 5.0,
) -> Instrumented[ProducerMetricsSnapshot]:
    """Registers producers' metrics on ``meter`` (as :func:`instrument_consumer`), with the
    attribute ``stream`` (producers of one stream merged); ``producers``: ``Producer``,
    ``SyncProducer``, or functions returning a :class:`ProducerMetricsSnapshot`."""
    handle: Instrumented[ProducerMetricsSnapshot] = Instrumented(producers, timeout)
    handle.register(_meter(meter, namespace), namespace, PRODUCER_METRICS, ("stream",), _by_stream)
    return handle
