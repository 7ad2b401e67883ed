"""Which DataFrame columns the sink writes, checked against the schema when Spark plans a write.

A row becomes one Kinesis record: ``data`` (binary or string) is the payload, ``partitionKey``
(string) routes it, and an optional ``explicitHashKey`` (decimal string) overrides the routing.
Column names match case-insensitively, as Spark's own do. Any other column is refused rather
than silently left out of the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.types import BinaryType, StringType, StructType

from shardflow.errors import SparkSinkSchemaError

if TYPE_CHECKING:
    import pyarrow as pa

DATA = "data"
PARTITION_KEY = "partitionKey"
EXPLICIT_HASH_KEY = "explicitHashKey"
KNOWN = (DATA, PARTITION_KEY, EXPLICIT_HASH_KEY)


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """Where each record field sits in the written rows (positions into the Arrow batches)."""

    data: int
    partition_key: int
    explicit_hash_key: int | None

    def rows(
        self, batch: pa.RecordBatch, first_row: int = 0
    ) -> tuple[list[bytes | str], list[str], list[str | None]]:
        """The batch's payloads, partition keys and explicit hash keys, as Python lists.

        Raises :class:`SparkSinkSchemaError` naming (counting from ``first_row``) the first row with a null payload or key:
        Kinesis has no null record, and dropping the row would lose it silently.
        """
        data = batch.column(self.data)
        keys = batch.column(self.partition_key)
        for name, column in ((DATA, data), (PARTITION_KEY, keys)):
            if column.null_count:
                first = column.is_null().to_pylist().index(True)
                raise SparkSinkSchemaError(f"column {name} is null in row {first_row + first}")
        if self.explicit_hash_key is None:
            hash_keys: list[str | None] = [None] * batch.num_rows
        else:
            hash_keys = batch.column(self.explicit_hash_key).to_pylist()
        return data.to_pylist(), keys.to_pylist(), hash_keys


def sink_columns(schema: StructType) -> SinkColumns:
    """Check ``schema`` (the written DataFrame's) and locate the record fields in it."""
    positions: dict[str, int] = {}
    unknown: list[str] = []
    by_lower = {name.lower(): name for name in KNOWN}
    for index, field in enumerate(schema.fields):
        known = by_lower.get(field.name.lower())
        if known is None:
            unknown.append(field.name)
            continue
        if known in positions:
            raise SparkSinkSchemaError(f"column {known} appears twice")
        positions[known] = index
        _check_type(known, field.dataType)
    if unknown:
        raise SparkSinkSchemaError(
            f"unexpected column(s) {', '.join(unknown)}: the shardflow sink writes only "
            f"{DATA}, {PARTITION_KEY} and optionally {EXPLICIT_HASH_KEY} "
            "(select or serialize the others into data, e.g. with to_json(struct(*)))"
        )
    for required in (DATA, PARTITION_KEY):
        if required not in positions:
            raise SparkSinkSchemaError(
                f"column {required} is missing; columns are: "
                + (", ".join(f.name for f in schema.fields) or "(none)")
            )
    return SinkColumns(
        data=positions[DATA],
        partition_key=positions[PARTITION_KEY],
        explicit_hash_key=positions.get(EXPLICIT_HASH_KEY),
    )


def _check_type(column: str, data_type: object) -> None:
    allowed: tuple[type, ...] = (BinaryType, StringType) if column == DATA else (StringType,)
    if not isinstance(data_type, allowed):
        wanted = " or ".join(t.__name__.removesuffix("Type").lower() for t in allowed)
        shown = getattr(data_type, "simpleString", lambda: str(data_type))()
        raise SparkSinkSchemaError(f"column {column} must be {wanted}, not {shown}")
