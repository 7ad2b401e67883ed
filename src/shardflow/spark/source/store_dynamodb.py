"""Batch ends as items of a DynamoDB table: ``dynamodb://table``.

One item per (run, batch, shard): partition key ``runId``, sort key ``batchShard``
(``<batch, 12 digits>/<shard id>``), the end as JSON in ``end``. The first attempt wins with a
conditional put (``attribute_not_exists``); reads are strongly consistent. The driver creates
the table (on-demand capacity) when it is missing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from botocore.exceptions import ClientError

from shardflow.errors import SourceMetadataError
from shardflow.spark.source.metadata_location import MetadataLocation
from shardflow.spark.source.metadata_store import batch_name
from shardflow.spark.source.store_aws import AwsBatchEnds

RUN = "runId"
ENTRY = "batchShard"
END = "end"
_TABLE_READY_TIMEOUT = 120.0
_HINTS = {
    "ResourceNotFoundException": "the table is missing: let the driver create it, or create it",
    "AccessDeniedException": (
        "give the driver dynamodb:DescribeTable and dynamodb:CreateTable, and the driver and "
        "every executor dynamodb:GetItem, PutItem, Query and BatchWriteItem on the table"
    ),
}


class DynamoDBBatchEnds(AwsBatchEnds):
    service = "dynamodb"
    hints = _HINTS

    def __init__(self, location: MetadataLocation, run_id: str) -> None:
        super().__init__(location, run_id)
        self.table = location.where

    def _key(self, batch: int, shard_id: str) -> dict[str, Any]:
        return {RUN: {"S": self.run_id}, ENTRY: {"S": f"{batch_name(batch)}/{shard_id}"}}

    def prepare(self) -> None:
        self._run("preparing the metadata", self._ensure_table)

    async def _ensure_table(self, dynamodb: Any) -> None:
        try:
            described = await dynamodb.describe_table(TableName=self.table)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            try:
                await dynamodb.create_table(
                    TableName=self.table,
                    KeySchema=[
                        {"AttributeName": RUN, "KeyType": "HASH"},
                        {"AttributeName": ENTRY, "KeyType": "RANGE"},
                    ],
                    AttributeDefinitions=[
                        {"AttributeName": RUN, "AttributeType": "S"},
                        {"AttributeName": ENTRY, "AttributeType": "S"},
                    ],
                    BillingMode="PAY_PER_REQUEST",
                )
            except ClientError as create_error:
                # Another query's driver created it at the same moment: wait for it too.
                if create_error.response.get("Error", {}).get("Code") != "ResourceInUseException":
                    raise
            described = await dynamodb.describe_table(TableName=self.table)
        deadline = time.monotonic() + _TABLE_READY_TIMEOUT
        while described["Table"]["TableStatus"] != "ACTIVE":
            if time.monotonic() > deadline:
                raise SourceMetadataError(f"table {self.table} did not become ACTIVE")
            await asyncio.sleep(1.0)
            described = await dynamodb.describe_table(TableName=self.table)
        keys = {k["AttributeName"]: k["KeyType"] for k in described["Table"]["KeySchema"]}
        if keys != {RUN: "HASH", ENTRY: "RANGE"}:
            raise SourceMetadataError(
                f"table {self.table} has keys {keys}, not {RUN} (HASH) and {ENTRY} (RANGE): "
                "use a table of its own for the source's metadata"
            )

    def _read(self, batch: int, shard_id: str) -> str | None:
        return self._run("reading a batch end from", lambda db: self._get(db, batch, shard_id))

    async def _get_text(self, client: Any, batch: int, shard_id: str) -> str | None:
        return await self._get(client, batch, shard_id)

    async def _get(self, dynamodb: Any, batch: int, shard_id: str) -> str | None:
        answer = await dynamodb.get_item(
            TableName=self.table, Key=self._key(batch, shard_id), ConsistentRead=True
        )
        item = answer.get("Item")
        return None if item is None else str(item[END]["S"])

    def _create(self, batch: int, shard_id: str, text: str) -> bool:
        return self._run(
            "recording a batch end in", lambda db: self._put_new(db, batch, shard_id, text)
        )

    async def _put_new(self, dynamodb: Any, batch: int, shard_id: str, text: str) -> bool:
        try:
            await dynamodb.put_item(
                TableName=self.table,
                Item={**self._key(batch, shard_id), END: {"S": text}},
                ConditionExpression="attribute_not_exists(#run)",
                ExpressionAttributeNames={"#run": RUN},
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def _delete_before(self, batch: int) -> None:
        self._run("forgetting old batch ends in", lambda db: self._delete_old(db, batch))

    async def _delete_old(self, dynamodb: Any, batch: int) -> None:
        old: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            page = await dynamodb.query(
                TableName=self.table,
                KeyConditionExpression="#run = :run AND #entry < :first",
                ExpressionAttributeNames={"#run": RUN, "#entry": ENTRY},
                ExpressionAttributeValues={
                    ":run": {"S": self.run_id},
                    ":first": {"S": batch_name(batch)},
                },
                ProjectionExpression="#run, #entry",
                **extra,
            )
            old.extend(page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        for i in range(0, len(old), 25):
            requests = [{"DeleteRequest": {"Key": key}} for key in old[i : i + 25]]
            pending: dict[str, Any] = {self.table: requests}
            while pending:
                answer = await dynamodb.batch_write_item(RequestItems=pending)
                pending = answer.get("UnprocessedItems") or {}
