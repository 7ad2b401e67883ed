"""Workers racing on DynamoDB (moto's server), and DynamoDB failing under the store.

Failures are real HTTP answers from the fault proxy in front of moto: throttling, 5xx after
the write happened (the answer is lost, the write is not).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from shardflow.aws import AwsSettings, Backoff, ClientFactory
from shardflow.errors import ThrottledError
from shardflow.leases import DynamoDBLeaseStore, Lease
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.leases.store import LeaseStoreBase
from shardflow.records import ExtendedSequenceNumber
from shardflow.testing.faults import THROTTLED, ErrorResponse, FaultProxy
from support.lease_backends import DynamoBackend

KEY = "shardId-000000000000"


@pytest.fixture
async def backend(moto_url: str) -> AsyncIterator[DynamoBackend]:
    async with DynamoBackend(moto_url) as backend:
        yield backend


async def test_racing_takes_have_exactly_one_winner_per_lease(backend: DynamoBackend) -> None:
    stores = [await backend.store() for _ in range(3)]
    await stores[0].ensure_table()
    keys = [f"shardId-{i:012d}" for i in range(8)]
    free = [await stores[0].create_if_absent(Lease.new(key)) for key in keys]

    attempts = [
        store.take(lease, f"worker-{n}") for lease in free for n, store in enumerate(stores)
    ]
    results = await asyncio.gather(*attempts, return_exceptions=True)

    table = {lease.lease_key: lease for lease in await stores[0].list_leases()}
    for i, key in enumerate(keys):
        outcomes = results[i * len(stores) : (i + 1) * len(stores)]
        winners = [r for r in outcomes if isinstance(r, Lease)]
        losers = [r for r in outcomes if isinstance(r, LeaseConditionFailedError)]
        assert len(winners) == 1, outcomes
        assert len(losers) == len(stores) - 1, outcomes
        assert winners[0] == table[key]
        assert table[key].lease_counter == 1
        for loser in losers:
            assert loser.current == winners[0]
            assert loser.current_owner == winners[0].lease_owner


async def test_a_steal_racing_a_renewal_leaves_one_owner(backend: DynamoBackend) -> None:
    owner, thief = await backend.store(), await backend.store()
    await owner.ensure_table()
    for round_ in range(5):
        key = f"shardId-{round_:012d}"
        lease = await owner.take(await owner.create_if_absent(Lease.new(key)), "owner")
        results = await asyncio.gather(
            owner.renew(lease, "owner"), thief.take(lease, "thief"), return_exceptions=True
        )
        winners = [r for r in results if isinstance(r, Lease)]
        assert len(winners) == 1, results
        assert await owner.get(key) == winners[0]


# --- failures of DynamoDB itself -------------------------------------------------------------


@pytest.fixture
def proxy(moto_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url, seed=5) as proxy:
        yield proxy


@pytest.fixture
async def via_proxy(moto_url: str, proxy: FaultProxy) -> AsyncIterator[DynamoBackend]:
    factory = ClientFactory(AwsSettings(endpoint_url=proxy.url))
    async with DynamoBackend(moto_url, factory=factory) as backend:
        yield backend


class SendCounter:
    """Counts HTTP requests per operation a client really sends (botocore's own event)."""

    def __init__(self, client: Any) -> None:
        self.sent: dict[str, int] = {}
        client.meta.events.register("before-send.dynamodb", self)

    def __call__(self, request: Any, **_: Any) -> None:
        target = request.headers.get("X-Amz-Target", b"")
        operation = (target.decode() if isinstance(target, bytes) else target).split(".")[-1]
        self.sent[operation] = self.sent.get(operation, 0) + 1


async def counted_store(backend: DynamoBackend) -> tuple[LeaseStoreBase, SendCounter]:
    client = await backend.client()
    store = DynamoDBLeaseStore(
        client, backend.table_name, backoff=Backoff(base=0.01, cap=0.05, max_attempts=4)
    )
    return store, SendCounter(client)


async def test_throttled_writes_are_retried(via_proxy: DynamoBackend, proxy: FaultProxy) -> None:
    store, counter = await counted_store(via_proxy)
    await store.ensure_table()
    lease = await store.take(await store.create_if_absent(Lease.new(KEY)), "a")
    rule = proxy.add(ErrorResponse(THROTTLED), service="DynamoDB", operation="UpdateItem", times=2)
    before = counter.sent.get("UpdateItem", 0)
    renewed = await store.renew(lease, "a")
    assert renewed.lease_counter == lease.lease_counter + 1
    assert proxy.injected_count(rule) == 2
    assert counter.sent["UpdateItem"] - before == 3


async def test_throttling_beyond_the_budget_is_raised_as_throttling(
    via_proxy: DynamoBackend, proxy: FaultProxy
) -> None:
    store, _ = await counted_store(via_proxy)
    await store.ensure_table()
    lease = await store.take(await store.create_if_absent(Lease.new(KEY)), "a")
    proxy.add(ErrorResponse(THROTTLED), service="DynamoDB", operation="UpdateItem", times=4)
    with pytest.raises(ThrottledError):
        await store.renew(lease, "a")
    assert await store.get(KEY) == lease


async def test_a_failed_condition_is_never_retried(via_proxy: DynamoBackend) -> None:
    store, counter = await counted_store(via_proxy)
    await store.ensure_table()
    lease = await store.take(await store.create_if_absent(Lease.new(KEY)), "a")
    await store.renew(lease, "a")
    before = counter.sent["UpdateItem"]
    with pytest.raises(LeaseConditionFailedError):
        await store.renew(lease, "a")
    assert counter.sent["UpdateItem"] - before == 1


@pytest.mark.parametrize("operation", ["renew", "take", "checkpoint", "release"])
async def test_a_write_whose_answer_was_lost_is_recognised_on_retry(
    via_proxy: DynamoBackend, proxy: FaultProxy, operation: str
) -> None:
    store, counter = await counted_store(via_proxy)
    await store.ensure_table()
    lease = await store.take(await store.create_if_absent(Lease.new(KEY)), "a")
    # The first attempt reaches DynamoDB and is applied; its answer becomes a 500.
    rule = proxy.add(
        ErrorResponse("InternalServerError", after_forwarding=True),
        service="DynamoDB",
        operation="UpdateItem",
        times=1,
    )
    before = counter.sent["UpdateItem"]
    if operation == "renew":
        result = await store.renew(lease, "a")
        assert result.lease_owner == "a"
    elif operation == "take":
        result = await store.take(lease, "b")
        assert result.lease_owner == "b"
    elif operation == "checkpoint":
        result = await store.checkpoint(lease, "a", ExtendedSequenceNumber("12345"))
        assert result.checkpoint.sequence_number == "12345"
    else:
        result = await store.release(lease, "a")
        assert result.lease_owner is None
    assert proxy.injected_count(rule) == 1
    assert counter.sent["UpdateItem"] - before == 2, "one retry, refused by its own condition"
    assert result.lease_counter == lease.lease_counter + 1
    assert await store.get(KEY) == result


async def test_a_retry_refused_because_of_another_writer_is_reported(
    via_proxy: DynamoBackend, proxy: FaultProxy
) -> None:
    store, counter = await counted_store(via_proxy)
    await store.ensure_table()
    lease = await store.take(await store.create_if_absent(Lease.new(KEY)), "a")
    # Another worker takes the lease (directly on moto), bumping the counter exactly as our
    # renewal would have; our first attempt fails with a 500 that never reached DynamoDB.
    via_proxy.raw.update_item(
        TableName=via_proxy.table_name,
        Key={"leaseKey": {"S": KEY}},
        UpdateExpression="SET leaseOwner = :o, leaseCounter = :c",
        ExpressionAttributeValues={
            ":o": {"S": "thief"},
            ":c": {"N": str(lease.lease_counter + 1)},
        },
    )
    rule = proxy.add(
        ErrorResponse("InternalServerError"), service="DynamoDB", operation="UpdateItem", times=1
    )
    before = counter.sent["UpdateItem"]
    with pytest.raises(LeaseConditionFailedError) as caught:
        await store.renew(lease, "a")
    assert proxy.injected_count(rule) == 1
    assert counter.sent["UpdateItem"] - before == 2
    assert caught.value.current_owner == "thief"
    assert caught.value.current == await store.get(KEY)
