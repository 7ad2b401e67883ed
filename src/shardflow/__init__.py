"""shardflow: Python-native toolkit for Amazon Kinesis Data Streams.

Everything an application uses every day is importable from here::

    from shardflow import Consumer, ConsumerSettings, Producer, StartPosition

Four more modules are public entry points of their own: :mod:`shardflow.spark` (the PySpark
source and sink), :mod:`shardflow.testing` (in-memory Kinesis and fault injection for your
tests), :mod:`shardflow.local` (the embedded local stack), and :mod:`shardflow.events` /
:mod:`shardflow.errors` (every diagnostic event and error type). Every other module is
internal: its names may move between releases.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardflow.aws import AwsSettings, ClientFactory, OpenClients
    from shardflow.backoff import Backoff
    from shardflow.consumer import (
        Checkpointer,
        CheckpointSettings,
        ConsumedRecord,
        Consumer,
        ConsumerMetrics,
        ConsumerSettings,
        ConsumerStatus,
        ShardSession,
        ShardStatus,
        run_consumer,
    )
    from shardflow.consumer.delivery import (
        DispatchSettings,
        FailurePolicy,
        Idempotency,
        OrderingMode,
    )
    from shardflow.consumer.delivery.calls import BatchHandler, Handler, RecordHandler
    from shardflow.deadletter import DeadLetter, JsonLinesDestination, KinesisDestination, replay
    from shardflow.errors import (
        AccessDeniedError,
        AggregationError,
        AwsError,
        DeserializationError,
        DispatchStoppedError,
        HandlerError,
        ProducerClosedError,
        RecordDeliveryError,
        RecordTooLargeError,
        ResourceNotFoundError,
        RetriesExhaustedError,
        ShardflowError,
        ShardLeaseLost,
        ThrottledError,
        TransientError,
    )
    from shardflow.events import DiagnosticEvent
    from shardflow.fetch import FanOut, Polling
    from shardflow.idempotency import DynamoDBIdempotencyGuard, MemoryIdempotencyGuard
    from shardflow.leases.settings import LeaseSettings
    from shardflow.positions import StartPosition
    from shardflow.producer import Producer, ProducerSettings, PutResult, SyncProducer
    from shardflow.reader import read_all, read_stream
    from shardflow.records import ExtendedSequenceNumber, Record, as_bytes, as_json, from_function

__version__ = "0.1.0"

# Where each name of the API is defined. ``import shardflow`` imports none of these modules:
# a name is imported on first use (PEP 562), so that a program that needs one part (a Spark
# worker reading a stream needs no consumer, producer or lease table) does not pay for all.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "shardflow.aws": (
        "AwsSettings",
        "ClientFactory",
        "OpenClients",
    ),
    "shardflow.backoff": ("Backoff",),
    "shardflow.consumer": (
        "Checkpointer",
        "CheckpointSettings",
        "ConsumedRecord",
        "Consumer",
        "ConsumerMetrics",
        "ConsumerSettings",
        "ConsumerStatus",
        "ShardSession",
        "ShardStatus",
        "run_consumer",
    ),
    "shardflow.consumer.delivery": (
        "DispatchSettings",
        "FailurePolicy",
        "Idempotency",
        "OrderingMode",
    ),
    "shardflow.consumer.delivery.calls": (
        "BatchHandler",
        "Handler",
        "RecordHandler",
    ),
    "shardflow.deadletter": (
        "DeadLetter",
        "JsonLinesDestination",
        "KinesisDestination",
        "replay",
    ),
    "shardflow.errors": (
        "AccessDeniedError",
        "AggregationError",
        "AwsError",
        "DeserializationError",
        "DispatchStoppedError",
        "HandlerError",
        "ProducerClosedError",
        "RecordDeliveryError",
        "RecordTooLargeError",
        "ResourceNotFoundError",
        "RetriesExhaustedError",
        "ShardflowError",
        "ShardLeaseLost",
        "ThrottledError",
        "TransientError",
    ),
    "shardflow.events": ("DiagnosticEvent",),
    "shardflow.fetch": (
        "FanOut",
        "Polling",
    ),
    "shardflow.idempotency": (
        "DynamoDBIdempotencyGuard",
        "MemoryIdempotencyGuard",
    ),
    "shardflow.leases.settings": ("LeaseSettings",),
    "shardflow.positions": ("StartPosition",),
    "shardflow.producer": (
        "Producer",
        "ProducerSettings",
        "PutResult",
        "SyncProducer",
    ),
    "shardflow.reader": (
        "read_all",
        "read_stream",
    ),
    "shardflow.records": (
        "ExtendedSequenceNumber",
        "Record",
        "as_bytes",
        "as_json",
        "from_function",
    ),
}

_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"shardflow.{name}") is not None:
        value = importlib.import_module(f"shardflow.{name}")  # shardflow.errors and the like
    else:
        raise AttributeError(f"module 'shardflow' has no attribute {name!r}")
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AccessDeniedError",
    "AggregationError",
    "AwsError",
    "AwsSettings",
    "Backoff",
    "BatchHandler",
    "CheckpointSettings",
    "Checkpointer",
    "ClientFactory",
    "ConsumedRecord",
    "Consumer",
    "ConsumerMetrics",
    "ConsumerSettings",
    "ConsumerStatus",
    "DeadLetter",
    "DeserializationError",
    "DiagnosticEvent",
    "DispatchSettings",
    "DispatchStoppedError",
    "DynamoDBIdempotencyGuard",
    "ExtendedSequenceNumber",
    "FailurePolicy",
    "FanOut",
    "Handler",
    "HandlerError",
    "Idempotency",
    "JsonLinesDestination",
    "KinesisDestination",
    "LeaseSettings",
    "MemoryIdempotencyGuard",
    "OpenClients",
    "OrderingMode",
    "Polling",
    "Producer",
    "ProducerClosedError",
    "ProducerSettings",
    "PutResult",
    "Record",
    "RecordDeliveryError",
    "RecordHandler",
    "RecordTooLargeError",
    "ResourceNotFoundError",
    "RetriesExhaustedError",
    "ShardLeaseLost",
    "ShardSession",
    "ShardStatus",
    "ShardflowError",
    "StartPosition",
    "SyncProducer",
    "ThrottledError",
    "TransientError",
    "__version__",
    "as_bytes",
    "as_json",
    "from_function",
    "read_all",
    "read_stream",
    "replay",
    "run_consumer",
]
