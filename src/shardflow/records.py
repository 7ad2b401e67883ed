"""The record as it travels through shardflow, its position in a shard, and deserializers."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import total_ordering
from typing import Any, Final, Generic, TypeVar

from shardflow.errors import DeserializationError

T = TypeVar("T")

# Sentinel checkpoint values used by the KCL lease table (attribute ``checkpoint``).
TRIM_HORIZON: Final = "TRIM_HORIZON"
LATEST: Final = "LATEST"
AT_TIMESTAMP: Final = "AT_TIMESTAMP"
SHARD_END: Final = "SHARD_END"

# Sentinels order before every real sequence number, except SHARD_END which orders after all
# (the same order KCL uses, so checkpoints compare the same way in a mixed fleet).
_SENTINEL_RANK: Final[dict[str, int]] = {
    AT_TIMESTAMP: -3,
    TRIM_HORIZON: -2,
    LATEST: -1,
}


@total_ordering
@dataclass(frozen=True, slots=True)
class ExtendedSequenceNumber:
    """A position in a shard: a sequence number plus a sub-sequence number for KPL sub-records.

    ``sequence_number`` is a decimal string or one of the sentinels TRIM_HORIZON, LATEST,
    AT_TIMESTAMP, SHARD_END. Ordering is numeric, then by sub-sequence number.
    """

    sequence_number: str
    sub_sequence_number: int = 0

    @property
    def is_sentinel(self) -> bool:
        return not self.sequence_number.isdigit()

    def _key(self) -> tuple[int, int, int]:
        seq = self.sequence_number
        if seq == SHARD_END:
            return (2, 0, 0)
        if seq in _SENTINEL_RANK:
            return (0, _SENTINEL_RANK[seq], 0)
        return (1, int(seq), self.sub_sequence_number)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        if self.is_sentinel or self.sub_sequence_number == 0:
            return self.sequence_number
        return f"{self.sequence_number}.{self.sub_sequence_number}"


@dataclass(frozen=True, slots=True)
class Record:
    """One Kinesis record, or one sub-record of a KPL aggregated record.

    Sub-records of one aggregate share ``sequence_number`` and differ in ``sub_sequence_number``
    (their index in the aggregate); ``aggregated`` tells them apart from plain records.
    """

    data: bytes
    partition_key: str
    sequence_number: str
    sub_sequence_number: int = 0
    explicit_hash_key: str | None = None
    approximate_arrival_timestamp: datetime | None = None
    shard_id: str = ""
    stream_name: str = ""
    aggregated: bool = False
    # Index of the last sub-record in the same aggregate (0 for plain records): lets a
    # checkpointer know when a whole Kinesis record has been handled.
    last_sub_sequence_number: int = field(default=0, compare=False)
    # The aggregate says its producer puts a sub-record outside the shard's hash-key range again
    # on the right shard (shardflow's producer does, after a reshard): a consumer
    # then skips the out-of-range copy, or it would handle the record twice.
    resent_if_out_of_range: bool = field(default=False, compare=False)

    @property
    def position(self) -> ExtendedSequenceNumber:
        return ExtendedSequenceNumber(self.sequence_number, self.sub_sequence_number)

    @property
    def hash_key(self) -> int:
        """The 128-bit hash key that places this record in a shard."""
        from shardflow.shards import hash_key_of

        return hash_key_of(self.partition_key, self.explicit_hash_key)

    @property
    def size(self) -> int:
        """Bytes counted against Kinesis limits: data plus UTF-8 partition key."""
        key = self.partition_key
        return len(self.data) + (len(key) if key.isascii() else len(key.encode()))


RECORD_FIELDS: Final = tuple(f.name for f in fields(Record))
"""Record's fields in declaration order: the arguments of :func:`build_record`."""

R = TypeVar("R")


def slot_builder(
    cls: type[R], names: Sequence[str], fixed: Mapping[str, Any] | None = None
) -> Callable[..., R]:
    """``build(*values)``: a new ``cls`` (a frozen slots dataclass) with ``names`` set to
    ``values`` and the fields named in ``fixed`` to their constants (``names`` and ``fixed``
    together: all its fields), written straight into the slots.

    A frozen dataclass's ``__init__`` sets every field through ``object.__setattr__``: on the
    per-record path (hundreds of thousands of records a second) that is about half the cost of
    a record. The built object is the same as ``cls(*values, **fixed)``, without its checks.
    """
    fixed = dict(fixed or {})
    arguments = ", ".join(f"v{i}" for i in range(len(names)))
    writes = "".join(f"    w{i}(o, v{i})\n" for i in range(len(names)))
    writes += "".join(f"    f{i}(o, c{i})\n" for i in range(len(fixed)))
    source = f"def build({arguments}):\n    o = new(cls)\n{writes}    return o\n"
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope |= {f"w{i}": getattr(cls, name).__set__ for i, name in enumerate(names)}
    for i, (name, value) in enumerate(fixed.items()):
        scope |= {f"f{i}": getattr(cls, name).__set__, f"c{i}": value}
    exec(source, scope)  # generated from field names only, as dataclasses does
    build: Callable[..., R] = scope["build"]
    return build


RecordBuilder = Callable[..., Record]
"""Makes a record from the values of :data:`RECORD_FIELDS`, in order (see
:func:`build_record`); fetchers and unpacking take one, so that a consumer can have its records
made as the type it hands out, in one allocation per record."""


build_record: RecordBuilder = slot_builder(Record, RECORD_FIELDS)
"""``build_record(data, partition_key, sequence_number, sub_sequence_number, explicit_hash_key,
approximate_arrival_timestamp, shard_id, stream_name, aggregated, last_sub_sequence_number,
resent_if_out_of_range)``:
a :class:`Record`, every field given in order, made at half the cost of ``Record(...)``."""


Deserializer = Callable[[Record], T]
"""Turns a record into a value; raises :class:`DeserializationError` on bad input."""


@dataclass(frozen=True, slots=True)
class FunctionDeserializer(Generic[T]):
    """Wraps a function of the payload bytes; any exception becomes a DeserializationError."""

    function: Callable[[bytes], T]

    def __call__(self, record: Record) -> T:
        try:
            return self.function(record.data)
        except DeserializationError:
            raise
        except Exception as exc:
            raise DeserializationError(
                f"{type(exc).__name__}: {exc}",
                shard_id=record.shard_id,
                sequence_number=record.sequence_number,
                sub_sequence_number=record.sub_sequence_number,
            ) from exc


def as_bytes(record: Record) -> bytes:
    """The payload unchanged."""
    return record.data


as_utf8: FunctionDeserializer[str] = FunctionDeserializer(lambda data: data.decode("utf-8"))
"""The payload decoded as UTF-8 (strict)."""

as_json: FunctionDeserializer[Any] = FunctionDeserializer(json.loads)
"""The payload parsed as JSON (UTF-8)."""


def from_function(function: Callable[[bytes], T]) -> FunctionDeserializer[T]:
    """A deserializer from any function of the payload bytes."""
    return FunctionDeserializer(function)
