"""Dispatch: how a shard's records reach the handler (ordering modes, retries, dead letters).

:class:`ShardDispatcher` (one per shard) runs a handler over records per
:class:`DispatchSettings`: in shard order, in key order with keys in parallel, or unordered;
bounded per shard (and per worker with a shared limit); retried per a :class:`~shardflow.backoff.Backoff`;
finally failed records stop the shard or go to a :class:`DeadLetterSink`. A record is
acknowledged in the shard's ack tracker only after it succeeded or was dead-lettered.
"""

from shardflow.consumer.delivery.calls import RecordHandler
from shardflow.consumer.delivery.dead_letters import (
    DeadLetters,
    DeadLetterSink,
    DestinationSink,
    WorkerLimit,
)
from shardflow.consumer.delivery.engine import DispatchCounts, ShardDispatcher
from shardflow.consumer.delivery.settings import (
    DispatchSettings,
    FailurePolicy,
    Idempotency,
    KeyFunction,
    OrderingMode,
    partition_key,
)

__all__ = [
    "DeadLetterSink",
    "DeadLetters",
    "DestinationSink",
    "DispatchCounts",
    "DispatchSettings",
    "FailurePolicy",
    "Idempotency",
    "KeyFunction",
    "OrderingMode",
    "RecordHandler",
    "ShardDispatcher",
    "WorkerLimit",
    "partition_key",
]
