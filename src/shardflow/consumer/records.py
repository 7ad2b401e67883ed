"""What a handler receives: a record, its deserialized value and its acknowledgement."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Generic, TypeVar

from shardflow.consumer.acks import AckHandle
from shardflow.records import RECORD_FIELDS, Record, slot_builder

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConsumedRecord(Record, Generic[T]):
    """One delivered record (a plain Kinesis record or one sub-record of a KPL aggregate).

    A :class:`~shardflow.records.Record` (``data``, ``partition_key``, ``sequence_number``,
    ``position``, ...) plus ``value``, the payload as the consumer's deserializer made it, and
    :meth:`ack`, which marks the record as handled: the consumer does it when a handler
    returns, unless the handler opted into manual acks. Acks may come from any task or thread,
    in any order; the checkpoint only moves over records that are all acknowledged. Pass it to
    a :class:`~shardflow.consumer.checkpoint.Checkpointer` (``stage``, ``checkpoint``) as is.
    """

    value: T = field(default=None, compare=False)  # type: ignore[assignment]
    handle: AckHandle | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, record: Record, value: T, handle: AckHandle) -> ConsumedRecord[T]:
        """``record`` with its deserialized ``value`` and the ``handle`` that acknowledges it."""
        if cls is ConsumedRecord:
            return _build_consumed(*_record_values(record), value, handle)
        fields = {name: getattr(record, name) for name in RECORD_FIELDS}
        return cls(**fields, value=value, handle=handle)

    def ack(self) -> None:
        """Mark this record as handled. Idempotent, never blocks, safe from any thread."""
        handle: Any = self.handle
        if handle is None:
            raise RuntimeError("this record was not delivered by a consumer: nothing to ack")
        handle.ack()


_record_values = attrgetter(*RECORD_FIELDS)
_build_consumed = slot_builder(ConsumedRecord, (*RECORD_FIELDS, "value", "handle"))
