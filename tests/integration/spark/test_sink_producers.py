"""The sink's producers: one per executor process, reused across tasks, flushed per task
(moto's server over HTTP; the task function called as Spark's Python worker calls it, and a
real streaming query on local[2])."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from shardflow.errors import SparkSinkWriteError
from shardflow.spark.sink import producers
from shardflow.spark.sink.columns import SinkColumns
from shardflow.spark.sink.options import sink_options
from shardflow.spark.sink.task import write_rows
from support.boto import make_stream, stored_records
from support.spark_source import wait_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

COLUMNS = SinkColumns(data=0, partition_key=1, explicit_hash_key=None)


def rows(prefix: str, count: int) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array([f"{prefix}-{i}".encode() for i in range(count)], pa.binary()),
            pa.array([f"key-{i % 7}" for i in range(count)], pa.string()),
        ],
        names=["data", "partitionKey"],
    )


def test_tasks_reuse_one_producer_and_each_commits_only_written_rows(
    moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 2)
    options = sink_options(
        {"streamName": stream_name, "endpointUrl": moto_url, "region": "us-east-1"}
    )
    before = producers.producers_started()
    counts = [
        write_rows(iter([rows(f"t{task}", 120)]), COLUMNS, options).records for task in range(4)
    ]
    assert counts == [120] * 4
    assert producers.producers_started() == before + 1
    # A task whose row cannot be a record fails, and its producer is not kept.
    bad = pa.record_batch(
        [pa.array([b"x" * (1024 * 1024 + 1)]), pa.array(["k"])], names=["data", "partitionKey"]
    )
    with pytest.raises(SparkSinkWriteError, match="row 3 of this task"):
        write_rows(iter([rows("ok", 3), bad]), COLUMNS, options)
    assert write_rows(iter([rows("after", 5)]), COLUMNS, options).records == 5
    assert producers.producers_started() == before + 2
    stored = [bytes(record["Data"]) for _, record in stored_records(moto_url, stream_name)]
    expected = {f"t{t}-{i}".encode() for t in range(4) for i in range(120)}
    expected |= {f"after-{i}".encode() for i in range(5)}
    assert expected <= set(stored)
    assert len([d for d in stored if not d.startswith(b"ok-")]) == len(expected)


@pytest.mark.timeout(180)
def test_a_streaming_query_writes_every_micro_batch_through_one_producer_per_executor_process(
    spark: SparkSession, moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    """A real query (rate source, 2 tasks per micro-batch): each executor Python process
    writes all its tasks of all micro-batches through one producer, and every task's rows are
    in the stream when its write returns (when Spark takes its commit message)."""
    from support import spark_sink_trace

    make_stream(moto_url, stream_name, 2)
    spark_sink_trace.register(spark)
    trace = tmp_path / "trace.jsonl"
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", "200")
        .option("numPartitions", "2")
        .load()
        .selectExpr(
            "concat('r-', cast(value AS string)) AS data",
            "cast(value % 7 AS string) AS partitionKey",
        )
    )
    query = (
        df.writeStream.format("shardflow_traced")
        .option("streamName", stream_name)
        .option("endpointUrl", moto_url)
        .option("region", "us-east-1")
        .option("traceFile", str(trace))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )

    def tasks() -> list[dict[str, Any]]:
        if not trace.exists():
            return []
        return [json.loads(line) for line in trace.read_text().splitlines() if line]

    try:
        wait_until(
            lambda: len({t["stage"] for t in tasks() if t["rows"]}) >= 6, 120, "6 micro-batches"
        )
    finally:
        query.stop()
    written = [t for t in tasks() if t["rows"]]
    producers_of: dict[int, set[str]] = defaultdict(set)
    stages_of: dict[str, set[int]] = defaultdict(set)
    for task in written:
        producers_of[task["pid"]].add(task["producer"])
        stages_of[task["producer"]].add(task["stage"])
        assert task["rows_in_stream"] == task["rows"], task  # flushed before its commit
    assert all(len(names) == 1 for names in producers_of.values()), producers_of
    assert len(stages_of) <= 2  # local[2]: at most two Python workers, one producer each
    assert max(len(stages) for stages in stages_of.values()) >= 3  # across micro-batches
    assert {task["producer"] for task in written} == set(stages_of)
    stored = Counter(bytes(record["Data"]) for _, record in stored_records(moto_url, stream_name))
    rows = [row.encode() for task in written for row in task["data"]]
    assert all(stored[row] == 1 for row in rows)
