"""What a handler receives: a record, its deserialized value and its acknowledgement."""

from __future__ import annotations

from datetime import datetime
from typing import Generic, TypeVar

from shardflow.consumer.acks import AckHandle
from shardflow.records import ExtendedSequenceNumber, Record

T = TypeVar("T")


class ConsumedRecord(Generic[T]):
    """One delivered record (a plain Kinesis record or one sub-record of a KPL aggregate).

    ``value`` is the payload as the consumer's deserializer made it; ``record`` is the raw
    :class:`~shardflow.records.Record`. :meth:`ack` marks the record as handled: the consumer
    does it for you when a handler returns, unless the handler opted into manual acks. Acks may
    come from any task or thread, in any order; the checkpoint only moves over records that are
    all acknowledged.
    """

    __slots__ = ("_handle", "record", "value")

    def __init__(self, record: Record, value: T, handle: AckHandle) -> None:
        self.record = record
        self.value = value
        self._handle = handle

    def ack(self) -> None:
        """Mark this record as handled. Idempotent, never blocks, safe from any thread."""
        self._handle.ack()

    @property
    def data(self) -> bytes:
        return self.record.data

    @property
    def partition_key(self) -> str:
        return self.record.partition_key

    @property
    def sequence_number(self) -> str:
        return self.record.sequence_number

    @property
    def sub_sequence_number(self) -> int:
        return self.record.sub_sequence_number

    @property
    def position(self) -> ExtendedSequenceNumber:
        return self.record.position

    @property
    def shard_id(self) -> str:
        return self.record.shard_id

    @property
    def stream_name(self) -> str:
        return self.record.stream_name

    @property
    def approximate_arrival_timestamp(self) -> datetime | None:
        return self.record.approximate_arrival_timestamp

    def __repr__(self) -> str:
        return (
            f"ConsumedRecord(shard={self.record.shard_id}, position={self.record.position}, "
            f"partition_key={self.record.partition_key!r})"
        )
