"""Fetchers: getting batches of records from one shard, by polling or by enhanced fan-out."""

from shardflow.consumer.fetch.batch import ChildShard, FetchedBatch
from shardflow.consumer.fetch.convert import record_from_kinesis
from shardflow.consumer.fetch.fanout import FanOutFetcher, FanOutSettings, fanout_client
from shardflow.consumer.fetch.limiter import CallRateLimiter
from shardflow.consumer.fetch.observer import FetchObserver, RenewalReason
from shardflow.consumer.fetch.pacing import SubscriptionPacer
from shardflow.consumer.fetch.polling import PollingFetcher, PollingSettings
from shardflow.consumer.fetch.registration import (
    ConsumerRegistration,
    StreamConsumer,
    deregister_consumer,
    register_consumer,
)

__all__ = [
    "CallRateLimiter",
    "ChildShard",
    "ConsumerRegistration",
    "FanOutFetcher",
    "FanOutSettings",
    "FetchObserver",
    "FetchedBatch",
    "PollingFetcher",
    "PollingSettings",
    "RenewalReason",
    "StreamConsumer",
    "SubscriptionPacer",
    "deregister_consumer",
    "fanout_client",
    "record_from_kinesis",
    "register_consumer",
]
