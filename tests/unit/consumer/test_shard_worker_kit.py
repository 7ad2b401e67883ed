"""Stand-ins for the shard worker's collaborators: a lease, its checkpoint writer, a fetcher."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from shardflow.errors import ShardLeaseLostError
from shardflow.fetch.batch import FetchedBatch
from shardflow.leases.model import Lease
from shardflow.positions import StartPosition
from shardflow.records import ExtendedSequenceNumber, Record
from shardflow.shards import ChildShard, HashKeyRange

SHARD = "shardId-000000000000"
STREAM = "orders"


def plain(seq: int, key: str = "k", data: bytes | None = None) -> Record:
    return Record(
        data=data if data is not None else f"r{seq}".encode(),
        partition_key=key,
        sequence_number=str(seq),
        shard_id=SHARD,
        stream_name=STREAM,
    )


@dataclass
class StubWriter:
    """Records checkpoint writes; refuses them once the lease is lost or invalid."""

    lease: StubLease
    written: list[ExtendedSequenceNumber] = field(default_factory=list)
    refused: int = 0

    async def write(
        self,
        position: ExtendedSequenceNumber,
        *,
        completed_state: bytes | None = None,
        final: bool = False,
    ) -> None:
        await asyncio.sleep(0)
        if not self.lease.valid():
            self.refused += 1
            raise ShardLeaseLostError(self.lease.shard_id, owner="someone-else")
        self.written.append(position)


class StubLease:
    """An owned lease as the coordinator would hand it over, driven by the test."""

    def __init__(
        self,
        checkpoint: str | ExtendedSequenceNumber = "TRIM_HORIZON",
        *,
        hash_range: HashKeyRange | None = None,
        completed_state: bytes | None = None,
    ) -> None:
        position = (
            checkpoint
            if isinstance(checkpoint, ExtendedSequenceNumber)
            else ExtendedSequenceNumber(checkpoint)
        )
        self.lease_key = SHARD
        self.stream = STREAM
        self.shard_id = SHARD
        self.lease = Lease(
            SHARD,
            lease_owner="me",
            lease_counter=1,
            checkpoint=position,
            hash_range=hash_range,
            completed_state=completed_state,
        )
        self.lost = asyncio.Event()
        self.giving_up = asyncio.Event()
        self.expired = False
        self.writer = StubWriter(self)

    def valid(self) -> bool:
        return not self.expired and not self.lost.is_set()

    def remaining(self) -> float:
        return 0.0 if not self.valid() else 10.0

    @property
    def checkpoint(self) -> ExtendedSequenceNumber:
        return self.lease.checkpoint

    @property
    def completed_state(self) -> bytes | None:
        return self.lease.completed_state

    @property
    def hash_range(self) -> HashKeyRange | None:
        return self.lease.hash_range

    def lose(self) -> None:
        self.lost.set()


class ScriptedFetcher:
    """Hands out scripted batches; after the script, either ends or reports caught-up forever."""

    def __init__(
        self,
        batches: Sequence[Sequence[Record]],
        *,
        ends: bool = True,
        children: tuple[ChildShard, ...] = (),
        idle: float = 0.005,
    ) -> None:
        self.batches = [list(b) for b in batches]
        self.ends = ends
        self.children = children
        self.idle = idle
        self.pulls = 0
        self.records_fetched = 0
        self.start: StartPosition | None = None

    def open(self, start: StartPosition) -> AsyncIterator[FetchedBatch]:
        self.start = start
        return self._run()

    async def _run(self) -> AsyncIterator[FetchedBatch]:
        for index, records in enumerate(self.batches):
            self.pulls += 1
            self.records_fetched += len(records)
            await asyncio.sleep(0)
            last = index == len(self.batches) - 1
            yield FetchedBatch(
                SHARD,
                records,
                millis_behind_latest=0 if last else 1000,
                shard_ended=last and self.ends,
                child_shards=self.children if last and self.ends else (),
            )
        if self.ends and self.batches:
            return
        while True:  # an open shard at its tip
            self.pulls += 1
            await asyncio.sleep(self.idle)
            yield FetchedBatch(SHARD, [], millis_behind_latest=0)


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``condition`` until it holds (bounded: fails after ``within`` seconds)."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - polling state owned by the code under test
            await asyncio.sleep(0.001)
