"""Leases: which worker processes which shard, and how far it got, in KCL's lease table.

:class:`Lease` is one lease item; a :class:`LeaseStore` reads and conditionally writes them,
on DynamoDB (:class:`DynamoDBLeaseStore`, shared with KCL workers of the same application) or
in memory with the same semantics (:class:`InMemoryLeaseStore`). A write that finds the lease
changed raises :class:`~shardflow.leases.errors.LeaseConditionFailedError` with the lease as it is now.
"""

from shardflow.deprecation import renamed
from shardflow.errors import MalformedLeaseError
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.leases.keys import (
    StreamIdentifier,
    is_multi_stream_lease_key,
    multi_stream_lease_key,
    split_multi_stream_lease_key,
)
from shardflow.leases.memory import InMemoryLeaseStore, InMemoryLeaseTables
from shardflow.leases.model import Lease
from shardflow.leases.store import LeaseStore, LeaseStoreBase, TableStatus

__all__ = [
    "DynamoDBLeaseStore",
    "InMemoryLeaseStore",
    "InMemoryLeaseTables",
    "Lease",
    "LeaseConditionFailedError",
    "LeaseStore",
    "LeaseStoreBase",
    "MalformedLeaseError",
    "StreamIdentifier",
    "TableStatus",
    "is_multi_stream_lease_key",
    "multi_stream_lease_key",
    "split_multi_stream_lease_key",
]

__getattr__ = renamed(__name__, {"LeaseConditionFailed": "LeaseConditionFailedError"})
