"""The columns of a Kinesis record as the source yields them."""

from __future__ import annotations

from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

RECORD_SCHEMA = StructType(
    [
        StructField("data", BinaryType(), nullable=False),
        StructField("streamName", StringType(), nullable=False),
        StructField("shardId", StringType(), nullable=False),
        StructField("partitionKey", StringType(), nullable=False),
        StructField("explicitHashKey", StringType(), nullable=True),
        StructField("sequenceNumber", StringType(), nullable=False),
        StructField("subSequenceNumber", LongType(), nullable=False),
        StructField("approximateArrivalTimestamp", TimestampType(), nullable=True),
    ]
)
