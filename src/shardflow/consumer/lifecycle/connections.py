"""What a running consumer is connected to: Kinesis, the lease table, fan-out registrations.

:meth:`Connections.open` opens whatever the consumer was not handed (clients from the AWS
settings, the DynamoDB lease table named after the application) and, for enhanced fan-out,
registers the stream consumers. It then hands out per-shard fetcher factories and shard
hash-key ranges.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

from shardflow.aws.arns import stream_region
from shardflow.aws.clients import ClientFactory
from shardflow.aws.kinesis import list_shards, require_stream
from shardflow.aws.routing import StreamRoutedKinesis
from shardflow.clock import Clock
from shardflow.consumer.checkpointing.acks import build_undelivered
from shardflow.consumer.lifecycle.starting import until_started
from shardflow.consumer.reading.reader import FetcherFactory
from shardflow.consumer.settings import ConsumerSettings
from shardflow.events import SILENT, ShardEmitter
from shardflow.fetch.batch import FetchedBatch
from shardflow.fetch.fanout import FanOut, FanOutFetcher, fanout_client
from shardflow.fetch.polling import PollingFetcher
from shardflow.fetch.registration import ConsumerRegistration
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.store import LeaseStore
from shardflow.positions import StartPosition
from shardflow.shards import HashKeyRange

log = logging.getLogger("shardflow.consumer")

EFO_POOL_SHARDS = 64
"""Connections a fan-out client keeps for subscriptions (one per subscribed shard)."""


class Connections:
    """The open clients and registrations of one consumer run (see the module doc)."""

    def __init__(
        self,
        settings: ConsumerSettings,
        application_name: str,
        streams: Sequence[str],
        *,
        clients: ClientFactory,
        lease_store: LeaseStore | None,
        clock: Clock,
    ) -> None:
        self._settings = settings
        self._application_name = application_name
        self._streams = list(streams)
        self._clients = clients
        self._clock = clock
        self.kinesis: Any = None
        """The client for control calls (ListShards, GetShardIterator, registrations)."""
        self.store: LeaseStore | None = lease_store
        self.lease_streams: Any = None
        """A DynamoDB Streams client for lease pick-up (when the consumer made the store)."""
        self._kinesis_of: dict[str, Any] = {}
        self._fetch_kinesis_of: dict[str, Any] = {}
        self._consumer_arns: dict[str, str] = {}
        self._shard_ranges: dict[tuple[str, str], HashKeyRange] = {}

    @property
    def efo_consumer_name(self) -> str | None:
        """The registered stream consumer's name (None unless fetching by enhanced fan-out)."""
        fetch = self._settings.fetch
        if not isinstance(fetch, FanOut):
            return None
        return fetch.consumer_name or self._application_name

    async def open(self, stack: AsyncExitStack) -> tuple[Any, LeaseStore]:
        """Open what is missing (closed with ``stack``); returns (kinesis client, lease store)."""
        factory = self._clients
        self._kinesis_of = await self._open_kinesis(stack, factory)
        clients = list({id(client): client for client in self._kinesis_of.values()}.values())
        self.kinesis = clients[0] if len(clients) == 1 else StreamRoutedKinesis(self._kinesis_of)
        for stream in self._streams:
            # Before anything is created (lease table, fan-out consumer): a wrong stream name
            # fails here and leaves nothing behind; a brownout is waited out (start_timeout).
            await until_started(
                partial(require_stream, self._kinesis_of[stream], stream),
                what=f"looking up stream {stream}",
                give_up_after=self._settings.start_timeout,
                clock=self._clock,
            )
        self._fetch_kinesis_of = dict(self._kinesis_of)
        if self.store is None:
            dynamodb = await stack.enter_async_context(factory.dynamodb(own_requests=True))
            self.store = DynamoDBLeaseStore(dynamodb, self._application_name, streams=self._streams)
            if self._settings.leases.pickup in ("stream", "auto"):
                self.lease_streams = await stack.enter_async_context(
                    factory.dynamodbstreams(own_requests=True)
                )
        if isinstance(self._settings.fetch, FanOut):
            await self._register_fanout(stack, factory, self._settings.fetch)
        return self.kinesis, self.store

    async def _open_kinesis(self, stack: AsyncExitStack, factory: ClientFactory) -> dict[str, Any]:
        """A Kinesis client per stream: one shared by the streams reached alike (same role,
        same region), one of their own for the others (another account, another region)."""
        settings = factory.settings
        opened: dict[tuple[Any, str | None], Any] = {}
        of: dict[str, Any] = {}
        for stream in self._streams:
            key = (settings.role_for(stream), stream_region(stream, settings.region))
            if key not in opened:
                opened[key] = await stack.enter_async_context(
                    factory.kinesis(stream=stream, own_requests=True)
                )
            of[stream] = opened[key]
        return of

    async def _register_fanout(
        self, stack: AsyncExitStack, factory: ClientFactory, fanout: FanOut
    ) -> None:
        name = fanout.consumer_name or self._application_name
        # Subscriptions keep a connection each for minutes: a client of their own (an open
        # client handed in is used as it is), per account and region as for other calls.
        opened: dict[int, Any] = {}
        for stream in self._streams:
            control = self._kinesis_of[stream]
            if id(control) not in opened:
                opened[id(control)] = await stack.enter_async_context(
                    fanout_client(factory, fanout, shards=EFO_POOL_SHARDS, stream=stream)
                )
            self._fetch_kinesis_of[stream] = opened[id(control)]
        for stream in self._streams:
            registration = ConsumerRegistration(
                self._kinesis_of[stream],
                stream,
                name,
                deregister_on_exit=fanout.deregister_on_stop,
                clock=self._clock,
            )
            registered = await stack.enter_async_context(registration)
            self._consumer_arns[stream] = registered.arn
            log.info("fan-out consumer %s of %s is active", name, stream)

    def fetchers(self, stream: str, shard_id: str, events: ShardEmitter = SILENT) -> FetcherFactory:
        """Opens fetchers of one shard, by fan-out or polling as the settings say; they emit
        what they see (throttling, renewed subscriptions) to ``events``."""
        kinesis, settings, clock = self._fetch_kinesis_of[stream], self._settings, self._clock
        fetch = settings.fetch
        if isinstance(fetch, FanOut):
            consumer_arn = self._consumer_arns[stream]

            def fanout(start: StartPosition) -> AsyncIterator[FetchedBatch]:
                return FanOutFetcher(
                    kinesis,
                    stream,
                    shard_id,
                    start,
                    fetch,
                    consumer_arn=consumer_arn,
                    clock=clock,
                    events=events,
                    build=build_undelivered,
                )

            return fanout
        polling = settings.polling_for_prefetch(fetch)

        def poll(start: StartPosition) -> AsyncIterator[FetchedBatch]:
            return PollingFetcher(
                kinesis,
                stream,
                shard_id,
                start,
                polling,
                clock=clock,
                events=events,
                build=build_undelivered,
            )

        return poll

    async def hash_range(self, stream: str, shard_id: str) -> HashKeyRange | None:
        """A shard's hash-key range from a listing of its stream (cached); None if unknown."""
        key = (stream, shard_id)
        if key not in self._shard_ranges:
            try:
                shards = await list_shards(self._kinesis_of[stream], stream)
            except Exception as exc:
                log.warning("cannot list shards of %s for hash ranges: %s", stream, exc)
                return None
            for shard in shards:
                self._shard_ranges[(stream, shard.shard_id)] = shard.hash_range
        return self._shard_ranges.get(key)
