"""Rows as Arrow record batches with exactly the schema Spark expects for RECORD_SCHEMA."""

from __future__ import annotations

from typing import Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from shardflow.spark.schema import RECORD_SCHEMA
from shardflow.spark.source.rows import Rows

ARROW_SCHEMA: Final = to_arrow_schema(RECORD_SCHEMA, timezone="UTC")
"""What ``read()`` must yield: timestamp[us, tz=UTC], string (not large_string)."""


def to_record_batch(rows: Rows, stream_label: str) -> pa.RecordBatch:
    """One record batch of ``rows``; the ``streamName`` column is ``stream_label``."""
    columns = [
        pa.array(rows.data, type=pa.binary()),
        pa.array([stream_label] * len(rows), type=pa.string()),
        pa.array(rows.shard_id, type=pa.string()),
        pa.array(rows.partition_key, type=pa.string()),
        pa.array(rows.explicit_hash_key, type=pa.string()),
        pa.array(rows.sequence_number, type=pa.string()),
        pa.array(rows.sub_sequence_number, type=pa.int64()),
        # Arrow converts datetimes itself (aware ones to UTC, naive ones taken as UTC), several
        # times faster than micros computed in Python.
        pa.array(rows.approximate_arrival_timestamp, type=pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
