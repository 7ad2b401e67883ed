"""The producer: KPL-compatible batching, aggregation, per-shard pacing and retries, from Python.

Public API: :class:`Producer` (asyncio), :class:`SyncProducer` (threads),
:class:`ProducerSettings`, :class:`PutResult`. Its metrics (:class:`ProducerMetricsSnapshot`,
:class:`ProducerCollector` for prometheus-client) are in :mod:`shardflow.metrics`, re-exported
here.
"""

from shardflow.metrics import ProducerCollector, ProducerMetricsSnapshot
from shardflow.producer.producer import Producer
from shardflow.producer.results import PutResult
from shardflow.producer.settings import ProducerSettings
from shardflow.producer.sync import SyncProducer

__all__ = [
    "Producer",
    "ProducerCollector",
    "ProducerMetricsSnapshot",
    "ProducerSettings",
    "PutResult",
    "SyncProducer",
]
