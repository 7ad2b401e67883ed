"""Creating and waiting for the DynamoDB tables shardflow owns (lease tables, idempotency).

Both are on-demand tables with one string hash key, created on first use by whichever worker
gets there first: a concurrent creation by another worker is not an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from shardflow.aws.backoff import retrying
from shardflow.backoff import Backoff
from shardflow.errors import ResourceNotFoundError, TransientError


async def describe_table(client: Any, name: str, *, backoff: Backoff) -> dict[str, Any] | None:
    """The table's description, or None if it does not exist."""
    try:
        answer = await retrying(
            lambda: client.describe_table(TableName=name),
            operation="DescribeTable",
            backoff=backoff,
        )
    except ResourceNotFoundError:
        return None
    table: dict[str, Any] = answer["Table"]
    return table


async def create_table(
    client: Any,
    name: str,
    *,
    key: str,
    backoff: Backoff,
    extra: Mapping[str, Any] | None = None,
) -> bool:
    """Create an on-demand table keyed by the string attribute ``key``.

    False when another worker is creating it at the same moment. ``extra`` adds CreateTable
    parameters (e.g. a StreamSpecification).
    """
    params: dict[str, Any] = {
        "TableName": name,
        "KeySchema": [{"AttributeName": key, "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": key, "AttributeType": "S"}],
        "BillingMode": "PAY_PER_REQUEST",
        **(extra or {}),
    }

    async def create() -> bool:
        try:
            await client.create_table(**params)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceInUseException":
                return False
            raise
        return True

    created: bool = await retrying(create, operation="CreateTable", backoff=backoff)
    return created


async def wait_until_active(
    client: Any, name: str, *, backoff: Backoff, max_wait: float
) -> dict[str, Any]:
    """Poll until the table is ACTIVE; its description. TransientError after ``max_wait``."""
    deadline = time.monotonic() + max_wait
    pause = 0.05
    while True:
        table = await describe_table(client, name, backoff=backoff)
        if table is not None and table.get("TableStatus") == "ACTIVE":
            return table
        if time.monotonic() >= deadline:
            raise TransientError(
                f"table {name} not ACTIVE after {max_wait:.0f}s",
                operation="DescribeTable",
                code="TableNotActive",
            )
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)
