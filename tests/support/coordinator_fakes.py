"""Helpers for unit tests of the lease coordinator: a Kinesis stand-in that only lists shards,
shard builders, an event recorder, and time control on a ManualClock.

The Kinesis stand-in answers ListShards and DescribeStreamSummary from a list in memory; it
exists only for unit tests of coordination logic (integration tests use real emulators).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shardflow.clock import ManualClock
from shardflow.events import DiagnosticEvent
from shardflow.leases import InMemoryLeaseStore, InMemoryLeaseTables, Lease
from shardflow.leases.coordinator import LeaseCoordinator
from shardflow.leases.owned import OwnedLease
from shardflow.leases.settings import LeaseSettings, StreamSpec
from shardflow.shards import HashKeyRange, ShardInfo

SETTINGS = LeaseSettings(handoff=False, pickup="off")
"""KCL 2.x: failover 10 s, renew 3.308 s, take 20.05 s, release at stop and steal to balance."""


def sid(i: int) -> str:
    return f"shardId-{i:012d}"


def shard(i: int, *parents: int, closed: bool = False) -> ShardInfo:
    return ShardInfo(
        sid(i),
        HashKeyRange(i * 10, i * 10 + 9),
        parent_shard_id=sid(parents[0]) if parents else None,
        adjacent_parent_shard_id=sid(parents[1]) if len(parents) > 1 else None,
        starting_sequence_number="1",
        ending_sequence_number="99" if closed else None,
    )


def api_shard(s: ShardInfo) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "ShardId": s.shard_id,
        "HashKeyRange": {
            "StartingHashKey": str(s.hash_range.start),
            "EndingHashKey": str(s.hash_range.end),
        },
        "SequenceNumberRange": {"StartingSequenceNumber": s.starting_sequence_number or "1"},
    }
    if s.parent_shard_id:
        raw["ParentShardId"] = s.parent_shard_id
    if s.adjacent_parent_shard_id:
        raw["AdjacentParentShardId"] = s.adjacent_parent_shard_id
    if s.ending_sequence_number:
        raw["SequenceNumberRange"]["EndingSequenceNumber"] = s.ending_sequence_number
    return raw


class FakeKinesis:
    """ListShards / DescribeStreamSummary from memory, per stream name."""

    def __init__(self, streams: dict[str, Sequence[ShardInfo]] | Sequence[ShardInfo]) -> None:
        self.streams = dict(streams) if isinstance(streams, dict) else {"*": list(streams)}
        self.list_calls = 0

    def shards_of(self, stream: str) -> list[ShardInfo]:
        return list(self.streams.get(stream, self.streams.get("*", [])))

    async def list_shards(self, **params: Any) -> dict[str, Any]:
        self.list_calls += 1
        await asyncio.sleep(0)
        return {"Shards": [api_shard(s) for s in self.shards_of(params["StreamName"])]}

    async def describe_stream_summary(self, **params: Any) -> dict[str, Any]:
        name = params["StreamName"]
        return {
            "StreamDescriptionSummary": {
                "StreamName": name,
                "StreamARN": f"arn:aws:kinesis:us-east-1:123456789012:stream/{name}",
                "StreamCreationTimestamp": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
                "StreamStatus": "ACTIVE",
            }
        }


@dataclass
class Recorder:
    """Diagnostic events with the (manual) monotonic time they were emitted at."""

    clock: ManualClock
    events: list[tuple[float, DiagnosticEvent]] = field(default_factory=list)

    def __call__(self, event: DiagnosticEvent) -> None:
        self.events.append((self.clock.monotonic(), event))

    def of(self, kind: type[Any]) -> list[Any]:
        return [event for _, event in self.events if isinstance(event, kind)]

    def times(self, kind: type[Any]) -> list[tuple[float, Any]]:
        return [(at, event) for at, event in self.events if isinstance(event, kind)]


async def settle(rounds: int = 30) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def run_for(seconds: float, *clocks: ManualClock, step: float = 0.1) -> None:
    """Let ``seconds`` pass on every clock, in small steps, letting tasks run between steps."""
    steps = round(seconds / step)
    for _ in range(steps):
        for clock in clocks:
            await clock.advance(step)
        await settle()


@dataclass
class World:
    """Workers sharing one in-memory lease table and one stream listing."""

    shards: list[ShardInfo]
    clock: ManualClock = field(default_factory=ManualClock)
    tables: InMemoryLeaseTables = field(default_factory=InMemoryLeaseTables)
    recorders: dict[str, Recorder] = field(default_factory=dict)
    started: list[LeaseCoordinator] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kinesis = FakeKinesis(self.shards)

    def store(self, fault: Callable[[str], None] | None = None) -> InMemoryLeaseStore:
        return InMemoryLeaseStore("app", tables=self.tables, fault=fault)

    def worker(
        self,
        worker_id: str,
        *,
        settings: LeaseSettings = SETTINGS,
        store: InMemoryLeaseStore | None = None,
        streams: list[StreamSpec | str] | None = None,
        clock: ManualClock | None = None,
        **options: Any,
    ) -> LeaseCoordinator:
        clock = clock or self.clock
        recorder = self.recorders[worker_id] = Recorder(clock)
        coordinator = LeaseCoordinator(
            store or self.store(),
            worker_id=worker_id,
            streams=streams or ["stream"],
            kinesis=self.kinesis,
            settings=settings,
            clock=clock,
            on_event=recorder,
            rng=random.Random(worker_id),
            **options,
        )
        self.started.append(coordinator)
        return coordinator

    async def start(self, worker_id: str, **options: Any) -> LeaseCoordinator:
        coordinator = self.worker(worker_id, **options)
        await coordinator.start()
        return coordinator

    async def leases(self) -> dict[str, Lease]:
        return {lease.lease_key: lease for lease in await self.store().list_leases()}

    async def owners(self) -> Counter[str | None]:
        return Counter(lease.lease_owner for lease in (await self.leases()).values())


@asynccontextmanager
async def world(shards: list[ShardInfo] | None = None) -> AsyncIterator[World]:
    """Workers sharing a table and a listing (four open shards unless given); stopped at the end."""
    w = World(list(shards) if shards is not None else [shard(i) for i in range(4)])
    try:
        yield w
    finally:
        for coordinator in w.started:
            await coordinator.stop(release=False)


def honour_handoffs(coordinator: LeaseCoordinator) -> None:
    """What the consumer does with a lease given up: release it (completing a handoff)."""

    async def release(owned: OwnedLease) -> None:
        await owned.giving_up.wait()
        await coordinator.release(owned, why="handoff")

    async def accept() -> None:
        async for owned in coordinator.acquisitions():
            tasks.add(asyncio.ensure_future(release(owned)))

    tasks: set[asyncio.Future[None]] = {asyncio.ensure_future(accept())}
    _KEEP.append(tasks)


_KEEP: list[set[asyncio.Future[None]]] = []
"""The tasks of honour_handoffs (kept referenced until the test process ends)."""
