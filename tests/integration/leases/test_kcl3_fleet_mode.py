"""Recognising a KCL 3.x application from its tables on moto's DynamoDB (no KCL running: the
tables and items are written as KCL 3.x writes them), and this worker's own metrics item."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.fleet import SHARDFLOW_MARK, FleetTables
from shardflow.leases.settings import LeaseSettings
from support.boto import make_stream
from support.lease_backends import DynamoBackend

LEASES = LeaseSettings(failover_time=2.0, renew_interval=0.4, safety_margin=0.3, pickup="off")


@pytest.fixture
async def backend(moto_url: str) -> AsyncIterator[DynamoBackend]:
    async with DynamoBackend(moto_url) as backend:
        yield backend


def kcl3_tables(backend: DynamoBackend, *, kcl_worker_updated: float | None) -> FleetTables:
    tables = FleetTables.of(backend.table_name)
    for name, key in ((tables.coordinator_state, "key"), (tables.worker_metrics, "wid")):
        backend.raw.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    backend.raw.put_item(
        TableName=tables.coordinator_state,
        Item={"key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_3X"}},
    )
    if kcl_worker_updated is not None:
        backend.raw.put_item(
            TableName=tables.worker_metrics,
            Item={"wid": {"S": "kcl-1"}, "lut": {"N": str(int(kcl_worker_updated))}},
        )
    return tables


async def run_worker(backend: DynamoBackend, moto_url: str, stream: str) -> tuple[str, set[str]]:
    """Start a coordinator, note its mode and the worker ids in the metrics table, stop it."""
    async with AsyncExitStack() as stack:
        factory = ClientFactory(AwsSettings(endpoint_url=moto_url))
        kinesis = await stack.enter_async_context(factory.kinesis())
        coordinator = LeaseCoordinator(
            await backend.store(),
            worker_id="sf-1",
            streams=[stream],
            kinesis=kinesis,
            settings=LEASES,
        )
        async with coordinator:
            mode = coordinator.fleet_mode
            metrics = FleetTables.of(backend.table_name).worker_metrics
            present: set[str] = set()
            if metrics in backend.raw.list_tables()["TableNames"]:
                items = backend.raw.scan(TableName=metrics)["Items"]
                present = {i["wid"]["S"] for i in items if SHARDFLOW_MARK in i}
        return mode, present


async def test_a_live_kcl_3_worker_makes_the_worker_defer_and_publish_its_metrics(
    backend: DynamoBackend, moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 1)
    tables = kcl3_tables(backend, kcl_worker_updated=time.time())
    mode, published = await run_worker(backend, moto_url, stream_name)
    assert mode == "kcl3"
    assert published == {"sf-1"}
    # Stopped: its item is gone, so the KCL leader assigns it nothing more.
    items = backend.raw.scan(TableName=tables.worker_metrics)["Items"]
    assert [i["wid"]["S"] for i in items] == ["kcl-1"]


async def test_without_a_live_kcl_worker_the_fleet_is_shardflows(
    backend: DynamoBackend, moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 1)
    kcl3_tables(backend, kcl_worker_updated=time.time() - 600)
    mode, published = await run_worker(backend, moto_url, stream_name)
    assert mode == "kcl3-takeover"
    assert published == {"sf-1"}


async def test_without_kcl_3_tables_the_worker_runs_standalone(
    backend: DynamoBackend, moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 1)
    mode, published = await run_worker(backend, moto_url, stream_name)
    assert mode == "standalone"
    assert published == set()
