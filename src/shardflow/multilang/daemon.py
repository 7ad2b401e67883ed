"""The MultiLangDaemon's job on shardflow's consumer: a record processor per shard lease.

::

    daemon = MultiLangDaemon(load_config("app.properties"))
    await daemon.run()          # until daemon.request_stop() (SIGTERM, Ctrl-C in the CLI)

Under it a :class:`~shardflow.consumer.Consumer` holds the leases (the KCL's lease table,
planned handoff, fetching by polling or enhanced fan-out); every shard it comes to own is
driven by a :class:`~shardflow.multilang.shard.ShardDriver` in a task of its own, so that a
processor's failure stops nothing else. A stop asks each processor to checkpoint
(``shutdownRequested``) within ``shutdownGraceMillis`` before the leases are handed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

from shardflow.aws.clients import ClientFactory
from shardflow.consumer import ConsumedRecord, Consumer, ShardSession
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.store import LeaseStore
from shardflow.multilang.config import MultiLangConfig
from shardflow.multilang.errors import PropertiesError
from shardflow.multilang.shard import DriverSettings, ShardDriver

log = logging.getLogger("shardflow.multilang")


def require_executable(command: tuple[str, ...]) -> None:
    """Raise PropertiesError unless ``command[0]`` names an executable file, found as the
    processor's start will find it (a path with a slash from the working directory, a bare
    name on ``PATH``)."""
    program = command[0] if command else ""
    found = program if "/" in program and os.access(program, os.X_OK) else shutil.which(program)
    if not found or not os.path.isfile(found):
        raise PropertiesError(
            f"the record processor {program!r} is not an executable file"
            + ("" if "/" in program else " on PATH"),
            key="executableName",
        )


class MultiLangDaemon:
    """Runs ``config``'s record processors over the stream's shards (see the module doc)."""

    def __init__(self, config: MultiLangConfig) -> None:
        self.config = config
        self.settings = DriverSettings(
            command=config.command,
            response_timeout=config.response_timeout,
            shutdown_grace=config.shutdown_grace,
            empty_batches=config.empty_batches,
            idle_time=config.idle_time,
        )
        self._stopping = asyncio.Event()
        self._consumer: Consumer | None = None
        self._drivers: set[asyncio.Task[None]] = set()
        # Shard id -> its session now (a shard taken again replaces its old session).
        self._sessions: dict[str, ShardSession] = {}

    @property
    def worker_id(self) -> str | None:
        return None if self._consumer is None else self._consumer.worker_id

    def request_stop(self) -> None:
        """Stop gracefully: processors are asked to checkpoint, leases handed over. On the
        daemon's event loop."""
        self._stopping.set()
        if self._consumer is not None:
            self._consumer.request_stop()

    async def run(self) -> None:
        """Process the stream until :meth:`request_stop`; raises what stops the consumer, and
        :class:`~shardflow.multilang.errors.PropertiesError` at once when the processor's
        executable cannot be found (the KCL would fail at its first lease)."""
        config = self.config
        require_executable(config.command)
        kinesis_clients = ClientFactory(config.kinesis_aws())
        async with self._lease_store() as store:
            consumer = Consumer(
                config.stream,
                config.application,
                settings=config.consumer_settings(),
                clients=kinesis_clients,
                lease_store=store,
            )
            self._consumer = consumer
            if self._stopping.is_set():
                consumer.request_stop()

            async def shard_ended(session: ShardSession, after: ConsumedRecord[Any] | None) -> bool:
                return session.shard_ended

            log.info(
                "multilang: stream %s, application %s, worker %s, processor %s",
                config.stream,
                config.application,
                consumer.worker_id,
                " ".join(config.command),
            )
            sessions = consumer.shards()
            try:
                async for session in sessions:
                    self._sessions[session.shard_id] = session
                    driver = ShardDriver(
                        session,
                        self.settings,
                        stopping=self._stopping,
                        lag_of=self._lag_of,
                        shard_ended=shard_ended,
                    )
                    task = asyncio.create_task(
                        driver.run(), name=f"shardflow-multilang-{session.shard_id}"
                    )
                    self._drivers.add(task)
                    task.add_done_callback(self._drivers.discard)
            finally:
                self._stopping.set()
                close = getattr(sessions, "aclose", None)
                if close is not None:
                    await close()  # stops the consumer (a generator left early)
                await self._wait_drivers()

    async def _wait_drivers(self) -> None:
        """Let every driver say its last word to its processor; bounded by the grace."""
        drivers = set(self._drivers)
        if not drivers:
            return
        _, late = await asyncio.wait(drivers, timeout=self.config.shutdown_grace + 10.0)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def _lease_store(self) -> AsyncIterator[LeaseStore | None]:
        """The lease table the properties name: the consumer's own unless it is another table
        or another endpoint than the stream's."""
        config = self.config
        if (
            config.table_name == config.application
            and config.dynamodb_aws() == config.kinesis_aws()
        ):
            yield None
            return
        async with ClientFactory(config.dynamodb_aws()).dynamodb(own_requests=True) as dynamodb:
            yield DynamoDBLeaseStore(dynamodb, config.table_name, streams=[config.stream])

    def _lag_of(self, shard_id: str) -> int | None:
        """millisBehindLatest of the shard as last fetched."""
        session = self._sessions.get(shard_id)
        return None if session is None else session.millis_behind_latest
