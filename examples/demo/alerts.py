"""The alert desk: a shardflow consumer (leases in DynamoDB) reading the alerts Spark publishes.

It runs on its own event loop in a thread and counts each alert by order id, so the pipeline
can check that every large order became exactly one alert.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections import Counter
from typing import Any

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.consumer import CheckpointSettings, ConsumedRecord, Consumer, ConsumerSettings
from shardflow.fetch.polling import Polling
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.settings import LeaseSettings

# Quick hand-overs for a short demo: leases are taken within a second of start.
SETTINGS = ConsumerSettings(
    leases=LeaseSettings(failover_time=3.0, take_interval=0.5, renew_interval=1.0),
    fetch=Polling(idle_time=0.25),
    checkpoint=CheckpointSettings(every_n=50, interval=1.0),
    drain_timeout=5.0,
)


class AlertDesk:
    """Consumes ``stream`` as application ``application`` until :meth:`stop`."""

    def __init__(
        self, stream: str, application: str, *, kinesis: AwsSettings, dynamodb: AwsSettings
    ) -> None:
        self.stream = stream
        self.application = application
        self.kinesis = kinesis
        self.dynamodb = dynamodb
        self.by_order: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: Consumer | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-alert-desk", daemon=True)

    @property
    def consumed(self) -> int:
        with self._lock:
            return sum(self.by_order.values())

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self.by_order)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop gracefully (final checkpoints, leases released) and wait for the thread."""
        loop, consumer = self._loop, self._consumer
        if loop is not None and consumer is not None and self._thread.is_alive():
            future = asyncio.run_coroutine_threadsafe(consumer.close(), loop)
            # The loop may have ended already, or the stop took too long: joined below.
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                future.result(timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            asyncio.run(self._consume())
        except BaseException as exc:  # reported by the pipeline
            self.error = exc
        finally:
            self._ready.set()

    async def _consume(self) -> None:
        async with ClientFactory(self.dynamodb).dynamodb() as dynamodb:
            store = DynamoDBLeaseStore(dynamodb, self.application)
            consumer = Consumer(
                self.stream,
                self.application,
                settings=SETTINGS,
                aws=self.kinesis,
                lease_store=store,
            )
            self._consumer = consumer
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            await consumer.consume(self._handle)

    async def _handle(self, record: ConsumedRecord[Any]) -> None:
        alert = json.loads(record.data)
        with self._lock:
            self.by_order[str(alert["order_id"])] += 1
