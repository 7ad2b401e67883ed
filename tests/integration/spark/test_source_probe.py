"""The driver's probes under Trigger.AvailableNow (issue 21 item 6): a busy stream's first plan
probes a sample of its shards and reads them all, and the trigger that ends the run asks
Kinesis nothing about shards this run already read to the tip or found caught up. Kinesalite
behind a FaultProxy counts what reached it; the tasks run in this process (``read``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardflow.spark.source.offsets import SourceOffset
from shardflow.spark.source.probe import SAMPLE_SHARDS
from shardflow.spark.source.stream import ShardflowStreamReader
from shardflow.testing.faults import FaultProxy
from support.boto import make_stream
from support.spark_source import stream_reader

pytestmark = pytest.mark.timeout(120)

SHARDS = SAMPLE_SHARDS + 8


def put_into(
    kinesis: Any, stream: str, shard_numbers: list[int], per_shard: int, tag: str
) -> set[bytes]:
    """``per_shard`` records into each named shard (by explicit hash key); their data."""
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    records = [
        {
            "PartitionKey": "k",
            "ExplicitHashKey": shards[n]["HashKeyRange"]["StartingHashKey"],
            "Data": f"{tag}-{n}-{i}".encode(),
        }
        for n in shard_numbers
        for i in range(per_shard)
    ]
    answer = kinesis.put_records(StreamName=stream, Records=records)
    assert answer.get("FailedRecordCount", 0) == 0
    assert {r["ShardId"] for r in answer["Records"]} == {
        shards[n]["ShardId"] for n in shard_numbers
    }
    return {r["Data"] for r in records}


def calls(proxy: FaultProxy) -> tuple[int, int]:
    return proxy.forwarded("GetShardIterator"), proxy.forwarded("GetRecords")


def run_batch(
    source: ShardflowStreamReader, start: dict[str, Any], end: dict[str, Any]
) -> list[bytes]:
    """The batch's tasks, one after the other in this process; the data of its rows."""
    data: list[bytes] = []
    for partition in source.partitions(start, end):
        for batch in source.read(partition):
            data += batch.column("data").to_pylist()
    source.commit(end)
    return data


@pytest.mark.parametrize("row_limit", [None, "100000"])
def test_a_busy_stream_is_sampled_and_the_last_trigger_asks_kinesis_nothing(
    kinesalite_url: str, stream_name: str, tmp_path: Path, row_limit: str | None
) -> None:
    kinesis = make_stream(kinesalite_url, stream_name, SHARDS)
    written = put_into(kinesis, stream_name, list(range(SHARDS)), 5, "busy")
    options = {} if row_limit is None else {"maxRecordsPerTrigger": row_limit}
    with FaultProxy(kinesalite_url) as proxy:
        source = stream_reader(proxy.url, stream_name, tmp_path / "meta", **options)
        start = source.initialOffset()
        source.prepareForTriggerAvailableNow()
        before = calls(proxy)
        end = source.latestOffset(start, source.getDefaultReadLimit())
        iterators = calls(proxy)[0] - before[0]
        planned = SourceOffset.from_dict(end)
        assert len(planned.read) == SHARDS  # every shard read in the one batch
        # No row limit: half the sample has records, the rest is read unprobed. A row limit
        # is shared among the shards read, so there every shard is probed.
        assert iterators == (SAMPLE_SHARDS if row_limit is None else SHARDS)
        data = run_batch(source, start, end)
        assert sorted(data) == sorted(written)
        written_late = put_into(kinesis, stream_name, [0, SHARDS - 1], 2, "late")
        before = calls(proxy)
        # Every shard was read to its tip after the run's cutoff: nothing more to plan, and
        # the late records arrived after the cutoff (the next run's).
        assert source.latestOffset(end, source.getDefaultReadLimit()) == end
        assert calls(proxy) == before
    # A new run (its own cutoff) probes again and finds the late records.
    again = stream_reader(kinesalite_url, stream_name, tmp_path / "meta", **options)
    again.prepareForTriggerAvailableNow()
    following = again.latestOffset(end, again.getDefaultReadLimit())
    assert following != end
    assert sorted(run_batch(again, end, following)) == sorted(written_late)


def test_a_sparse_stream_is_probed_whole_and_only_shards_with_records_are_read(
    kinesalite_url: str, stream_name: str, tmp_path: Path
) -> None:
    kinesis = make_stream(kinesalite_url, stream_name, SHARDS)
    written = put_into(kinesis, stream_name, [3, SHARDS - 2], 4, "sparse")
    with FaultProxy(kinesalite_url) as proxy:
        source = stream_reader(proxy.url, stream_name, tmp_path / "meta")
        start = source.initialOffset()
        source.prepareForTriggerAvailableNow()
        end = source.latestOffset(start, source.getDefaultReadLimit())
        planned = SourceOffset.from_dict(end)
        assert sorted(planned.read) == sorted({f"shardId-{n:012d}" for n in (3, SHARDS - 2)})
        assert calls(proxy)[0] == SHARDS
        assert sorted(run_batch(source, start, end)) == sorted(written)
        before = calls(proxy)
        # The shards read went to their tip, the others were found caught up: no call.
        assert source.latestOffset(end, source.getDefaultReadLimit()) == end
        assert calls(proxy) == before
