"""The shardflow source in Structured Streaming: Spark local[2] reads kinesalite into Parquet."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from shardflow.spark.source.arrow import ARROW_SCHEMA
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = pytest.mark.timeout(120)


def batch_dirs(metadata: Path) -> list[Path]:
    return sorted(p for run in metadata.iterdir() for p in run.iterdir() if p.name.isdigit())


def test_available_now_reads_every_record_once_in_bounded_batches(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    items = payloads("a", 1000)
    placed = make_stream(kinesalite_url, stream_name, 2, items)
    df = source(
        spark,
        kinesalite_url,
        stream_name,
        metadataPath=str(tmp_path / "meta"),
        maxRecordsPerTrigger="300",
    )
    query = to_parquet(df, tmp_path / "out", tmp_path / "ckpt")
    query.awaitTermination(90)

    rows = output_rows(spark, tmp_path / "out")
    expect_each_once(rows, items)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(sizes) >= 4, sizes
    assert max(sizes) <= 300, sizes
    # Columns as Kinesis gave them: shard, key, sequence number of each record.
    where = {bytes(r.data): (r.shardId, r.sequenceNumber) for r in rows}
    assert [where[data] for _, data in items] == placed
    assert all(r.streamName == stream_name and r.subSequenceNumber == 0 for r in rows)
    assert all(r.approximateArrivalTimestamp is not None for r in rows)
    assert {r.partitionKey for r in rows} == {key for key, _ in items}
    # Every shard of every batch has its end recorded under metadataPath.
    recorded = [f for d in batch_dirs(tmp_path / "meta") for f in d.glob("shardId-*.json")]
    assert len(recorded) >= len(sizes)
    assert str(ARROW_SCHEMA.field("approximateArrivalTimestamp").type) == "timestamp[us, tz=UTC]"


def test_aggregates_are_split_and_a_batch_may_end_inside_one(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    make_stream(kinesalite_url, stream_name, 2)
    items = payloads("g", 300, keys=6)
    aggregates = write_aggregated(kinesalite_url, stream_name, items, per_aggregate=25)
    # 40 rows a trigger cuts across aggregates of 25: batches end inside them.
    df = source(
        spark,
        kinesalite_url,
        stream_name,
        metadataPath=str(tmp_path / "meta"),
        maxRecordsPerTrigger="40",
    )
    query = to_parquet(df, tmp_path / "out", tmp_path / "ckpt")
    query.awaitTermination(90)
    rows = output_rows(spark, tmp_path / "out")
    expect_each_once(rows, items)
    assert {r.subSequenceNumber for r in rows} == set(range(25))
    ends = [
        json.loads(f.read_text())["end"]
        for d in batch_dirs(tmp_path / "meta")
        for f in d.glob("*.json")
    ]
    assert any("/" in end for end in ends), "no batch ended inside an aggregate"
    # Each key's records come out in the order they were written.
    for key in {k for k, _ in items}:
        mine = sorted(
            (r for r in rows if r.partitionKey == key),
            key=lambda r: (int(r.sequenceNumber), r.subSequenceNumber),
        )
        assert [bytes(r.data) for r in mine] == [d for k, d in items if k == key]

    raw = (
        spark.read.format("shardflow")
        .option("streamName", stream_name)
        .option("endpointUrl", kinesalite_url)
        .option("deaggregate", "false")
        .load()
        .collect()
    )
    assert len(raw) == aggregates
    assert {r.subSequenceNumber for r in raw} == {0}


def last_offsets(checkpoint: Path) -> tuple[int, dict[str, object], bool]:
    """The last planned batch of a checkpoint, its source offset, and whether it committed."""
    batch = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    offset = json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])
    return batch, offset, (checkpoint / "commits" / str(batch)).exists()


def test_restarts_after_failures_mid_batch_deliver_every_record_exactly_once(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    items = payloads("x", 1200)
    make_stream(kinesalite_url, stream_name, 2, items)
    out, checkpoint, metadata = tmp_path / "out", tmp_path / "ckpt", tmp_path / "meta"
    replayed_recorded_batch = False
    with FaultProxy(kinesalite_url, seed=3) as proxy:
        for skip in (5, 3, 3):
            # A denied GetRecords kills a task (local mode: no task retry) or the driver's
            # planning, mid-query; other shards' tasks of the batch may have finished.
            proxy.add(
                ErrorResponse("AccessDeniedException"),
                operation="GetRecords",  # names no stream; only this test uses the proxy
                skip=skip,
                times=1,
            )
            df = source(
                spark,
                proxy.url,
                stream_name,
                metadataPath=str(metadata),
                maxRecordsPerTrigger="300",
            )
            query = to_parquet(df, out, checkpoint)
            with pytest.raises(Exception, match="AccessDenied"):
                query.awaitTermination(90)
            proxy.clear()
            batch, offset, committed = last_offsets(checkpoint)
            ends = metadata / str(offset["run"]) / f"{batch:012d}"
            if not committed and ends.is_dir() and any(ends.glob("*.json")):
                replayed_recorded_batch = True  # the restart must replay recorded ends
        assert proxy.injected(operation="GetRecords")
        df = source(
            spark, proxy.url, stream_name, metadataPath=str(metadata), maxRecordsPerTrigger="300"
        )
        query = to_parquet(df, out, checkpoint)
        query.awaitTermination(90)
        assert query.exception() is None
    assert replayed_recorded_batch, "no failure left a batch with recorded ends uncommitted"
    expect_each_once(output_rows(spark, out), items)


def test_available_now_stops_at_the_tip_as_of_its_start(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    before = payloads("before", 400)
    make_stream(kinesalite_url, stream_name, 2, before)
    stop = threading.Event()
    after: list[tuple[str, bytes]] = []

    def keep_writing() -> None:
        for i in range(2000):  # bounded: ~20 s at most
            if stop.is_set():
                return
            chunk = payloads(f"after{i}", 20)
            write(kinesalite_url, stream_name, chunk)
            after.extend(chunk)
            time.sleep(0.01)

    writer = threading.Thread(target=keep_writing, daemon=True)
    df = source(
        spark,
        kinesalite_url,
        stream_name,
        metadataPath=str(tmp_path / "meta"),
        maxRecordsPerTrigger="150",
    )
    query = to_parquet(df, tmp_path / "out", tmp_path / "ckpt")
    writer.start()
    try:
        assert query.awaitTermination(60), "AvailableNow kept chasing new records"
        time.sleep(0.5)
    finally:
        stop.set()
        writer.join(30)
    rows = output_rows(spark, tmp_path / "out")
    got = {bytes(r.data) for r in rows}
    assert {data for _, data in before} <= got
    assert len(got) == len(rows)
    assert len(got) < len(before) + len(after), "it read records written after it stopped"


def test_a_running_query_plans_no_batch_until_new_records_arrive(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    first = payloads("one", 50)
    make_stream(kinesalite_url, stream_name, 2, first)
    df = source(spark, kinesalite_url, stream_name, metadataPath=str(tmp_path / "meta"))
    query = to_parquet(df, tmp_path / "out", tmp_path / "ckpt", available_now=False)
    try:
        query.processAllAvailable()
        planned = len(batch_dirs(tmp_path / "meta"))
        time.sleep(1.5)  # ~15 triggers of 100 ms with nothing new
        assert len(batch_dirs(tmp_path / "meta")) == planned
        second = payloads("two", 70)
        write(kinesalite_url, stream_name, second)
        wait_until(lambda: len(batch_dirs(tmp_path / "meta")) > planned, 30, "a new batch")
        query.processAllAvailable()
    finally:
        query.stop()
    expect_each_once(output_rows(spark, tmp_path / "out"), first + second)


def test_records_gone_past_the_stored_position_fail_or_are_skipped_and_reported(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    import asyncio

    from support.streams import create_stream, kinesis_at

    old = payloads("old", 30)
    make_stream(kinesalite_url, stream_name, 1, old)
    out, checkpoint, metadata = tmp_path / "out", tmp_path / "ckpt", str(tmp_path / "meta")
    to_parquet(
        source(spark, kinesalite_url, stream_name, metadataPath=metadata), out, checkpoint
    ).awaitTermination(60)

    async def recreate() -> None:
        # What retention does to a slow query, at once: the records it stood at are gone.
        async with kinesis_at(kinesalite_url) as kinesis:
            await kinesis.delete_stream(StreamName=stream_name)
            for _ in range(100):
                try:
                    await create_stream(kinesis, stream_name, 1)
                    return
                except Exception:
                    await asyncio.sleep(0.1)

    asyncio.run(recreate())
    new = payloads("new", 12)
    write(kinesalite_url, stream_name, new)

    failing = to_parquet(
        source(spark, kinesalite_url, stream_name, metadataPath=metadata), out, checkpoint
    )
    with pytest.raises(Exception, match="DataLossError"):
        failing.awaitTermination(60)

    skipping = to_parquet(
        source(spark, kinesalite_url, stream_name, metadataPath=metadata, failOnDataLoss="false"),
        out,
        checkpoint,
    )
    skipping.awaitTermination(60)
    assert skipping.exception() is None
    expect_each_once(output_rows(spark, out), old + new)
    reported = [json.loads(p["sources"][0]["endOffset"]) for p in skipping.recentProgress]
    assert reported[-1]["dataLossEvents"] == 1
    assert any("shardId-000000000000" in o.get("lastDataLoss", {}) for o in reported)


def test_a_batch_replayed_after_a_failure_holds_exactly_the_same_records(
    spark: SparkSession, kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    items = payloads("r", 200)
    make_stream(kinesalite_url, stream_name, 2, items)
    attempts: dict[int, list[list[tuple[str, str, int]]]] = {}

    def sink(df: DataFrame, batch_id: int) -> None:
        rows = df.collect()  # reads the batch: its ends are recorded by now
        attempts.setdefault(batch_id, []).append(
            [(r.shardId, r.sequenceNumber, r.subSequenceNumber) for r in rows]
        )
        if batch_id == 1 and len(attempts[1]) == 1:
            raise RuntimeError("the driver dies after the batch was read, before its commit")

    def run() -> StreamingQuery:
        df = source(
            spark,
            kinesalite_url,
            stream_name,
            metadataPath=str(tmp_path / "meta"),
            maxRecordsPerTrigger="60",
        )
        return (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )

    with pytest.raises(Exception, match="the driver dies"):
        run().awaitTermination(60)
    # More records arrive meanwhile: the replay must still stop where the first attempt did.
    more = payloads("r-more", 100)
    write(kinesalite_url, stream_name, more)
    run().awaitTermination(60)
    first, replay = attempts[1]
    assert replay == first
    assert 0 < len(first) <= 60
    committed = [row for batch in sorted(attempts) for row in attempts[batch][-1]]
    assert len(committed) == len(set(committed)) == len(items) + len(more)
