"""One call of a user's handler: the layer under both delivery paths.

Shard-ordered delivery (:class:`~shardflow.consumer.handlers.HandlerAdapter`, a chunk at a
time) and dispatched delivery (:class:`~shardflow.consumer.dispatch.invoke.RetryingCall`, a
record at a time, retried) call handlers through an :class:`Invoker`: an ``async def``
handler is awaited on the loop, a plain one runs in the executor (a plain one that returns an
awaitable is refused with TypeError: it would never run), and every failure reaches the
consumer as a :class:`~shardflow.errors.HandlerError` naming the record
(:func:`handler_error`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

from shardflow.consumer.running import RunningCalls, in_thread
from shardflow.errors import HandlerError
from shardflow.records import Record

A = TypeVar("A")


def is_async_handler(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` gives a coroutine (an ``async def`` function or ``__call__``)."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects, not callability
    return call is not None and inspect.iscoroutinefunction(call)


def handler_error(error: BaseException, record: Record) -> HandlerError:
    """``error`` as a :class:`HandlerError` naming ``record`` (the original is its cause)."""
    wrapped = HandlerError(
        error,
        stream=record.stream_name,
        shard_id=record.shard_id,
        sequence_number=record.sequence_number,
        sub_sequence_number=record.sub_sequence_number,
    )
    wrapped.__cause__ = error
    return wrapped


class Invoker(Generic[A]):
    """Calls one handler with one argument (a record, or a list of them) the right way."""

    def __init__(
        self, handler: Callable[[A], Awaitable[None] | None], executor: Executor | None = None
    ) -> None:
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {handler!r}")
        self.handler = handler
        self.is_async = is_async_handler(handler)
        self._executor = executor

    async def __call__(self, argument: A, calls: RunningCalls | None = None) -> None:
        """One call: awaited on the loop, or run in the executor; raises what the handler
        raised. Counted in ``calls`` until it has really ended (a thread outlives a cancelled
        wait)."""
        if self.is_async:
            ended = calls.enter() if calls is not None else None
            try:
                result = self.handler(argument)
                if inspect.isawaitable(result):
                    await result
            finally:
                if ended is not None:
                    ended()
        else:
            await in_thread(self._executor, calls, self.call_sync, argument)

    def call_sync(self, argument: A) -> None:
        """One call of a plain handler on this thread (a worker thread of the executor)."""
        result = self.handler(argument)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"handler {self.handler!r} returned an awaitable but is not declared "
                "'async def'; declare it async so the consumer awaits it on the event loop"
            )
