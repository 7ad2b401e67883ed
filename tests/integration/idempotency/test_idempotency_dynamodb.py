"""The DynamoDB idempotency guard on moto's server: races, TTL by condition, failed handlers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.clock import ManualClock
from shardflow.errors import ClaimInProgressError
from shardflow.idempotency import ClaimOutcome, DynamoDBIdempotencyGuard, handle_once
from shardflow.testing.faults import ErrorResponse, FaultProxy

CLAIMED, DONE, IN_PROGRESS = ClaimOutcome.CLAIMED, ClaimOutcome.DONE, ClaimOutcome.IN_PROGRESS


@pytest.fixture
def table() -> str:
    return f"sf-idem-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def guards(
    moto_url: str, table: str, clock: ManualClock
) -> AsyncIterator[list[DynamoDBIdempotencyGuard]]:
    """Four guards on one table, each with its own client (as four workers)."""
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url))
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                DynamoDBIdempotencyGuard.connect(
                    factory, table, clock=clock, claim_ttl=30.0, done_ttl=600.0
                )
            )
            for _ in range(4)
        ]


async def test_table_is_created_pay_per_request_with_ttl_on(
    guards: list[DynamoDBIdempotencyGuard], moto_url: str, table: str
) -> None:
    async with ClientFactory(AwsSettings(endpoint_url=moto_url)).dynamodb() as dynamodb:
        described = (await dynamodb.describe_table(TableName=table))["Table"]
        ttl = (await dynamodb.describe_time_to_live(TableName=table))["TimeToLiveDescription"]
    assert described["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
    assert described["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "ttl"}
    # Making it ready again is harmless.
    assert await guards[1].ensure_table() is False


async def test_concurrent_claims_of_one_key_have_exactly_one_winner(
    guards: list[DynamoDBIdempotencyGuard],
) -> None:
    for round_ in range(5):
        key = f"order-{round_}"
        claims = await asyncio.gather(*(g.claim(key) for g in guards for _ in range(3)))
        outcomes = [c.outcome for c in claims]
        assert outcomes.count(CLAIMED) == 1, outcomes
        assert outcomes.count(IN_PROGRESS) == len(claims) - 1
        winner = next(c for c in claims if c.claimed)
        owner = guards[claims.index(winner) // 3]
        await owner.complete(winner)
        again = await asyncio.gather(*(g.claim(key) for g in guards))
        assert [c.outcome for c in again] == [DONE] * len(guards)


async def test_expired_items_count_as_absent_though_moto_keeps_them(
    guards: list[DynamoDBIdempotencyGuard], clock: ManualClock, moto_url: str, table: str
) -> None:
    first, second = guards[0], guards[1]
    abandoned = await first.claim("k")  # its worker "dies": no complete, no release
    await clock.advance(29.0)
    assert (await second.claim("k")).outcome is IN_PROGRESS
    await clock.advance(2.0)
    taken_over = await second.claim("k")
    assert taken_over.outcome is CLAIMED
    assert not await first.release(abandoned)  # cannot drop the new owner's claim
    await second.complete(taken_over)
    await clock.advance(599.0)
    assert (await first.claim("k")).outcome is DONE
    await clock.advance(2.0)
    # The done item is still stored (moto never deletes by TTL) but has expired.
    async with ClientFactory(AwsSettings(endpoint_url=moto_url)).dynamodb() as dynamodb:
        item = (await dynamodb.get_item(TableName=table, Key={"key": {"S": "k"}}))["Item"]
    assert item["state"] == {"S": "done"}
    assert (await first.claim("k")).outcome is CLAIMED


async def test_a_failed_handler_does_not_make_its_record_skipped(
    guards: list[DynamoDBIdempotencyGuard],
) -> None:
    guard = guards[0]
    calls: list[int] = []

    async def failing() -> None:
        calls.append(1)
        raise ValueError("handler failed")

    async def working() -> None:
        calls.append(2)

    with pytest.raises(ValueError, match="handler failed"):
        await handle_once(guard, "evt-1", failing)
    # Another worker (after a failover) sees the key free and handles it, once.
    assert await handle_once(guards[2], "evt-1", working)
    assert not await handle_once(guards[3], "evt-1", working)
    assert calls == [1, 2]
    # A live claim elsewhere: the record is not handled and not skippable.
    await guards[1].claim("evt-2")
    with pytest.raises(ClaimInProgressError):
        await handle_once(guard, "evt-2", working)


async def test_a_claim_whose_answer_was_lost_is_still_ours(
    moto_url: str, table: str, clock: ManualClock
) -> None:
    async with FaultProxy(moto_url) as proxy:
        factory = ClientFactory(AwsSettings(endpoint_url=proxy.url, sdk_max_attempts=1))
        async with DynamoDBIdempotencyGuard.connect(factory, table, clock=clock) as guard:
            proxy.add(
                ErrorResponse("InternalServerError", after_forwarding=True),
                service="DynamoDB",
                operation="PutItem",
                times=1,
            )
            claim = await guard.claim("k")
            await proxy.idle()
            assert proxy.injected(operation="PutItem")
            assert claim.outcome is CLAIMED
            assert (await guard.claim("k")).outcome is IN_PROGRESS


# --- batched claims and completions (batch=True) ---------------------------------------------


async def test_batched_claims_travel_in_transactions_and_answer_like_single_ones(
    moto_url: str, table: str, clock: ManualClock
) -> None:
    async with FaultProxy(moto_url) as proxy:
        factory = ClientFactory(AwsSettings(endpoint_url=proxy.url))
        async with (
            DynamoDBIdempotencyGuard.connect(factory, table, clock=clock) as single,
            DynamoDBIdempotencyGuard.connect(
                factory, table, clock=clock, create=False, batch=True
            ) as batched,
        ):
            done = await single.claim("done-0")
            await single.complete(done)
            held = await single.claim("held-0")
            # 250 keys at once, among them one done and one claimed elsewhere: the cancelled
            # transactions answer those two and send the others again.
            keys = ["done-0", "held-0", *(f"free-{i}" for i in range(248))]
            claims = await asyncio.gather(*(batched.claim(k) for k in keys))
            outcomes = {c.key: c.outcome for c in claims}
            assert outcomes.pop("done-0") is DONE
            assert outcomes.pop("held-0") is IN_PROGRESS
            assert set(outcomes.values()) == {CLAIMED}
            # Three transactions of at most 100, plus the resends of a cancelled one's others.
            transactions = proxy.forwarded("TransactWriteItems")
            assert 3 <= transactions <= 6
            assert proxy.forwarded("PutItem") == 3  # the single guard: claim, complete, claim
            await asyncio.gather(*(batched.complete(c) for c in claims if c.claimed))
            assert proxy.forwarded("BatchWriteItem") == 10  # 248 completions, 25 a request
            # Batches and transactions are counted against their table.
            assert proxy.forwarded_to(table) >= 3 + transactions + 10
            again = await asyncio.gather(*(single.claim(k) for k in keys if k != "held-0"))
            assert {c.outcome for c in again} == {DONE}
            await single.release(held)


async def test_one_key_claimed_twice_at_once_in_a_batch_has_one_winner(
    moto_url: str, table: str, clock: ManualClock
) -> None:
    factory = ClientFactory(AwsSettings(endpoint_url=moto_url))
    async with DynamoDBIdempotencyGuard.connect(factory, table, clock=clock, batch=True) as guard:
        claims = await asyncio.gather(*(guard.claim("same") for _ in range(5)))
        assert sorted(c.outcome for c in claims) == sorted([CLAIMED] + [IN_PROGRESS] * 4)


async def test_a_batched_claim_rides_out_a_brownout(
    moto_url: str, table: str, clock: ManualClock
) -> None:
    async with FaultProxy(moto_url) as proxy:
        factory = ClientFactory(AwsSettings(endpoint_url=proxy.url, sdk_max_attempts=1))
        async with DynamoDBIdempotencyGuard.connect(
            factory, table, clock=clock, batch=True
        ) as guard:
            # The first transaction lands but its answer is lost: its retry finds every key
            # claimed with its own token, so all are still ours.
            proxy.add(
                ErrorResponse("InternalServerError", after_forwarding=True),
                service="DynamoDB",
                operation="TransactWriteItems",
                times=1,
            )
            claims = await asyncio.gather(*(guard.claim(f"k{i}") for i in range(20)))
            await proxy.idle()
            assert proxy.injected(operation="TransactWriteItems")
            assert {c.outcome for c in claims} == {CLAIMED}
