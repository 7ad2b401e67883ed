"""User handlers, whatever their shape, as one kind of call the consumer makes per chunk.

A handler takes one :class:`~shardflow.consumer.checkpointing.acks.ConsumedRecord` (``batch=False``) or a
list of them (``batch=True``), and is a plain function (run in a thread pool so it never blocks
the event loop) or an ``async def`` (awaited on the loop). Records of one shard reach the
handler in shard order, one call at a time. With ``auto_ack`` a record is acknowledged when the
call that received it returns; otherwise the handler calls ``record.ack()`` itself, from any
task or thread, in any order.

A handler that raises ends the chunk: records it finished before stay acknowledged, and the
failure is raised as :class:`~shardflow.errors.HandlerError` naming the record.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from types import CoroutineType
from typing import Any

from shardflow.consumer.checkpointing.acks import ConsumedRecord, ack_run
from shardflow.consumer.delivery.calls import Invoker, RunningCalls, handler_error, in_thread
from shardflow.errors import HandlerError
from shardflow.turns import Turns

RecordHandler = Callable[[ConsumedRecord[Any]], Awaitable[None] | None]
"""Called with one record."""
BatchHandler = Callable[[list[ConsumedRecord[Any]]], Awaitable[None] | None]
"""Called with the records of one chunk of one shard, in shard order."""
Handler = RecordHandler | BatchHandler

MayContinue = Callable[[], bool]
"""Asked before each call: False once the shard must stop delivering (lease lost, stopping)."""


@dataclass(slots=True)
class ChunkOutcome:
    """What one :meth:`HandlerAdapter.run` did."""

    handled: int = 0
    """Records whose handler call returned (the first ``handled`` of the chunk)."""
    latencies: list[float] = field(default_factory=list)
    """Seconds each handler call took."""
    error: HandlerError | None = None


class HandlerAdapter:
    """Runs a user handler over chunks of records (see the module doc)."""

    def __init__(
        self,
        handler: Handler,
        *,
        batch: bool = False,
        auto_ack: bool = True,
        executor: Executor | None = None,
    ) -> None:
        self._invoke: Invoker[Any] = Invoker(handler, executor)
        self.handler = handler
        self.batch = batch
        self.auto_ack = auto_ack
        self.is_async = self._invoke.is_async
        self._executor = executor

    async def run(
        self,
        records: Sequence[ConsumedRecord[Any]],
        may_continue: MayContinue,
        calls: RunningCalls | None = None,
    ) -> ChunkOutcome:
        """Hand ``records`` to the handler; stops early once ``may_continue()`` is False.

        Handler calls are counted in ``calls`` until they have really ended: cancelling this
        coroutine cancels an ``async def`` handler, but a thread runs on to the end of its
        record (it asks ``may_continue()`` before the next one)."""
        if not records:
            return ChunkOutcome()
        if self.batch:
            outcome = await self._run_batch(list(records), may_continue, calls)
        elif self.is_async:
            ended = calls.enter() if calls is not None else None
            try:
                return await self._run_each_async(records, may_continue)  # acks as it goes
            finally:
                if ended is not None:
                    ended()
        else:
            outcome = await in_thread(
                self._executor, calls, self._run_each_sync, records, may_continue
            )
        if self.auto_ack:
            ack_run(records, 0, outcome.handled)
        return outcome

    async def _run_batch(
        self,
        records: list[ConsumedRecord[Any]],
        may_continue: MayContinue,
        calls: RunningCalls | None,
    ) -> ChunkOutcome:
        outcome = ChunkOutcome()
        if not may_continue():
            return outcome
        started = time.perf_counter()
        try:
            await self._invoke(records, calls)
        except Exception as exc:
            outcome.error = handler_error(exc, records[0])
            return outcome
        outcome.latencies.append(time.perf_counter() - started)
        outcome.handled = len(records)
        return outcome

    async def _run_each_async(
        self, records: Sequence[ConsumedRecord[Any]], may_continue: MayContinue
    ) -> ChunkOutcome:
        outcome = ChunkOutcome()
        handler = self.handler  # called inline, not through the invoker: one frame less a record
        turns = Turns()  # a handler that never suspends must not hold the loop for a chunk
        latencies, auto_ack, perf_counter = outcome.latencies, self.auto_ack, time.perf_counter
        acked = 0  # with automatic acks: records[:acked] are acknowledged
        try:
            for record in records:
                if turns.due:
                    if auto_ack:
                        # Before the turn, not after the chunk: acks may trigger a checkpoint.
                        ack_run(records, acked, outcome.handled)
                        acked = outcome.handled
                    await turns.take()
                if not may_continue():
                    break
                started = perf_counter()
                try:
                    result = handler(record)  # type: ignore[arg-type]
                    if type(result) is CoroutineType or inspect.isawaitable(result):
                        await result
                except Exception as exc:
                    outcome.error = handler_error(exc, record)
                    break
                latencies.append(perf_counter() - started)
                outcome.handled += 1
        finally:
            if auto_ack:
                ack_run(records, acked, outcome.handled)
        return outcome

    def _run_each_sync(
        self, records: Sequence[ConsumedRecord[Any]], may_continue: MayContinue
    ) -> ChunkOutcome:
        # Runs in a worker thread: one thread hop per chunk, not per record.
        outcome = ChunkOutcome()
        for record in records:
            if not may_continue():
                break
            started = time.perf_counter()
            try:
                self._invoke.call_sync(record)
            except Exception as exc:
                outcome.error = handler_error(exc, record)
                break
            outcome.latencies.append(time.perf_counter() - started)
            outcome.handled += 1
        return outcome
