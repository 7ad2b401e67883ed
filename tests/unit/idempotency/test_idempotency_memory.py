"""The in-memory guard and the claim protocol: claim, complete, release, expiry, eviction."""

from __future__ import annotations

import json

import pytest

from shardflow.clock import ManualClock
from shardflow.errors import ClaimInProgressError
from shardflow.idempotency import (
    ClaimOutcome,
    IdempotencyGuard,
    InMemoryIdempotencyGuard,
    by_position,
    by_user_key,
    handle_once,
)
from shardflow.records import Record

CLAIMED, DONE, IN_PROGRESS = ClaimOutcome.CLAIMED, ClaimOutcome.DONE, ClaimOutcome.IN_PROGRESS


def guard(**options: object) -> tuple[InMemoryIdempotencyGuard, ManualClock]:
    clock = ManualClock()
    return InMemoryIdempotencyGuard(clock=clock, **options), clock  # type: ignore[arg-type]


async def test_a_key_is_claimed_once_then_done_after_complete() -> None:
    g, _ = guard()
    assert isinstance(g, IdempotencyGuard)
    first = await g.claim("k")
    assert first.outcome is CLAIMED
    assert first.token
    assert (await g.claim("k")).outcome is IN_PROGRESS
    await g.complete(first)
    assert (await g.claim("k")).outcome is DONE
    assert (await g.claim("other")).outcome is CLAIMED


async def test_a_failed_handler_releases_its_key_for_the_retry() -> None:
    g, _ = guard()
    first = await g.claim("k")
    assert await g.release(first)
    retry = await g.claim("k")
    assert retry.outcome is CLAIMED
    assert retry.token != first.token
    # The old claim cannot release the new one.
    assert not await g.release(first)
    assert (await g.claim("k")).outcome is IN_PROGRESS


async def test_an_abandoned_claim_expires_and_done_keys_expire_after_done_ttl() -> None:
    g, clock = guard(claim_ttl=30.0, done_ttl=100.0)
    abandoned = await g.claim("k")
    await clock.advance(29.9)
    assert (await g.claim("k")).outcome is IN_PROGRESS
    await clock.advance(0.2)
    taken_over = await g.claim("k")
    assert taken_over.outcome is CLAIMED
    assert not await g.release(abandoned)
    await g.complete(taken_over)
    await clock.advance(99.0)
    assert (await g.claim("k")).outcome is DONE
    await clock.advance(1.5)
    assert (await g.claim("k")).outcome is CLAIMED


async def test_least_recently_used_keys_are_evicted_first() -> None:
    g, _ = guard(max_entries=3)
    for key in "abc":
        await g.complete(await g.claim(key))
    assert (await g.claim("a")).outcome is DONE  # "a" is now the most recently used
    await g.complete(await g.claim("d"))  # evicts "b"
    assert len(g) == 3
    assert (await g.claim("b")).outcome is CLAIMED
    assert (await g.claim("a")).outcome is DONE


async def test_only_claimed_claims_complete_or_release() -> None:
    g, _ = guard()
    await g.claim("k")
    busy = await g.claim("k")
    with pytest.raises(ValueError, match="only a CLAIMED claim"):
        await g.complete(busy)
    with pytest.raises(ValueError, match="only a CLAIMED claim"):
        await g.release(busy)
    with pytest.raises(ValueError, match="max_entries"):
        InMemoryIdempotencyGuard(0)


async def test_handle_once_runs_skips_releases_and_refuses_in_progress() -> None:
    g, _ = guard()
    ran: list[str] = []

    async def work() -> None:
        ran.append("x")

    async def boom() -> None:
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        await handle_once(g, "k", boom)
    assert await handle_once(g, "k", work)  # the failure did not mark it done
    assert not await handle_once(g, "k", work)
    assert ran == ["x"]
    await g.claim("busy")
    with pytest.raises(ClaimInProgressError, match="busy"):
        await handle_once(g, "busy", work)


def test_key_functions() -> None:
    record = Record(
        data=b'{"id": "evt-9"}',
        partition_key="p",
        sequence_number="123",
        sub_sequence_number=2,
        shard_id="shardId-000000000004",
        stream_name="orders",
    )
    assert by_position(record) == "orders/shardId-000000000004/123/2"
    by_event = by_user_key(lambda r: json.loads(r.data)["id"], namespace="app1:")
    assert by_event(record) == "app1:evt-9"
    with pytest.raises(ValueError, match="123/2 of shard shardId-000000000004"):
        by_user_key(lambda r: "")(record)
