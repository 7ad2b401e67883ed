"""The shardflow sink: Spark (local[2]) writes to kinesalite; shardflow.reader reads it back."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from shardflow.reader import read_all
from shardflow.records import Record
from shardflow.shards import hash_key_of
from shardflow.testing.faults import ErrorResponse, FaultProxy
from support.streams import create_stream, kinesis_at

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.timeout(120)


def make_stream(url: str, name: str, shards: int) -> list[dict[str, Any]]:
    """Create the stream; returns its shards (with hash key ranges)."""

    async def go() -> list[dict[str, Any]]:
        async with kinesis_at(url) as kinesis:
            await create_stream(kinesis, name, shards)
            listed = await kinesis.list_shards(StreamName=name)
            return list(listed["Shards"])

    return asyncio.run(go())


def read_back(url: str, name: str, *, deaggregate: bool = True) -> list[Record]:
    from shardflow.aws import AwsSettings

    return asyncio.run(read_all(name, aws=AwsSettings(endpoint_url=url), deaggregate=deaggregate))


def orders(spark: SparkSession, count: int) -> DataFrame:
    rows = [
        (json.dumps({"order": i, "amount": i % 97}).encode(), f"customer-{i % 37}")
        for i in range(count)
    ]
    return spark.createDataFrame(rows, "data binary, partitionKey string").repartition(2)


def written(records: list[Record]) -> Counter[tuple[bytes, str]]:
    return Counter((bytes(r.data), r.partition_key) for r in records)


def expected(df: DataFrame) -> Counter[tuple[bytes, str]]:
    return Counter((bytes(row.data), row.partitionKey) for row in df.collect())


def test_batch_write_lands_every_row_once_in_its_keys_shard(
    spark: SparkSession, kinesalite_url: str, stream_name: str
) -> None:
    shards = make_stream(kinesalite_url, stream_name, 2)
    df = orders(spark, 1500)
    (
        df.write.format("shardflow")
        .option("streamName", stream_name)
        .option("endpointUrl", kinesalite_url)
        .option("region", "us-east-1")
        .mode("append")
        .save()
    )
    records = read_back(kinesalite_url, stream_name)
    assert written(records) == expected(df)
    for record in records:  # routed by the MD5 of its key, as Kinesis does
        shard = next(s for s in shards if s["ShardId"] == record.shard_id)
        low, high = shard["HashKeyRange"]["StartingHashKey"], shard["HashKeyRange"]["EndingHashKey"]
        assert int(low) <= hash_key_of(record.partition_key) <= int(high)


def test_aggregated_string_rows_with_explicit_hash_keys(
    spark: SparkSession, kinesalite_url: str, stream_name: str
) -> None:
    shards = make_stream(kinesalite_url, stream_name, 2)
    last_shard = max(shards, key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
    pinned = last_shard["HashKeyRange"]["EndingHashKey"]
    rows = [(f"event {i} ✓", f"k{i % 11}", pinned if i % 3 == 0 else None) for i in range(900)]
    df = spark.createDataFrame(rows, "data string, partitionKey string, explicitHashKey string")
    (
        df.write.format("shardflow")
        .option("streamName", stream_name)
        .option("endpointUrl", kinesalite_url)
        .option("aggregate", "true")
        .mode("append")
        .save()
    )
    records = read_back(kinesalite_url, stream_name)
    assert Counter((bytes(r.data).decode(), r.partition_key) for r in records) == Counter(
        (data, key) for data, key, _ in rows
    )
    pinned_data = {data for data, _, hash_key in rows if hash_key is not None}
    assert {r.shard_id for r in records if bytes(r.data).decode() in pinned_data} == {
        last_shard["ShardId"]
    }
    # Aggregation really happened: far fewer Kinesis records than rows.
    raw = read_back(kinesalite_url, stream_name, deaggregate=False)
    assert len(raw) <= 20


def test_streaming_query_writes_each_micro_batch(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    make_stream(kinesalite_url, stream_name, 2)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    sent: list[dict[str, Any]] = []
    for file_number in range(3):  # three files, one per micro-batch
        chunk = [
            {"id": f"{file_number}-{i}", "customer": f"c{i % 13}", "amount": i} for i in range(200)
        ]
        sent += chunk
        (incoming / f"part-{file_number}.json").write_text(
            "\n".join(json.dumps(row) for row in chunk)
        )
    query = (
        spark.readStream.schema("id string, customer string, amount long")
        .option("maxFilesPerTrigger", 1)
        .json(str(incoming))
        .selectExpr("to_json(struct(id, amount)) AS data", "customer AS partitionKey")
        .writeStream.format("shardflow")
        .option("streamName", stream_name)
        .option("endpointUrl", kinesalite_url)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(90)
    assert query.exception() is None
    commits = (tmp_path / "checkpoint" / "commits").iterdir()
    assert sorted(int(p.name) for p in commits if p.name.isdigit()) == [0, 1, 2]
    records = read_back(kinesalite_url, stream_name)
    got = Counter(
        (json.loads(r.data)["id"], json.loads(r.data)["amount"], r.partition_key) for r in records
    )
    assert got == Counter((row["id"], row["amount"], row["customer"]) for row in sent)


def test_a_record_kinesis_refuses_fails_the_job_with_the_reason(
    spark: SparkSession, kinesalite_url: str, stream_name: str
) -> None:
    from pyspark.errors import PySparkException

    make_stream(kinesalite_url, stream_name, 1)
    df = orders(spark, 50)
    with FaultProxy(kinesalite_url) as proxy:
        proxy.add(ErrorResponse("AccessDeniedException"), operation="PutRecords")
        with pytest.raises(PySparkException) as failure:
            (
                df.write.format("shardflow")
                .option("streamName", stream_name)
                .option("endpointUrl", proxy.url)
                .mode("append")
                .save()
            )
        proxy.wait_idle()
        assert proxy.injected(kind="error")
    message = str(failure.value)
    assert "SparkSinkWriteError" in message
    assert f"writing to stream {stream_name}" in message
    assert "could not be written" in message
    assert "AccessDenied" in message
    assert read_back(kinesalite_url, stream_name) == []


def test_throttled_entries_are_retried_within_the_task(
    spark: SparkSession, kinesalite_url: str, stream_name: str
) -> None:
    from shardflow.testing.faults import PartialFailure

    make_stream(kinesalite_url, stream_name, 2)
    df = orders(spark, 600)
    with FaultProxy(kinesalite_url, seed=3) as proxy:
        proxy.add(PartialFailure(fraction=0.3), times=4)
        (
            df.write.format("shardflow")
            .option("streamName", stream_name)
            .option("endpointUrl", proxy.url)
            .mode("append")
            .save()
        )
        proxy.wait_idle()
        assert len(proxy.injected(kind="partial_failure")) == 4
    assert written(read_back(kinesalite_url, stream_name)) == expected(df)


@pytest.mark.parametrize(
    ("columns", "complaint"),
    [
        ("CAST(CAST(id AS STRING) AS BINARY) AS data", "column partitionKey is missing"),
        (
            "CAST(id AS STRING) AS data, 'k' AS partitionKey, id",
            "unexpected column(s) id",
        ),
    ],
)
def test_wrong_columns_fail_when_the_write_is_planned(
    spark: SparkSession, columns: str, complaint: str
) -> None:
    from pyspark.errors import PySparkException

    df = spark.range(3).selectExpr(*[c.strip() for c in _split(columns)])
    with pytest.raises(PySparkException) as failure:
        df.write.format("shardflow").option("streamName", "never-written").mode("append").save()
    assert "SparkSinkSchemaError" in str(failure.value)
    assert complaint in str(failure.value)


def test_a_misspelt_option_fails_the_write_naming_the_right_one(spark: SparkSession) -> None:
    from pyspark.errors import PySparkException

    df = spark.createDataFrame([("a", "k")], "data string, partitionKey string")
    writer = df.write.format("shardflow").option("streamName", "never-written").mode("append")
    with pytest.raises(PySparkException) as failure:
        writer.option("agregate", "true").save()  # was: written, not aggregated
    assert "UnknownSparkOptionError: option agregate:" in str(failure.value)
    assert "did you mean aggregate?" in str(failure.value)


def test_a_null_partition_key_fails_the_task_naming_the_row(
    spark: SparkSession, kinesalite_url: str, stream_name: str
) -> None:
    from pyspark.errors import PySparkException

    make_stream(kinesalite_url, stream_name, 1)
    df = spark.createDataFrame(
        [(b"a", "k"), (b"b", None)], "data binary, partitionKey string"
    ).coalesce(1)
    with pytest.raises(PySparkException) as failure:
        (
            df.write.format("shardflow")
            .option("streamName", stream_name)
            .option("endpointUrl", kinesalite_url)
            .mode("append")
            .save()
        )
    assert "column partitionKey is null in row 1 of this task" in str(failure.value)


def _split(columns: str) -> list[str]:
    # Split on top-level commas only (none of the expressions above nests one).
    return columns.split(", ")
