"""The consumer: reading shards and handing their records to user code, KCL-compatible.

Built in layers along the path of a record: ``fetch`` (batches of one shard, by polling or
enhanced fan-out), ``intake`` (de-aggregation, resume filter, hash-range rule), ``prefetch``
(bounded), ``shard_worker`` (delivery, acks, checkpoints of one shard), ``consumer`` (leases
from :mod:`shardflow.leases.coordinator`, a worker per owned shard).

Public API: :class:`Consumer` (``consume(handler)``, ``shards()``, ``stop()``, ``run()``),
:func:`run_consumer`, :class:`ConsumerSettings`, :class:`ConsumedRecord`,
:class:`ShardSession`, :class:`Checkpointer` and :class:`CheckpointSettings`,
:class:`ConsumerStatus`, :class:`ConsumerMetrics` and :class:`ConsumerCollector`
(prometheus-client), the diagnostic events in :mod:`shardflow.events`.
"""

from shardflow.consumer.checkpoint import Checkpointer, CheckpointSettings
from shardflow.consumer.consumer import Consumer
from shardflow.consumer.metrics import ConsumerCollector, ConsumerMetrics
from shardflow.consumer.records import ConsumedRecord
from shardflow.consumer.session import ShardSession
from shardflow.consumer.settings import ConsumerSettings
from shardflow.consumer.status import ConsumerStatus, ShardStatus
from shardflow.consumer.sync import run_consumer

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
