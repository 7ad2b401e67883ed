"""The stream reader against real emulators over HTTP: all shards, lineage, positions, follow."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from datetime import UTC, datetime

import pytest

from shardflow.aggregation import aggregate
from shardflow.aws import AwsSettings
from shardflow.aws.kinesis import list_shards, wait_for_active
from shardflow.errors import ResourceNotFoundError
from shardflow.fetch import Polling
from shardflow.positions import StartPosition
from shardflow.reader import read_all, read_stream
from shardflow.records import Record
from shardflow.testing.faults import FaultProxy
from support.streams import create_stream, kinesis_at, put

# Every test is bounded: a reader that never stops fails instead of hanging.
LIMIT = 30.0


def counted(phase: str, keys: int, per_key: int, first: int = 0) -> list[tuple[str, bytes]]:
    """Items whose payload names their key and their rank within it: ``k3:phase:7``."""
    return [
        (f"k{k}", f"k{k}:{phase}:{n}".encode())
        for n in range(first, first + per_key)
        for k in range(keys)
    ]


@pytest.fixture(params=["moto_url", "kinesalite_url"])
def emulator_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param)
    return url


async def test_reads_every_record_of_every_shard_once(emulator_url: str, stream_name: str) -> None:
    async with kinesis_at(emulator_url) as kinesis:
        await create_stream(kinesis, stream_name, 3)
        items = [(f"key-{i}", f"record-{i}".encode()) for i in range(400)]
        placed = await put(kinesis, stream_name, items)

        async with asyncio.timeout(LIMIT):
            records = await read_all(
                stream_name, kinesis=kinesis, polling=Polling(max_records=50, idle_time=0)
            )

    assert sorted(r.data for r in records) == sorted(d for _, d in items)
    by_shard: dict[str, list[str]] = defaultdict(list)
    for record in records:
        by_shard[record.shard_id].append(record.sequence_number)
    expected: dict[str, list[str]] = defaultdict(list)
    for shard_id, sequence_number in placed:
        expected[shard_id].append(sequence_number)
    assert by_shard == expected  # each shard in order
    assert len(by_shard) == 3


@pytest.mark.parametrize("url_fixture", ["kinesis_local_url", "kinesalite_url"])
async def test_a_resharded_stream_keeps_per_key_order_and_loses_nothing(
    url_fixture: str, stream_name: str, request: pytest.FixtureRequest
) -> None:
    # kinesis-local reports ChildShards at shard end; kinesalite does not (the reader lists).
    url: str = request.getfixturevalue(url_fixture)
    keys, per_phase = 8, 5
    async with kinesis_at(url) as kinesis:
        await create_stream(kinesis, stream_name, 2)
        written = counted("split", keys, per_phase)
        await put(kinesis, stream_name, written)
        first = (await list_shards(kinesis, stream_name))[0]
        middle = (first.hash_range.start + first.hash_range.end + 1) // 2
        await kinesis.split_shard(
            StreamName=stream_name, ShardToSplit=first.shard_id, NewStartingHashKey=str(middle)
        )
        await wait_for_active(kinesis, stream_name)
        phase2 = counted("merge", keys, per_phase, first=per_phase)
        await put(kinesis, stream_name, phase2)
        children = sorted(
            s.shard_id for s in await list_shards(kinesis, stream_name) if s.parent_ids
        )
        await kinesis.merge_shards(
            StreamName=stream_name, ShardToMerge=children[0], AdjacentShardToMerge=children[1]
        )
        await wait_for_active(kinesis, stream_name)
        phase3 = counted("end", keys, per_phase, first=2 * per_phase)
        await put(kinesis, stream_name, phase3)
        written += phase2 + phase3

        async with asyncio.timeout(LIMIT):
            records = await read_all(stream_name, kinesis=kinesis)
        shards = await list_shards(kinesis, stream_name)

    assert sorted(r.data for r in records) == sorted(d for _, d in written)  # all, once
    ranks: dict[str, list[int]] = defaultdict(list)
    for record in records:
        key, _, rank = record.data.decode().split(":")
        ranks[key].append(int(rank))
    assert ranks == {f"k{k}": list(range(3 * per_phase)) for k in range(keys)}  # in order
    assert len(shards) == 5  # 2 + split into 2 + merged into 1
    assert len({r.shard_id for r in records}) >= 4  # parents, children and grandchild were read


@pytest.mark.parametrize("follow", [False, True])
async def test_moto_closed_shards_that_never_end_still_lead_to_their_children(
    moto_url: str, stream_name: str, follow: bool
) -> None:
    # moto never ends a closed shard's iterator: the reader must see it is closed and drained.
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, counted("a", 4, 5))
        parent = (await list_shards(kinesis, stream_name))[0]
        middle = (parent.hash_range.start + parent.hash_range.end + 1) // 2
        await kinesis.split_shard(
            StreamName=stream_name, ShardToSplit=parent.shard_id, NewStartingHashKey=str(middle)
        )
        await wait_for_active(kinesis, stream_name)
        assert not (await list_shards(kinesis, stream_name))[0].is_open

    async with FaultProxy(moto_url) as proxy, kinesis_at(proxy.url) as kinesis:
        reader = read_stream(
            stream_name, kinesis=kinesis, follow=follow, polling=Polling(idle_time=0.05)
        )
        payloads: list[bytes] = []

        async def collect() -> None:
            async for record in reader:
                payloads.append(record.data)

        async with contextlib.aclosing(reader), asyncio.timeout(LIMIT):
            collecting = asyncio.create_task(collect())
            if follow:
                # Following never ends: wait until the two children got their iterators.
                for _ in range(1000):
                    if proxy.forwarded("GetShardIterator") >= 3 and len(payloads) == 20:
                        break
                    await asyncio.sleep(0.02)
                collecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collecting  # without follow: ends by itself once all shards are done
        assert proxy.forwarded("GetShardIterator") == 3

    # moto moves a split shard's records around; what matters: nothing lost or repeated.
    assert sorted(payloads) == sorted(d for _, d in counted("a", 4, 5))


async def test_at_timestamp_reads_only_later_records_of_all_shards(
    moto_url: str, stream_name: str
) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 2)
        await put(kinesis, stream_name, counted("old", 6, 3))
        await asyncio.sleep(0.3)
        moment = datetime.now(UTC)
        await asyncio.sleep(0.3)
        new = counted("new", 6, 3)
        await put(kinesis, stream_name, new)

        async with asyncio.timeout(LIMIT):
            records = await read_all(
                stream_name, kinesis=kinesis, start=StartPosition.at_timestamp(moment)
            )

    assert sorted(r.data for r in records) == sorted(d for _, d in new)
    assert len({r.shard_id for r in records}) == 2


async def test_following_from_latest_gets_new_records_only(moto_url: str, stream_name: str) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 2)
        await put(kinesis, stream_name, counted("old", 6, 2))

    new = counted("new", 6, 2)
    async with FaultProxy(moto_url) as proxy, kinesis_at(proxy.url) as kinesis:
        reader = read_stream(
            stream_name,
            kinesis=kinesis,
            start=StartPosition.latest(),
            follow=True,
            polling=Polling(idle_time=0.05),
        )
        got: list[Record] = []

        async def collect() -> None:
            async for record in reader:
                got.append(record)
                if len(got) == len(new):
                    return

        async with contextlib.aclosing(reader), asyncio.timeout(LIMIT):
            collecting = asyncio.create_task(collect())
            # Both shards hold a LATEST iterator once each has polled: then write.
            for _ in range(1000):
                if proxy.forwarded("GetRecords") >= 2:
                    break
                await asyncio.sleep(0.02)
            await put(kinesis, stream_name, new)
            await collecting

    assert sorted(r.data for r in got) == sorted(d for _, d in new)


async def test_aggregated_records_are_unpacked_unless_asked_not_to(
    moto_url: str, stream_name: str
) -> None:
    users = [(f"user-{i}", f"event-{i}".encode(), None) for i in range(5)]
    (packed,) = aggregate(users)
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, [(packed.partition_key, packed.data), ("plain", b"alone")])

        async with asyncio.timeout(LIMIT):
            unpacked = await read_all(stream_name, kinesis=kinesis)
            raw = await read_all(stream_name, kinesis=kinesis, deaggregate=False)

    assert [(r.partition_key, r.data) for r in unpacked] == [
        *((k, d) for k, d, _ in users),
        ("plain", b"alone"),
    ]
    assert [r.sub_sequence_number for r in unpacked[:5]] == [0, 1, 2, 3, 4]
    assert all(r.aggregated for r in unpacked[:5])
    assert not unpacked[5].aggregated
    assert [r.data for r in raw] == [packed.data, b"alone"]


async def test_read_all_stops_at_the_limit(moto_url: str, stream_name: str) -> None:
    async with kinesis_at(moto_url) as kinesis:
        await create_stream(kinesis, stream_name, 2)
        await put(kinesis, stream_name, counted("x", 5, 4))
        async with asyncio.timeout(LIMIT):
            records = await read_all(stream_name, kinesis=kinesis, limit=7)
    assert len(records) == 7


async def test_a_missing_stream_is_reported_as_not_found(moto_url: str, stream_name: str) -> None:
    with pytest.raises(ResourceNotFoundError):
        await read_all(stream_name, aws=AwsSettings(endpoint_url=moto_url))


async def test_sequence_positions_are_refused_for_a_whole_stream(stream_name: str) -> None:
    with pytest.raises(ValueError, match="one shard"):
        await read_all(stream_name, start=StartPosition.after_sequence_number("1"))


@pytest.mark.parametrize("url_fixture", ["kinesis_local_url", "kinesalite_url"])
async def test_following_crosses_a_split_made_while_reading(
    url_fixture: str, stream_name: str, request: pytest.FixtureRequest
) -> None:
    url: str = request.getfixturevalue(url_fixture)
    before, after = counted("before", 6, 3), counted("after", 6, 3, first=3)
    async with kinesis_at(url) as kinesis:
        await create_stream(kinesis, stream_name, 1)
        await put(kinesis, stream_name, before)
        reader = read_stream(
            stream_name, kinesis=kinesis, follow=True, polling=Polling(idle_time=0.05)
        )
        got: list[Record] = []
        async with contextlib.aclosing(reader), asyncio.timeout(LIMIT):
            async for record in reader:
                got.append(record)
                if len(got) == len(before):
                    break
            parent = (await list_shards(kinesis, stream_name))[0]
            middle = (parent.hash_range.start + parent.hash_range.end + 1) // 2
            await kinesis.split_shard(
                StreamName=stream_name, ShardToSplit=parent.shard_id, NewStartingHashKey=str(middle)
            )
            await wait_for_active(kinesis, stream_name)
            await put(kinesis, stream_name, after)
            async for record in reader:
                got.append(record)
                if len(got) == len(before) + len(after):
                    break

    ranks: dict[str, list[int]] = defaultdict(list)
    for record in got:
        key, _, rank = record.data.decode().split(":")
        ranks[key].append(int(rank))
    assert ranks == {f"k{k}": list(range(6)) for k in range(6)}
    assert {r.shard_id for r in got[len(before) :]}.isdisjoint({parent.shard_id})
