"""The producer: KPL-compatible batching, aggregation, per-shard pacing and retries, from Python.

Public API: :class:`Producer` (asyncio), :class:`SyncProducer` (threads),
:class:`ProducerSettings`, :class:`PutResult`,
:class:`ProducerMetricsSnapshot` and :class:`ProducerCollector` (prometheus-client).
"""

from shardflow.producer.metrics import ProducerMetricsSnapshot
from shardflow.producer.producer import Producer
from shardflow.producer.prometheus import ProducerCollector
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
