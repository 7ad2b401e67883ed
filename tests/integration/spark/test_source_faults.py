"""The source's driver side and its batch-end stores through a fault proxy in front of moto:
a Kinesis, S3 or DynamoDB brownout delays batches, it does not fail the query.

Found by ``bench/chaos_spark.py``: with the stores' SDK retries off (shardflow retries itself)
one S3 500 failed a task or, on the driver, the query; and planning a batch on the driver,
where Spark retries nothing, failed the query after a few seconds of Kinesis 500s.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardflow.aws.settings import AwsSettings
from shardflow.errors import AwsError
from shardflow.spark.source.metadata import ShardBatchEnd
from shardflow.spark.source.metadata_location import parse_location
from shardflow.spark.source.offsets import SourceOffset
from shardflow.spark.source.stores import open_store
from shardflow.spark.source.stream import ShardflowStreamReader
from shardflow.testing.faults import INTERNAL_FAILURE, THROTTLED, ErrorResponse, FaultProxy
from support.boto import boto_client, make_stream, put_records
from support.spark_source import stream_reader

pytestmark = pytest.mark.timeout(120)
SHARD = "shardId-000000000000"


@pytest.mark.parametrize("kind", ["s3", "dynamodb"])
def test_the_batch_end_store_retries_500s_and_throttling(moto_url: str, kind: str) -> None:
    name = f"sf-meta-{uuid.uuid4().hex[:12]}"
    if kind == "s3":
        boto_client("s3", moto_url).create_bucket(Bucket=name)
    with FaultProxy(moto_url, seed=3) as proxy:
        aws = AwsSettings(region="us-east-1", endpoint_url=proxy.url)
        where = f"s3://{name}/q" if kind == "s3" else f"dynamodb://{name}"
        store = open_store(parse_location(where, aws), uuid.uuid4().hex)
        store.prepare()
        service = None if kind == "s3" else "DynamoDB"  # S3 requests name no X-Amz-Target
        # Every call below meets errors first: the writes, then the read.
        proxy.add(ErrorResponse("InternalError", status=500), service=service, times=3)
        proxy.add(ErrorResponse("SlowDown", status=503), service=service, times=2)
        end = ShardBatchEnd(end="AFTER:42", rows=3, stopped="tip")
        assert store.record_first(0, SHARD, end) == end
        assert store.require(0, SHARD) == end
        proxy.wait_idle()
        assert len(proxy.injections) == 5


@dataclass
class Planning:
    """A one-shard stream behind a fault proxy, a source reading it, its initial offset taken
    before ``records`` were put."""

    proxy: FaultProxy
    source: ShardflowStreamReader
    start: dict[str, Any]


@contextmanager
def planning(
    moto_url: str, stream: str, meta: Path, *, seed: int, records: list[tuple[str, bytes]]
) -> Iterator[Planning]:
    kinesis = make_stream(moto_url, stream, 1)
    with FaultProxy(moto_url, seed=seed) as proxy:
        source = stream_reader(proxy.url, stream, meta)
        start = source.initialOffset()
        put_records(kinesis, stream, records)
        yield Planning(proxy, source, start)


def test_a_kinesis_brownout_while_planning_plans_no_batch_and_the_next_trigger_does(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    records = [("k", b"one"), ("k", b"two")]
    with planning(moto_url, stream_name, tmp_path / "meta", seed=5, records=records) as p:
        # Longer than the calls' own retries: every Kinesis call fails while it lasts.
        rule = p.proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500))
        limit = p.source.getDefaultReadLimit()
        assert p.source.latestOffset(p.start, limit) == p.start  # no batch this trigger
        assert p.proxy.injected_count(rule) >= 6
        p.proxy.remove(rule)
        planned = SourceOffset.from_dict(p.source.latestOffset(p.start, limit))
    assert planned.batch == 0
    assert SHARD in planned.read


def test_under_available_now_a_brownout_while_planning_fails_the_query(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    # AvailableNow ends when no batch is planned: riding the outage out would end it early.
    records = [("k", b"one")]
    with planning(moto_url, stream_name, tmp_path / "meta", seed=5, records=records) as p:
        p.source.prepareForTriggerAvailableNow()
        p.proxy.add(ErrorResponse(THROTTLED))
        with pytest.raises(AwsError):
            p.source.latestOffset(p.start, p.source.getDefaultReadLimit())


def test_a_restarted_driver_lists_the_shards_of_its_planned_batch_through_a_brownout(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    # A driver started again replays its last planned batch: partitions() with no listing
    # held. It cannot plan no batch instead, and Spark retries nothing on the driver: a 20 s
    # Kinesis brownout failed the query here (bench/chaos_spark.py).
    meta = tmp_path / "meta"
    with planning(moto_url, stream_name, meta, seed=7, records=[("k", b"one")]) as p:
        end = p.source.latestOffset(p.start, p.source.getDefaultReadLimit())
        again = stream_reader(p.proxy.url, stream_name, meta)  # no listing held
        # More failures than the listing's own retries allow, then the service answers.
        rule = p.proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500), operation="ListShards")
        timer = threading.Timer(4.0, p.proxy.remove, args=(rule,))
        timer.start()
        try:
            partitions = again.partitions(p.start, end)
        finally:
            timer.cancel()
        assert p.proxy.injected_count(rule) >= 6
    assert [plan.shard_id for part in partitions for plan in part.plans] == [SHARD]
