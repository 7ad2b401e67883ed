"""Enhanced fan-out against kinesis-local over HTTP: consumers, subscriptions, renewal, shard end.

kinesis-local sends an event every second per subscription, never sends the initial-response
botocore expects (the fetcher's tolerance is exercised by every test here), and never ends a
closed shard's subscription (the shard-end test uses the fetcher's closed-shard check).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import list_shards, wait_for_active
from shardflow.errors import ResourceNotFoundError
from shardflow.fetch import (
    ConsumerRegistration,
    FanOut,
    FanOutFetcher,
    FetchedBatch,
    SubscriptionPacer,
    deregister_consumer,
    fanout_client,
    register_consumer,
)
from shardflow.fetch.registration import describe_consumer
from shardflow.positions import StartPosition
from shardflow.shards import MAX_HASH_KEY
from support.streams import create_stream, put

#: Renewal, silence and retries scaled down so that tests take seconds.
FAST = FanOut(renew_after=120.0, event_timeout=8.0, read_timeout=10.0)


@asynccontextmanager
async def kinesis_at(url: str, shards: int = 0, settings: FanOut = FAST) -> AsyncIterator[Any]:
    factory = ClientFactory(AwsSettings(endpoint_url=url))
    async with fanout_client(factory, settings, shards=shards) as client:
        yield client


def fetcher_for(
    kinesis: Any,
    stream: str,
    shard_id: str,
    consumer_arn: str,
    settings: FanOut = FAST,
    pacer: SubscriptionPacer | None = None,
    closed_shard_check: float | None = None,
) -> FanOutFetcher:
    return FanOutFetcher(
        kinesis,
        stream,
        shard_id,
        StartPosition.trim_horizon(),
        settings,
        consumer_arn=consumer_arn,
        pacer=pacer or SubscriptionPacer(),
        closed_shard_check=closed_shard_check,
    )


async def read_until(
    fetcher: FanOutFetcher, wanted: set[str], *, limit: float
) -> tuple[list[str], list[FetchedBatch]]:
    """Sequence numbers in the order read, until every one of ``wanted`` was seen (or the end)."""
    seen: list[str] = []
    batches: list[FetchedBatch] = []
    deadline = time.monotonic() + limit
    async with fetcher:
        while not wanted <= set(seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{fetcher.shard_id}: missing {sorted(wanted - set(seen))}"
            batch = await asyncio.wait_for(anext(fetcher), remaining)
            batches.append(batch)
            seen += [r.sequence_number for r in batch.records]
            if batch.shard_ended:
                break
    return seen, batches


async def test_a_consumer_is_registered_reused_and_deregistered(
    kinesis_local_url: str, stream_name: str
) -> None:
    async with kinesis_at(kinesis_local_url) as kinesis:
        stream_arn = (await create_stream(kinesis, stream_name, 1))["StreamARN"]
        first = await register_consumer(kinesis, stream_name, "app")
        assert first.is_active
        assert first.stream_arn == stream_arn
        assert f"stream/{stream_name}/consumer/app" in first.arn
        again = await register_consumer(kinesis, stream_arn, "app")
        assert again.arn == first.arn

        async with ConsumerRegistration(
            kinesis, stream_name, "short-lived", deregister_on_exit=True
        ) as other:
            listed = await kinesis.list_stream_consumers(StreamARN=stream_arn)
            assert {c["ConsumerName"] for c in listed["Consumers"]} == {"app", "short-lived"}
        try:
            gone = await describe_consumer(kinesis, consumer_arn=other.arn)
            assert gone.status == "DELETING"
        except ResourceNotFoundError:
            pass

        await deregister_consumer(kinesis, first)
        with pytest.raises(ResourceNotFoundError):
            await describe_consumer(kinesis, consumer_arn=first.arn)
        await deregister_consumer(kinesis, first)  # already gone: fine


async def test_every_record_of_two_shards_arrives_once_in_order_including_later_ones(
    kinesis_local_url: str, stream_name: str
) -> None:
    async with kinesis_at(kinesis_local_url, shards=2) as kinesis:
        await create_stream(kinesis, stream_name, 2)
        placed = await put(kinesis, stream_name, [(f"key-{i}", b"early-%d" % i) for i in range(30)])
        consumer = await register_consumer(kinesis, stream_name, "reader")
        shard_ids = [s.shard_id for s in await list_shards(kinesis, stream_name)]
        pacer = SubscriptionPacer()
        fetchers = [
            fetcher_for(kinesis, stream_name, s, consumer.arn, pacer=pacer) for s in shard_ids
        ]
        first_batches = await asyncio.gather(*(anext(f) for f in fetchers))
        assert all(f.subscriptions == 1 for f in fetchers)
        # Written after both subscriptions are open: pushed on the same subscriptions.
        placed += await put(kinesis, stream_name, [(f"key-{i}", b"late-%d" % i) for i in range(30)])

        expected = {s: [seq for shard, seq in placed if shard == s] for s in shard_ids}
        assert all(expected.values()), "the keys should reach both shards"
        results = await asyncio.gather(
            *(
                read_until(
                    f,
                    set(expected[f.shard_id]) - {r.sequence_number for r in b.records},
                    limit=20.0,
                )
                for f, b in zip(fetchers, first_batches, strict=True)
            )
        )
        for fetcher, first, (seen, _) in zip(fetchers, first_batches, results, strict=True):
            got = [r.sequence_number for r in first.records] + seen
            assert got == expected[fetcher.shard_id]
            assert fetcher.subscriptions == 1
            assert fetcher.last_sequence_number == expected[fetcher.shard_id][-1]


async def test_renewals_lose_and_repeat_no_record(kinesis_local_url: str, stream_name: str) -> None:
    settings = FanOut(renew_after=2.0, event_timeout=8.0, read_timeout=10.0)
    async with kinesis_at(kinesis_local_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        consumer = await register_consumer(kinesis, stream_name, "renewer")
        (shard,) = await list_shards(kinesis, stream_name)
        fetcher = fetcher_for(kinesis, stream_name, shard.shard_id, consumer.arn, settings)

        async def write_until_renewed(renewals: int) -> list[str]:
            placed: list[str] = []
            for round_ in range(60):
                items = [(f"k{round_}-{i}", b"%d-%d" % (round_, i)) for i in range(3)]
                placed += [seq for _, seq in await put(kinesis, stream_name, items)]
                if fetcher.renewals >= renewals:
                    break
                await asyncio.sleep(0.5)
            return placed

        # Records keep arriving before, during and after each renewal.
        writer = asyncio.create_task(write_until_renewed(3))
        seen: list[str] = []
        deadline = time.monotonic() + 40.0
        async with fetcher:
            while not writer.done() or not set(writer.result()) <= set(seen):
                assert time.monotonic() < deadline, "records missing after 40 s"
                batch = await asyncio.wait_for(anext(fetcher), 15.0)
                seen += [r.sequence_number for r in batch.records]
        assert seen == writer.result()  # all of them, once each, in order
        assert fetcher.renewals >= 3
        assert len(set(seen)) > 3 * fetcher.renewals


async def test_a_caller_slower_than_the_read_timeout_reads_on_without_errors(
    kinesis_local_url: str, stream_name: str
) -> None:
    # The HTTP read timeout is shorter than the caller's pause: the connection must neither
    # time out nor be replaced (KCL's complaint: read timeouts with slow processors).
    settings = FanOut(renew_after=120.0, event_timeout=8.0, read_timeout=6.0)
    async with kinesis_at(kinesis_local_url, settings=settings) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        placed = [seq for _, seq in await put(kinesis, stream_name, [("a", b"1"), ("b", b"2")])]
        consumer = await register_consumer(kinesis, stream_name, "slow")
        (shard,) = await list_shards(kinesis, stream_name)
        fetcher = fetcher_for(kinesis, stream_name, shard.shard_id, consumer.arn, settings)
        first = await anext(fetcher)
        seen = [r.sequence_number for r in first.records]

        async def meanwhile() -> list[str]:
            await asyncio.sleep(2.0)
            return [seq for _, seq in await put(kinesis, stream_name, [("c", b"3"), ("d", b"4")])]

        writer = asyncio.create_task(meanwhile())
        await asyncio.sleep(9.0)  # a slow handler, busy with the first batch
        placed += await writer
        async with fetcher:
            for _ in range(30):
                if set(placed) <= set(seen):
                    break
                batch = await asyncio.wait_for(anext(fetcher), 5.0)
                seen += [r.sequence_number for r in batch.records]
        assert seen == placed
        assert fetcher.subscriptions == 1
        assert fetcher.renewals == 0


async def test_a_split_parent_ends_with_its_children(
    kinesis_local_url: str, stream_name: str
) -> None:
    settings = FanOut(renew_after=120.0, event_timeout=8.0, read_timeout=10.0)
    async with kinesis_at(kinesis_local_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        (parent,) = await list_shards(kinesis, stream_name)
        before = await put(kinesis, stream_name, [(f"key-{i}", b"before") for i in range(10)])
        await kinesis.split_shard(
            StreamName=stream_name,
            ShardToSplit=parent.shard_id,
            NewStartingHashKey=str(MAX_HASH_KEY // 2 + 1),
        )
        await wait_for_active(kinesis, stream_name)
        after = await put(kinesis, stream_name, [(f"key-{i}", b"after") for i in range(10)])
        assert {shard for shard, _ in after}.isdisjoint({parent.shard_id})
        children = sorted(
            s.shard_id
            for s in await list_shards(kinesis, stream_name)
            if parent.shard_id in s.parent_ids
        )
        assert len(children) == 2

        consumer = await register_consumer(kinesis, stream_name, "splitter")
        fetcher = fetcher_for(
            kinesis, stream_name, parent.shard_id, consumer.arn, settings, closed_shard_check=1.0
        )
        seen, batches = await read_until(fetcher, {"never-a-sequence-number"}, limit=15.0)
        assert seen == [seq for _, seq in before]
        assert batches[-1].shard_ended
        assert fetcher.ended
        assert sorted(c.shard_id for c in batches[-1].child_shards) == children
        assert all(c.parent_shard_ids == (parent.shard_id,) for c in batches[-1].child_shards)
        assert await anext(fetcher, None) is None


async def test_a_wrong_stream_fails_fast_with_a_typed_error(
    kinesis_local_url: str, stream_name: str
) -> None:
    async with kinesis_at(kinesis_local_url) as kinesis:
        started = time.monotonic()
        with pytest.raises(ResourceNotFoundError) as registering:
            await register_consumer(kinesis, stream_name, "app")
        assert registering.value.stream == stream_name
        # A consumer ARN of a stream that does not exist: refused by the subscription itself.
        missing = f"arn:aws:kinesis:us-east-1:000000000000:stream/{stream_name}/consumer/app:1"
        fetcher = fetcher_for(kinesis, stream_name, "shardId-000000000000", missing)
        with pytest.raises(ResourceNotFoundError) as subscribing:
            await anext(fetcher)
        assert subscribing.value.shard_id == "shardId-000000000000"
        assert subscribing.value.code == "ResourceNotFoundException"
        assert time.monotonic() - started < 5.0
