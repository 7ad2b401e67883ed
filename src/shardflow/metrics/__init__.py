"""Metrics of consumers and producers: snapshots, and collectors for prometheus-client.

``consumer.metrics()`` returns a :class:`ConsumerMetricsSnapshot`, ``producer.metrics()`` a
:class:`ProducerMetricsSnapshot`: frozen copies, taken from any thread (on the client's event
loop; TimeoutError if it does not answer within ``timeout``). Both hold counters since start,
gauges as of now, and distributions as :class:`Histogram` (HdrHistogram inside, 3
significant digits). **Durations are in seconds** everywhere: in snapshots, percentiles and
exported histograms (kept as whole microseconds inside, from 1 µs to a day).

Export to Prometheus by registering a collector per kind of client:

    from prometheus_client import REGISTRY, start_http_server
    from shardflow.metrics import ConsumerCollector, ProducerCollector

    REGISTRY.register(ConsumerCollector(consumer))
    REGISTRY.register(ProducerCollector(producer))
    start_http_server(9100, addr="127.0.0.1")

Every scrape takes fresh snapshots; a client whose loop is busy past ``timeout`` (5 s) is left
out of that scrape. ``shardflow consume --metrics-port 9100 [--metrics-host 0.0.0.0]`` serves
the consumer's, with the health probes ``/healthz`` and ``/readyz`` beside them
(:class:`MetricsServer`). The exported names, one per snapshot field, are listed in the operations guide
(namespaces ``shardflow_consumer`` and ``shardflow_producer``); latency histograms have the
buckets of :data:`LATENCY_BUCKETS`.

``ConsumerSettings(metrics=CloudWatch())`` publishes the consumer's metrics to CloudWatch under
the KCL's names (:mod:`shardflow.metrics.cloudwatch`; the mapping is in the operations guide).

With the ``otel`` extra, :mod:`shardflow.metrics.otel` registers the same metrics as
OpenTelemetry observable instruments (``instrument_consumer``, ``instrument_producer``); this
module does not import OpenTelemetry.
"""

from shardflow.metrics.cloudwatch import CloudWatch, MetricsLevel
from shardflow.metrics.http import HealthReport, MetricsServer
from shardflow.metrics.prometheus import (
    LATENCY_BUCKETS,
    ConsumerCollector,
    HasMetrics,
    ProducerCollector,
)
from shardflow.metrics.recording import Histogram
from shardflow.metrics.snapshots import (
    ConsumerMetricsSnapshot,
    ProducerMetricsSnapshot,
    ShardMetrics,
    StreamMetrics,
)

__all__ = [
    "LATENCY_BUCKETS",
    "CloudWatch",
    "ConsumerCollector",
    "ConsumerMetricsSnapshot",
    "HasMetrics",
    "HealthReport",
    "Histogram",
    "MetricsLevel",
    "MetricsServer",
    "ProducerCollector",
    "ProducerMetricsSnapshot",
    "ShardMetrics",
    "StreamMetrics",
]
