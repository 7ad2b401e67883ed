"""A lease-table brownout on demand, for the in-memory lease store and its stream.

DynamoDB has bad minutes: throttling, 500s, a region's hiccup. :class:`LeaseTableBrownout` is
the ``fault`` hook of :class:`~shardflow.leases.InMemoryLeaseStore` (and of
:class:`~shardflow.leases.memory.InMemoryLeaseStreams`) that makes them answer errors while it
is on, for a fraction of the calls or all of them, as DynamoDB would after the SDK's own
retries gave up::

    brownout = LeaseTableBrownout(seed=7)
    store = InMemoryLeaseStore("app", tables=tables, fault=brownout)
    brownout.start(0.5)            # half of the calls fail from now on
    ...
    brownout.start(1.0, error="throttled", operations={"UpdateItem"})  # every write throttled
    brownout.stop()                # the table answers again
    brownout.failed                # calls failed so far, by operation

One brownout may serve every store of a simulated fleet (a table-wide outage) or one store
only (one worker cut off). Every failure is an :class:`~shardflow.errors.AwsError` the stores'
callers already handle: :class:`~shardflow.errors.TransientError` (HTTP 500,
``InternalServerError``) or :class:`~shardflow.errors.ThrottledError`
(``ProvisionedThroughputExceededException``).
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Literal

from shardflow.errors import AwsError, ThrottledError, TransientError

BrownoutError = Literal["unavailable", "throttled"]


class LeaseTableBrownout:
    """The ``fault`` hook of an in-memory lease store: errors while on (see the module doc)."""

    def __init__(self, *, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._fraction = 0.0
        self._error: BrownoutError = "unavailable"
        self._operations: frozenset[str] | None = None
        self.failed: dict[str, int] = {}
        """Calls failed so far, by operation name."""

    @property
    def active(self) -> bool:
        return self._fraction > 0.0

    def start(
        self,
        fraction: float = 1.0,
        *,
        error: BrownoutError = "unavailable",
        operations: Collection[str] | None = None,
    ) -> None:
        """From now on fail ``fraction`` (0 < f <= 1) of the calls, each drawn at random, with
        ``error``; only calls of ``operations`` (e.g. ``{"UpdateItem", "Scan"}``) if given."""
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        if error not in ("unavailable", "throttled"):
            raise ValueError(f"error must be 'unavailable' or 'throttled', got {error!r}")
        self._fraction = fraction
        self._error = error
        self._operations = frozenset(operations) if operations is not None else None

    def stop(self) -> None:
        """The table answers every call again."""
        self._fraction = 0.0

    def __call__(self, operation: str) -> None:
        if self._fraction <= 0.0:
            return
        if self._operations is not None and operation not in self._operations:
            return
        if self._fraction < 1.0 and self._rng.random() >= self._fraction:
            return
        self.failed[operation] = self.failed.get(operation, 0) + 1
        raise self._failure(operation)

    def _failure(self, operation: str) -> AwsError:
        if self._error == "throttled":
            return ThrottledError(
                "The level of configured provisioned throughput for the table was exceeded",
                operation=operation,
                code="ProvisionedThroughputExceededException",
                status=400,
            )
        return TransientError(
            "Internal server error (a lease-table brownout)",
            operation=operation,
            code="InternalServerError",
            status=500,
        )
