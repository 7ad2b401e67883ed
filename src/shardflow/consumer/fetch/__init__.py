"""Fetchers: getting batches of records from one shard (polling now; enhanced fan-out later)."""

from shardflow.consumer.fetch.batch import ChildShard, FetchedBatch
from shardflow.consumer.fetch.convert import record_from_kinesis
from shardflow.consumer.fetch.limiter import CallRateLimiter
from shardflow.consumer.fetch.polling import PollingFetcher, PollingSettings

__all__ = [
    "CallRateLimiter",
    "ChildShard",
    "FetchedBatch",
    "PollingFetcher",
    "PollingSettings",
    "record_from_kinesis",
]
