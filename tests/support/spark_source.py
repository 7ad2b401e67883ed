"""Helpers for the Spark source tests: streams with known records, queries, and the output."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardflow.aggregation import aggregate
from support.streams import PUT_RECORDS_LIMIT, create_stream_holding, kinesis_at, put

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from shardflow.spark.source.stream import ShardflowStreamReader


def make_stream(
    url: str, name: str, shards: int, items: list[tuple[str, bytes]] | None = None
) -> list[tuple[str, str]]:
    """A stream of ``shards`` shards, with ``items`` put in it as :func:`write` puts them;
    returns (shard id, sequence number) of each item."""

    async def go() -> list[tuple[str, str]]:
        async with kinesis_at(url) as kinesis:
            return await create_stream_holding(kinesis, name, shards, items or [])

    return asyncio.run(go())


def payloads(prefix: str, count: int, keys: int = 23) -> list[tuple[str, bytes]]:
    """``(partition key, data)`` items with unique data ``<prefix>-<i>``."""
    return [(f"key-{i % keys}", f"{prefix}-{i}".encode()) for i in range(count)]


def write(url: str, name: str, items: list[tuple[str, bytes]]) -> list[tuple[str, str]]:
    """Put plain records in order; returns (shard id, sequence number) of each."""

    async def go() -> list[tuple[str, str]]:
        async with kinesis_at(url) as kinesis:
            return await put(kinesis, name, items)

    return asyncio.run(go())


def write_aggregated(
    url: str, name: str, items: list[tuple[str, bytes]], per_aggregate: int
) -> int:
    """Put the items packed into KPL aggregates of ``per_aggregate`` user records (one key per
    aggregate so every key's records stay on one shard); returns how many aggregates."""
    groups: dict[str, list[bytes]] = {}
    for key, data in items:
        groups.setdefault(key, []).append(data)
    records: list[dict[str, Any]] = []
    for key, datas in groups.items():
        for i in range(0, len(datas), per_aggregate):
            chunk = [(key, data, None) for data in datas[i : i + per_aggregate]]
            (packed,) = aggregate(chunk)
            records.append({"PartitionKey": packed.partition_key, "Data": packed.data})

    async def go() -> None:
        async with kinesis_at(url) as kinesis:
            for i in range(0, len(records), PUT_RECORDS_LIMIT):
                answer = await kinesis.put_records(
                    StreamName=name, Records=records[i : i + PUT_RECORDS_LIMIT]
                )
                assert answer.get("FailedRecordCount", 0) == 0

    asyncio.run(go())
    return len(records)


def source(spark: SparkSession, url: str, name: str, **options: str) -> DataFrame:
    reader = (
        spark.readStream.format("shardflow")
        .option("streamName", name)
        .option("endpointUrl", url)
        .option("region", "us-east-1")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def stream_reader(url: str, stream: str, meta: Path, **options: str) -> ShardflowStreamReader:
    """The source's streaming reader built as Spark builds it, for driving its planning from
    the test's own process (no query)."""
    from shardflow.spark.source.options import parse_options
    from shardflow.spark.source.stream import ShardflowStreamReader

    given = {
        "streamName": stream,
        "endpointUrl": url,
        "region": "us-east-1",
        "metadataPath": str(meta),
        **options,
    }
    return ShardflowStreamReader(parse_options(given, streaming=True))


def to_parquet(
    df: DataFrame, out: Path, checkpoint: Path, *, available_now: bool = True
) -> StreamingQuery:
    writer = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime="100 milliseconds")
    )
    return writer.start()


def output_rows(spark: SparkSession, out: Path) -> list[Any]:
    """Every row the file sink committed (it reads only committed files via _spark_metadata)."""
    if not (out / "_spark_metadata").exists():
        return []
    return spark.read.parquet(str(out)).collect()


def data_counts(rows: list[Any]) -> Counter[bytes]:
    return Counter(bytes(row.data) for row in rows)


def expect_each_once(rows: list[Any], items: list[tuple[str, bytes]]) -> None:
    counts = data_counts(rows)
    duplicated = {data: n for data, n in counts.items() if n > 1}
    missing = {data for _, data in items} - counts.keys()
    assert not duplicated, f"{len(duplicated)} records delivered more than once"
    assert not missing, f"{len(missing)} records missing, e.g. {sorted(missing)[:3]}"
    assert len(counts) == len(items)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
