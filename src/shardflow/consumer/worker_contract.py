"""What a shard worker needs (its lease, its fetchers) and what it reports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol

from shardflow.consumer.checkpoint import CheckpointWriter
from shardflow.fetch.batch import FetchedBatch
from shardflow.leases.model import Lease
from shardflow.positions import StartPosition
from shardflow.records import ExtendedSequenceNumber
from shardflow.shards import ChildShard, HashKeyRange

MIB: Final = 1024 * 1024


class ShardLease(Protocol):
    """What a worker needs of the lease it processes (the coordinator's ``OwnedLease``)."""

    @property
    def lease_key(self) -> str: ...

    @property
    def stream(self) -> str: ...

    @property
    def shard_id(self) -> str: ...

    @property
    def lease(self) -> Lease: ...

    @property
    def lost(self) -> asyncio.Event: ...

    @property
    def giving_up(self) -> asyncio.Event: ...

    def valid(self) -> bool: ...

    @property
    def checkpoint(self) -> ExtendedSequenceNumber: ...

    @property
    def completed_state(self) -> bytes | None:
        """Records handled beyond the checkpoint, as stored (None: none)."""
        ...

    @property
    def hash_range(self) -> HashKeyRange | None: ...

    @property
    def writer(self) -> CheckpointWriter: ...


FetcherFactory = Callable[[StartPosition], AsyncIterator[FetchedBatch]]
"""Opens a fetcher of the shard at a position (a PollingFetcher or a FanOutFetcher)."""


class StopReason(StrEnum):
    """Why a shard worker ended."""

    SHARD_END = "shard_end"
    """Every record handled; SHARD_END written."""
    ALREADY_ENDED = "already_ended"
    """The stored checkpoint was SHARD_END already: nothing to read."""
    STOPPED = "stopped"
    """The consumer is stopping."""
    GIVEN_UP = "given_up"
    """The coordinator asked for the lease back."""
    LOST = "lost"
    """The lease was lost: no checkpoint was written after that."""
    FAILED = "failed"
    """Reading, decoding or handling failed; ``error`` says why."""


@dataclass(frozen=True, slots=True)
class ShardResult:
    """How a shard worker ended and the checkpoint it left."""

    reason: StopReason
    checkpoint: ExtendedSequenceNumber | None
    children: tuple[ChildShard, ...] = ()
    """Child shards GetRecords reported at the shard's end (may be empty: list the stream)."""
    error: BaseException | None = None
    handler_running: bool = False
    """A handler call of the shard still ran when the consumer stopped, ``drain_timeout`` after
    the stop: the lease must not be let go (released or handed over), nobody else may start
    the shard while that call runs; it is left to expire instead."""
