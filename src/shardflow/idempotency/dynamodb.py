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
from shardflow.idempotency.batching import (
    MAX_BATCH_WRITE,
    MAX_TRANSACTION,
    Coalescer,
    Pending,
    cancellation_reasons,
)
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
_MAX_BATCH_ROUNDS: Final = 5
"""A key a batch sent back this often (passing cancellations, unprocessed) goes alone."""


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

    ``batch``: claims made within ``batch_window`` seconds of each other go to DynamoDB
    together (one ``TransactWriteItems`` of up to 100 keys), completions likewise (one
    ``BatchWriteItem`` of up to 25): far fewer requests per record, at 2 write units per
    claim instead of 1 (see :mod:`shardflow.idempotency.batching`).
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
        batch: bool = False,
        batch_window: float = 0.002,
    ) -> None:
        if claim_ttl <= 0 or (done_ttl is not None and done_ttl <= 0):
            raise ValueError("claim_ttl and done_ttl must be positive")
        if batch_window < 0:
            raise ValueError("batch_window must not be negative")
        self.table_name = table_name
        self.claim_ttl = claim_ttl
        self.done_ttl = done_ttl
        self._client = client
        self._clock = clock
        self._backoff = backoff
        self._table_wait = table_wait
        self.batch = batch
        self._claims = Coalescer(self._send_claims, limit=MAX_TRANSACTION, window=batch_window)
        self._completions = Coalescer(
            self._send_completions, limit=MAX_BATCH_WRITE, window=batch_window
        )

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
        if self.batch:
            claim: Claim = await self._claims.submit(key, token)
            return claim
        return await self._claim_alone(key, token)

    async def _claim_alone(self, key: str, token: str) -> Claim:
        for _ in range(_MAX_CLAIM_ROUNDS):
            outcome = await self._put_claim(key, token)
            if not isinstance(outcome, _Rejected):
                return Claim(key, ClaimOutcome.CLAIMED, token)
            claim = await self._answer(key, token, outcome.item)
            if claim is not None:
                return claim
        return Claim(key, ClaimOutcome.IN_PROGRESS)

    async def _answer(self, key: str, token: str, item: dict[str, Any] | None) -> Claim | None:
        """The outcome of a claim whose condition failed, from the item as it was (read if
        DynamoDB did not return it); None when the key turned out free: try again."""
        if item is None:
            item = await self._get(key)
        if item is None or self._expired(item):
            return None  # released or expired between the write and the read
        if item[TOKEN]["S"] == token:
            # An earlier attempt of this same call landed before its answer was lost.
            return Claim(key, ClaimOutcome.CLAIMED, token)
        done = item[STATE]["S"] == DONE
        return Claim(key, ClaimOutcome.DONE if done else ClaimOutcome.IN_PROGRESS)

    async def _send_claims(self, batch: list[Pending]) -> list[Pending]:
        """One transaction claiming every key of ``batch``; returns the keys to send again."""
        items = [{"Put": self._claim_params(p.key, p.token)} for p in batch]

        async def call() -> list[dict[str, Any]] | None:
            try:
                await self._client.transact_write_items(TransactItems=items)
            except ClientError as exc:
                reasons = cancellation_reasons(exc)
                if reasons is None:
                    raise
                return reasons
            return None

        reasons: list[dict[str, Any]] | None = await self._call("TransactWriteItems", call)
        if reasons is None:
            for p in batch:
                p.answer(Claim(p.key, ClaimOutcome.CLAIMED, p.token))
            return []
        again = []
        for i, p in enumerate(batch):
            reason = reasons[i] if i < len(reasons) else {}
            code = reason.get("Code") or "None"
            if code == "None":
                again.append(p)  # not written only because another item failed
                continue
            claim = None
            if code == "ConditionalCheckFailed":
                claim = await self._answer(p.key, p.token, reason.get("Item"))
            if claim is not None:
                p.answer(claim)
                continue
            p.rounds += 1
            if p.rounds < _MAX_BATCH_ROUNDS:
                again.append(p)
            else:
                p.answer(await self._claim_alone(p.key, p.token))
        return again

    async def _put_claim(self, key: str, token: str) -> _Rejected | None:
        return await self._conditional(
            "PutItem", self._client.put_item, self._claim_params(key, token)
        )

    def _claim_params(self, key: str, token: str) -> dict[str, Any]:
        return {
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
        if self.batch:
            await self._completions.submit(claim.key, token)
            return
        await self._complete_alone(claim.key, token)

    def _done_item(self, key: str, token: str) -> dict[str, Any]:
        item = {KEY: {"S": key}, STATE: {"S": DONE}, TOKEN: {"S": token}}
        if self.done_ttl is not None:
            item[TTL] = {"N": str(self._expiry(self.done_ttl))}
        return item

    async def _complete_alone(self, key: str, token: str) -> None:
        item = self._done_item(key, token)
        # Unconditional: the handler did finish, whoever claimed the key since.
        await self._call(
            "PutItem", lambda: self._client.put_item(TableName=self.table_name, Item=item)
        )

    async def _send_completions(self, batch: list[Pending]) -> list[Pending]:
        """One BatchWriteItem marking every key of ``batch`` done; returns the unprocessed."""
        writes = [{"PutRequest": {"Item": self._done_item(p.key, p.token)}} for p in batch]
        answer = await self._call(
            "BatchWriteItem",
            lambda: self._client.batch_write_item(RequestItems={self.table_name: writes}),
        )
        unprocessed = answer.get("UnprocessedItems", {}).get(self.table_name, [])
        left = {w["PutRequest"]["Item"][KEY]["S"] for w in unprocessed}
        again = []
        for p in batch:
            if p.key not in left:
                p.answer(None)
                continue
            p.rounds += 1
            if p.rounds < _MAX_BATCH_ROUNDS:
                again.append(p)
            else:
                await self._complete_alone(p.key, p.token)
                p.answer(None)
        return again

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
