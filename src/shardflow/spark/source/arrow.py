"""Records as Arrow record batches with exactly the schema Spark expects for RECORD_SCHEMA."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from shardflow.records import Record
from shardflow.spark.schema import RECORD_SCHEMA

ARROW_SCHEMA: Final = to_arrow_schema(RECORD_SCHEMA, timezone="UTC")
"""What ``read()`` must yield: timestamp[us, tz=UTC], string (not large_string)."""


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
        # Arrow converts datetimes itself (aware ones to UTC, naive ones taken as UTC), several
        # times faster than micros computed in Python.
        pa.array(
            [r.approximate_arrival_timestamp for r in records], type=pa.timestamp("us", tz="UTC")
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
