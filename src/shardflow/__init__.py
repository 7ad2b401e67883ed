"""shardflow: Python-native toolkit for Amazon Kinesis Data Streams.

Everything an application uses every day is importable from here::

    from shardflow import Consumer, ConsumerSettings, Producer, StartPosition

Four more modules are public entry points of their own: :mod:`shardflow.spark` (the PySpark
source and sink), :mod:`shardflow.testing` (in-memory Kinesis and fault injection for your
tests), :mod:`shardflow.local` (the embedded local stack), and :mod:`shardflow.events` /
:mod:`shardflow.errors` (every diagnostic event and error type). Every other module is
internal: its names may move between releases.
"""

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
from shardflow.consumer.dispatch import (
    DispatchSettings,
    FailurePolicy,
    Idempotency,
    OrderingMode,
)
from shardflow.consumer.handlers import BatchHandler, Handler, RecordHandler
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
