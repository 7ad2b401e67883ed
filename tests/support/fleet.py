"""In-process consumers of one application, each a worker of the fleet that shares its lease
table, for the tests that move leases between workers over HTTP (moto's server)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from shardflow.aws import AwsSettings
from shardflow.consumer import Consumer, ConsumerSettings
from shardflow.events import DiagnosticEvent, LeaseAcquired, LeaseLost, LeaseReleased


class FleetWorker:
    """One in-process consumer, worker ``name`` (``settings`` with that ``worker_id``), that
    records its diagnostic events; a subclass handles the records in :meth:`handle` (one
    record, or with ``batch`` a list) and may append their data to :attr:`handled`."""

    def __init__(
        self,
        url: str,
        stream: str,
        app: str,
        name: str,
        settings: ConsumerSettings,
        *,
        batch: bool = False,
    ) -> None:
        self.name = name
        self.batch = batch
        self.handled: list[bytes] = []
        self.events: list[DiagnosticEvent] = []
        self.consumer = Consumer(
            stream,
            app,
            settings=replace(settings, worker_id=name),
            aws=AwsSettings(endpoint_url=url),
            on_event=self.events.append,
        )
        self._run: asyncio.Task[None] | None = None

    async def handle(self, arg: Any) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._run = asyncio.create_task(self.consumer.consume(self.handle, batch=self.batch))

    async def stop(self) -> None:
        await self.consumer.close()
        if self._run is not None:
            await self._run

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def owned(self) -> int:
        """Leases held now, by this worker's events."""
        ended = len(self.of(LeaseLost)) + len(self.of(LeaseReleased))
        return len(self.of(LeaseAcquired)) - ended
