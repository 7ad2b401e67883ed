"""shardsPerTask's grouping, the side-by-side read of a task's shards, and the probe's kept
iterators (issue 21 item 6)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shardflow.errors import SparkOptionError
from shardflow.spark.source.options import parse_options, shards_per_task_for
from shardflow.spark.source.partition import tasks_of
from shardflow.spark.source.positions import ShardPosition
from shardflow.spark.source.probe import ITERATOR_KEPT_S, ProbeIterators
from shardflow.spark.source.side_by_side import Done, interleave


@pytest.mark.parametrize(
    ("count", "per_task", "sizes"),
    [(10, 4, [4, 3, 3]), (6, 4, [3, 3]), (8, 8, [8]), (3, 1, [1, 1, 1]), (256, 16, [16] * 16)],
)
def test_tasks_are_the_fewest_and_even(count: int, per_task: int, sizes: list[int]) -> None:
    tasks = tasks_of(list(range(count)), per_task)
    assert [len(t) for t in tasks] == sizes
    assert [item for task in tasks for item in task] == list(range(count))  # order kept


def test_auto_shards_per_task_makes_about_four_tasks_of_at_most_64_shards() -> None:
    assert [shards_per_task_for(n, None) for n in (1, 4, 5, 16, 17, 64, 256, 1000)] == [
        1,
        1,
        2,
        4,
        5,
        16,
        64,
        64,
    ]
    assert shards_per_task_for(256, 3) == 3


def test_shards_per_task_option() -> None:
    base = {"streamName": "s", "metadataPath": "/tmp/m"}
    assert parse_options(base, streaming=True).shards_per_task is None
    assert parse_options({**base, "shardsPerTask": "auto"}, streaming=True).shards_per_task is None
    assert parse_options({**base, "SHARDSPERTASK": " 12 "}, streaming=True).shards_per_task == 12
    for bad in ("0", "-1", "x", "1.5", "100000"):
        with pytest.raises(SparkOptionError, match="shardsPerTask"):
            parse_options({**base, "shardsPerTask": bad}, streaming=True)


async def _source(name: str, count: int, pause: float) -> AsyncIterator[str]:
    for i in range(count):
        await asyncio.sleep(pause)
        yield f"{name}{i}"


def test_interleave_keeps_each_source_in_order_and_marks_its_end() -> None:
    async def go() -> list[tuple[int, str | Done]]:
        sources = [_source("a", 5, 0.002), _source("b", 3, 0.001), _source("c", 0, 0.0)]
        return [item async for item in interleave(sources)]

    items = asyncio.run(go())
    for index, name, count in ((0, "a", 5), (1, "b", 3), (2, "c", 0)):
        mine = [chunk for i, chunk in items if i == index]
        assert mine[:-1] == [f"{name}{k}" for k in range(count)]
        assert isinstance(mine[-1], Done)  # the marker comes after the source's last chunk
    assert {i for i, _ in items[:4]} != {0}  # side by side, not one after the other


def test_interleave_raises_the_first_failure_and_stops_the_others() -> None:
    closed: list[str] = []

    async def failing() -> AsyncIterator[str]:
        yield "f0"
        raise RuntimeError("shard read failed")

    async def endless() -> AsyncIterator[str]:
        try:
            while True:
                await asyncio.sleep(0.001)
                yield "e"
        finally:
            closed.append("endless")

    async def go() -> None:
        async for _ in interleave([failing(), endless()]):
            pass

    with pytest.raises(RuntimeError, match="shard read failed"):
        asyncio.run(go())
    assert closed == ["endless"]


def test_probe_iterators_hold_for_the_same_position_and_not_too_long() -> None:
    now = [0.0]
    kept = ProbeIterators(clock=lambda: now[0])
    at, later = ShardPosition.after("10"), ShardPosition.after("11")
    kept.keep("s1", at, "it-1")
    assert kept.take("s1", later) is None  # the shard moved on: a new iterator
    kept.keep("s1", at, "it-1")
    assert kept.take("s1", at) == "it-1"
    assert kept.take("s1", at) is None  # taken once: the probe keeps the next one
    kept.keep("s1", at, "it-2")
    now[0] = ITERATOR_KEPT_S
    assert kept.take("s1", at) is None  # old enough for the service to refuse it
    kept.keep("s1", at, "it-3")
    kept.keep("s2", at, "it-4")
    kept.keep_only(["s2"])
    assert len(kept) == 1
    assert kept.take("s2", at) == "it-4"
