"""The sink's options and column checks, without a SparkSession."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from shardflow.errors import SparkOptionError, SparkSinkSchemaError, UnknownSparkOptionError
from shardflow.spark.sink.columns import sink_columns
from shardflow.spark.sink.options import DEFAULT_FLUSH_TIMEOUT, sink_options


def schema(**columns: object) -> StructType:
    return StructType([StructField(name, kind, True) for name, kind in columns.items()])  # type: ignore[arg-type]


def test_defaults_are_the_producers_own() -> None:
    options = sink_options({"streamname": "orders"})
    assert options.stream == "orders"
    assert options.producer.aggregate is False
    assert options.producer.retry.max_attempts == 10
    assert options.flush_timeout == DEFAULT_FLUSH_TIMEOUT


def test_producer_knobs_are_read_case_insensitively() -> None:
    options = sink_options(
        {
            "streamARN": "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
            "AGGREGATE": "True",
            "preservekeyorder": "yes",
            "maxAttempts": "3",
            "recordTtl": "7.5",
            "linger": "0",
            "maxConcurrentRequests": "2",
            "flushTimeout": "30",
            "shardRecordsPerSecond": "500",
            "shardbytespersecond": "1e9",
            "region": "eu-west-1",
        }
    )
    assert options.stream.endswith("stream/orders")
    assert options.connection.stream_label == "orders"
    producer = options.producer
    assert (producer.aggregate, producer.preserve_key_order) == (True, True)
    assert (producer.retry.max_attempts, producer.record_ttl, producer.linger) == (3, 7.5, 0.0)
    assert producer.max_concurrent_requests == 2
    assert (producer.shard_records_per_second, producer.shard_bytes_per_second) == (500.0, 1e9)
    assert options.flush_timeout == 30.0
    assert options.connection.aws_settings().region == "eu-west-1"


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("aggregate", "sometimes", "expected true or false"),
        ("maxAttempts", "0", "must be > 0"),
        ("maxAttempts", "2.5", "whole number"),
        ("recordTtl", "-1", "must be > 0"),
        ("linger", "soon", "number of seconds"),
        ("flushTimeout", "nan", "must be > 0"),
        ("shardRecordsPerSecond", "0", "must be > 0"),
        ("shardBytesPerSecond", "fast", "number per second"),
    ],
)
def test_bad_values_name_the_option(option: str, value: str, problem: str) -> None:
    with pytest.raises(SparkOptionError, match=problem) as failure:
        sink_options({"streamName": "orders", option: value})
    assert failure.value.option == option


def test_an_unknown_option_is_refused_naming_the_closest() -> None:
    with pytest.raises(UnknownSparkOptionError, match="did you mean aggregate") as caught:
        sink_options({"streamName": "orders", "agregate": "true"})
    assert (caught.value.option, caught.value.closest) == ("agregate", "aggregate")
    # What Spark adds to a streaming sink's options is no typo.
    spark_adds = {"checkpointlocation": "/tmp/ck", "queryname": "alerts"}
    assert sink_options({"streamName": "orders", **spark_adds}).stream == "orders"


def test_a_stream_is_required() -> None:
    with pytest.raises(SparkOptionError, match="streamName"):
        sink_options({"aggregate": "true"})


def test_columns_are_located_whatever_their_order_and_case() -> None:
    columns = sink_columns(
        schema(PartitionKey=StringType(), explicithashkey=StringType(), DATA=BinaryType())
    )
    assert (columns.data, columns.partition_key, columns.explicit_hash_key) == (2, 0, 1)
    assert (
        sink_columns(schema(data=StringType(), partitionKey=StringType())).explicit_hash_key is None
    )


@pytest.mark.parametrize(
    ("columns", "problem"),
    [
        ({"data": BinaryType()}, "column partitionKey is missing; columns are: data"),
        ({"partitionKey": StringType()}, "column data is missing"),
        (
            {"data": LongType(), "partitionKey": StringType()},
            "data must be binary or string, not bigint",
        ),
        ({"data": StringType(), "partitionKey": BinaryType()}, "partitionKey must be string"),
        (
            {"data": StringType(), "partitionKey": StringType(), "amount": LongType()},
            r"unexpected column\(s\) amount",
        ),
        ({"data": StringType(), "Data": StringType()}, "column data appears twice"),
    ],
)
def test_wrong_columns_are_refused(columns: dict[str, object], problem: str) -> None:
    with pytest.raises(SparkSinkSchemaError, match=problem):
        sink_columns(schema(**columns))


def test_rows_come_out_as_python_values_and_nulls_are_refused() -> None:
    columns = sink_columns(schema(data=BinaryType(), partitionKey=StringType()))
    batch = pa.record_batch(
        [pa.array([b"a", b"b"]), pa.array(["k1", "k2"])], ["data", "partitionKey"]
    )
    assert columns.rows(batch) == ([b"a", b"b"], ["k1", "k2"], [None, None])
    with_null = pa.record_batch(
        [pa.array([b"a", None, b"c"]), pa.array(["k", "k", "k"])], ["data", "partitionKey"]
    )
    with pytest.raises(SparkSinkSchemaError, match="column data is null in row 11"):
        columns.rows(with_null, first_row=10)
