"""An in-memory lease store with DynamoDB's semantics, for tests and single-process use.

It keeps items in DynamoDB's wire form and runs the very same write descriptions as the
DynamoDB store (:mod:`shardflow.leases.writes`), so conditions, counters, preserved extra
attributes and errors are the same. Several stores (one per simulated worker) share one
:class:`InMemoryLeaseTables`, as workers share one DynamoDB table.

For tests and simulations of whole fleets, the tables also offer what DynamoDB shows from
outside: every write as it happens (:meth:`InMemoryLeaseTables.watch`: who wrote what, landed or
refused, the lease before and after), the table's size (:meth:`InMemoryLeaseTables.size`), and
the table's stream of changes, read with :class:`InMemoryLeaseStreams` (the calls of a
``dynamodbstreams`` client), so that lease pick-up reads a stream in memory as it reads
DynamoDB's. Faults are injected per store (``fault=``; see
:class:`shardflow.testing.LeaseTableBrownout`).

Stored items are never changed in place (a write replaces the item), so a scan hands out the
leases parsed once per write, not once per read: 100 simulated workers scanning 10,000 leases
cost what one does.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from botocore.exceptions import ClientError

from shardflow.aws.backoff import retrying
from shardflow.backoff import Backoff
from shardflow.errors import InvalidArgumentError, MalformedLeaseError, ResourceNotFoundError
from shardflow.leases.entities import MODE_KEY, Entity, entity_from_item
from shardflow.leases.errors import EntityConditionFailedError, LeaseConditionFailedError
from shardflow.leases.model import (
    LEASE_KEY,
    AttributeValue,
    Item,
    Lease,
    ParsedItem,
    is_lease_item,
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

log = logging.getLogger("shardflow.leases")

MAX_ITEM_BYTES: Final = 400 * 1024


STREAM_RECORDS_KEPT: Final = 200_000
"""Changes an in-memory table stream keeps (DynamoDB keeps 24 hours); a reader further behind
gets ExpiredIteratorException and starts again at the latest change."""
_STREAM_PAGE: Final = 1_000  # records per GetRecords, as DynamoDB Streams
_STREAM_SHARD: Final = "shardId-00000001-memory"


@dataclass(frozen=True, slots=True)
class LeaseWriteSeen:
    """One conditional write as the in-memory table saw it (see :meth:`InMemoryLeaseTables.watch`).

    ``store`` is the store that sent it (one per simulated worker); ``before`` and ``after``
    the lease as it was and is (None: no such item, or not a lease); ``refused`` when its
    condition failed (nothing changed; ``after`` is then ``before``).
    """

    table: str
    store: InMemoryLeaseStore
    write: LeaseWrite
    before: Lease | None
    after: Lease | None
    refused: bool


WriteWatcher = Callable[[LeaseWriteSeen], None]


def _stream_record(sequence: int, event: str, key: str, old: Item | None, new: Item | None) -> Any:
    """A change as GetRecords returns it (made once, shared by every reader)."""
    change: dict[str, Any] = {"Keys": {LEASE_KEY: {"S": key}}}
    if old is not None:
        change["OldImage"] = old
    if new is not None:
        change["NewImage"] = new
    change["SequenceNumber"] = str(sequence)
    change["StreamViewType"] = "NEW_AND_OLD_IMAGES"
    return {
        "eventID": str(sequence),
        "eventName": event,
        "eventSource": "aws:dynamodb",
        "dynamodb": change,
    }


@dataclass
class _Table:
    items: dict[str, Item] = field(default_factory=dict)
    stream_view: bool = False
    parsed: dict[str, Lease | MalformedLeaseError | None] = field(default_factory=dict)
    """Per key, the item parsed once: a lease, a malformed lease, or None (not a lease)."""
    order: list[str] | None = None
    """The keys sorted (None: to sort again; a write of a new key or a delete resets it)."""
    bytes: int = 0
    sizes: dict[str, int] = field(default_factory=dict)
    changes: list[dict[str, Any]] = field(default_factory=list)
    """The stream's records kept, oldest first; the first has sequence ``first_sequence``."""
    first_sequence: int = 1
    next_sequence: int = 1

    def store(self, key: str, item: Item, size: int | None = None) -> Lease | None:
        """Keep ``item`` under ``key`` (replacing, never changing, what was there)."""
        old = self.items.get(key)
        if old is None:
            self.order = None
        self.items[key] = item
        self.parsed.pop(key, None)
        size = item_size(item) if size is None else size
        self.bytes += size - self.sizes.get(key, 0)
        self.sizes[key] = size
        found = self.lease(key)
        lease = found if isinstance(found, Lease) else None
        if self.stream_view:
            image = ParsedItem(item, lease) if lease is not None else item
            self._log("INSERT" if old is None else "MODIFY", key, old, image)
        return lease

    def remove(self, key: str) -> None:
        old = self.items.pop(key, None)
        if old is None:
            return
        self.order = None
        self.parsed.pop(key, None)
        self.bytes -= self.sizes.pop(key, 0)
        self._log("REMOVE", key, old, None)

    def lease(self, key: str) -> Lease | MalformedLeaseError | None:
        """The item under ``key`` parsed (cached until it is written again)."""
        if key in self.parsed:
            return self.parsed[key]
        item = self.items.get(key)
        found: Lease | MalformedLeaseError | None = None
        if item is not None and is_lease_item(item):
            try:
                found = lease_from_item(item)
            except MalformedLeaseError as exc:
                found = exc
        self.parsed[key] = found
        return found

    def sorted_keys(self) -> list[str]:
        if self.order is None:
            self.order = sorted(self.items)
        return self.order

    def _log(self, event: str, key: str, old: Item | None, new: Item | None) -> None:
        if not self.stream_view:
            return
        if not self.changes:
            self.first_sequence = self.next_sequence
        self.changes.append(_stream_record(self.next_sequence, event, key, old, new))
        self.next_sequence += 1
        if len(self.changes) > STREAM_RECORDS_KEPT:
            dropped = len(self.changes) - STREAM_RECORDS_KEPT // 2
            del self.changes[:dropped]
            self.first_sequence += dropped


class InMemoryLeaseTables:
    """The shared stand-in for DynamoDB: lease tables by name."""

    def __init__(self) -> None:
        self.tables: dict[str, _Table] = {}
        self._watchers: list[WriteWatcher] = []

    def items(self, table_name: str) -> dict[str, Item]:
        """The raw items of a table (a copy), for tests that inspect what was written."""
        return copy.deepcopy(self.tables[table_name].items)

    def put_raw(self, table_name: str, item: Item) -> None:
        """Store ``item`` as is (as another KCL version would have written it)."""
        self.tables[table_name].store(item[LEASE_KEY]["S"], copy.deepcopy(item))

    def size(self, table_name: str) -> tuple[int, int]:
        """(items, bytes) of a table, bytes as DynamoDB counts an item's size (roughly)."""
        table = self.tables[table_name]
        return len(table.items), table.bytes

    def watch(self, watcher: WriteWatcher) -> Callable[[], None]:
        """Call ``watcher`` with every conditional write to any table, landed or refused, at
        the moment it is applied (see :class:`LeaseWriteSeen`); returns a function that stops
        watching. For checks a test makes from the table's side (who owned a lease when), not
        from what a worker believes."""
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher)

    def _seen(self, seen: LeaseWriteSeen) -> None:
        for watcher in self._watchers:
            watcher(seen)


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
    # Values are replaced, never changed in place: a shallow copy leaves ``item`` untouched.
    result = dict(item)
    for action in actions:
        if isinstance(action, Put):
            result[action.attribute] = _copied(action.value)
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


def _copied(value: AttributeValue) -> AttributeValue:
    """A copy of one attribute value (its list of set members too)."""
    return {kind: list(raw) if isinstance(raw, list) else raw for kind, raw in value.items()}


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


def _as_lease(table: _Table, key: str) -> Lease | None:
    found = table.lease(key)
    return found if isinstance(found, Lease) else None


# --- the store ------------------------------------------------------------------------------------


class InMemoryLeaseStore(LeaseStoreBase):
    """A :class:`~shardflow.leases.store.LeaseStore` kept in memory.

    ``tables`` is shared between the stores of simulated workers. The table exists only after
    :meth:`ensure_table` (or with ``create_table=True``), as in DynamoDB. ``fault`` is called
    with the operation name before every call; tests raise errors from it (e.g. a
    :class:`~shardflow.errors.ThrottledError`) to see how callers cope. A fault is raised to
    the caller at once, unless ``backoff`` is given: then retryable ones are retried as
    :class:`~shardflow.leases.dynamodb.DynamoDBLeaseStore` retries DynamoDB's failures (with
    its ``LEASE_BACKOFF``, a store that behaves as the DynamoDB one does under a brownout:
    what ``bench/simulate.py`` needs), the pauses drawn from ``rng``.
    """

    def __init__(
        self,
        table_name: str,
        *,
        tables: InMemoryLeaseTables | None = None,
        create_table: bool = False,
        fault: Callable[[str], None] | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(table_name)
        self.tables = tables if tables is not None else InMemoryLeaseTables()
        self._fault = fault
        self._backoff = backoff
        self._rng = rng
        if create_table:
            self.tables.tables.setdefault(table_name, _Table())

    async def _answered(self, operation: str) -> None:
        """The yield every call makes (a real store awaits its answer there; so does this one,
        for fair races), then the injected fault, if any: raised, or retried per ``backoff``.
        Nothing yields between the return and the caller's next line: a write stays atomic."""
        fault = self._fault
        if fault is None or self._backoff is None:
            await asyncio.sleep(0)
            if fault is not None:
                fault(operation)
            return

        async def attempt() -> None:
            await asyncio.sleep(0)
            fault(operation)

        await retrying(attempt, operation=operation, backoff=self._backoff, rng=self._rng)

    def _table(self, operation: str) -> _Table:
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
        await self._answered("CreateTable")
        table = self.tables.tables.get(self._table_name)
        created = table is None
        if table is None:
            table = self.tables.tables[self._table_name] = _Table()
        table.stream_view = table.stream_view or stream_view or (created and stream_if_created)
        self.saw_stream(table.stream_view)
        return TableStatus(
            name=self._table_name,
            created=created,
            billing_mode="PAY_PER_REQUEST",
            stream_arn=stream_arn_of(self._table_name) if table.stream_view else None,
            stream_view_type="NEW_AND_OLD_IMAGES" if table.stream_view else None,
        )

    async def list_leases(self) -> list[Lease]:
        await self._answered("Scan")
        table = self._table("Scan")
        leases = []
        for key in table.sorted_keys():
            found = table.lease(key)
            if isinstance(found, Lease):
                leases.append(found)
            elif found is not None:
                log.warning("skipping lease item %s: %s", key, found.reason)
        return leases

    async def scan_table(self) -> TableScan:
        await self._answered("Scan")
        table = self._table("Scan")
        leases = []
        found: list[Entity] = []
        for key in table.sorted_keys():
            lease = table.lease(key)
            if isinstance(lease, Lease):
                leases.append(lease)
            elif lease is not None:
                log.warning("skipping lease item %s: %s", key, lease.reason)
            else:
                entity = entity_from_item(table.items[key])
                if entity is not None:
                    found.append(entity)
        scan = TableScan.of(leases, found)
        self.saw_mode(scan.mode)
        return scan

    async def read_marks(self, heartbeat_keys: Sequence[str]) -> TableMarks | None:
        await self._answered("BatchGetItem")
        table = self._table("BatchGetItem")
        keys = [MODE_KEY, *heartbeat_keys]
        return marks_of(
            (copy.deepcopy(table.items[key]) for key in keys if key in table.items), self
        )

    async def execute_entity(self, write: LeaseWrite) -> Item | None:
        operation = {"update": "UpdateItem", "put": "PutItem", "delete": "DeleteItem"}[write.kind]
        await self._answered(operation)
        table = self._table(operation)
        key = write.lease_key
        old = table.items.get(key)
        if not all(holds(condition, old) for condition in write.conditions):
            self.tables._seen(LeaseWriteSeen(self._table_name, self, write, None, None, True))
            raise EntityConditionFailedError(
                write.operation, key, current=copy.deepcopy(old) if old is not None else None
            )
        if write.kind == "delete":
            table.remove(key)
            self.tables._seen(LeaseWriteSeen(self._table_name, self, write, None, None, False))
            return None
        if write.kind == "put":
            assert write.item is not None
            new = copy.deepcopy(write.item)
        else:
            new = apply(write.actions, old if old is not None else {LEASE_KEY: {"S": key}})
        table.store(key, new)
        self.tables._seen(LeaseWriteSeen(self._table_name, self, write, None, None, False))
        return copy.deepcopy(new)

    async def get(self, lease_key: str) -> Lease | None:
        await self._answered("GetItem")
        table = self._table("GetItem")
        if lease_key not in table.items:
            return None
        found = table.lease(lease_key)
        if isinstance(found, MalformedLeaseError):
            raise found
        return found

    async def execute(self, write: LeaseWrite) -> Lease | None:
        operation = {"update": "UpdateItem", "put": "PutItem", "delete": "DeleteItem"}[write.kind]
        await self._answered(operation)
        table = self._table(operation)
        # Between the yield above and here nothing else runs: the write is atomic, as in DynamoDB.
        key = write.lease_key
        old = table.items.get(key)
        before = _as_lease(table, key)
        if not all(holds(condition, old) for condition in write.conditions):
            self.tables._seen(LeaseWriteSeen(self._table_name, self, write, before, before, True))
            raise LeaseConditionFailedError(write.operation, key, current=before)
        if write.kind == "delete":
            table.remove(key)
            self.tables._seen(LeaseWriteSeen(self._table_name, self, write, before, None, False))
            return None
        if write.kind == "put":
            assert write.item is not None
            new = copy.deepcopy(write.item)
        else:
            base = old if old is not None else {LEASE_KEY: {"S": key}}
            new = apply(write.actions, base)
        size = item_size(new)
        if size > MAX_ITEM_BYTES:
            raise InvalidArgumentError(
                "Item size has exceeded the maximum allowed size",
                operation=operation,
                code="ValidationException",
            )
        after = table.store(key, new, size)
        self.tables._seen(LeaseWriteSeen(self._table_name, self, write, before, after, False))
        return after if after is not None else lease_from_item(new)  # raises: not a lease


# --- the table's stream ---------------------------------------------------------------------------


def stream_arn_of(table_name: str) -> str:
    """The ARN an in-memory table's stream goes by (DynamoDB's form, region ``memory``)."""
    return f"arn:aws:dynamodb:memory:000000000000:table/{table_name}/stream/memory"


def _stream_error(code: str, message: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


class InMemoryLeaseStreams:
    """The lease tables' streams (NEW_AND_OLD_IMAGES), read with the calls of an aiobotocore
    ``dynamodbstreams`` client: ``describe_stream``, ``get_shard_iterator``, ``get_records``.

    Pass it as ``lease_streams`` to the coordinator (or the consumer's clients) of a worker
    whose store is an :class:`InMemoryLeaseStore` on the same ``tables``: lease pick-up then
    reads the stream as it reads DynamoDB's. One stream shard per table, never closed; up to
    1,000 records per call; the images are the stored items (do not change them). ``fault``
    is called with the operation name before every call, as the store's. ``calls`` counts the
    calls by operation.
    """

    def __init__(
        self, tables: InMemoryLeaseTables, *, fault: Callable[[str], None] | None = None
    ) -> None:
        self._tables = tables
        self._fault = fault
        self.calls: dict[str, int] = {}

    def _enter(self, operation: str) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        if self._fault is not None:
            self._fault(operation)

    def _stream_table(self, arn: str, operation: str) -> _Table:
        prefix, _, rest = arn.partition(":table/")
        name = rest.split("/stream/")[0]
        table = self._tables.tables.get(name)
        if not prefix.startswith("arn:") or table is None or not table.stream_view:
            raise _stream_error("ResourceNotFoundException", f"no stream {arn}", operation)
        return table

    async def describe_stream(self, **params: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        self._enter("DescribeStream")
        arn = params["StreamArn"]
        self._stream_table(arn, "DescribeStream")
        return {
            "StreamDescription": {
                "StreamArn": arn,
                "StreamStatus": "ENABLED",
                "StreamViewType": "NEW_AND_OLD_IMAGES",
                "Shards": [
                    {
                        "ShardId": _STREAM_SHARD,
                        "SequenceNumberRange": {"StartingSequenceNumber": "1"},
                    }
                ],
            }
        }

    async def get_shard_iterator(self, **params: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        self._enter("GetShardIterator")
        arn = params["StreamArn"]
        table = self._stream_table(arn, "GetShardIterator")
        kind = params.get("ShardIteratorType", "LATEST")
        if kind == "LATEST":
            position = table.next_sequence
        elif kind == "TRIM_HORIZON":
            position = table.first_sequence if table.changes else table.next_sequence
        else:
            number = int(params["SequenceNumber"])
            position = number + 1 if kind == "AFTER_SEQUENCE_NUMBER" else number
        return {"ShardIterator": f"{position}|{arn}"}

    async def get_records(self, **params: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        self._enter("GetRecords")
        position_text, _, arn = params["ShardIterator"].partition("|")
        table = self._stream_table(arn, "GetRecords")
        position = int(position_text)
        changes = table.changes
        first = table.first_sequence if changes else table.next_sequence
        if position < first:
            raise _stream_error(
                "ExpiredIteratorException", "the iterator is behind the stream", "GetRecords"
            )
        start = position - first
        limit = min(int(params.get("Limit", _STREAM_PAGE)), _STREAM_PAGE)
        records = changes[start : start + limit]
        following = position + len(records)
        return {"Records": records, "NextShardIterator": f"{following}|{arn}"}
