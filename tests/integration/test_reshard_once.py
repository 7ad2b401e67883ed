"""A record put once is handled once across a split, with aggregation on (kinesis-local for
Kinesis, moto for the leases).

After a split the producer's shard map is stale: an aggregate meant for the parent lands on one
child, and those of its user records whose hash keys belong to the other child are put again
there (the KCL drops such out-of-range sub-records; the re-send is what keeps KCL consumers from
losing them). shardflow's consumer delivers out-of-range sub-records by default (other
aggregators never re-send), but skips them in aggregates that carry shardflow's re-send mark,
so neither a loss nor a second handling happens.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from integration.consumer.test_consumer_resharding import consuming
from shardflow.aws import AwsSettings
from shardflow.aws.kinesis import list_shards
from shardflow.consumer import ConsumedRecord
from shardflow.producer import Producer
from support.resend import STALE_MAP, wave
from support.streams import create_stream, kinesis_at, split_in_half
from support.waiting import until


@pytest.mark.timeout(180)
async def test_out_of_range_records_resent_after_a_split_are_handled_once(
    kinesis_local_url: str, moto_url: str, stream_name: str
) -> None:
    handled: Counter[bytes] = Counter()

    def handle(record: ConsumedRecord[bytes]) -> None:
        handled[record.data] += 1

    written: list[bytes] = []
    aws = AwsSettings(endpoint_url=kinesis_local_url)
    async with kinesis_at(kinesis_local_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        async with (
            Producer(stream_name, settings=STALE_MAP, aws=aws) as producer,
            consuming(kinesis_local_url, moto_url, stream_name, handle) as (consumer, _, _),
        ):
            written.extend(data for _, data in await wave(producer, "before"))
            (parent,) = await list_shards(kinesis, stream_name)
            await split_in_half(kinesis, stream_name, parent)
            # The producer still predicts the parent: its aggregates land on one child, half of
            # their user records out of that child's range; those go out again.
            written.extend(data for _, data in await wave(producer, "after"))
            assert producer.metrics().retries > 0  # the out-of-range records were sent again
            await until(lambda: set(handled) >= set(written), 90)
            await asyncio.sleep(1.0)  # a second handling would show up by now
            dropped = consumer.metrics().streams[stream_name].out_of_range_dropped
    assert handled == Counter(written)  # every record once
    assert dropped > 0  # the out-of-range copies were there, and skipped
