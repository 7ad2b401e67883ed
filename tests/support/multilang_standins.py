"""Stand-ins for what a multilang ``ShardDriver`` is given by the consumer: a shard's session
and its checkpointer (no AWS, no lease). Tests give the session its batches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from shardflow.consumer import ConsumedRecord
from shardflow.multilang.shard import DriverSettings, ShardDriver
from shardflow.records import ExtendedSequenceNumber


class StandInCheckpointer:
    """Writes every checkpoint asked for (or raises ``fail_with``) and notes its position, never
    the record (a test counting live records must not keep them alive itself)."""

    def __init__(self) -> None:
        self.last_written: ExtendedSequenceNumber | None = ExtendedSequenceNumber("TRIM_HORIZON")
        self.written: list[ExtendedSequenceNumber] = []
        self.fail_with: Exception | None = None

    async def checkpoint(self, record: Any) -> ExtendedSequenceNumber:
        if self.fail_with is not None:
            raise self.fail_with
        self.written.append(record.position)
        return record.position


class StandInSession:
    """One shard's session as the driver reads it; ``batches`` is set by the test."""

    shard_id = "shardId-000000000000"
    stream = "s"
    lost = False
    shard_ended = False
    millis_behind_latest = 0

    def __init__(self) -> None:
        self.checkpointer = StandInCheckpointer()
        self.batches: AsyncIterator[list[ConsumedRecord[Any]]] | None = None


async def _never(*_: Any) -> bool:
    return False


def stand_in_driver(
    session: StandInSession,
    settings: DriverSettings,
    *,
    stopping: asyncio.Event | None = None,
    lag_of: Callable[[Any], Any] = lambda _: None,
) -> ShardDriver:
    """A driver over ``session``; its shard never ends."""
    return ShardDriver(
        session,  # type: ignore[arg-type]
        settings,
        stopping=asyncio.Event() if stopping is None else stopping,
        lag_of=lag_of,
        shard_ended=_never,
    )
