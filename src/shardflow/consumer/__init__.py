"""The consumer: reading shards and handing their records to user code, KCL-compatible.

Grouped by the stages of a record (fetching itself is :mod:`shardflow.fetch`):

- ``reading/``: a shard's batches through intake (de-aggregation, resume filter, hash-range
  rule) into a bounded prefetch buffer;
- ``delivery/``: the records to the handler per the ordering mode, retries, dead letters;
- ``checkpointing/``: acknowledgements, the safe position, the checkpoint write;
- ``lifecycle/``: a worker per owned shard (start, stop, handoff, shard end), supervision,
  connections, status and signals.

Public API: :class:`Consumer` (``consume(handler)``, ``shards()``, ``close()``, ``run()``),
:func:`run_consumer`, :class:`ConsumerSettings`, :class:`ConsumedRecord`,
:class:`ShardSession`, :class:`Checkpointer` and :class:`CheckpointSettings`,
:class:`ConsumerStatus`, the diagnostic events in :mod:`shardflow.events`; its metrics in
:mod:`shardflow.metrics` (:class:`ConsumerCollector` re-exported here; :class:`ConsumerMetrics`
is the live recorder behind ``Consumer.metrics()``).
"""

from shardflow.consumer.checkpointing.acks import ConsumedRecord
from shardflow.consumer.checkpointing.checkpoint import Checkpointer, CheckpointSettings
from shardflow.consumer.consumer import Consumer
from shardflow.consumer.lifecycle.session import ShardSession
from shardflow.consumer.lifecycle.status import ConsumerStatus, ShardStatus
from shardflow.consumer.lifecycle.sync import run_consumer
from shardflow.consumer.metrics import ConsumerMetrics
from shardflow.consumer.settings import ConsumerSettings
from shardflow.metrics import ConsumerCollector

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
