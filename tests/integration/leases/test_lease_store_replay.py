"""Random lease histories run in lockstep on DynamoDB (moto's server) and in memory.

The same hypothesis state machine as the unit test (tests/support/lease_steps.py): every step
runs on both stores and each must give the outcome the independent model predicts. Few
examples: moto performs about 110 conditional writes a second.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.leases import DynamoDBLeaseStore, InMemoryLeaseStore, LeaseStore
from support.lease_backends import FAST, unique_table_name
from support.lease_steps import LeaseMachine


class LockstepMachine(LeaseMachine):
    endpoint_url = ""

    async def open_stores(self) -> list[LeaseStore]:
        self.stack = AsyncExitStack()
        factory = ClientFactory(AwsSettings(endpoint_url=self.endpoint_url))
        client = await self.stack.enter_async_context(factory.dynamodb())
        self.client = client
        self.table_name = unique_table_name("sf-replay")
        dynamo = DynamoDBLeaseStore(client, self.table_name, backoff=FAST)
        memory = InMemoryLeaseStore(self.table_name)
        for store in (memory, dynamo):
            await store.ensure_table()
        return [memory, dynamo]

    async def close_stores(self) -> None:
        try:
            await self.client.delete_table(TableName=self.table_name)
        finally:
            await self.stack.aclose()


def test_dynamodb_and_memory_agree_on_random_histories(moto_url: str) -> None:
    LockstepMachine.endpoint_url = moto_url
    run_state_machine_as_test(
        LockstepMachine,
        settings=settings(
            max_examples=6,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
