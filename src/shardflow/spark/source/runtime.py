"""Running shardflow's asyncio code from Spark's synchronous calls, one event loop per thread.

Spark calls the source from plain functions (``latestOffset`` on the driver, ``read`` in
executor Python workers, which are reused across tasks). Each thread keeps one event loop and
one open Kinesis client per connection, created on first use (never pickled), so a reused
worker does not pay for a new client and connection pool on every task.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from shardflow.aws.clients import ClientFactory, Service
from shardflow.aws.settings import AwsSettings
from shardflow.fetch.fanout import fanout_client

T = TypeVar("T")


class LoopRunner:
    """An event loop of this thread, with Kinesis clients kept open on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._stack = AsyncExitStack()
        self._clients: dict[tuple[AwsSettings, bool], Any] = {}
        self._service_clients: dict[tuple[Service, AwsSettings], Any] = {}

    def run(self, work: Awaitable[T]) -> T:
        return self.loop.run_until_complete(work)

    def kinesis(self, settings: AwsSettings, *, fanout: bool = False) -> Any:
        """An open aiobotocore Kinesis client for ``settings`` (one for subscriptions if asked)."""
        key = (settings, fanout)
        client = self._clients.get(key)
        if client is None:
            factory = ClientFactory(settings)
            opening = (
                fanout_client(factory, shards=16) if fanout else factory.kinesis(own_requests=True)
            )
            client = self.run(self._stack.enter_async_context(opening))
            self._clients[key] = client
        return client

    def client(self, service: Service, settings: AwsSettings) -> Any:
        """An open aiobotocore client of ``service`` (the metadata stores: S3, DynamoDB)."""
        key = (service, settings)
        client = self._service_clients.get(key)
        if client is None:
            opening = ClientFactory(settings).client(service)
            client = self.run(self._stack.enter_async_context(opening))
            self._service_clients[key] = client
        return client

    def iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """A synchronous iterator over an async one, closed when the caller stops early."""
        try:
            while True:
                try:
                    yield self.run(anext(items))
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:
                self.run(close())


_local = threading.local()


def runner() -> LoopRunner:
    """This thread's runner, made on first use."""
    current: LoopRunner | None = getattr(_local, "runner", None)
    if current is None:
        current = LoopRunner()
        _local.runner = current
    return current
