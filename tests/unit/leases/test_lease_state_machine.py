"""Random histories of 3 workers on 2 leases against the in-memory store (hypothesis.stateful)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from shardflow.leases import InMemoryLeaseStore, InMemoryLeaseTables, LeaseStore
from support.lease_steps import LeaseMachine


class InMemoryMachine(LeaseMachine):
    async def open_stores(self) -> list[LeaseStore]:
        tables = InMemoryLeaseTables()
        store = InMemoryLeaseStore("app", tables=tables)
        await store.ensure_table()
        return [store]


InMemoryMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestInMemoryLeaseHistories = InMemoryMachine.TestCase
