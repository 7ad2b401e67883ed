"""The rows of a task, column by column: what a shard's read hands to Arrow.

A 1 MiB aggregate of small records holds thousands of user records. Made into
:class:`~shardflow.records.Record` objects and then taken apart again into Arrow columns, each
costs an object; here an aggregate's user records go straight into the columns, and its
sequence number, arrival time and shard are repeated along them. A record is made only where
one is asked for (:meth:`Rows.record`: the last row of a read; iterating, as tests do).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from shardflow.aggregation import MAGIC, Unpacking, log_malformed
from shardflow.records import RECORD_FIELDS, Record, build_record


@dataclass(slots=True)
class Rows:
    """Records in shard order, one list per :class:`~shardflow.records.Record` field."""

    data: list[bytes] = field(default_factory=list)
    partition_key: list[str] = field(default_factory=list)
    sequence_number: list[str] = field(default_factory=list)
    sub_sequence_number: list[int] = field(default_factory=list)
    explicit_hash_key: list[str | None] = field(default_factory=list)
    approximate_arrival_timestamp: list[datetime | None] = field(default_factory=list)
    shard_id: list[str] = field(default_factory=list)
    stream_name: list[str] = field(default_factory=list)
    aggregated: list[bool] = field(default_factory=list)
    last_sub_sequence_number: list[int] = field(default_factory=list)
    resent_if_out_of_range: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[Record]:
        return (self.record(index) for index in range(len(self.data)))

    def columns(self) -> tuple[list[Any], ...]:
        """Every column, in the order of :data:`~shardflow.records.RECORD_FIELDS`."""
        return (
            self.data,
            self.partition_key,
            self.sequence_number,
            self.sub_sequence_number,
            self.explicit_hash_key,
            self.approximate_arrival_timestamp,
            self.shard_id,
            self.stream_name,
            self.aggregated,
            self.last_sub_sequence_number,
            self.resent_if_out_of_range,
        )

    def record(self, index: int) -> Record:
        """Row ``index`` as a record (the one deaggregating would have made)."""
        return build_record(*(column[index] for column in self.columns()))

    def extend(self, records: list[Record], *, unpack: bool) -> None:
        """``records`` as rows; with ``unpack``, the user records of each KPL aggregate instead
        of it: the rows of :func:`~shardflow.aggregation.deaggregate` (a malformed aggregate is
        one plain row, with its WARNING)."""
        if not unpack or not any(record.data.startswith(MAGIC) for record in records):
            self._add_as_they_are(records)
            return
        plain: list[Record] = []
        for record in records:
            if record.aggregated or not record.data.startswith(MAGIC):
                plain.append(record)
                continue
            if plain:
                self._add_as_they_are(plain)
                plain = []
            self._add_unpacked(record)
        if plain:
            self._add_as_they_are(plain)

    def _add_as_they_are(self, records: list[Record]) -> None:
        self.data += [r.data for r in records]
        self.partition_key += [r.partition_key for r in records]
        self.sequence_number += [r.sequence_number for r in records]
        self.sub_sequence_number += [r.sub_sequence_number for r in records]
        self.explicit_hash_key += [r.explicit_hash_key for r in records]
        self.approximate_arrival_timestamp += [r.approximate_arrival_timestamp for r in records]
        self.shard_id += [r.shard_id for r in records]
        self.stream_name += [r.stream_name for r in records]
        self.aggregated += [r.aggregated for r in records]
        self.last_sub_sequence_number += [r.last_sub_sequence_number for r in records]
        self.resent_if_out_of_range += [r.resent_if_out_of_range for r in records]

    def _add_unpacked(self, record: Record) -> None:
        unpacking = Unpacking(record)
        unpacked = unpacking.columns()
        if unpacked is None:
            log_malformed(unpacking)
            self._add_as_they_are([record])
            return
        count = len(unpacked.data)
        self.data += unpacked.data
        self.partition_key += unpacked.partition_keys
        self.sequence_number += [record.sequence_number] * count
        self.sub_sequence_number += range(count)
        self.explicit_hash_key += unpacked.explicit_hash_keys
        self.approximate_arrival_timestamp += [record.approximate_arrival_timestamp] * count
        self.shard_id += [record.shard_id] * count
        self.stream_name += [record.stream_name] * count
        self.aggregated += [True] * count
        self.last_sub_sequence_number += [count - 1] * count
        self.resent_if_out_of_range += [unpacked.resent_if_out_of_range] * count

    def select(self, indexes: range | list[int]) -> Rows:
        """The rows at ``indexes`` (a range of step 1: sliced, column by column; all of them:
        these rows themselves)."""
        if indexes == range(len(self.data)):
            return self
        if isinstance(indexes, range) and indexes.step == 1:
            at = slice(indexes.start, indexes.stop)
            return Rows(*(column[at] for column in self.columns()))
        return Rows(*([column[i] for i in indexes] for column in self.columns()))


assert tuple(f.name for f in fields(Rows)) == RECORD_FIELDS, "Rows' columns follow Record's fields"
