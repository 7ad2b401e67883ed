"""Packing user records into KPL aggregated records, with exact size accounting.

The builder tracks the serialized size as records are added (table entries, varint indices,
length prefixes), so checking whether one more record fits costs O(1) and never re-serializes
the aggregate. ``size`` always equals the ``size`` of what ``build()`` returns.

A user record that does not fit even into an empty aggregate (``try_add`` on an empty builder
returns False; ``aggregate`` raises :class:`~shardflow.errors.RecordTooLargeError`) must be
handled by the caller: aggregation adds at least ``MAGIC`` + MD5 + a few framing bytes to the
record, so such a record may still fit Kinesis' limit on its own. Send it as a plain
(non-aggregated) record if ``len(data) + len(partition_key.encode())`` is within the limit,
otherwise reject it with ``RecordTooLargeError``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from shardflow.aggregation._format import (
    FRAMING_BYTES,
    MAGIC,
    MAX_RECORD_BYTES,
    length_delimited_size,
    varint_field_size,
)
from shardflow.errors import InvalidPartitionKeyError, RecordTooLargeError

if TYPE_CHECKING:
    from shardflow.aggregation._messages import AggregatedRecordMessage


@dataclass(frozen=True, slots=True)
class AggregatedRecord:
    """One Kinesis record holding ``count`` user records in the KPL aggregation format.

    Put it with ``partition_key`` and, if set, ``explicit_hash_key``: both come from the first
    user record, so the aggregate lands on the shard that record would have gone to.
    """

    partition_key: str
    explicit_hash_key: str | None
    data: bytes
    count: int

    @property
    def size(self) -> int:
        """Bytes counted against Kinesis' record limit: data plus UTF-8 partition key."""
        return len(self.data) + len(self.partition_key.encode())


class _Placement(NamedTuple):
    """Where a user record would go in the aggregate and how many bytes it would add."""

    partition_key_index: int
    explicit_hash_key_index: int | None
    added_body_bytes: int
    # UTF-8 length of the partition key when it is new to the table (always so for the first
    # record, whose key becomes the outer one), else 0
    new_partition_key_bytes: int


def _utf8_length(key: str, *, partition_key: bool) -> int:
    try:
        return len(key.encode())
    except UnicodeEncodeError as exc:
        if partition_key:
            raise InvalidPartitionKeyError("partition key is not valid Unicode") from exc
        raise ValueError("explicit hash key is not valid Unicode") from exc


_MARK_BYTES = 3


def new_aggregated_record() -> AggregatedRecordMessage:
    """An empty ``AggregatedRecord`` message. protobuf is imported at the first aggregate
    built, not with the package: a process that never aggregates never loads it (3.4 MiB
    of RSS, the multilang daemon's among them)."""
    from shardflow.aggregation import _messages

    return _messages.new_aggregated_record()


class AggregateBuilder:
    """Accumulates user records into one aggregated record of at most ``max_bytes``.

    Partition keys and explicit hash keys are stored once each in the aggregate's tables and
    referenced by index. ``resends_out_of_range`` marks the aggregate as coming from a producer
    that puts user records landing outside their shard's range again on the right shard
    (shardflow's producer does): shardflow's consumer then skips the out-of-range copies, so a
    record put once is handled once; other readers ignore the mark. Not thread-safe.
    """

    def __init__(
        self, max_bytes: int = MAX_RECORD_BYTES, *, resends_out_of_range: bool = False
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self._max_bytes = max_bytes
        self._resends = resends_out_of_range
        # The mark is field 100, a bool: a two-byte tag and a one-byte value.
        self._mark_bytes = _MARK_BYTES if resends_out_of_range else 0
        self.clear()

    def clear(self) -> None:
        """Drop every user record; the builder is empty again."""
        # dicts keep insertion order, which is the order of the tables in the message
        self._partition_keys: dict[str, int] = {}
        self._explicit_hash_keys: dict[str, int] = {}
        self._records: list[tuple[int, int | None, bytes]] = []
        self._body_bytes = 0
        self._outer_partition_key_bytes = 0
        self._outer_partition_key = ""
        self._outer_explicit_hash_key: str | None = None

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    def __len__(self) -> int:
        """The number of user records held."""
        return len(self._records)

    @property
    def size(self) -> int:
        """The exact ``size`` of the record ``build()`` would return now (0 when empty)."""
        if not self._records:
            return 0
        return FRAMING_BYTES + self._mark_bytes + self._body_bytes + self._outer_partition_key_bytes

    def size_with(
        self, partition_key: str, data: bytes, explicit_hash_key: str | None = None
    ) -> int:
        """The exact ``size`` of the built record if this user record were added."""
        placement = self._place(partition_key, data, explicit_hash_key)
        return self._size_after(placement)

    def try_add(
        self, partition_key: str, data: bytes, explicit_hash_key: str | None = None
    ) -> bool:
        """Add the user record and return True, or return False (unchanged) if it won't fit."""
        placement = self._place(partition_key, data, explicit_hash_key)
        if self._size_after(placement) > self._max_bytes:
            return False
        if not self._records:
            self._outer_partition_key = partition_key
            self._outer_explicit_hash_key = explicit_hash_key
            self._outer_partition_key_bytes = placement.new_partition_key_bytes
        self._partition_keys.setdefault(partition_key, placement.partition_key_index)
        if explicit_hash_key is not None:
            self._explicit_hash_keys.setdefault(explicit_hash_key, len(self._explicit_hash_keys))
        self._records.append(
            (placement.partition_key_index, placement.explicit_hash_key_index, data)
        )
        self._body_bytes += placement.added_body_bytes
        return True

    def build(self) -> AggregatedRecord:
        """The aggregated record of every user record added so far (the builder keeps them)."""
        if not self._records:
            raise ValueError("cannot build an aggregated record without user records")
        message = new_aggregated_record()
        message.partition_key_table.extend(self._partition_keys)
        message.explicit_hash_key_table.extend(self._explicit_hash_keys)
        for partition_key_index, explicit_hash_key_index, data in self._records:
            message.records.add(
                partition_key_index=partition_key_index,
                explicit_hash_key_index=explicit_hash_key_index,
                data=data,
            )
        if self._resends:
            message.resends_out_of_range = True
        body = message.SerializeToString()
        digest = hashlib.md5(body, usedforsecurity=False).digest()
        return AggregatedRecord(
            partition_key=self._outer_partition_key,
            explicit_hash_key=self._outer_explicit_hash_key,
            data=MAGIC + body + digest,
            count=len(self._records),
        )

    def _place(self, partition_key: str, data: bytes, explicit_hash_key: str | None) -> _Placement:
        added = 0
        partition_key_bytes = 0
        partition_key_index = self._partition_keys.get(partition_key)
        if partition_key_index is None:
            partition_key_index = len(self._partition_keys)
            partition_key_bytes = _utf8_length(partition_key, partition_key=True)
            added += length_delimited_size(partition_key_bytes)
        record_bytes = varint_field_size(partition_key_index)

        explicit_hash_key_index: int | None = None
        if explicit_hash_key is not None:
            explicit_hash_key_index = self._explicit_hash_keys.get(explicit_hash_key)
            if explicit_hash_key_index is None:
                explicit_hash_key_index = len(self._explicit_hash_keys)
                added += length_delimited_size(_utf8_length(explicit_hash_key, partition_key=False))
            record_bytes += varint_field_size(explicit_hash_key_index)

        record_bytes += length_delimited_size(len(data))
        added += length_delimited_size(record_bytes)
        return _Placement(partition_key_index, explicit_hash_key_index, added, partition_key_bytes)

    def _size_after(self, placement: _Placement) -> int:
        outer_partition_key_bytes = (
            self._outer_partition_key_bytes if self._records else placement.new_partition_key_bytes
        )
        return (
            FRAMING_BYTES
            + self._mark_bytes
            + self._body_bytes
            + placement.added_body_bytes
            + outer_partition_key_bytes
        )


def aggregate(
    items: Iterable[tuple[str, bytes, str | None]], max_bytes: int = MAX_RECORD_BYTES
) -> list[AggregatedRecord]:
    """Pack ``(partition_key, data, explicit_hash_key)`` items, in order, into aggregates.

    A new aggregate starts whenever the next item would push the current one over
    ``max_bytes``. Raises :class:`RecordTooLargeError` for an item that does not fit even
    into an empty aggregate (see the module docstring for what to do with such records).
    """
    builder = AggregateBuilder(max_bytes)
    built: list[AggregatedRecord] = []
    for partition_key, data, explicit_hash_key in items:
        if builder.try_add(partition_key, data, explicit_hash_key):
            continue
        if len(builder):
            built.append(builder.build())
            builder.clear()
            if builder.try_add(partition_key, data, explicit_hash_key):
                continue
        raise RecordTooLargeError(
            builder.size_with(partition_key, data, explicit_hash_key), max_bytes
        )
    if len(builder):
        built.append(builder.build())
    return built
