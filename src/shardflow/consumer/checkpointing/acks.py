"""Delivered records and their acknowledgements: which are done, and how far a checkpoint may go.

A :class:`ConsumedRecord` is what a handler receives: the record, its deserialized value and
:meth:`ConsumedRecord.ack`, a slot in its shard's :class:`AckTracker`.

Records of one shard are delivered in shard order and may be acknowledged in any order, from any
task or thread. The checkpoint may only advance over the *contiguous acknowledged prefix*: the
highest position such that every delivered record at or before it is acknowledged. Records
acknowledged beyond the first gap can be stored compactly next to the checkpoint
(:func:`~shardflow.read.completed.encode_completed`) so that a restart can skip them.

Threads: an :class:`AckTracker` belongs to one event loop and takes no locks. :meth:`AckHandle.ack`
may be called from any thread (a sync handler in a thread pool): off the loop's thread it hands
the acknowledgement to the loop with ``call_soon_threadsafe`` and returns at once. For positions,
use :meth:`AckTracker.ack_threadsafe`. The tracker binds to the running loop the first time it
delivers a record (or on :meth:`AckTracker.bind_loop`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Final, Generic, TypeVar

from shardflow.errors import DeliveryOrderError, DeserializationError, RecordNotDeliveredError
from shardflow.read.completed import CompletedState
from shardflow.records import (
    RECORD_FIELDS,
    ExtendedSequenceNumber,
    Record,
    RecordBuilder,
    slot_builder,
)

log = logging.getLogger("shardflow.consumer.acks")

AckTarget = Record | ExtendedSequenceNumber
"""What an acknowledgement names: a delivered record or its position."""

# Drop the acknowledged prefix from the slot arrays once it is this long and at least half of
# them: each slot is moved at most once per compaction, so acks stay O(1) amortized.
_COMPACT_AFTER: Final = 4096


@dataclass(frozen=True, slots=True)
class PendingCounts:
    """Where a shard's records are, counted one by one (each sub-record of an aggregate counts)."""

    delivered: int
    """Records delivered so far."""
    unacked: int
    """Delivered and not yet acknowledged."""
    acked_unchecked: int
    """Acknowledged but not covered by the last written checkpoint."""
    checkpointed: int
    """Delivered records covered by the last written checkpoint."""

    @property
    def lag(self) -> int:
        """Records between the last delivered one and the checkpoint."""
        return self.delivered - self.checkpointed


class AckHandle:
    """The acknowledgement of one delivered record; :meth:`ack` may be called from any thread."""

    __slots__ = ("_record", "index", "tracker")

    def __init__(self, tracker: AckTracker, index: int, record: Record) -> None:
        self.tracker = tracker
        self.index = index
        """The record's slot in ``tracker``."""
        self._record = record

    @property
    def position(self) -> ExtendedSequenceNumber:
        return self._record.position

    def ack(self) -> None:
        """Mark the record as handled. Idempotent, never blocks, never fails."""
        self.tracker._ack_from_any_thread(self.index)

    def __repr__(self) -> str:
        return f"AckHandle({self.position})"


class AckTracker:
    """Tracks the records of one shard from delivery to acknowledgement.

    ``deliver`` registers records in shard order and returns their :class:`AckHandle`; ``ack``
    and ``ack_through`` mark them handled; ``safe_position`` is the checkpoint they allow.
    """

    def __init__(
        self, shard_id: str = "", *, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.shard_id = shard_id
        # Delivered records from global index ``_base`` on, in shard order (so an ack by
        # position is a binary search: no per-record index to build); the slots before
        # ``_head`` form the acked prefix, whose slots are emptied (None) as it grows: a record
        # the prefix covers is let go at once, not at the next compaction (which a batch of
        # up to 10,000 records, checkpointed a part at a time, may not reach before it ends).
        # Positions are made only when asked for.
        self._records: list[Record | None] = []
        self._acked = bytearray()
        self._base = 0
        self._head = 0
        self._acked_count = 0
        self._checkpointed_count = 0
        self._first_key: tuple[int, int] | None = None
        self._last: Record | None = None
        self._safe: Record | None = None
        self._listeners: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        if loop is not None:
            self.bind_loop(loop)

    # --- delivery ------------------------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Tie the tracker to ``loop`` (default: the running loop); call from that loop's thread."""
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def deliver(self, record: Record) -> AckHandle:
        """Register the next record of the shard; positions must strictly increase."""
        return AckHandle(self, self.register(record), record)

    def register(self, record: Record) -> int:
        """:meth:`deliver` without the handle: the record's slot index, for ``ack_index``."""
        last = self._last
        sequence_number = record.sequence_number
        # Sequence numbers of one length order as strings do: the common case needs no ints.
        if (
            last is None
            or len(sequence_number) != len(last.sequence_number)
            or not sequence_number.isdigit()
            or sequence_number < last.sequence_number
            or (
                sequence_number == last.sequence_number
                and record.sub_sequence_number <= last.sub_sequence_number
            )
        ):
            self._check_order(record)
        records = self._records
        index = self._base + len(records)
        records.append(record)
        self._acked.append(0)
        self._last = record
        return index

    def _check_order(self, record: Record) -> None:
        """Raise unless ``record`` may follow the last delivered one; the first delivery also
        binds the tracker to the running loop."""
        if record.position.is_sentinel:
            raise DeliveryOrderError(self.shard_id, str(record.position), None)
        key = _key_of(record)
        last = self._last
        if last is not None and key <= _key_of(last):
            raise DeliveryOrderError(self.shard_id, str(record.position), str(last.position))
        if self._first_key is None:
            self._first_key = key
        if self._loop is None:
            # Without a running loop (plain synchronous use) there is nothing to bind to.
            with contextlib.suppress(RuntimeError):
                self.bind_loop()

    # --- acknowledgement -----------------------------------------------------------------------

    def ack(self, target: AckTarget) -> None:
        """Mark one delivered record as handled (idempotent).

        Raises :class:`RecordNotDeliveredError` for a position that was never delivered. A
        position at or before :attr:`safe_position` counts as a repeated ack: the tracker keeps no
        history of the prefix it has let go.
        """
        index = self._resolve(target)
        if index is not None:
            self.ack_index(index)

    def ack_through(self, target: AckTarget) -> None:
        """Mark every delivered record up to and including ``target`` as handled."""
        index = self._resolve(target)
        if index is None:
            return
        start, end = self._head, index - self._base + 1
        segment = self._acked[start:end]
        newly = segment.count(0)
        if newly:
            self._acked[start:end] = b"\x01" * len(segment)
            self._acked_count += newly
            self._advance()
            self._notify()

    def ack_slots(self, first: int, last: int) -> None:
        """Mark slots ``first`` to ``last`` (from :meth:`register`, both included) handled in
        one step, with one notification: for the records of a chunk a handler went through.
        On the loop's thread only."""
        start, end = max(first - self._base, self._head), last - self._base + 1
        if start >= end:
            return
        acked = self._acked
        newly = acked[start:end].count(0)
        if newly:
            acked[start:end] = b"\x01" * (end - start)
            self._acked_count += newly
            self._advance()
            self._notify()

    def ack_threadsafe(self, target: AckTarget) -> concurrent.futures.Future[None]:
        """:meth:`ack` from any thread, without blocking.

        The returned future completes once the loop has applied the ack (with
        :class:`RecordNotDeliveredError` if it names an unknown position); waiting on it is
        optional.
        """
        result: concurrent.futures.Future[None] = concurrent.futures.Future()

        def apply() -> None:
            if not result.set_running_or_notify_cancel():
                return
            try:
                self.ack(target)
            except Exception as exc:
                result.set_exception(exc)
            else:
                result.set_result(None)

        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            apply()
        else:
            loop.call_soon_threadsafe(apply)
        return result

    def _ack_from_any_thread(self, index: int) -> None:
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            self.ack_index(index)
            return
        try:
            loop.call_soon_threadsafe(self.ack_index, index)
        except RuntimeError:
            # The loop is closed: nothing will write a checkpoint any more, so the ack is moot.
            log.debug("ack of %s dropped: event loop closed", self.shard_id)

    def _resolve(self, target: AckTarget) -> int | None:
        """Global slot index of ``target``, or None when it lies in the acked prefix."""
        position = target.position if isinstance(target, Record) else target
        if position.is_sentinel:
            raise RecordNotDeliveredError(self.shard_id, str(position))
        key = (int(position.sequence_number), position.sub_sequence_number)
        records = self._records
        local = bisect_left(records, key, lo=self._head, key=_key_of)
        if local < len(records) and _key_of(records[local]) == key:
            return self._base + local
        safe, first = self._safe, self._first_key
        if safe is not None and first is not None and first <= key <= _key_of(safe):
            return None
        raise RecordNotDeliveredError(self.shard_id, str(position))

    def ack_index(self, index: int) -> None:
        """Mark the record in slot ``index`` (from :meth:`register`) as handled, on the loop."""
        local = index - self._base
        acked = self._acked
        if local < self._head or acked[local]:
            return
        acked[local] = 1
        self._acked_count += 1
        if local == self._head:
            self._advance()
        self._notify()

    def _advance(self) -> None:
        """Move the prefix boundary over acknowledged slots (the head slot must be acked)."""
        records, acked = self._records, self._acked
        head, size = self._head, len(records)
        while head < size and acked[head]:
            head += 1
        if head == self._head:
            return
        self._safe = records[head - 1]
        if head >= _COMPACT_AFTER and head * 2 >= size:
            del records[:head]
            del acked[:head]
            self._base += head
            head = 0
        else:
            # Each slot is emptied once: O(1) amortized, as the compaction. Kept until the next
            # compaction, the prefix held up to ~4,096 handled records per shard (half a
            # GetRecords answer when a processor checkpoints every 1,000): a multilang drain
            # of 100k records ended with 10k of them alive, their arenas mapped.
            old = self._head
            if head - old == 1:  # a record acked in order: the common case, without a list
                records[old] = None
            else:
                records[old:head] = [None] * (head - old)
        self._head = head

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("ack listener failed (shard %s)", self.shard_id)

    # --- observation ---------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the loop after every ack that changed something; it must be quick."""
        self._listeners.append(listener)

    @property
    def safe_position(self) -> ExtendedSequenceNumber | None:
        """The highest position with every delivered record at or before it acked (None: none)."""
        return None if self._safe is None else self._safe.position

    @property
    def last_delivered(self) -> ExtendedSequenceNumber | None:
        return None if self._last is None else self._last.position

    @property
    def delivered_count(self) -> int:
        return self._base + len(self._records)

    @property
    def prefix_count(self) -> int:
        """Records in the contiguous acknowledged prefix (covered by :attr:`safe_position`)."""
        return self._base + self._head

    @property
    def acked_count(self) -> int:
        """Records acknowledged so far, inside the prefix or beyond it."""
        return self._acked_count

    @property
    def checkpointed_count(self) -> int:
        return self._checkpointed_count

    @property
    def all_acked(self) -> bool:
        """True when every delivered record is acknowledged (also when none was delivered)."""
        return self._acked_count == self.delivered_count

    @property
    def pending(self) -> PendingCounts:
        delivered = self.delivered_count
        return PendingCounts(
            delivered=delivered,
            unacked=delivered - self._acked_count,
            acked_unchecked=self._acked_count - self._checkpointed_count,
            checkpointed=self._checkpointed_count,
        )

    def mark_checkpointed(self, count: int) -> None:
        """Record that a checkpoint covering the first ``count`` delivered records was written."""
        self._checkpointed_count = max(self._checkpointed_count, min(count, self.delivered_count))

    def completed_beyond_prefix(self) -> list[ExtendedSequenceNumber]:
        """Acknowledged positions after the first gap, in shard order."""
        head = self._head
        return [
            record.position
            for record, done in zip(self._records[head:], self._acked[head:], strict=True)
            if done and record is not None
        ]

    def completed_state(self) -> CompletedState:
        """The safe position and the records completed beyond it, ready to encode."""
        return CompletedState(self.safe_position, tuple(self.completed_beyond_prefix()))


def _key_of(record: Record | None) -> tuple[int, int]:
    """A record's position as numbers (its sequence number must not be a sentinel)."""
    assert record is not None  # only slots past the acked prefix are looked at: never emptied
    return (int(record.sequence_number), record.sub_sequence_number)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConsumedRecord(Record, Generic[T]):
    """One delivered record (a plain Kinesis record or one sub-record of a KPL aggregate).

    A :class:`~shardflow.records.Record` (``data``, ``partition_key``, ``sequence_number``,
    ``position``, ...) plus ``value``, the payload as the consumer's deserializer made it, and
    :meth:`ack`, which marks the record as handled: the consumer does it when a handler
    returns, unless the handler opted into manual acks. Acks may come from any task or thread,
    in any order; the checkpoint only moves over records that are all acknowledged. Pass it to
    a :class:`~shardflow.consumer.checkpointing.checkpoint.Checkpointer` (``stage``, ``checkpoint``) as is.
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


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record the deserializer rejected, delivered to the shard's tracker unacknowledged (its
    ``value`` is None); what happens to it is the failure policy's call."""

    record: ConsumedRecord[Any]
    error: DeserializationError


_record_values = attrgetter(*RECORD_FIELDS)
_build_consumed = slot_builder(ConsumedRecord, (*RECORD_FIELDS, "value", "_tracker", "_index"))


build_undelivered: RecordBuilder = slot_builder(
    ConsumedRecord, RECORD_FIELDS, {"value": None, "_tracker": None, "_index": -1}
)
"""The consumer's :data:`~shardflow.records.RecordBuilder` for its fetchers and unpacking: each
record is made once, as the :class:`ConsumedRecord` it will be handed out as, not yet delivered
(no value, no tracker); :func:`bind_delivered` completes it."""

# The slots' own setters (a frozen dataclass refuses setattr), to complete a record that nothing
# else holds yet.
_set_value = vars(ConsumedRecord)["value"].__set__
_set_tracker = vars(ConsumedRecord)["_tracker"].__set__
_set_index = vars(ConsumedRecord)["_index"].__set__


def bind_delivered(
    record: Record, value: Any, tracker: AckTracker, index: int
) -> ConsumedRecord[Any]:
    """``record`` from the read stage as delivered: slot ``index`` of ``tracker``, with
    ``value``. The one place a record becomes a delivered :class:`ConsumedRecord`.

    A record made by :data:`build_undelivered` and not delivered yet is completed in place:
    only its shard's reader has held it, no handler has seen it. Any other record (a plain
    one, or one delivered before) is copied, so a record handed out once never changes.
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
