"""The polling fetcher against real emulators over HTTP (moto, kinesalite, kinesis-local)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from shardflow.aws import Backoff
from shardflow.aws.kinesis import list_shards, wait_for_active
from shardflow.errors import ResourceNotFoundError
from shardflow.fetch import FetchedBatch, Polling, PollingFetcher
from shardflow.positions import StartPosition
from shardflow.shards import partition_key_hash
from shardflow.testing.faults import THROTTLED, ErrorResponse, FaultProxy
from support.streams import create_stream, kinesis_at, put

FAST = Polling(idle_time=0.05)


async def drain(fetcher: PollingFetcher, *, max_batches: int = 200) -> list[FetchedBatch]:
    """Batches until the shard is caught up (included)."""
    batches = []
    for _ in range(max_batches):
        batch = await anext(fetcher)
        batches.append(batch)
        if batch.caught_up:
            return batches
    raise AssertionError(f"{fetcher.shard_id} not caught up after {max_batches} batches")


async def until_end(fetcher: PollingFetcher, *, max_batches: int = 200) -> list[FetchedBatch]:
    """Every batch up to the shard-end batch, after which the fetcher stops by itself."""
    batches = []
    for _ in range(max_batches):
        batch = await anext(fetcher, None)
        if batch is None:
            return batches
        batches.append(batch)
    raise AssertionError(f"{fetcher.shard_id} did not end after {max_batches} batches")


def data_of(batches: list[FetchedBatch]) -> list[bytes]:
    return [r.data for b in batches for r in b.records]


@pytest.fixture(params=["moto_url", "kinesalite_url"])
def emulator_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param)
    return url


async def test_fetchers_read_every_shard_in_sequence_order(
    emulator_url: str, stream_name: str
) -> None:
    async with kinesis_at(emulator_url) as kinesis:
        await create_stream(kinesis, stream_name, 3)
        items = [(f"key-{i}", f"record-{i}".encode()) for i in range(300)]
        placed = await put(kinesis, stream_name, items)
        shards = await list_shards(kinesis, stream_name)
        settings = Polling(max_records=40, idle_time=0.05)

        read: dict[str, list[tuple[str, bytes]]] = {}
        for shard in shards:
            fetcher = PollingFetcher(kinesis, stream_name, shard.shard_id, None, settings)
            batches = await drain(fetcher)
            read[shard.shard_id] = [(r.sequence_number, r.data) for b in batches for r in b.records]
            assert all(r.shard_id == shard.shard_id for b in batches for r in b.records)

    expected: dict[str, list[tuple[str, bytes]]] = {s.shard_id: [] for s in shards}
    for (shard_id, sequence_number), (_, data) in zip(placed, items, strict=True):
        expected[shard_id].append((sequence_number, data))
    assert read == expected
    assert sum(1 for v in read.values() if v) == 3  # the keys really spread over the shards


async def test_at_timestamp_starts_with_the_first_record_after_the_moment(
    emulator_url: str, stream_name: str
) -> None:
    async with kinesis_at(emulator_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, [("k", f"before-{i}".encode()) for i in range(5)])
        await asyncio.sleep(0.3)
        moment = datetime.now(UTC)
        await asyncio.sleep(0.3)
        await put(kinesis, stream_name, [("k", f"after-{i}".encode()) for i in range(5)])
        shard_id = (await list_shards(kinesis, stream_name))[0].shard_id

        fetcher = PollingFetcher(
            kinesis, stream_name, shard_id, StartPosition.at_timestamp(moment), FAST
        )
        batches = await drain(fetcher)

    assert data_of(batches) == [f"after-{i}".encode() for i in range(5)]
    first_arrival = batches[0].records[0].approximate_arrival_timestamp
    assert first_arrival is not None
    assert first_arrival >= moment.replace(microsecond=0)


async def test_latest_sees_only_records_written_after_the_first_poll(
    emulator_url: str, stream_name: str
) -> None:
    async with kinesis_at(emulator_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, [("k", b"old-1"), ("k", b"old-2")])
        shard_id = (await list_shards(kinesis, stream_name))[0].shard_id
        fetcher = PollingFetcher(kinesis, stream_name, shard_id, StartPosition.latest(), FAST)

        first = await anext(fetcher)  # takes the LATEST iterator
        await put(kinesis, stream_name, [("k", b"new-1"), ("k", b"new-2")])
        later = [first, *await drain(fetcher)]
        if not data_of(later):  # the records may show up one poll later
            later += await drain(fetcher)

    assert data_of(later) == [b"new-1", b"new-2"]


async def test_sequence_positions_start_at_or_after_a_record(
    emulator_url: str, stream_name: str
) -> None:
    async with kinesis_at(emulator_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        placed = await put(kinesis, stream_name, [("k", f"r{i}".encode()) for i in range(10)])
        shard_id, fourth = placed[3]

        after = PollingFetcher(
            kinesis, stream_name, shard_id, StartPosition.after_sequence_number(fourth), FAST
        )
        at = PollingFetcher(
            kinesis, stream_name, shard_id, StartPosition.at_sequence_number(fourth), FAST
        )
        after_data = data_of(await drain(after))
        at_data = data_of(await drain(at))

    assert after_data == [f"r{i}".encode() for i in range(4, 10)]
    assert at_data == [f"r{i}".encode() for i in range(3, 10)]


async def test_an_expired_iterator_is_renewed_without_loss_or_repeat(
    moto_url: str, stream_name: str
) -> None:
    # Emulators do not expire iterators within a test's time: the proxy answers one GetRecords
    # with the genuine ExpiredIteratorException instead.
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, [("k", f"r{i}".encode()) for i in range(10)])
        shard_id = (await list_shards(kinesis, stream_name))[0].shard_id

    async with FaultProxy(moto_url) as proxy, kinesis_at(proxy.url) as kinesis:
        proxy.add(
            ErrorResponse("ExpiredIteratorException"), operation="GetRecords", skip=1, times=1
        )
        fetcher = PollingFetcher(
            kinesis, stream_name, shard_id, None, Polling(max_records=4, idle_time=0.05)
        )
        batches = await drain(fetcher)

        assert data_of(batches) == [f"r{i}".encode() for i in range(10)]
        assert len(proxy.injected(kind="error", operation="GetRecords")) == 1
        assert proxy.forwarded("GetShardIterator") == 2


async def test_throttled_reads_are_retried_until_they_pass(moto_url: str, stream_name: str) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, [("k", f"r{i}".encode()) for i in range(6)])
        shard_id = (await list_shards(kinesis, stream_name))[0].shard_id

    settings = Polling(idle_time=0.05, throttle_backoff=Backoff(base=0.02, max_attempts=5))
    async with FaultProxy(moto_url) as proxy, kinesis_at(proxy.url) as kinesis:
        proxy.add(ErrorResponse(THROTTLED), operation="GetRecords", times=3)
        batches = await drain(PollingFetcher(kinesis, stream_name, shard_id, None, settings))

        assert data_of(batches) == [f"r{i}".encode() for i in range(6)]
        assert len(proxy.injected(kind="error", operation="GetRecords")) == 3


async def test_a_missing_stream_is_reported_as_not_found(moto_url: str, stream_name: str) -> None:
    async with kinesis_at(moto_url) as kinesis:
        fetcher = PollingFetcher(kinesis, stream_name, "shardId-000000000000", None, FAST)
        with pytest.raises(ResourceNotFoundError) as raised:
            await anext(fetcher)
    assert raised.value.shard_id == "shardId-000000000000"


async def split_in_the_middle(kinesis: Any, stream: str, shard_id: str) -> None:
    shard = next(s for s in await list_shards(kinesis, stream) if s.shard_id == shard_id)
    middle = (shard.hash_range.start + shard.hash_range.end + 1) // 2
    await kinesis.split_shard(
        StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str(middle)
    )
    await wait_for_active(kinesis, stream)


async def test_a_split_parent_ends_with_its_children_then_the_children_hold_the_rest(
    kinesis_local_url: str, stream_name: str
) -> None:
    async with kinesis_at(kinesis_local_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        before = [(f"key-{i}", f"before-{i}".encode()) for i in range(20)]
        after = [(f"key-{i}", f"after-{i}".encode()) for i in range(20)]
        await put(kinesis, stream_name, before)
        parent_id = (await list_shards(kinesis, stream_name))[0].shard_id
        await split_in_the_middle(kinesis, stream_name, parent_id)
        await put(kinesis, stream_name, after)

        parent = PollingFetcher(kinesis, stream_name, parent_id, None, FAST)
        parent_batches = await until_end(parent)
        last = parent_batches[-1]
        children: dict[str, list[tuple[str, bytes]]] = {}
        for child in last.child_shards:
            fetcher = PollingFetcher(kinesis, stream_name, child.shard_id, None, FAST)
            batches = await drain(fetcher)
            children[child.shard_id] = [
                (r.partition_key, r.data) for b in batches for r in b.records
            ]

    assert data_of(parent_batches) == [d for _, d in before]
    assert last.shard_ended
    assert not any(b.shard_ended for b in parent_batches[:-1])
    assert len(last.child_shards) == 2
    assert all(c.parent_shard_ids == (parent_id,) for c in last.child_shards)
    assert sorted(d for records in children.values() for _, d in records) == sorted(
        d for _, d in after
    )
    for child in last.child_shards:
        assert child.hash_range is not None
        assert all(partition_key_hash(k) in child.hash_range for k, _ in children[child.shard_id])


async def test_kinesalite_ends_a_split_parent_without_naming_children(
    kinesalite_url: str, stream_name: str
) -> None:
    async with kinesis_at(kinesalite_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, [(f"key-{i}", f"r{i}".encode()) for i in range(8)])
        parent_id = (await list_shards(kinesis, stream_name))[0].shard_id
        await split_in_the_middle(kinesis, stream_name, parent_id)

        batches = await until_end(PollingFetcher(kinesis, stream_name, parent_id, None, FAST))

    assert data_of(batches) == [f"r{i}".encode() for i in range(8)]
    assert batches[-1].shard_ended
    assert batches[-1].child_shards == ()
