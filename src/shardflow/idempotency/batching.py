"""Batched claims and completions for the DynamoDB idempotency guard (``batch=True``).

Per record the guard makes two DynamoDB writes, a conditional claim and a completion: two
round trips, and on a busy table the request count is what limits it. With batching, claims
made at about the same time (the dispatcher runs many records of a shard at once) travel
together: up to 100 conditional Puts in one ``TransactWriteItems``, and completions, which are
unconditional, up to 25 in one ``BatchWriteItem``.

A transaction is all or nothing: when a key's condition fails (done, or claimed by someone
else), DynamoDB cancels the whole call and says per item why. The item that failed its
condition is answered from the item DynamoDB returns (as a single claim would be); the others
were not written and go out again in the next batch. A key claimed twice at once by this
guard goes out once per batch (a transaction may not name an item twice). An item cancelled
for a passing reason (a conflicting transaction, throttling) goes out again, at most
``_MAX_ROUNDS`` times, then is claimed on its own.

Cost on AWS: a transactional write costs two write units per item, so a batched claim costs
2 WCU per record against 1 for a single conditional Put, plus 1 for the completion either
way: fewer requests, more write units. Batching pays where requests (latency, a request-bound
table or emulator) limit throughput, not where write units do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from botocore.exceptions import ClientError

MAX_TRANSACTION: Final = 100
"""Items per TransactWriteItems (the DynamoDB limit)."""
MAX_BATCH_WRITE: Final = 25
"""Items per BatchWriteItem (the DynamoDB limit)."""
_MAX_ROUNDS: Final = 5


@dataclass(eq=False)
class Pending:
    """One request waiting in a :class:`Coalescer`: a key, its claim token, the caller's
    future, and how often a batch sent it back."""

    key: str
    token: str
    future: asyncio.Future[Any]
    rounds: int = 0

    def answer(self, value: Any) -> None:
        if not self.future.done():
            self.future.set_result(value)


@dataclass
class _Queue:
    """Requests waiting for the next batch, and the task that will send it."""

    items: list[Pending] = field(default_factory=list)
    flusher: asyncio.Task[None] | None = None
    sending: set[asyncio.Task[None]] = field(default_factory=set)


class Coalescer:
    """Gathers concurrent requests into batches of at most ``limit`` distinct keys.

    ``send(batch)`` answers each request (sets its future) or returns the requests to send
    again. A batch leaves ``window`` seconds after its first request, or at once when full.
    """

    def __init__(
        self,
        send: Callable[[list[Pending]], Awaitable[list[Pending]]],
        *,
        limit: int,
        window: float,
    ) -> None:
        self._send = send
        self._limit = limit
        self._window = window
        self._queue = _Queue()

    async def submit(self, key: str, token: str) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.items.append(Pending(key, token, future))
        self._schedule()
        return await future

    def _schedule(self) -> None:
        queue = self._queue
        if queue.flusher is None and queue.items:
            queue.flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        queue = self._queue
        try:
            if len(queue.items) < self._limit:
                await asyncio.sleep(self._window)
            while queue.items:
                batch: list[Pending] = []
                rest: list[Pending] = []
                seen: set[str] = set()
                for pending in queue.items:
                    if pending.future.done():  # its caller gave up
                        continue
                    if len(batch) < self._limit and pending.key not in seen:
                        seen.add(pending.key)
                        batch.append(pending)
                    else:
                        rest.append(pending)
                queue.items = rest
                if batch:
                    task = asyncio.get_running_loop().create_task(self._run(batch))
                    queue.sending.add(task)
                    task.add_done_callback(queue.sending.discard)
                if len(rest) < self._limit:
                    break
        finally:
            queue.flusher = None
            if queue.items:
                self._schedule()

    async def _run(self, batch: list[Pending]) -> None:
        try:
            again = await self._send(batch)
        except BaseException as exc:
            for pending in batch:
                if not pending.future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        pending.future.cancel()
                    else:
                        pending.future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if again:
            self._queue.items.extend(again)
            self._schedule()


def cancellation_reasons(exc: ClientError) -> list[dict[str, Any]] | None:
    """The per-item reasons of a cancelled transaction (None: another error)."""
    if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
        return None
    reasons = exc.response.get("CancellationReasons")
    return list(reasons) if isinstance(reasons, list) else []
