"""An idempotency guard on a DynamoDB table, shared by every worker of an application.

Item per key: ``key`` (S, the table's hash key), ``state`` (``claimed`` | ``done``), ``token``
(the claim's random token) and ``ttl`` (N, epoch seconds after which the item no longer
counts). DynamoDB's TTL deletes expired items eventually (hours, even days, later), so every
condition treats an item whose ``ttl`` has passed as absent instead of waiting for the
deletion. Expiry is judged on the caller's wall clock: keep ``claim_ttl`` far above the clock
skew between workers.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

from botocore.exceptions import ClientError

from shardflow.aws.backoff import retrying
from shardflow.aws.clients import ClientFactory
from shardflow.aws.dynamodb_tables import create_table, describe_table, wait_until_active
from shardflow.backoff import Backoff
from shardflow.clock import SYSTEM_CLOCK, Clock
from shardflow.errors import InvalidArgumentError
from shardflow.idempotency.guard import Claim, ClaimOutcome, new_token, require_claimed

KEY: Final = "key"
STATE: Final = "state"
TOKEN: Final = "token"
TTL: Final = "ttl"
CLAIMED: Final = "claimed"
DONE: Final = "done"

DEFAULT_CLAIM_TTL: Final = 300.0
DEFAULT_DONE_TTL: Final = 24 * 3600.0
"""A day: Kinesis' default retention, after which a record cannot be redelivered anyway."""

GUARD_BACKOFF: Final = Backoff(base=0.05, cap=1.0, max_attempts=6)

# "key" and "ttl" are DynamoDB reserved words: always go through attribute names.
_FREE: Final = "attribute_not_exists(#key) OR #ttl <= :now"
_MAX_CLAIM_ROUNDS: Final = 3


@dataclass(frozen=True, slots=True)
class _Rejected:
    """A conditional write DynamoDB refused; ``item`` is the item as it was, if returned."""

    item: dict[str, Any] | None


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class DynamoDBIdempotencyGuard:
    """:class:`~shardflow.idempotency.guard.IdempotencyGuard` on the table ``table_name``.

    ``client`` is an open aiobotocore DynamoDB client (:meth:`connect` opens one and creates
    the table if needed). Every call goes through :func:`shardflow.aws.retrying`; a retried
    claim whose first attempt did land is recognised by its token and still answers CLAIMED.
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        claim_ttl: float = DEFAULT_CLAIM_TTL,
        done_ttl: float | None = DEFAULT_DONE_TTL,
        clock: Clock = SYSTEM_CLOCK,
        backoff: Backoff = GUARD_BACKOFF,
        table_wait: float = 120.0,
    ) -> None:
        if claim_ttl <= 0 or (done_ttl is not None and done_ttl <= 0):
            raise ValueError("claim_ttl and done_ttl must be positive")
        self.table_name = table_name
        self.claim_ttl = claim_ttl
        self.done_ttl = done_ttl
        self._client = client
        self._clock = clock
        self._backoff = backoff
        self._table_wait = table_wait

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, factory: ClientFactory, table_name: str, *, create: bool = True, **options: Any
    ) -> AsyncIterator[DynamoDBIdempotencyGuard]:
        """A guard with its own client; with ``create`` the table is made ready first."""
        async with factory.dynamodb() as client:
            guard = cls(client, table_name, **options)
            if create:
                await guard.ensure_table()
            yield guard

    async def _call(self, operation: str, call: Callable[[], Awaitable[Any]]) -> Any:
        return await retrying(call, operation=operation, backoff=self._backoff)

    def _now(self) -> int:
        return math.floor(self._clock.wall())

    def _expiry(self, seconds: float) -> int:
        # Rounded up: an item lives at least its TTL (the stored value is whole seconds).
        return math.ceil(self._clock.wall() + seconds)

    # --- claims ----------------------------------------------------------------------------

    async def claim(self, key: str) -> Claim:
        token = new_token()
        for _ in range(_MAX_CLAIM_ROUNDS):
            outcome = await self._put_claim(key, token)
            if not isinstance(outcome, _Rejected):
                return Claim(key, ClaimOutcome.CLAIMED, token)
            item = outcome.item if outcome.item is not None else await self._get(key)
            if item is None or self._expired(item):
                continue  # released or expired between the write and the read: try again
            if item[TOKEN]["S"] == token:
                # An earlier attempt of this same call landed before its answer was lost.
                return Claim(key, ClaimOutcome.CLAIMED, token)
            done = item[STATE]["S"] == DONE
            return Claim(key, ClaimOutcome.DONE if done else ClaimOutcome.IN_PROGRESS)
        return Claim(key, ClaimOutcome.IN_PROGRESS)

    async def _put_claim(self, key: str, token: str) -> _Rejected | None:
        params = {
            "TableName": self.table_name,
            "Item": {
                KEY: {"S": key},
                STATE: {"S": CLAIMED},
                TOKEN: {"S": token},
                TTL: {"N": str(self._expiry(self.claim_ttl))},
            },
            "ConditionExpression": _FREE + " OR #token = :token",
            "ExpressionAttributeNames": {"#key": KEY, "#ttl": TTL, "#token": TOKEN},
            "ExpressionAttributeValues": {
                ":now": {"N": str(self._now())},
                ":token": {"S": token},
            },
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        return await self._conditional("PutItem", self._client.put_item, params)

    async def _conditional(
        self, operation: str, method: Callable[..., Awaitable[Any]], params: dict[str, Any]
    ) -> _Rejected | None:
        async def call() -> _Rejected | None:
            try:
                await method(**params)
            except ClientError as exc:
                if _code(exc) == "ConditionalCheckFailedException":
                    return _Rejected(exc.response.get("Item"))
                raise
            return None

        result: _Rejected | None = await self._call(operation, call)
        return result

    async def _get(self, key: str) -> dict[str, Any] | None:
        answer = await self._call(
            "GetItem",
            lambda: self._client.get_item(
                TableName=self.table_name, Key={KEY: {"S": key}}, ConsistentRead=True
            ),
        )
        item: dict[str, Any] | None = answer.get("Item")
        return item

    def _expired(self, item: dict[str, Any]) -> bool:
        ttl = item.get(TTL)
        return ttl is not None and int(ttl["N"]) <= self._now()

    async def complete(self, claim: Claim) -> None:
        token = require_claimed(claim)
        item = {KEY: {"S": claim.key}, STATE: {"S": DONE}, TOKEN: {"S": token}}
        if self.done_ttl is not None:
            item[TTL] = {"N": str(self._expiry(self.done_ttl))}
        # Unconditional: the handler did finish, whoever claimed the key since.
        await self._call(
            "PutItem", lambda: self._client.put_item(TableName=self.table_name, Item=item)
        )

    async def release(self, claim: Claim) -> bool:
        token = require_claimed(claim)
        params = {
            "TableName": self.table_name,
            "Key": {KEY: {"S": claim.key}},
            "ConditionExpression": "#token = :token AND #state = :claimed",
            "ExpressionAttributeNames": {"#token": TOKEN, "#state": STATE},
            "ExpressionAttributeValues": {":token": {"S": token}, ":claimed": {"S": CLAIMED}},
        }
        return await self._conditional("DeleteItem", self._client.delete_item, params) is None

    async def close(self) -> None:
        """Nothing to release: the client belongs to whoever opened it."""

    # --- table -----------------------------------------------------------------------------

    async def ensure_table(self) -> bool:
        """Create the table if missing (PAY_PER_REQUEST) and turn on TTL for ``ttl``.

        True if this call created the table. An existing table with TTL on another attribute
        is refused: its expired items would never be deleted.
        """
        created = False
        if await self._describe() is None:
            created = await self._create()
        await self._wait_active()
        answer = await self._call(
            "DescribeTimeToLive",
            lambda: self._client.describe_time_to_live(TableName=self.table_name),
        )
        ttl = answer.get("TimeToLiveDescription", {})
        status = ttl.get("TimeToLiveStatus", "DISABLED")
        if status in ("ENABLED", "ENABLING"):
            if ttl.get("AttributeName") != TTL:
                raise InvalidArgumentError(
                    f"table {self.table_name} has TTL on {ttl.get('AttributeName')!r}; "
                    f"the idempotency guard needs it on {TTL!r}",
                    operation="DescribeTimeToLive",
                    code="TimeToLiveAttribute",
                )
            return created
        spec = {"Enabled": True, "AttributeName": TTL}
        await self._call(
            "UpdateTimeToLive",
            lambda: self._client.update_time_to_live(
                TableName=self.table_name, TimeToLiveSpecification=spec
            ),
        )
        return created

    async def _describe(self) -> dict[str, Any] | None:
        return await describe_table(self._client, self.table_name, backoff=self._backoff)

    async def _create(self) -> bool:
        return await create_table(self._client, self.table_name, key=KEY, backoff=self._backoff)

    async def _wait_active(self) -> None:
        await wait_until_active(
            self._client, self.table_name, backoff=self._backoff, max_wait=self._table_wait
        )
