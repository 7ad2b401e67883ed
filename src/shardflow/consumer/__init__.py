"""The consumer: reading shards and handing their records to user code, KCL-compatible.

Built in layers along the path of a record: ``fetch`` (batches of one shard, by polling or
enhanced fan-out), ``intake`` (de-aggregation, resume filter, hash-range rule), ``prefetch``
(bounded), ``shard_worker`` (delivery, acks, checkpoints of one shard), ``consumer`` (leases
from :mod:`shardflow.leases.coordinator`, a worker per owned shard).

Public API: :class:`Consumer` (``consume(handler)``, ``shards()``, ``stop()``, ``run()``),
:func:`run_consumer`, :class:`ConsumerSettings`, :class:`ConsumedRecord`,
:class:`ShardSession`, :class:`Checkpointer` and :class:`CheckpointSettings`,
:class:`ConsumerStatus`, :class:`ConsumerMetrics` and :class:`ConsumerCollector`
(prometheus-client), the diagnostic events in :mod:`shardflow.consumer.events`.

Names are imported on first use: the lease coordinator imports parts of this package, and a
package that imported the consumer eagerly would import the coordinator in a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardflow._lazy import lazy_attributes

if TYPE_CHECKING:
    from shardflow.consumer.checkpoint import Checkpointer, CheckpointSettings
    from shardflow.consumer.consumer import Consumer
    from shardflow.consumer.metrics import ConsumerCollector, ConsumerMetrics
    from shardflow.consumer.records import ConsumedRecord
    from shardflow.consumer.session import ShardSession
    from shardflow.consumer.settings import ConsumerSettings
    from shardflow.consumer.status import ConsumerStatus, ShardStatus
    from shardflow.consumer.sync import run_consumer

_EXPORTS = {
    "Checkpointer": "shardflow.consumer.checkpoint",
    "CheckpointSettings": "shardflow.consumer.checkpoint",
    "Consumer": "shardflow.consumer.consumer",
    "ConsumerCollector": "shardflow.consumer.metrics",
    "ConsumerMetrics": "shardflow.consumer.metrics",
    "ConsumedRecord": "shardflow.consumer.records",
    "ConsumerSettings": "shardflow.consumer.settings",
    "ConsumerStatus": "shardflow.consumer.status",
    "ShardSession": "shardflow.consumer.session",
    "ShardStatus": "shardflow.consumer.status",
    "run_consumer": "shardflow.consumer.sync",
}

__all__ = [
    "CheckpointSettings",
    "Checkpointer",
    "ConsumedRecord",
    "Consumer",
    "ConsumerCollector",
    "ConsumerMetrics",
    "ConsumerSettings",
    "ConsumerStatus",
    "ShardSession",
    "ShardStatus",
    "run_consumer",
]

__getattr__, __dir__ = lazy_attributes(globals(), _EXPORTS)
