"""The sink's producers: one per executor process, reused across tasks, flushed per task
(moto's server over HTTP, the task function called as Spark's Python worker calls it)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from shardflow.errors import SparkSinkWriteError
from shardflow.spark.sink import producers
from shardflow.spark.sink.columns import SinkColumns
from shardflow.spark.sink.options import sink_options
from shardflow.spark.sink.task import write_rows
from support.boto import make_stream, stored_records

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
