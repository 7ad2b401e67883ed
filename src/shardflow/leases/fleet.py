"""This worker as a member of a KCL 3.x application's fleet (same lease table, other workers).

A KCL 3.x application leaves two tables beside its lease table: ``<app>-CoordinatorState``
(the leader lock, item ``Leader``, and the migration state, item ``Migration3.0``) and
``<app>-WorkerMetricStats`` (one item per worker). Its leader assigns leases only to workers
with a fresh item in the worker-metrics table and moves them by graceful handoff
(``leaseOwner := new, checkpointOwner := old``); the other workers never take or steal.

How shardflow takes part (the mode is logged when it changes and shown by
``Consumer.status().fleet_mode``):

- ``"standalone"``: no KCL 3.x tables (a shardflow-only or KCL 2.x fleet, or a 3.x fleet still
  in its 2.x-compatible client version): shardflow's own rules (take, steal or ask, hand off).
- ``"kcl3"``: KCL 3.x tables and at least one live KCL worker. shardflow publishes its worker
  metrics so the KCL leader assigns it leases, and **defers to that leader**: it takes free
  and expired leases (conditional writes make a race with the leader harmless) but never
  steals or asks for a live lease; leases handed to it start only once ``checkpointOwner`` is
  cleared, at the old owner's final checkpoint; a handoff away from it drains, checkpoints
  and clears ``checkpointOwner`` in one write; at shutdown it hands its leases to the live
  workers, KCL workers included, the same way.
- ``"kcl3-takeover"``: KCL 3.x tables but no live KCL worker: the fleet is all shardflow and
  runs shardflow's own balancing and handoff. It keeps publishing metrics, so a KCL worker
  that joins later finds it and its leader takes over the assignment again.

Why defer rather than take part in the leader lock: the KCL leader balances with state of its
own (throughput history, pending handoff timeouts) that a second implementation would have to
match exactly, and two balancers in one fleet fight. A KCL worker is "live" while its metrics
item is fresh (the leader's own rule: updated within two reporting periods).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from botocore.exceptions import BotoCoreError, ClientError

from shardflow.clock import Clock

log = logging.getLogger("shardflow.leases")

FleetMode = Literal["standalone", "kcl3", "kcl3-takeover"]

LEASE_OWNER_INDEX: Final = "LeaseOwnerToLeaseKeyIndex"
MIGRATION_KEY: Final = "Migration3.0"
#: Client versions in which KCL 3.x workers still balance KCL 2.x-style, each by itself.
_TWO_X_VERSIONS: Final = frozenset({"CLIENT_VERSION_2X", "CLIENT_VERSION_UPGRADE_FROM_2X"})
#: shardflow's mark on its own worker-metrics items (KCL ignores attributes it does not map).
SHARDFLOW_MARK: Final = "shardflowWorker"

REPORT_EVERY: Final = 20.0
"""Seconds between this worker's metrics writes (KCL: 30 s; the leader drops a worker after
two missed periods, 60 s)."""
WORKER_EXPIRY: Final = 60.0


@dataclass(frozen=True, slots=True)
class FleetTables:
    """The KCL 3.x tables of an application, named as KCL names them by default."""

    coordinator_state: str
    worker_metrics: str

    @classmethod
    def of(cls, lease_table: str) -> FleetTables:
        return cls(f"{lease_table}-CoordinatorState", f"{lease_table}-WorkerMetricStats")


def metrics_item(worker_id: str, now_epoch: float) -> dict[str, Any]:
    """This worker's worker-metrics item: a worker without platform metrics, as KCL writes one
    off EC2/ECS/EKS (the leader then balances it by lease throughput), plus shardflow's mark."""
    return {
        "wid": {"S": worker_id},
        "lut": {"N": str(int(now_epoch))},
        "sts": {"M": {}},
        "opr": {"M": {}},
        SHARDFLOW_MARK: {"BOOL": True},
    }


def live_kcl_workers(
    items: Sequence[Mapping[str, Any]], now_epoch: float, *, expiry: float = WORKER_EXPIRY
) -> frozenset[str]:
    """KCL workers (not shardflow's) whose metrics item was updated within ``expiry`` s."""
    live = set()
    for item in items:
        worker = item.get("wid", {}).get("S")
        updated = item.get("lut", {}).get("N")
        if worker is None or updated is None or SHARDFLOW_MARK in item:
            continue
        if float(updated) >= now_epoch - expiry:
            live.add(worker)
    return frozenset(live)


class KclFleet:
    """Detection of a KCL 3.x fleet, this worker's metrics in it, and its live KCL workers.

    ``client`` is the open aiobotocore DynamoDB client of the lease store.
    """

    def __init__(self, client: Any, lease_table: str, worker_id: str, *, clock: Clock) -> None:
        self._client = client
        self._lease_table = lease_table
        self._tables = FleetTables.of(lease_table)
        self._worker_id = worker_id
        self._clock = clock
        self.kcl3 = False
        """The application's tables are a KCL 3.x fleet's (in its 3.x client version)."""
        self.kcl_workers: frozenset[str] = frozenset()
        """Live KCL workers, as of the last :meth:`refresh`."""
        self._mode: FleetMode | None = None

    @property
    def mode(self) -> FleetMode:
        if not self.kcl3:
            return "standalone"
        return "kcl3" if self.kcl_workers else "kcl3-takeover"

    @property
    def defers(self) -> bool:
        """Whether a KCL leader assigns leases: take nothing live, ask for nothing."""
        return self.mode == "kcl3"

    async def detect(self) -> bool:
        """Look for the KCL 3.x tables; True if this is a KCL 3.x fleet (False if unsure)."""
        try:
            lease_table = await self._describe(self._lease_table)
            state = await self._describe(self._tables.coordinator_state)
            metrics = await self._describe(self._tables.worker_metrics)
        except (ClientError, BotoCoreError) as exc:
            log.warning("looking for KCL 3.x tables failed; running standalone: %s", exc)
            return False
        indexes = {
            index.get("IndexName")
            for index in (lease_table or {}).get("GlobalSecondaryIndexes", [])
        }
        found = state is not None and metrics is not None
        version = await self._client_version() if found else None
        self.kcl3 = found and version not in _TWO_X_VERSIONS
        log.info(
            "lease table %s: coordinator state %s, worker metrics %s, %s index %s, client "
            "version %s",
            self._lease_table,
            "found" if state is not None else "absent",
            "found" if metrics is not None else "absent",
            LEASE_OWNER_INDEX,
            "found" if LEASE_OWNER_INDEX in indexes else "absent",
            version or "unknown",
        )
        return self.kcl3

    async def report(self) -> None:
        """Publish this worker's metrics and re-read who else is live (one round)."""
        if not self.kcl3:
            return
        now = self._clock.wall()
        try:
            await self._client.put_item(
                TableName=self._tables.worker_metrics, Item=metrics_item(self._worker_id, now)
            )
            items = await self._scan(self._tables.worker_metrics)
        except (ClientError, BotoCoreError) as exc:
            log.warning("worker metrics of %s not updated: %s", self._worker_id, exc)
            return
        self.kcl_workers = live_kcl_workers(items, now)
        self._note_mode()

    async def withdraw(self) -> None:
        """Remove this worker's metrics item (at shutdown): the leader assigns it nothing more."""
        if not self.kcl3:
            return
        try:
            await self._client.delete_item(
                TableName=self._tables.worker_metrics, Key={"wid": {"S": self._worker_id}}
            )
        except (ClientError, BotoCoreError) as exc:
            log.warning("worker metrics of %s not removed: %s", self._worker_id, exc)

    def _note_mode(self) -> None:
        mode = self.mode
        if mode != self._mode:
            self._mode = mode
            workers = ", ".join(sorted(self.kcl_workers)) or "none"
            log.info(
                "worker %s runs in fleet mode %s (live KCL workers: %s)",
                self._worker_id,
                mode,
                workers,
            )

    async def _describe(self, table: str) -> dict[str, Any] | None:
        try:
            answer = await self._client.describe_table(TableName=table)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                return None
            raise
        described: dict[str, Any] = answer["Table"]
        return described

    async def _client_version(self) -> str | None:
        try:
            answer = await self._client.get_item(
                TableName=self._tables.coordinator_state,
                Key={"key": {"S": MIGRATION_KEY}},
                ConsistentRead=True,
            )
        except (ClientError, BotoCoreError):
            return None
        version = answer.get("Item", {}).get("cv", {}).get("S")
        return str(version) if version is not None else None

    async def _scan(self, table: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
        while True:
            page = await self._client.scan(**params)
            items += page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return items
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]
