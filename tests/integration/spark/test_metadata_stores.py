"""The source's batch-end stores on moto's server over HTTP: S3 (conditional PutObject,
``If-None-Match: *``) and DynamoDB (conditional put), raced by concurrent attempts.

moto's S3 honours ``If-None-Match: *`` on PutObject (412 PreconditionFailed when the key
exists); shardflow's moto server handles one request at a time, so the check and the write are
one step, as they are on S3.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardflow.aws.settings import AwsSettings
from shardflow.errors import BatchEndConflictError, MetadataOutOfStepError, SourceMetadataError
from shardflow.spark.source.execute import read_partition
from shardflow.spark.source.metadata import ShardBatchEnd
from shardflow.spark.source.metadata_location import MetadataLocation, parse_location
from shardflow.spark.source.metadata_store import BatchEndStore
from shardflow.spark.source.partition import BatchSlot, ShardPartition
from shardflow.spark.source.positions import ShardPosition
from shardflow.spark.source.shard_read import ShardReadPlan
from shardflow.spark.source.stores import open_store
from support.boto import boto_client, make_stream, put_records

pytestmark = pytest.mark.timeout(120)


def new_run() -> str:
    return uuid.uuid4().hex


@pytest.fixture(params=["s3", "dynamodb", "local"])
def location(request: pytest.FixtureRequest, moto_url: str, tmp_path: Path) -> MetadataLocation:
    aws = AwsSettings(region="us-east-1", endpoint_url=moto_url)
    name = f"sf-meta-{uuid.uuid4().hex[:12]}"
    if request.param == "s3":
        boto_client("s3", moto_url).create_bucket(Bucket=name)
        return parse_location(f"s3://{name}/queries/orders", aws)
    if request.param == "dynamodb":
        return parse_location(f"dynamodb://{name}", aws)
    return parse_location(str(tmp_path / "meta"), aws)


def prepared(location: MetadataLocation, run: str) -> BatchEndStore:
    store = open_store(location, run)
    store.prepare()
    return store


def in_threads(count: int, work: Callable[[int], object]) -> list[object]:
    """Run ``work(i)`` for i < count at once (released together), results in order."""
    start = threading.Barrier(count)

    def one(index: int) -> object:
        start.wait()
        try:
            return work(index)
        except Exception as error:
            return error

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_round_trip_cleanup_and_missing_ends(location: MetadataLocation) -> None:
    store = prepared(location, new_run())
    end = ShardBatchEnd(end="AFTER:42", rows=3, stopped="tip", start="TRIM_HORIZON")
    for batch in range(4):
        assert store.record_first(batch, "shardId-000000000000", end) == end
    assert store.load(3, "shardId-000000000000") == end
    assert store.load(3, "shardId-000000000001") is None
    store.forget_before(2)
    assert store.load(1, "shardId-000000000000") is None
    assert store.load(2, "shardId-000000000000") == end
    with pytest.raises(MetadataOutOfStepError, match=r"holds no end.*Fix: restart the query"):
        store.require(0, "shardId-000000000000")
    # Another run (a new checkpoint) never sees this run's ends.
    assert prepared(location, new_run()).load(2, "shardId-000000000000") is None


def test_the_ends_of_many_shards_are_read_together(location: MetadataLocation) -> None:
    store = prepared(location, new_run())
    shards = [f"shardId-{i:012d}" for i in range(40)]
    ends = {s: ShardBatchEnd(end=f"AFTER:{i}", rows=i, stopped="tip") for i, s in enumerate(shards)}
    for shard in shards[:-1]:
        store.record_first(5, shard, ends[shard])
    found = store.load_many(5, shards)
    assert found == {**{s: ends[s] for s in shards[:-1]}, shards[-1]: None}
    assert store.require_many(5, shards[:-1]) == {s: ends[s] for s in shards[:-1]}
    with pytest.raises(MetadataOutOfStepError, match=shards[-1]):
        store.require_many(5, shards)


def test_concurrent_attempts_agree_on_the_first_recorded_end(location: MetadataLocation) -> None:
    run = new_run()
    prepared(location, run)

    def attempt(index: int) -> object:
        mine = ShardBatchEnd(end=f"AFTER:{100 + index}", rows=index, stopped="tip")
        return open_store(location, run).record_first(7, "shardId-000000000003", mine)

    held = in_threads(8, attempt)
    assert all(isinstance(h, ShardBatchEnd) for h in held), held
    assert len({h.end for h in held if isinstance(h, ShardBatchEnd)}) == 1
    assert open_store(location, run).require(7, "shardId-000000000003") == held[0]


def test_a_missing_bucket_names_the_fix(moto_url: str) -> None:
    aws = AwsSettings(region="us-east-1", endpoint_url=moto_url)
    store = open_store(parse_location("s3://sf-no-such-bucket/meta", aws), new_run())
    with pytest.raises(SourceMetadataError, match="create the bucket"):
        store.prepare()


def test_two_attempts_of_one_batch_racing_while_records_arrive(
    location: MetadataLocation, moto_url: str, stream_name: str
) -> None:
    """Attempts of one task (a retry and a speculative copy) read at once while the shard
    grows: each hands out exactly the recorded records or fails with BatchEndConflictError,
    and a later attempt reads exactly the recorded ones."""
    kinesis = make_stream(moto_url, stream_name, 1)
    shard_id = kinesis.list_shards(StreamName=stream_name)["Shards"][0]["ShardId"]
    put_records(kinesis, stream_name, [("k", f"first-{i}".encode()) for i in range(200)])
    run = new_run()
    prepared(location, run)
    partition = ShardPartition(
        ShardReadPlan(
            stream=stream_name,
            stream_label=stream_name,
            shard_id=shard_id,
            start=ShardPosition.trim_horizon(),
        ),
        AwsSettings(region="us-east-1", endpoint_url=moto_url),
        BatchSlot(location, run, 0),
    )
    writing = threading.Event()

    def keep_writing() -> None:
        for round_ in range(20):
            if writing.is_set():
                return
            put_records(
                kinesis, stream_name, [("k", f"more-{round_}-{i}".encode()) for i in range(25)]
            )

    def attempt(_index: int) -> object:
        return [
            bytes(d)
            for batch in read_partition(partition)
            for d in batch.column("data").to_pylist()
        ]

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        outcomes = in_threads(2, attempt)
    finally:
        writing.set()
        writer.join()
    retry = attempt(0)
    assert isinstance(retry, list)
    recorded = open_store(location, run).require(0, shard_id)
    assert recorded.rows == len(retry) >= 200
    for outcome in outcomes:
        assert isinstance(outcome, (list, BatchEndConflictError)), outcome
        if isinstance(outcome, list):
            assert outcome == retry
    assert any(isinstance(outcome, list) for outcome in outcomes)
