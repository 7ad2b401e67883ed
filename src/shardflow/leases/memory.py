"""An in-memory lease store with DynamoDB's semantics, for tests and single-process use.

It keeps items in DynamoDB's wire form and runs the very same write descriptions as the
DynamoDB store (:mod:`shardflow.leases.writes`), so conditions, counters, preserved extra
attributes and errors are the same. Several stores (one per simulated worker) share one
:class:`InMemoryLeaseTables`, as workers share one DynamoDB table.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final

from shardflow.errors import InvalidArgumentError, MalformedLeaseError, ResourceNotFoundError
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.leases.model import (
    LEASE_KEY,
    AttributeValue,
    Item,
    Lease,
    is_lease_item,
    lease_from_item,
)
from shardflow.leases.store import LeaseStoreBase, TableStatus
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

log = logging.getLogger("shardflow.leases")

MAX_ITEM_BYTES: Final = 400 * 1024


@dataclass
class _Table:
    items: dict[str, Item] = field(default_factory=dict)
    stream_view: bool = False


class InMemoryLeaseTables:
    """The shared stand-in for DynamoDB: lease tables by name."""

    def __init__(self) -> None:
        self.tables: dict[str, _Table] = {}

    def items(self, table_name: str) -> dict[str, Item]:
        """The raw items of a table (a copy), for tests that inspect what was written."""
        return copy.deepcopy(self.tables[table_name].items)

    def put_raw(self, table_name: str, item: Item) -> None:
        """Store ``item`` as is (as another KCL version would have written it)."""
        self.tables[table_name].items[item[LEASE_KEY]["S"]] = copy.deepcopy(item)


# --- DynamoDB semantics on wire-form items -----------------------------------------------------


def _equal(found: AttributeValue, expected: AttributeValue) -> bool:
    ((kind, want),) = expected.items()
    if kind not in found:
        return False
    have = found[kind]
    if kind == "N":
        return Decimal(have) == Decimal(want)
    if kind in ("SS", "NS", "BS"):
        return set(have) == set(want)
    return bool(have == want)


def holds(condition: Condition, item: Item | None) -> bool:
    """Whether ``condition`` holds for ``item`` (None = no such item), as DynamoDB judges it."""
    value = None if item is None else item.get(condition.attribute)
    if isinstance(condition, Absent):
        return value is None
    if isinstance(condition, Exists):
        return value is not None
    if isinstance(condition, Equals):
        return value is not None and _equal(value, condition.value)
    raise TypeError(f"unknown condition {condition!r}")


def apply(actions: tuple[Action, ...], item: Item) -> Item:
    """A new item: ``item`` changed by ``actions``."""
    result = copy.deepcopy(item)
    for action in actions:
        if isinstance(action, Put):
            result[action.attribute] = copy.deepcopy(action.value)
        elif isinstance(action, Remove):
            result.pop(action.attribute, None)
        elif isinstance(action, Add):
            current = result.get(action.attribute, {"N": "0"})
            if "N" not in current:
                raise InvalidArgumentError(
                    "An operand in the update expression has an incorrect data type",
                    operation="UpdateItem",
                    code="ValidationException",
                )
            result[action.attribute] = {"N": str(Decimal(current["N"]) + action.amount)}
        else:
            raise TypeError(f"unknown action {action!r}")
    return result


def item_size(item: Item) -> int:
    """Roughly DynamoDB's size of an item: names plus values in bytes."""

    def value_size(value: AttributeValue) -> int:
        ((kind, raw),) = value.items()
        if kind == "S":
            return len(raw.encode())
        if kind == "B":
            return len(raw)
        if kind == "N":
            return len(raw) // 2 + 1
        if kind in ("SS", "NS", "BS"):
            return sum(value_size({kind[0]: member}) for member in raw)
        return 1

    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def _as_lease(item: Item | None) -> Lease | None:
    if item is None or not is_lease_item(item):
        return None
    try:
        return lease_from_item(item)
    except MalformedLeaseError:
        return None


# --- the store ------------------------------------------------------------------------------------


class InMemoryLeaseStore(LeaseStoreBase):
    """A :class:`~shardflow.leases.store.LeaseStore` kept in memory.

    ``tables`` is shared between the stores of simulated workers. The table exists only after
    :meth:`ensure_table` (or with ``create_table=True``), as in DynamoDB. ``fault`` is called
    with the operation name before every call; tests raise errors from it (e.g. a
    :class:`~shardflow.errors.ThrottledError`) to see how callers cope.
    """

    def __init__(
        self,
        table_name: str,
        *,
        tables: InMemoryLeaseTables | None = None,
        create_table: bool = False,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(table_name)
        self.tables = tables if tables is not None else InMemoryLeaseTables()
        self._fault = fault
        if create_table:
            self.tables.tables.setdefault(table_name, _Table())

    def _table(self, operation: str) -> _Table:
        if self._fault is not None:
            self._fault(operation)
        table = self.tables.tables.get(self._table_name)
        if table is None:
            raise ResourceNotFoundError(
                "Requested resource not found",
                operation=operation,
                code="ResourceNotFoundException",
            )
        return table

    async def ensure_table(
        self, *, stream_view: bool = False, stream_if_created: bool = False
    ) -> TableStatus:
        await asyncio.sleep(0)
        if self._fault is not None:
            self._fault("CreateTable")
        table = self.tables.tables.get(self._table_name)
        created = table is None
        if table is None:
            table = self.tables.tables[self._table_name] = _Table()
        table.stream_view = table.stream_view or stream_view or (created and stream_if_created)
        return TableStatus(
            name=self._table_name,
            created=created,
            billing_mode="PAY_PER_REQUEST",
            stream_arn=f"memory://{self._table_name}/stream" if table.stream_view else None,
            stream_view_type="NEW_AND_OLD_IMAGES" if table.stream_view else None,
        )

    async def list_leases(self) -> list[Lease]:
        await asyncio.sleep(0)  # a real store yields here; so does this one, for fair races
        leases = []
        for key, item in sorted(self._table("Scan").items.items()):
            if not is_lease_item(item):
                continue
            try:
                leases.append(lease_from_item(item))
            except MalformedLeaseError as exc:
                log.warning("skipping lease item %s: %s", key, exc.reason)
        return leases

    async def get(self, lease_key: str) -> Lease | None:
        await asyncio.sleep(0)
        item = self._table("GetItem").items.get(lease_key)
        if item is None or not is_lease_item(item):
            return None
        return lease_from_item(copy.deepcopy(item))

    async def execute(self, write: LeaseWrite) -> Lease | None:
        await asyncio.sleep(0)
        operation = {"update": "UpdateItem", "put": "PutItem", "delete": "DeleteItem"}[write.kind]
        items = self._table(operation).items
        # Between the yield above and here nothing else runs: the write is atomic, as in DynamoDB.
        old = items.get(write.lease_key)
        if not all(holds(condition, old) for condition in write.conditions):
            raise LeaseConditionFailedError(
                write.operation, write.lease_key, current=_as_lease(old)
            )
        if write.kind == "delete":
            items.pop(write.lease_key, None)
            return None
        if write.kind == "put":
            assert write.item is not None
            new = copy.deepcopy(write.item)
        else:
            base = old if old is not None else {LEASE_KEY: {"S": write.lease_key}}
            new = apply(write.actions, base)
        if item_size(new) > MAX_ITEM_BYTES:
            raise InvalidArgumentError(
                "Item size has exceeded the maximum allowed size",
                operation=operation,
                code="ValidationException",
            )
        items[write.lease_key] = new
        return lease_from_item(copy.deepcopy(new))
