"""spark.read.format("shardflow"): a range of every shard, by positions or timestamps."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pytest

from shardflow.errors import SparkOptionError, UnknownSparkOptionError
from support.spark_source import expect_each_once, make_stream, payloads, write

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.timeout(120)


def read(spark: SparkSession, url: str, name: str, **options: str) -> DataFrame:
    reader = spark.read.format("shardflow").option("streamName", name)
    reader = reader.option("endpointUrl", url).option("region", "us-east-1")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_reads_all_or_a_range_by_positions_or_timestamps(
    spark: SparkSession, kinesalite_url: str, stream_name: str
) -> None:
    url = kinesalite_url
    make_stream(url, stream_name, 2)
    early = payloads("early", 120)
    placed = write(url, stream_name, early)
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    late = payloads("late", 80)
    write(url, stream_name, late)

    everything = read(spark, url, stream_name).collect()
    expect_each_once(everything, early + late)

    until_middle = read(spark, url, stream_name, endingPosition=str(middle_ms)).collect()
    expect_each_once(until_middle, early)
    from_middle = read(
        spark, url, stream_name, startingPosition="AT_TIMESTAMP", startingTimestamp=str(middle_ms)
    ).collect()
    expect_each_once(from_middle, late)

    # After the 10th and through the 50th record of one shard; the other shard is skipped.
    shard = placed[0][0]
    mine = [(item, seq) for item, (s, seq) in zip(early, placed, strict=True) if s == shard]
    others = {s for s, _ in placed if s != shard}
    start = {shard: f"AFTER_SEQUENCE_NUMBER:{mine[9][1]}", **{s: "SHARD_END" for s in others}}
    ranged = read(
        spark,
        url,
        stream_name,
        startingPosition=json.dumps(start),
        endingPosition=json.dumps({shard: mine[49][1]}),
    ).collect()
    expect_each_once(ranged, [item for item, _ in mine[10:50]])


def test_a_stream_that_does_not_exist_fails_with_its_name(
    spark: SparkSession, kinesalite_url: str, stream_name: str
) -> None:
    with pytest.raises(Exception, match="ResourceNotFound") as caught:
        read(spark, kinesalite_url, stream_name).collect()
    assert stream_name in str(caught.value)


def test_a_bad_option_fails_naming_it(
    spark: SparkSession, kinesalite_url: str, stream_name: str
) -> None:
    with pytest.raises(Exception, match="option startingPosition") as caught:
        read(spark, kinesalite_url, stream_name, startingPosition="SOMEWHERE").collect()
    assert "SparkOptionError" in str(caught.value)


def test_a_bad_option_fails_where_the_source_is_defined(spark: SparkSession) -> None:
    reader = spark.readStream.format("shardflow").options(streamName="orders", metadataPath="m")
    with pytest.raises(SparkOptionError, match="option maxRecordsPerTrigger"):
        reader.option("maxRecordsPerTrigger", "many").load()  # not at .start()


def test_a_misspelt_option_fails_at_load_naming_the_right_one(spark: SparkSession) -> None:
    # Read from TRIM_HORIZON, silently, before options were checked by name.
    reader = spark.read.format("shardflow").option("streamName", "orders")
    with pytest.raises(Exception, match="did you mean startingPosition") as caught:
        reader.option("startingPostion", "LATEST").load()
    assert "UnknownSparkOptionError" in str(caught.value)
    stream = spark.readStream.format("shardflow").options(streamName="orders", metadataPath="m")
    with pytest.raises(UnknownSparkOptionError, match="did you mean startingPosition"):
        stream.option("startingPostion", "LATEST").load()


def test_a_stream_read_without_metadata_path_fails_at_load(spark: SparkSession) -> None:
    reader = spark.readStream.format("shardflow").option("streamName", "orders")
    with pytest.raises(SparkOptionError, match="option metadataPath: required for streaming"):
        reader.load()  # was: when the query started, from awaitTermination()
    with pytest.raises(SparkOptionError, match="option metadataPath: required for streaming"):
        spark.readStream.load(format="shardflow", streamName="orders")
    assert spark.read.format("shardflow").option("streamName", "orders").load().isStreaming is False
