"""The error a conditional lease write raises when the lease changed under it."""

from __future__ import annotations

from typing import Any

from shardflow.deprecation import renamed
from shardflow.errors import ConditionFailedError, ShardLeaseLostError
from shardflow.leases.model import Lease


class LeaseConditionFailedError(ConditionFailedError):
    """A conditional lease write found the lease changed: it is not what the caller thought.

    ``current`` is the lease as it is now, taken from the failed write's response (no extra
    read), or None if the item no longer exists (or is not a readable lease). ``operation`` is
    the lease operation that failed (``renew``, ``take``, ``checkpoint``, ...).
    """

    def __init__(self, operation: str, lease_key: str, *, current: Lease | None) -> None:
        self.lease_key = lease_key
        self.current = current
        if current is None:
            state = "it no longer exists"
        else:
            owner = current.lease_owner if current.lease_owner is not None else "nobody"
            state = f"now owned by {owner} with leaseCounter {current.lease_counter}"
            if current.checkpoint_owner is not None:
                state += f", handoff from {current.checkpoint_owner} pending"
        super().__init__(
            f"{operation} of lease {lease_key} failed: {state}",
            operation=operation,
            code="ConditionalCheckFailedException",
        )

    @property
    def current_owner(self) -> str | None:
        """The worker holding the lease now (the checkpoint owner during a handoff), if any."""
        return None if self.current is None else self.current.actual_owner

    def as_lease_lost(self) -> ShardLeaseLostError:
        """The same news as the consumer tells it: the shard's lease is lost to its current owner."""
        shard_id = self.current.shard_id if self.current is not None else self.lease_key
        return ShardLeaseLostError(shard_id, owner=self.current_owner)


class EntityConditionFailedError(ConditionFailedError):
    """A conditional write of one of shardflow's own lease-table items (a heartbeat, the mode)
    found the item changed. ``current`` is the item as it is now (None: no such item)."""

    def __init__(self, operation: str, key: str, *, current: dict[str, Any] | None) -> None:
        self.key = key
        self.current = current
        state = "it does not exist" if current is None else "it changed"
        super().__init__(
            f"{operation} of {key} failed: {state}",
            operation=operation,
            code="ConditionalCheckFailedException",
        )


__getattr__ = renamed(__name__, {"LeaseConditionFailed": "LeaseConditionFailedError"})
