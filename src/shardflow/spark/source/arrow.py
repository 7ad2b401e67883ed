"""Records as Arrow record batches with exactly the schema Spark expects for RECORD_SCHEMA."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from shardflow.records import Record
from shardflow.spark.schema import RECORD_SCHEMA

ARROW_SCHEMA: Final = to_arrow_schema(RECORD_SCHEMA, timezone="UTC")
"""What ``read()`` must yield: timestamp[us, tz=UTC], string (not large_string)."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


def _micros(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


def to_record_batch(records: Sequence[Record], stream_label: str) -> pa.RecordBatch:
    """One record batch of ``records``; the ``streamName`` column is ``stream_label``."""
    count = len(records)
    columns = [
        pa.array([r.data for r in records], type=pa.binary()),
        pa.array([stream_label] * count, type=pa.string()),
        pa.array([r.shard_id for r in records], type=pa.string()),
        pa.array([r.partition_key for r in records], type=pa.string()),
        pa.array([r.explicit_hash_key for r in records], type=pa.string()),
        pa.array([r.sequence_number for r in records], type=pa.string()),
        pa.array([r.sub_sequence_number for r in records], type=pa.int64()),
        pa.array(
            [_micros(r.approximate_arrival_timestamp) for r in records],
            type=pa.timestamp("us", tz="UTC"),
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
