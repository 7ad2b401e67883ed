"""The lease store on DynamoDB: the KCL lease table, shared with KCL workers of the same app.

Each :class:`~shardflow.leases.writes.LeaseWrite` is rendered as DynamoDB request parameters
(condition and update expressions, every name and value through a placeholder) and sent as
one conditional request."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

from botocore.exceptions import ClientError

from shardflow.aws.backoff import retrying
from shardflow.aws.clients import ClientFactory
from shardflow.aws.dynamodb_tables import create_table, describe_table, wait_until_active
from shardflow.backoff import Backoff
from shardflow.errors import InvalidArgumentError, MalformedLeaseError
from shardflow.leases.entities import MODE_KEY, Entity, entity_from_item
from shardflow.leases.errors import EntityConditionFailedError, LeaseConditionFailedError
from shardflow.leases.model import (
    LEASE_KEY,
    AttributeValue,
    Item,
    Lease,
    is_lease_item,
    key_of,
    lease_from_item,
)
from shardflow.leases.store import LeaseStoreBase, TableMarks, TableScan, TableStatus, marks_of
from shardflow.leases.writes import (
    Absent,
    Action,
    Add,
    Condition,
    Equals,
    Exists,
    LeaseWrite,
    Put,
    Remove,
)


class _Placeholders:
    """Names every attribute and value through placeholders (``#a0``, ``:v0``).

    Placeholders keep attribute names safe from DynamoDB's reserved words.
    """

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, AttributeValue] = {}

    def name(self, attribute: str) -> str:
        for placeholder, known in self.names.items():
            if known == attribute:
                return placeholder
        placeholder = f"#a{len(self.names)}"
        self.names[placeholder] = attribute
        return placeholder

    def value(self, value: AttributeValue) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = value
        return placeholder


def _condition(condition: Condition, ph: _Placeholders) -> str:
    name = ph.name(condition.attribute)
    if isinstance(condition, Equals):
        return f"{name} = {ph.value(condition.value)}"
    if isinstance(condition, Exists):
        return f"attribute_exists({name})"
    if isinstance(condition, Absent):
        return f"attribute_not_exists({name})"
    raise TypeError(f"unknown condition {condition!r}")


def _update(actions: tuple[Action, ...], ph: _Placeholders) -> str:
    sets: list[str] = []
    removes: list[str] = []
    adds: list[str] = []
    for action in actions:
        name = ph.name(action.attribute)
        if isinstance(action, Put):
            sets.append(f"{name} = {ph.value(action.value)}")
        elif isinstance(action, Remove):
            removes.append(name)
        elif isinstance(action, Add):
            adds.append(f"{name} {ph.value({'N': str(action.amount)})}")
        else:
            raise TypeError(f"unknown action {action!r}")
    clauses = [
        f"{verb} {', '.join(parts)}"
        for verb, parts in (("SET", sets), ("REMOVE", removes), ("ADD", adds))
        if parts
    ]
    return " ".join(clauses)


def render(conditions: tuple[Condition, ...], actions: tuple[Action, ...] = ()) -> dict[str, Any]:
    """``ConditionExpression``, ``UpdateExpression`` (if any actions) and their placeholder maps."""
    ph = _Placeholders()
    params: dict[str, Any] = {}
    if actions:
        params["UpdateExpression"] = _update(actions, ph)
    if conditions:
        params["ConditionExpression"] = " AND ".join(_condition(c, ph) for c in conditions)
    if ph.names:
        params["ExpressionAttributeNames"] = ph.names
    if ph.values:
        params["ExpressionAttributeValues"] = ph.values
    return params


log = logging.getLogger("shardflow.leases")

LEASE_BACKOFF: Final = Backoff(base=0.05, cap=1.0, max_attempts=6)
"""Retries of lease calls stay well inside KCL's 10 s failover time (at most ~3 s of waiting)."""

STREAM_VIEW_TYPE: Final = "NEW_AND_OLD_IMAGES"

_OPERATION_OF: Final = {"update": "UpdateItem", "put": "PutItem", "delete": "DeleteItem"}


@dataclass(frozen=True, slots=True)
class _Rejected:
    """A conditional write DynamoDB refused; ``item`` is the item as it was (ALL_OLD)."""

    item: Item | None


STREAMS_TAG = "shardflow:streams"
"""Tag of a lease table shardflow created: its application's streams, space-separated."""
_MAX_TAG_VALUE = 256
_BATCH_GET_KEYS = 100
"""Keys one BatchGetItem takes: the mode item and 99 heartbeats (more workers: pick-up scans)."""


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _as_lease(item: Item | None) -> Lease | None:
    if not item or not is_lease_item(item):
        return None
    try:
        return lease_from_item(item)
    except MalformedLeaseError:
        return None


class DynamoDBLeaseStore(LeaseStoreBase):
    """A :class:`~shardflow.leases.store.LeaseStore` on a DynamoDB table named ``table_name``.

    ``client`` is an open aiobotocore DynamoDB client (see :meth:`connect` to open one from a
    :class:`~shardflow.aws.ClientFactory`). ``scan_page_size`` limits items per Scan page
    (None: DynamoDB's 1 MB pages). ``table_wait`` bounds the wait for the table to be ACTIVE.
    ``streams``: the application's streams, recorded in a tag of the table this store creates
    (``shardflow leases APP`` reads it to measure lag; KCL-made tables have none).
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        backoff: Backoff = LEASE_BACKOFF,
        scan_page_size: int | None = None,
        table_wait: float = 300.0,
        streams: Sequence[str] = (),
    ) -> None:
        super().__init__(table_name)
        self._streams_tag = " ".join(streams)
        self._client = client
        self._backoff = backoff
        self._scan_page_size = scan_page_size
        self._table_wait = table_wait
        self._scanned: dict[str, tuple[Mapping[str, Any], Lease]] = {}
        """Lease key -> its item and lease as the last complete scan read them: an item that
        has not changed since is not parsed again (a worker polling a 1,000-lease table for
        changes reads the same items several times a second), and the same Lease object
        tells a reader cheaply that nothing changed."""

    @property
    def client(self) -> Any:
        """The aiobotocore DynamoDB client (the KCL 3.x fleet tables are read with it too)."""
        return self._client

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, factory: ClientFactory, table_name: str, **options: Any
    ) -> AsyncIterator[DynamoDBLeaseStore]:
        """A store with its own DynamoDB client, closed when the block ends."""
        async with factory.dynamodb(own_requests=True) as client:
            yield cls(client, table_name, **options)

    async def _call(self, operation: str, call: Callable[[], Awaitable[Any]]) -> Any:
        return await retrying(call, operation=operation, backoff=self._backoff)

    # --- table ---------------------------------------------------------------------------------

    async def _describe(self) -> dict[str, Any] | None:
        return await describe_table(self._client, self._table_name, backoff=self._backoff)

    async def _create(self, stream_view: bool) -> bool:
        """Create the table; False if another worker of the application created it first."""
        stream = {"StreamEnabled": True, "StreamViewType": STREAM_VIEW_TYPE}
        extra: dict[str, Any] = {"StreamSpecification": stream} if stream_view else {}
        if self._streams_tag and len(self._streams_tag) <= _MAX_TAG_VALUE:
            extra["Tags"] = [{"Key": STREAMS_TAG, "Value": self._streams_tag}]
        return await create_table(
            self._client, self._table_name, key=LEASE_KEY, backoff=self._backoff, extra=extra
        )

    async def recorded_streams(self) -> list[str]:
        """The streams recorded when shardflow created the table (empty if none were)."""
        table = await self._describe()
        arn = (table or {}).get("TableArn")
        if not arn:
            return []
        answer = await self._call(
            "ListTagsOfResource", lambda: self._client.list_tags_of_resource(ResourceArn=arn)
        )
        for tag in answer.get("Tags", []):
            if tag.get("Key") == STREAMS_TAG:
                return str(tag.get("Value", "")).split()
        return []

    async def _wait_active(self) -> dict[str, Any]:
        return await wait_until_active(
            self._client, self._table_name, backoff=self._backoff, max_wait=self._table_wait
        )

    async def _enable_stream(self) -> None:
        spec = {"StreamEnabled": True, "StreamViewType": STREAM_VIEW_TYPE}

        async def update() -> None:
            await self._client.update_table(TableName=self._table_name, StreamSpecification=spec)

        await self._call("UpdateTable", update)

    async def ensure_table(
        self, *, stream_view: bool = False, stream_if_created: bool = False
    ) -> TableStatus:
        table = await self._describe()
        created = False
        if table is None:
            created = await self._create(stream_view or stream_if_created)
        table = await self._wait_active()
        spec = table.get("StreamSpecification") or {}
        if stream_view and not spec.get("StreamEnabled"):
            await self._enable_stream()
            table = await self._wait_active()
            spec = table.get("StreamSpecification") or {}
        elif stream_view and spec.get("StreamViewType") != STREAM_VIEW_TYPE:
            raise InvalidArgumentError(
                f"lease table {self._table_name} has a DynamoDB stream of view type "
                f"{spec.get('StreamViewType')}; shardflow needs {STREAM_VIEW_TYPE}",
                operation="DescribeTable",
                code="StreamViewType",
            )
        enabled = bool(spec.get("StreamEnabled"))
        self.saw_stream(enabled)
        return TableStatus(
            name=self._table_name,
            created=created,
            billing_mode=(table.get("BillingModeSummary") or {}).get("BillingMode", "PROVISIONED"),
            stream_arn=table.get("LatestStreamArn") if enabled else None,
            stream_view_type=spec.get("StreamViewType") if enabled else None,
        )

    # --- reads -----------------------------------------------------------------------------------

    async def list_leases(self) -> list[Lease]:
        return (await self.scan_table()).leases

    async def scan_table(self) -> TableScan:
        params: dict[str, Any] = {"TableName": self._table_name, "ConsistentRead": True}
        if self._scan_page_size is not None:
            params["Limit"] = self._scan_page_size
        leases: list[Lease] = []
        found: list[Entity] = []
        earlier = self._scanned
        scanned: dict[str, tuple[Mapping[str, Any], Lease]] = {}
        while True:
            page = await self._call(
                "Scan",
                lambda p=dict(params): self._client.scan(**p),  # type: ignore[misc]
            )
            for item in page.get("Items", []):
                if not is_lease_item(item):
                    entity = entity_from_item(item)
                    if entity is not None:
                        found.append(entity)
                    continue
                key = item.get("leaseKey", {}).get("S")
                known = earlier.get(key) if key is not None else None
                if known is not None and known[0] == item:
                    # Unchanged: keep the item and lease of the earlier scan, and let this
                    # page's copy die young. Each scan's fresh copies (about 9 dicts a lease)
                    # lived until the next scan, long enough for the collector to move them
                    # to its oldest generation, whose full collections cost ~0.25 s of CPU at
                    # 1,000 leases (bench/consumer.py's scale part): an idle 1,000-lease
                    # heartbeat worker moved 8,174 objects there in 30 s, 4,977 with this.
                    lease = known[1]
                    scanned[key] = known
                else:
                    try:
                        lease = lease_from_item(item)
                    except MalformedLeaseError as exc:
                        log.warning("skipping lease item %s: %s", exc.lease_key, exc.reason)
                        continue
                    scanned[lease.lease_key] = (item, lease)
                leases.append(lease)
            last = page.get("LastEvaluatedKey")
            if not last:
                break
            params["ExclusiveStartKey"] = last
        self._scanned = scanned
        scan = TableScan.of(sorted(leases, key=lambda lease: lease.lease_key), found)
        self.saw_mode(scan.mode)
        return scan

    async def read_marks(self, heartbeat_keys: Sequence[str]) -> TableMarks | None:
        """One consistent BatchGetItem of the mode item and the heartbeats (None: more keys
        than one request takes, or DynamoDB left some unprocessed: the caller scans)."""
        keys = [MODE_KEY, *heartbeat_keys]
        if len(keys) > _BATCH_GET_KEYS:
            return None
        request = {
            self._table_name: {"Keys": [key_of(key) for key in keys], "ConsistentRead": True}
        }
        answer = await self._call(
            "BatchGetItem", lambda: self._client.batch_get_item(RequestItems=request)
        )
        if answer.get("UnprocessedKeys"):
            return None
        items = answer.get("Responses", {}).get(self._table_name, [])
        return marks_of(items, self)

    async def get(self, lease_key: str) -> Lease | None:
        answer = await self._call(
            "GetItem",
            lambda: self._client.get_item(
                TableName=self._table_name, Key=key_of(lease_key), ConsistentRead=True
            ),
        )
        item = answer.get("Item")
        if not item or not is_lease_item(item):
            return None
        return lease_from_item(item)

    # --- writes ----------------------------------------------------------------------------------

    def _request(self, write: LeaseWrite) -> Callable[[], Awaitable[Any]]:
        common: dict[str, Any] = {
            "TableName": self._table_name,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            **render(write.conditions, write.actions),
        }
        if write.kind == "update":
            return lambda: self._client.update_item(
                Key=key_of(write.lease_key), ReturnValues="ALL_NEW", **common
            )
        if write.kind == "put":
            return lambda: self._client.put_item(Item=write.item, **common)
        return lambda: self._client.delete_item(Key=key_of(write.lease_key), **common)

    async def _send(self, write: LeaseWrite) -> tuple[Any, int]:
        """Send ``write`` with the store's retries: (the answer, attempts made). A refused
        condition comes back as :class:`_Rejected`, an answer rather than a failure, so it is
        never retried."""
        request = self._request(write)
        attempts = 0

        async def attempt() -> Any:
            nonlocal attempts
            attempts += 1
            try:
                return await request()
            except ClientError as exc:
                if _error_code(exc) == "ConditionalCheckFailedException":
                    return _Rejected(exc.response.get("Item"))
                raise

        return await self._call(_OPERATION_OF[write.kind], attempt), attempts

    async def execute(self, write: LeaseWrite) -> Lease | None:
        answer, attempts = await self._send(write)
        if isinstance(answer, _Rejected):
            if answer.item is None:
                # No item in the refusal: gone, or a server that ignores
                # ReturnValuesOnConditionCheckFailure (dynalite, older DynamoDB Local). A
                # refusal must name the current owner (a handoff is told from a loss by it).
                current = await self.get(write.lease_key)
            else:
                current = _as_lease(answer.item)
            if attempts > 1 and write.already_applied(current):
                # An earlier attempt succeeded but its answer was lost (timeout, dropped
                # connection): the item shows our own write, as KCL's renew also checks.
                log.info("%s of %s had succeeded before a retry", write.operation, write.lease_key)
                return current
            raise LeaseConditionFailedError(write.operation, write.lease_key, current=current)
        if write.kind == "update":
            return lease_from_item(answer["Attributes"])
        if write.kind == "put":
            assert write.item is not None
            return lease_from_item(write.item)
        return None

    async def execute_entity(self, write: LeaseWrite) -> Item | None:
        answer, _ = await self._send(write)
        if isinstance(answer, _Rejected):
            current = answer.item
            if current is None:
                # A server that leaves the item out of a refusal (dynalite): read it.
                got = await self._call(
                    "GetItem",
                    lambda: self._client.get_item(
                        TableName=self._table_name, Key=key_of(write.lease_key), ConsistentRead=True
                    ),
                )
                current = got.get("Item")
            raise EntityConditionFailedError(write.operation, write.lease_key, current=current)
        if write.kind == "update":
            attributes: Item = answer["Attributes"]
            return attributes
        if write.kind == "put":
            assert write.item is not None
            return write.item
        return None
