"""shardflow: Python-native toolkit for Amazon Kinesis Data Streams.

Everything an application uses every day is importable from here::

    from shardflow import Consumer, ConsumerSettings, Producer, StartPosition

More modules are public entry points of their own: :mod:`shardflow.spark` (the PySpark
source and sink), :mod:`shardflow.testing` (in-memory Kinesis and fault injection for your
tests), :mod:`shardflow.local` (the embedded local stack), :mod:`shardflow.metrics` (metrics
snapshots, Prometheus collectors, the metrics port with its health probes), and
:mod:`shardflow.events` / :mod:`shardflow.errors` (every diagnostic event and error type). Every other module is
internal: its names may move between releases.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # generated from _EXPORTS by tests/support/public_api.py
    from shardflow.aws import AssumeRole as AssumeRole
    from shardflow.aws import AwsSettings as AwsSettings
    from shardflow.aws import ClientFactory as ClientFactory
    from shardflow.aws import OpenClients as OpenClients
    from shardflow.backoff import Backoff as Backoff
    from shardflow.consumer import Checkpointer as Checkpointer
    from shardflow.consumer import CheckpointSettings as CheckpointSettings
    from shardflow.consumer import ConsumedRecord as ConsumedRecord
    from shardflow.consumer import Consumer as Consumer
    from shardflow.consumer import ConsumerSettings as ConsumerSettings
    from shardflow.consumer import ConsumerStatus as ConsumerStatus
    from shardflow.consumer import ShardSession as ShardSession
    from shardflow.consumer import ShardStatus as ShardStatus
    from shardflow.consumer import run_consumer as run_consumer
    from shardflow.consumer.delivery import DispatchSettings as DispatchSettings
    from shardflow.consumer.delivery import FailurePolicy as FailurePolicy
    from shardflow.consumer.delivery import Idempotency as Idempotency
    from shardflow.consumer.delivery import OrderingMode as OrderingMode
    from shardflow.consumer.delivery.calls import BatchHandler as BatchHandler
    from shardflow.consumer.delivery.calls import Handler as Handler
    from shardflow.consumer.delivery.calls import RecordHandler as RecordHandler
    from shardflow.deadletter import DeadLetter as DeadLetter
    from shardflow.deadletter import JsonLinesDestination as JsonLinesDestination
    from shardflow.deadletter import KinesisDestination as KinesisDestination
    from shardflow.deadletter import replay as replay
    from shardflow.errors import AccessDeniedError as AccessDeniedError
    from shardflow.errors import AggregationError as AggregationError
    from shardflow.errors import AwsError as AwsError
    from shardflow.errors import DeserializationError as DeserializationError
    from shardflow.errors import DispatchStoppedError as DispatchStoppedError
    from shardflow.errors import HandlerError as HandlerError
    from shardflow.errors import ProducerClosedError as ProducerClosedError
    from shardflow.errors import RecordDeliveryError as RecordDeliveryError
    from shardflow.errors import RecordTooLargeError as RecordTooLargeError
    from shardflow.errors import ResourceNotFoundError as ResourceNotFoundError
    from shardflow.errors import RetriesExhaustedError as RetriesExhaustedError
    from shardflow.errors import ShardflowError as ShardflowError
    from shardflow.errors import ShardLeaseLostError as ShardLeaseLostError
    from shardflow.errors import ThrottledError as ThrottledError
    from shardflow.errors import TransientError as TransientError
    from shardflow.events import DiagnosticEvent as DiagnosticEvent
    from shardflow.fetch import FanOut as FanOut
    from shardflow.fetch import Polling as Polling
    from shardflow.idempotency import DynamoDBIdempotencyGuard as DynamoDBIdempotencyGuard
    from shardflow.idempotency import InMemoryIdempotencyGuard as InMemoryIdempotencyGuard
    from shardflow.leases.settings import LeaseSettings as LeaseSettings
    from shardflow.metrics import ConsumerMetricsSnapshot as ConsumerMetricsSnapshot
    from shardflow.metrics import ProducerMetricsSnapshot as ProducerMetricsSnapshot
    from shardflow.positions import StartPosition as StartPosition
    from shardflow.producer import Producer as Producer
    from shardflow.producer import ProducerSettings as ProducerSettings
    from shardflow.producer import PutResult as PutResult
    from shardflow.producer import SyncProducer as SyncProducer
    from shardflow.reader import read_all as read_all
    from shardflow.reader import read_stream as read_stream
    from shardflow.records import ExtendedSequenceNumber as ExtendedSequenceNumber
    from shardflow.records import Record as Record
    from shardflow.records import as_bytes as as_bytes
    from shardflow.records import as_json as as_json
    from shardflow.records import from_function as from_function

__version__ = "0.1.0"

# Where each name of the API is defined. ``import shardflow`` imports none of these modules:
# a name is imported on first use (PEP 562), so that a program that needs one part (a Spark
# worker reading a stream needs no consumer, producer or lease table) does not pay for all.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "shardflow.aws": (
        "AssumeRole",
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
        "ShardLeaseLostError",
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
        "InMemoryIdempotencyGuard",
    ),
    "shardflow.leases.settings": ("LeaseSettings",),
    "shardflow.metrics": (
        "ConsumerMetricsSnapshot",
        "ProducerMetricsSnapshot",
    ),
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


# Names of the first release that were renamed: they work, with a DeprecationWarning, until
# the next one (CHANGELOG.md lists them).
_RENAMED: dict[str, str] = {
    "ShardLeaseLost": "ShardLeaseLostError",
    "MemoryIdempotencyGuard": "InMemoryIdempotencyGuard",
}
# Names that were exported by mistake (internal machinery): they work until the next release.
_WITHDRAWN: dict[str, tuple[str, str]] = {
    "ConsumerMetrics": (
        "shardflow.consumer.metrics",
        "the consumer's internal recorder; Consumer.metrics() returns a ConsumerMetricsSnapshot",
    ),
}


def __getattr__(name: str) -> Any:
    new = _RENAMED.get(name)
    if new is not None:
        warnings.warn(
            f"shardflow.{name} is shardflow.{new} now; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__(new)
    withdrawn = _WITHDRAWN.get(name)
    if withdrawn is not None:
        home, why = withdrawn
        warnings.warn(
            f"shardflow.{name} is no longer exported ({why})", DeprecationWarning, stacklevel=2
        )
        return getattr(importlib.import_module(home), name)
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


__all__ = [*sorted(_MODULE_OF, key=str.lower), "__version__"]
"""The public names: exactly ``_EXPORTS``, the one list (the type checkers' import block above
is generated from it)."""
