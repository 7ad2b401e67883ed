"""One fresh lease table per test, on DynamoDB (moto's server over HTTP) or in memory.

A backend hands out stores, one per simulated worker (on DynamoDB each with its own client,
as separate processes would have), and reads or writes raw items the way another KCL version
would, bypassing shardflow.
"""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack, suppress
from typing import Any, Self

import boto3

from shardflow.aws import AwsSettings, Backoff, ClientFactory
from shardflow.leases import DynamoDBLeaseStore, InMemoryLeaseStore, InMemoryLeaseTables
from shardflow.leases.store import LeaseStoreBase

FAST = Backoff(base=0.01, cap=0.05, max_attempts=5)


def unique_table_name(prefix: str = "sf-leases") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class _ClosedOnExit:
    """``async with backend:`` closes the backend (and drops its table) at the end."""

    async def aclose(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class MemoryBackend(_ClosedOnExit):
    kind = "memory"

    def __init__(self) -> None:
        self.table_name = unique_table_name()
        self.tables = InMemoryLeaseTables()

    async def store(self, **options: Any) -> LeaseStoreBase:
        options.pop("scan_page_size", None)  # memory has no pages
        return InMemoryLeaseStore(self.table_name, tables=self.tables, **options)

    def put_raw(self, item: dict[str, Any]) -> None:
        self.tables.put_raw(self.table_name, item)

    def get_raw(self, key: str) -> dict[str, Any] | None:
        return self.tables.items(self.table_name).get(key)


class DynamoBackend(_ClosedOnExit):
    kind = "dynamodb"

    def __init__(self, endpoint_url: str, *, factory: ClientFactory | None = None) -> None:
        self.table_name = unique_table_name()
        self.endpoint_url = endpoint_url
        self.factory = factory or ClientFactory(AwsSettings(endpoint_url=endpoint_url))
        self.raw = boto3.client("dynamodb", endpoint_url=endpoint_url)
        self._stack = AsyncExitStack()

    async def client(self) -> Any:
        return await self._stack.enter_async_context(self.factory.dynamodb())

    async def store(self, **options: Any) -> LeaseStoreBase:
        options.setdefault("backoff", FAST)
        return DynamoDBLeaseStore(await self.client(), self.table_name, **options)

    def put_raw(self, item: dict[str, Any]) -> None:
        self.raw.put_item(TableName=self.table_name, Item=item)

    def get_raw(self, key: str) -> dict[str, Any] | None:
        answer = self.raw.get_item(
            TableName=self.table_name, Key={"leaseKey": {"S": key}}, ConsistentRead=True
        )
        item: dict[str, Any] | None = answer.get("Item")
        return item

    async def aclose(self) -> None:
        await self._stack.aclose()
        with suppress(self.raw.exceptions.ResourceNotFoundException):
            self.raw.delete_table(TableName=self.table_name)


Backend = MemoryBackend | DynamoBackend
