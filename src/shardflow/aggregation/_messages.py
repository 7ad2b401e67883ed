"""The KPL ``AggregatedRecord`` protobuf messages, built at import time from a descriptor.

The schema is declared here as a ``FileDescriptorProto`` and loaded into a private descriptor
pool, so there is no generated ``_pb2`` file to keep in step with the protobuf runtime, and no
clash with other copies of the same schema (``aws_kinesis_agg`` registers its own in the
default pool under ``aws.kinesis.protobuf``). Only the field numbers and types reach the
wire, so the package name chosen here does not affect compatibility.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableSequence
from typing import Protocol, cast

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "shardflow.kpl"
_Field = descriptor_pb2.FieldDescriptorProto


class TagMessage(Protocol):
    key: str
    value: str


class RecordMessage(Protocol):
    """One user record inside an aggregate."""

    partition_key_index: int
    explicit_hash_key_index: int
    data: bytes

    @property
    def tags(self) -> MutableSequence[TagMessage]: ...

    def HasField(self, field_name: str) -> bool: ...


class RecordList(Protocol):
    """The repeated ``records`` field."""

    def add(
        self,
        *,
        partition_key_index: int,
        data: bytes,
        explicit_hash_key_index: int | None = None,
    ) -> RecordMessage: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> RecordMessage: ...

    def __iter__(self) -> Iterator[RecordMessage]: ...


class AggregatedRecordMessage(Protocol):
    """The protobuf body of a KPL aggregated record.

    Repeated ``string`` fields hold ``str``; for a proto2 string that is not valid UTF-8 the
    protobuf runtime hands back ``bytes`` instead, which callers must treat as malformed.
    """

    @property
    def partition_key_table(self) -> MutableSequence[str]: ...

    @property
    def explicit_hash_key_table(self) -> MutableSequence[str]: ...

    @property
    def records(self) -> RecordList: ...

    resends_out_of_range: bool

    def HasField(self, field_name: str) -> bool: ...

    def SerializeToString(self) -> bytes: ...

    def ParseFromString(self, data: bytes | memoryview) -> int: ...

    def IsInitialized(self) -> bool: ...


def _add_field(
    message: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    label: _Field.Label.ValueType,
    field_type: _Field.Type.ValueType,
    type_name: str = "",
) -> None:
    field = message.field.add(name=name, number=number, label=label, type=field_type)
    if type_name:
        field.type_name = f".{_PACKAGE}.{type_name}"


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The aggregation schema (proto2), field for field as the KPL publishes it, plus one
    optional field of shardflow's (number 100) that other readers skip as unknown."""
    file = descriptor_pb2.FileDescriptorProto(
        name="shardflow/aggregation/kpl_aggregation.proto", package=_PACKAGE, syntax="proto2"
    )
    required, optional, repeated = (
        _Field.LABEL_REQUIRED,
        _Field.LABEL_OPTIONAL,
        _Field.LABEL_REPEATED,
    )

    tag = file.message_type.add(name="Tag")
    _add_field(tag, "key", 1, required, _Field.TYPE_STRING)
    _add_field(tag, "value", 2, optional, _Field.TYPE_STRING)

    record = file.message_type.add(name="Record")
    _add_field(record, "partition_key_index", 1, required, _Field.TYPE_UINT64)
    _add_field(record, "explicit_hash_key_index", 2, optional, _Field.TYPE_UINT64)
    _add_field(record, "data", 3, required, _Field.TYPE_BYTES)
    _add_field(record, "tags", 4, repeated, _Field.TYPE_MESSAGE, "Tag")

    aggregated = file.message_type.add(name="AggregatedRecord")
    _add_field(aggregated, "partition_key_table", 1, repeated, _Field.TYPE_STRING)
    _add_field(aggregated, "explicit_hash_key_table", 2, repeated, _Field.TYPE_STRING)
    _add_field(aggregated, "records", 3, repeated, _Field.TYPE_MESSAGE, "Record")
    # shardflow's own addition, unknown to (and skipped by) every other KPL-format reader: the
    # producer sends user records that land outside their shard's range again (see
    # shardflow.producer.outcomes), so a consumer must not deliver the out-of-range copy.
    _add_field(aggregated, "resends_out_of_range", 100, optional, _Field.TYPE_BOOL)
    return file


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file_descriptor())
_aggregated_record_class = message_factory.GetMessageClass(
    _pool.FindMessageTypeByName(f"{_PACKAGE}.AggregatedRecord")
)


def new_aggregated_record() -> AggregatedRecordMessage:
    """An empty ``AggregatedRecord`` message."""
    return cast(AggregatedRecordMessage, _aggregated_record_class())
