"""What a handler receives: a record, its deserialized value and its acknowledgement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from shardflow.consumer.acks import AckHandle
from shardflow.records import RECORD_FIELDS, Record, RecordBuilder, slot_builder

if TYPE_CHECKING:
    from shardflow.consumer.acks import AckTracker

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
    # The shard's ack tracker and the record's slot in it, set when it is delivered. (Not an
    # AckHandle per record: one object per record is what a consumer's CPU budget allows;
    # :attr:`handle` makes one when asked.)
    _tracker: AckTracker | None = field(default=None, compare=False, repr=False)
    _index: int = field(default=-1, compare=False, repr=False)

    @classmethod
    def of(cls, record: Record, value: T, handle: AckHandle) -> ConsumedRecord[T]:
        """``record`` with its deserialized ``value`` and the ``handle`` that acknowledges it."""
        tracker, index = handle.tracker, handle.index
        if cls is ConsumedRecord:
            return _build_consumed(*_record_values(record), value, tracker, index)
        fields = {name: getattr(record, name) for name in RECORD_FIELDS}
        return cls(**fields, value=value, _tracker=tracker, _index=index)

    @property
    def handle(self) -> AckHandle | None:
        """The acknowledgement of this record (None: not delivered by a consumer)."""
        tracker = self._tracker
        return None if tracker is None else AckHandle(tracker, self._index, self)

    def ack(self) -> None:
        """Mark this record as handled. Idempotent, never blocks, safe from any thread."""
        tracker = self._tracker
        if tracker is None:
            raise RuntimeError("this record was not delivered by a consumer: nothing to ack")
        tracker._ack_from_any_thread(self._index)


_record_values = attrgetter(*RECORD_FIELDS)
_build_consumed = slot_builder(ConsumedRecord, (*RECORD_FIELDS, "value", "_tracker", "_index"))

build_undelivered: RecordBuilder = slot_builder(
    ConsumedRecord, RECORD_FIELDS, {"value": None, "_tracker": None, "_index": -1}
)
"""A :data:`~shardflow.records.RecordBuilder` for the consumer's fetchers: each record is made
once, as the :class:`ConsumedRecord` it will be handed out as, not yet delivered (no value, no
tracker); :func:`bind_delivered` completes it on delivery."""

# The slots' own setters (a frozen dataclass refuses ``setattr``): for completing a record
# nothing else holds yet, in :func:`bind_delivered`.
_slots: Mapping[str, Any] = vars(ConsumedRecord)
_set_value = _slots["value"].__set__
_set_tracker = _slots["_tracker"].__set__
_set_index = _slots["_index"].__set__


def bind_delivered(
    record: Record, value: Any, tracker: AckTracker, index: int
) -> ConsumedRecord[Any]:
    """``record`` delivered as slot ``index`` of ``tracker`` with ``value``.

    A record made by :data:`build_undelivered` and never delivered before is completed in
    place (nothing else holds it yet: it came from this shard's fetcher and no handler has
    seen it); any other record is copied, so a record object handed out once is never
    changed afterwards.
    """
    if type(record) is ConsumedRecord and record._tracker is None:
        _set_value(record, value)
        _set_tracker(record, tracker)
        _set_index(record, index)
        return record
    return _build_consumed(*_record_values(record), value, tracker, index)


def ack_run(records: Sequence[ConsumedRecord[Any]], start: int, end: int) -> None:
    """Acknowledge ``records[start:end]``, handled records of one chunk in shard order, on the
    event loop's thread: one step for the lot when they came from one tracker (the slots
    between them belong to the chunk: its other records, acknowledged on delivery), else one
    by one. One call a run, not a record: the consumer's per-record path."""
    if start >= end:
        return
    first, last = records[start], records[end - 1]
    tracker = first._tracker
    if tracker is not None and last._tracker is tracker:
        tracker.ack_slots(first._index, last._index)
        return
    for record in records[start:end]:
        record.ack()
