"""The producer: KPL-compatible batching, aggregation, per-shard pacing and retries, from Python.

Public API: :class:`Producer` (asyncio), :class:`SyncProducer` (threads),
:class:`ProducerSettings`, :class:`PutResult`,
:class:`ProducerMetricsSnapshot` and :class:`ProducerCollector` (prometheus-client).
"""

from typing import TYPE_CHECKING, Any

from shardflow.producer.metrics import ProducerMetricsSnapshot
from shardflow.producer.producer import Producer
from shardflow.producer.results import PutResult
from shardflow.producer.settings import ProducerSettings
from shardflow.producer.sync import SyncProducer

if TYPE_CHECKING:
    from shardflow.producer.prometheus import ProducerCollector


def __getattr__(name: str) -> Any:
    # prometheus-client is imported only by programs that export to it.
    if name == "ProducerCollector":
        from shardflow.producer.prometheus import ProducerCollector

        return ProducerCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Producer",
    "ProducerCollector",
    "ProducerMetricsSnapshot",
    "ProducerSettings",
    "PutResult",
    "SyncProducer",
]
