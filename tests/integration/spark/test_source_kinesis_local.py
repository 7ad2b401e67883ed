"""The shardflow source on kinesis-local: resharding while a query runs, LATEST, fan-out."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from shardflow.aws.kinesis import list_shards
from support.spark_source import (
    expect_each_once,
    make_stream,
    output_rows,
    payloads,
    source,
    to_parquet,
    wait_until,
    write,
)
from support.streams import create_stream, kinesis_at, merge_children, put, split_in_half

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.timeout(150)

KEYS = 8


def ranked(round_: int, per_key: int) -> list[tuple[str, bytes]]:
    """``per_key`` records for each key, data ``key:rank`` with ranks continuing per round."""
    return [
        (f"k{key}", f"k{key}:{round_ * per_key + rank}".encode())
        for rank in range(per_key)
        for key in range(KEYS)
    ]


def test_split_and_merge_while_the_query_runs_lose_nothing_and_keep_key_order(
    spark: SparkSession, kinesis_local_url: str, stream_name: str, tmp_path: Path
) -> None:
    url = kinesis_local_url
    make_stream(url, stream_name, 2)
    batches: list[tuple[int, list[Any]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, df.collect()))

    written = ranked(0, 6)
    write(url, stream_name, written)
    df = source(
        spark, url, stream_name, metadataPath=str(tmp_path / "meta"), maxRecordsPerTrigger="30"
    )
    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    async def reshard() -> list[str]:
        async with kinesis_at(url) as kinesis:
            first = (await list_shards(kinesis, stream_name))[0]
            await split_in_half(kinesis, stream_name, first)
            written.extend(ranked(1, 6))
            await put(kinesis, stream_name, ranked(1, 6))
            await merge_children(kinesis, stream_name, first.shard_id)
            return [s.shard_id for s in await list_shards(kinesis, stream_name)]

    try:
        shard_ids = asyncio.run(reshard())
        last = ranked(2, 6)
        write(url, stream_name, last)
        written.extend(last)
        wait_until(
            lambda: sum(len(rows) for _, rows in batches) >= len(written), 90, "every record"
        )
        query.processAllAvailable()
    finally:
        query.stop()

    rows = [row for _, rows in batches for row in rows]
    expect_each_once(rows, written)
    assert len(shard_ids) == 5
    assert {r.shardId for r in rows} == set(shard_ids)
    # A key's records in batch order, and in shard order within a batch (a batch never holds a
    # parent and its child), come out in the order they were written.
    per_key: dict[str, list[int]] = defaultdict(list)
    for _, rows_of_batch in sorted(batches, key=lambda b: b[0]):
        for row in sorted(
            rows_of_batch, key=lambda r: (int(r.sequenceNumber), r.subSequenceNumber)
        ):
            key, rank = bytes(row.data).decode().split(":")
            per_key[key].append(int(rank))
    assert dict(per_key) == {f"k{k}": list(range(18)) for k in range(KEYS)}


def test_latest_reads_only_records_written_after_the_query_started(
    spark: SparkSession, kinesis_local_url: str, stream_name: str, tmp_path: Path
) -> None:
    url = kinesis_local_url
    make_stream(url, stream_name, 2, payloads("old", 30))
    df = source(
        spark, url, stream_name, metadataPath=str(tmp_path / "meta"), startingPosition="LATEST"
    )
    query = to_parquet(df, tmp_path / "out", tmp_path / "ckpt", available_now=False)
    try:
        query.processAllAvailable()  # the first offset (the start moment) is fixed by now
        new = payloads("new", 40)
        write(url, stream_name, new)
        query.processAllAvailable()
    finally:
        query.stop()
    expect_each_once(output_rows(spark, tmp_path / "out"), new)


def test_enhanced_fan_out_reads_every_record_once(
    spark: SparkSession, kinesis_local_url: str, stream_name: str, tmp_path: Path
) -> None:
    url = kinesis_local_url
    items = payloads("efo", 80)
    make_stream(url, stream_name, 2, items)
    df = source(
        spark,
        url,
        stream_name,
        metadataPath=str(tmp_path / "meta"),
        consumerType="efo",
        consumerName="spark-test",
    )
    to_parquet(df, tmp_path / "out", tmp_path / "ckpt").awaitTermination(90)
    expect_each_once(output_rows(spark, tmp_path / "out"), items)

    async def consumers() -> list[str]:
        async with kinesis_at(url) as kinesis:
            arn = (await kinesis.describe_stream_summary(StreamName=stream_name))[
                "StreamDescriptionSummary"
            ]["StreamARN"]
            listed = await kinesis.list_stream_consumers(StreamARN=arn)
            return [c["ConsumerName"] for c in listed["Consumers"]]

    assert asyncio.run(consumers()) == ["spark-test"]


def test_sub_records_the_producer_resent_after_a_split_are_read_once(
    spark: SparkSession, kinesis_local_url: str, stream_name: str, tmp_path: Path
) -> None:
    """After a split shardflow's producer, its shard map stale, puts aggregates meant for the
    parent on one child and those of their records that belong to the other child again
    there: the source reads each record once, in a batch read and in micro-batches that may end
    on a skipped sub-record (maxRecordsPerTrigger)."""
    from shardflow.aws import AwsSettings
    from shardflow.producer import Producer
    from support.resend import STALE_MAP, wave

    url = kinesis_local_url
    written: list[tuple[str, bytes]] = []

    async def produce() -> int:
        async with kinesis_at(url) as kinesis:
            await create_stream(kinesis, stream_name, 1)
            async with Producer(
                stream_name, settings=STALE_MAP, aws=AwsSettings(endpoint_url=url)
            ) as producer:
                written.extend(await wave(producer, "before"))
                (parent,) = await list_shards(kinesis, stream_name)
                await split_in_half(kinesis, stream_name, parent)
                written.extend(await wave(producer, "after"))
                written.extend(await wave(producer, "later"))
                return producer.metrics().retries

    retried = asyncio.run(produce())
    assert retried > 0  # out-of-range records were put again: the copies are in the stream
    batch = (
        spark.read.format("shardflow")
        .option("streamName", stream_name)
        .option("endpointUrl", url)
        .option("region", "us-east-1")
        .load()
        .collect()
    )
    expect_each_once(batch, written)
    df = source(
        spark, url, stream_name, metadataPath=str(tmp_path / "meta"), maxRecordsPerTrigger="10"
    )
    to_parquet(df, tmp_path / "out", tmp_path / "ckpt").awaitTermination(120)
    expect_each_once(output_rows(spark, tmp_path / "out"), written)
