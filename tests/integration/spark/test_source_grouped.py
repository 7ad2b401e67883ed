"""shardsPerTask: shards grouped into tasks keep each shard's order and exactly-once (issue 21
item 6), and an idle trigger probes with the iterators its last probe kept."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from shardflow.aws.kinesis import list_shards
from shardflow.errors import SparkOptionError
from shardflow.testing.faults import ErrorResponse, FaultProxy
from support.spark_source import (
    expect_each_once,
    make_stream,
    output_rows,
    payloads,
    source,
    to_parquet,
    wait_until,
    write,
    write_aggregated,
)
from support.streams import kinesis_at, put, split_in_half

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = pytest.mark.timeout(150)

Row = tuple[str, int, int]  # shard, sequence number, sub-sequence number


def collecting(
    batches: dict[int, list[list[Row]]], tasks: list[int]
) -> Any:  # the foreachBatch function
    def collect(df: DataFrame, batch_id: int) -> None:
        tasks.append(df.rdd.getNumPartitions())
        # Rows as Spark handed them out, task after task: each shard's order shows as read.
        rows = df.select("shardId", "sequenceNumber", "subSequenceNumber").collect()
        batches.setdefault(batch_id, []).append(
            [(r.shardId, int(r.sequenceNumber), r.subSequenceNumber) for r in rows]
        )

    return collect


def drain(
    spark: SparkSession, url: str, stream: str, work: Path, run: str, **options: str
) -> tuple[dict[int, list[list[Row]]], list[int]]:
    batches: dict[int, list[list[Row]]] = {}
    tasks: list[int] = []
    df = source(spark, url, stream, metadataPath=str(work / f"{run}-meta"), **options)
    query = (
        df.writeStream.foreachBatch(collecting(batches, tasks))
        .option("checkpointLocation", str(work / f"{run}-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(90)
    assert query.exception() is None
    return batches, tasks


def in_shard_order(rows: list[Row]) -> bool:
    """Whether every shard's rows come in its order (sequence, then sub-sequence number)."""
    last: dict[str, tuple[int, int]] = {}
    for shard, sequence, sub in rows:
        if shard in last and (sequence, sub) <= last[shard]:
            return False
        last[shard] = (sequence, sub)
    return True


def test_grouped_tasks_give_the_same_rows_in_shard_order(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    items = payloads("p", 600, keys=40)
    make_stream(kinesalite_url, stream_name, 6, items)
    aggregated = payloads("a", 300, keys=12)
    write_aggregated(kinesalite_url, stream_name, aggregated, per_aggregate=20)

    single, single_tasks = drain(
        spark, kinesalite_url, stream_name, tmp_path, "one", shardsPerTask="1"
    )
    grouped, grouped_tasks = drain(
        spark,
        kinesalite_url,
        stream_name,
        tmp_path,
        "grouped",
        shardsPerTask="4",
        maxRecordsPerTrigger="250",
    )
    assert max(single_tasks) == 6
    assert max(grouped_tasks) == 2, grouped_tasks  # 6 shards by 4: two tasks of 3
    single_rows = [row for b in sorted(single) for row in single[b][-1]]
    grouped_rows = [row for b in sorted(grouped) for row in grouped[b][-1]]
    assert len(grouped) >= 4  # several bounded batches
    assert sorted(grouped_rows) == sorted(single_rows)
    assert len(set(grouped_rows)) == len(grouped_rows) == len(items) + len(aggregated)
    # Within every batch, and across batches, each shard's rows come in shard order.
    assert all(in_shard_order(rows) for attempts in grouped.values() for rows in attempts)
    assert in_shard_order(grouped_rows)


def test_grouped_tasks_failing_mid_batch_restart_exactly_once(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    items = payloads("x", 900, keys=30)
    make_stream(kinesalite_url, stream_name, 6, items)
    out, checkpoint, metadata = tmp_path / "out", tmp_path / "ckpt", tmp_path / "meta"
    with FaultProxy(kinesalite_url, seed=5) as proxy:
        for skip, per_task in ((7, "3"), (4, "2")):
            # A denied GetRecords fails one task of the batch while other shards of its group
            # (and other tasks) finished and recorded their ends; the restart may group the
            # shards otherwise: ends are per shard.
            proxy.add(ErrorResponse("AccessDeniedException"), operation="GetRecords", skip=skip)
            df = source(
                spark,
                proxy.url,
                stream_name,
                metadataPath=str(metadata),
                maxRecordsPerTrigger="300",
                shardsPerTask=per_task,
            )
            query = to_parquet(df, out, checkpoint)
            with pytest.raises(Exception, match="AccessDenied"):
                query.awaitTermination(90)
            proxy.clear()
        assert proxy.injected(operation="GetRecords")
        df = source(
            spark,
            proxy.url,
            stream_name,
            metadataPath=str(metadata),
            maxRecordsPerTrigger="300",
            shardsPerTask="4",
        )
        query = to_parquet(df, out, checkpoint)
        query.awaitTermination(90)
        assert query.exception() is None
    expect_each_once(output_rows(spark, out), items)


def test_a_grouped_batch_replayed_after_a_restart_holds_the_same_rows(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    items = payloads("r", 400)
    make_stream(kinesalite_url, stream_name, 5, items)
    attempts: dict[int, list[list[Row]]] = {}

    def sink(df: DataFrame, batch_id: int) -> None:
        rows = df.select("shardId", "sequenceNumber", "subSequenceNumber").collect()
        attempts.setdefault(batch_id, []).append(
            [(r.shardId, int(r.sequenceNumber), r.subSequenceNumber) for r in rows]
        )
        if batch_id == 1 and len(attempts[1]) == 1:
            raise RuntimeError("the driver dies after the batch was read, before its commit")

    def run(per_task: str) -> StreamingQuery:
        df = source(
            spark,
            kinesalite_url,
            stream_name,
            metadataPath=str(tmp_path / "meta"),
            maxRecordsPerTrigger="120",
            shardsPerTask=per_task,
        )
        return (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )

    with pytest.raises(Exception, match="the driver dies"):
        run("3").awaitTermination(60)
    more = payloads("r-more", 100)
    write(kinesalite_url, stream_name, more)  # arrives meanwhile: not in the replayed batch
    run("2").awaitTermination(60)
    first, replay = attempts[1]
    assert sorted(replay) == sorted(first)
    assert 0 < len(first) <= 120
    committed = [row for batch in sorted(attempts) for row in attempts[batch][-1]]
    assert len(committed) == len(set(committed)) == len(items) + len(more)
    assert in_shard_order(committed)


def test_grouped_tasks_across_a_split_keep_every_key_in_order(
    spark: SparkSession, kinesis_local_url: str, stream_name: str, tmp_path: Path
) -> None:
    url = kinesis_local_url
    keys = 6

    def ranked(round_: int, per_key: int) -> list[tuple[str, bytes]]:
        return [
            (f"k{key}", f"k{key}:{round_ * per_key + rank}".encode())
            for rank in range(per_key)
            for key in range(keys)
        ]

    make_stream(url, stream_name, 3)
    written = ranked(0, 5)
    write(url, stream_name, written)
    batches: list[tuple[int, list[Any]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, df.collect()))

    df = source(
        spark,
        url,
        stream_name,
        metadataPath=str(tmp_path / "meta"),
        maxRecordsPerTrigger="20",
        shardsPerTask="2",
    )
    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    async def reshard() -> None:
        async with kinesis_at(url) as kinesis:
            for shard in (await list_shards(kinesis, stream_name))[:2]:
                await split_in_half(kinesis, stream_name, shard)
            await put(kinesis, stream_name, ranked(1, 5))

    try:
        asyncio.run(reshard())
        written.extend(ranked(1, 5))
        wait_until(
            lambda: sum(len(rows) for _, rows in batches) >= len(written), 90, "every record"
        )
        query.processAllAvailable()
    finally:
        query.stop()
    rows = [row for _, rows in batches for row in rows]
    expect_each_once(rows, written)
    # The second round went to the children of the two split shards (ids after the 3 first).
    assert {r.shardId for r in rows} - {f"shardId-{i:012d}" for i in range(3)}
    per_key: dict[str, list[int]] = defaultdict(list)
    for _, rows_of_batch in sorted(batches, key=lambda b: b[0]):
        for row in sorted(
            rows_of_batch, key=lambda r: (int(r.sequenceNumber), r.subSequenceNumber)
        ):
            key, rank = bytes(row.data).decode().split(":")
            per_key[key].append(int(rank))
    assert dict(per_key) == {f"k{k}": list(range(10)) for k in range(keys)}


@pytest.mark.parametrize("value", ["0", "-2", "three", "2.5", "5000"])
def test_an_invalid_shards_per_task_is_a_clear_error_at_load(
    spark: SparkSession, kinesalite_url: str, tmp_path: Path, value: str
) -> None:
    with pytest.raises(SparkOptionError, match="shardsPerTask") as raised:
        source(
            spark,
            kinesalite_url,
            "any",
            metadataPath=str(tmp_path / "meta"),
            shardsPerTask=value,
        )
    assert "whole number from 1 to" in str(raised.value)


def test_idle_triggers_probe_with_the_iterators_kept_and_still_see_new_records(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    shards = 4
    make_stream(kinesalite_url, stream_name, shards)
    with FaultProxy(kinesalite_url) as proxy:
        spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
        df = source(spark, proxy.url, stream_name, metadataPath=str(tmp_path / "meta"))
        query = to_parquet(df, tmp_path / "out", tmp_path / "ckpt", available_now=False)
        try:
            wait_until(lambda: len(query.recentProgress) >= 8, 60, "eight idle triggers")
            idle = [p for p in query.recentProgress if not p["numInputRows"]]
            # Every idle trigger asked GetRecords of every shard; a new iterator was needed
            # only for the first probe of each shard.
            assert proxy.forwarded("GetRecords") >= shards * len(idle)
            assert proxy.forwarded("GetShardIterator") == shards
            items = payloads("new", 40)
            write(kinesalite_url, stream_name, items)
            wait_until(
                lambda: sum(p["numInputRows"] for p in query.recentProgress) >= len(items),
                60,
                "the new records",
            )
            time.sleep(0.5)
        finally:
            query.stop()
    expect_each_once(output_rows(spark, tmp_path / "out"), items)
