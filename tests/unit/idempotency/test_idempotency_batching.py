"""The coalescer behind the batched DynamoDB guard: batch sizes, distinct keys, resends."""

from __future__ import annotations

import asyncio

import pytest

from shardflow.idempotency.batching import Coalescer, Pending


async def test_concurrent_requests_share_batches_of_distinct_keys_up_to_the_limit() -> None:
    batches: list[list[str]] = []

    async def send(batch: list[Pending]) -> list[Pending]:
        batches.append([p.key for p in batch])
        for p in batch:
            p.answer(p.key.upper())
        return []

    coalescer = Coalescer(send, limit=4, window=0.01)
    keys = ["a", "b", "a", "c", "d", "e", "f"]
    answers = await asyncio.gather(*(coalescer.submit(k, f"t{i}") for i, k in enumerate(keys)))
    assert answers == [k.upper() for k in keys]
    assert all(len(b) <= 4 and len(set(b)) == len(b) for b in batches)
    assert sorted(k for b in batches for k in b) == sorted(keys)
    assert len(batches) == 2


async def test_requests_sent_back_go_out_again_and_errors_reach_every_caller() -> None:
    rounds: list[int] = []

    async def send(batch: list[Pending]) -> list[Pending]:
        rounds.append(len(batch))
        again = []
        for p in batch:
            if p.key == "retry" and p.rounds == 0:
                p.rounds += 1
                again.append(p)
            else:
                p.answer(p.rounds)
        return again

    coalescer = Coalescer(send, limit=10, window=0.0)
    assert await asyncio.gather(coalescer.submit("x", "1"), coalescer.submit("retry", "2")) == [
        0,
        1,
    ]
    assert rounds == [2, 1]

    async def failing(batch: list[Pending]) -> list[Pending]:
        raise RuntimeError("table gone")

    broken = Coalescer(failing, limit=10, window=0.0)
    results = await asyncio.gather(
        broken.submit("a", "1"), broken.submit("b", "2"), return_exceptions=True
    )
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    with pytest.raises(RuntimeError, match="table gone"):
        await broken.submit("c", "3")
