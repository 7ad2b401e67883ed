"""Helpers for the dispatcher tests: shard records with keys, a memory sink, a zero-time clock,
and consumers with dispatch settings over an in-memory stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from shardflow.backoff import NO_BACKOFF
from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.consumer.checkpointing.acks import AckTracker
from shardflow.consumer.delivery import DispatchSettings
from shardflow.leases import InMemoryLeaseStore
from shardflow.records import ExtendedSequenceNumber, Record
from shardflow.testing import MemoryKinesis, fast_settings

SHARD = "shardId-000000000007"


def shard_records(keys: Iterable[str], *, aggregate_every: int = 0) -> list[Record]:
    """One record per key, in shard order; with ``aggregate_every`` n, runs of n records are
    sub-records of one aggregate (same sequence number)."""
    out: list[Record] = []
    seq = 49_000_000_000_000_000_000
    keys = list(keys)
    i = 0
    while i < len(keys):
        seq += 17
        size = aggregate_every if aggregate_every > 1 else 1
        group = keys[i : i + size]
        for sub, key in enumerate(group):
            out.append(
                Record(
                    f"payload-{i + sub}".encode(),
                    key,
                    str(seq),
                    sub if size > 1 else 0,
                    shard_id=SHARD,
                    stream_name="orders",
                    aggregated=size > 1,
                    last_sub_sequence_number=len(group) - 1 if size > 1 else 0,
                )
            )
        i += len(group)
    return out


def delivered(records: list[Record]) -> AckTracker:
    """A tracker with ``records`` delivered (call on the loop the dispatcher runs on)."""
    tracker = AckTracker(SHARD)
    for record in records:
        tracker.deliver(record)
    return tracker


def acked_positions(tracker: AckTracker) -> set[ExtendedSequenceNumber]:
    """Every position the tracker counts as acknowledged (prefix and beyond)."""
    # The prefix is not kept as positions: the caller compares against its own record list.
    return set(tracker.completed_beyond_prefix())


def is_acked(tracker: AckTracker, record: Record) -> bool:
    safe = tracker.safe_position
    if safe is not None and record.position <= safe:
        return True
    return record.position in acked_positions(tracker)


@dataclass
class Letter:
    record: Record
    error: BaseException
    attempts: int


@dataclass
class MemorySink:
    """Keeps dead letters in a list; refuses those whose position is in ``refuse``."""

    letters: list[Letter] = field(default_factory=list)
    refuse: set[ExtendedSequenceNumber] = field(default_factory=set)
    yields: int = 0

    async def dead_letter(self, record: Record, error: BaseException, attempts: int) -> None:
        for _ in range(self.yields):
            await asyncio.sleep(0)
        if record.position in self.refuse:
            raise OSError(f"disk full writing {record.position}")
        self.letters.append(Letter(record, error, attempts))


@dataclass
class ZeroTimeClock:
    """A clock whose sleeps only yield to the loop; it remembers how long they asked for."""

    slept: list[float] = field(default_factory=list)

    def monotonic(self) -> float:
        return 0.0

    def wall(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(0)


# --- consumers with dispatch settings over an in-memory stream (unit tests) --------------------


def stream_of(items: list[tuple[str, bytes]], shards: int = 1) -> MemoryKinesis:
    """An in-memory stream "s" holding ``items`` (partition key, data)."""
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", shards)
    kinesis.put_many("s", items)
    return kinesis


def dispatching(**options: Any) -> DispatchSettings:
    """Dispatch settings; two attempts without backoff unless ``retry`` is given."""
    options.setdefault("retry", replace(NO_BACKOFF, max_attempts=2))
    return DispatchSettings(**options)


def failing_on(
    bad: bytes, error: type[Exception], message: str, handled: list[bytes]
) -> Callable[[ConsumedRecord[bytes]], Awaitable[None]]:
    """A handler that raises ``error(message)`` for the record ``bad`` and notes the others."""

    async def handle(record: ConsumedRecord[bytes]) -> None:
        if record.data == bad:
            raise error(message)
        handled.append(record.data)

    return handle


def dispatch_consumer(
    kinesis: MemoryKinesis,
    store: InMemoryLeaseStore | None = None,
    *,
    on_error: Callable[[str, str, BaseException], None] | None = None,
    **dispatch: Any,
) -> Consumer:
    """Application "app" on stream "s" with fast settings and ``dispatching(**dispatch)``."""
    return Consumer(
        "s",
        "app",
        settings=fast_settings(dispatch=dispatching(**dispatch)),
        kinesis=kinesis,
        lease_store=store or InMemoryLeaseStore("app"),
        on_error=on_error,
    )
