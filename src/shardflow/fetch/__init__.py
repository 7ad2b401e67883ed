"""Fetchers: getting batches of records from one shard, by polling or by enhanced fan-out."""

from shardflow.events import RenewalReason
from shardflow.fetch.batch import FetchedBatch, record_from_kinesis
from shardflow.fetch.fanout import FanOut, FanOutFetcher, fanout_client
from shardflow.fetch.limiter import CallRateLimiter
from shardflow.fetch.pacing import SubscriptionPacer
from shardflow.fetch.polling import Polling, PollingFetcher
from shardflow.fetch.registration import (
    ConsumerRegistration,
    StreamConsumer,
    deregister_consumer,
    register_consumer,
)
from shardflow.shards import ChildShard

__all__ = [
    "CallRateLimiter",
    "ChildShard",
    "ConsumerRegistration",
    "FanOut",
    "FanOutFetcher",
    "FetchedBatch",
    "Polling",
    "PollingFetcher",
    "RenewalReason",
    "StreamConsumer",
    "SubscriptionPacer",
    "deregister_consumer",
    "fanout_client",
    "record_from_kinesis",
    "register_consumer",
]
