"""Calls of a user's handler: how one is made, counted until it really ended, and retried.

- :class:`Invoker`: an ``async def`` handler is awaited on the loop, a plain one runs in the
  executor (a plain one that returns an awaitable is refused with TypeError: it would never
  run); every failure reaches the consumer as a :class:`~shardflow.errors.HandlerError` naming
  the record (:func:`handler_error`).
- :class:`RunningCalls`: the shard's calls that have not really ended. Cancelling a wait for a
  plain handler's thread does not stop the thread, so every call is counted from the moment it
  is submitted until it has returned (:func:`in_thread`, :class:`ThreadCall`: a call still
  queued when its wait is cancelled never starts), and whoever starts the shard again waits
  for them: one shard, one running handler.
- :class:`RetryingCall`: one record through the handler until it succeeds or the retry policy
  is spent. A call holds a slot of the worker-wide limit while it runs; the pause before a
  retry does not. With an idempotency guard each call is claim -> handler -> complete, and a
  failed handler releases its claim; a claim that cannot be settled on the spot is settled in
  the background (:mod:`~shardflow.consumer.delivery.claims`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from types import CoroutineType
from typing import Any, Generic, TypeVar

from shardflow.backoff import Backoff
from shardflow.clock import Clock
from shardflow.consumer.delivery.claims import ClaimSettler
from shardflow.consumer.delivery.dead_letters import WorkerLimit
from shardflow.consumer.delivery.settings import Idempotency
from shardflow.errors import AwsError, ClaimInProgressError, HandlerError
from shardflow.idempotency.guard import Claim, ClaimOutcome, IdempotencyGuard
from shardflow.records import Record
from shardflow.turns import Turns

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

    async def __call__(
        self,
        argument: A,
        calls: RunningCalls | None = None,
        go_on: Callable[[], bool] | None = None,
    ) -> Any:
        """One call: awaited on the loop, or run in the executor; returns what the handler
        returned and raises what it raised. Counted in ``calls`` until it has really ended (a
        thread outlives a cancelled wait). A thread asks ``go_on`` again when its turn comes
        (:class:`NotStarted` if it says no)."""
        if self.is_async:
            ended = calls.enter() if calls is not None else None
            try:
                result = self.handler(argument)
                if inspect.isawaitable(result):
                    return await result
                return result
            finally:
                if ended is not None:
                    ended()
        return await in_thread(self._executor, calls, self.call_sync, argument, go_on=go_on)

    def call_sync(self, argument: A) -> Any:
        """One call of a plain handler on this thread (a worker thread of the executor)."""
        result = self.handler(argument)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"handler {self.handler!r} returned an awaitable but is not declared "
                "'async def'; declare it async so the consumer awaits it on the event loop"
            )
        return result


T = TypeVar("T")


class RunningCalls:
    """How many handler calls of one shard are running; use on the consumer's event loop."""

    def __init__(self) -> None:
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._when_idle: list[Callable[[], None]] = []

    @property
    def running(self) -> int:
        """Calls started and not ended."""
        return self._running

    @property
    def idle(self) -> bool:
        return self._running == 0

    def enter(self) -> Callable[[], None]:
        """A call starts; call what this returns once it has ended (more calls do nothing)."""
        self._running += 1
        self._idle.clear()
        done = False

        def ended() -> None:
            nonlocal done
            if done:
                return
            done = True
            self._running -= 1
            if self._running == 0:
                self._idle.set()
                callbacks, self._when_idle = self._when_idle, []
                for callback in callbacks:
                    callback()

        return ended

    async def wait_idle(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until no call runs (at most ``timeout`` seconds); whether none runs."""
        if self._idle.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        return self._idle.is_set()

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once no call runs (now, if none does)."""
        if self.idle:
            callback()
        else:
            self._when_idle.append(callback)


class NotStarted(Exception):
    """A thread's turn came after ``go_on`` turned false: the call never started."""


class ThreadCall:
    """One function call handed to an executor, told apart from the wait for it.

    :meth:`run` is what the executor runs; :meth:`abandon` is called when the wait is
    cancelled: if the call had not started it never will (True), otherwise it runs to its
    end. ``ended`` is called on ``loop`` once the call is over either way. With ``go_on``,
    the thread asks it once more when its turn comes and, if it says no, starts nothing and
    raises :class:`NotStarted`: a call queued behind busy threads may wait long (a process
    frozen by SIGSTOP wakes with its queue full), and the lease it was checked against may
    have lapsed since.
    """

    def __init__(
        self,
        ended: Callable[[], None],
        loop: asyncio.AbstractEventLoop,
        go_on: Callable[[], bool] | None = None,
    ) -> None:
        self._ended = ended
        self._loop = loop
        self._go_on = go_on
        self._lock = threading.Lock()
        self._state = "queued"  # -> "running" -> "over", or "queued" -> "abandoned"

    def run(self, function: Callable[..., T], *args: Any) -> T | None:
        with self._lock:
            if self._state == "abandoned":
                return None  # nobody waits for it and it must not start any more
            refused = self._go_on is not None and not self._go_on()
            self._state = "abandoned" if refused else "running"
        if refused:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                self._loop.call_soon_threadsafe(self._ended)
            raise NotStarted
        try:
            return function(*args)
        finally:
            with self._lock:
                self._state = "over"
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                self._loop.call_soon_threadsafe(self._ended)

    def abandon(self) -> bool:
        """The wait for the call was cancelled; True (and ended) if the call never started."""
        with self._lock:
            if self._state != "queued":
                return False
            self._state = "abandoned"
        self._ended()
        return True


async def in_thread(
    executor: Any,
    calls: RunningCalls | None,
    function: Callable[..., T],
    *args: Any,
    go_on: Callable[[], bool] | None = None,
) -> T:
    """``function(*args)`` in ``executor`` (None: the loop's), counted in ``calls`` until the
    thread has left it, whatever happens to this wait. With ``go_on``, the thread checks it
    when its turn comes and raises :class:`NotStarted` instead of calling (see
    :class:`ThreadCall`)."""
    loop = asyncio.get_running_loop()
    if calls is None and go_on is None:
        return await loop.run_in_executor(executor, function, *args)
    call = ThreadCall(calls.enter() if calls is not None else _nothing, loop, go_on)
    try:
        result = await loop.run_in_executor(executor, call.run, function, *args)
    except asyncio.CancelledError:
        call.abandon()
        raise
    return result  # type: ignore[return-value]  # None only for an abandoned call


def _nothing() -> None:
    return None


R = TypeVar("R", bound=Record)

RecordHandler = Callable[[R], Awaitable[None] | None]
"""Handles one record; a plain function runs in a thread pool, an ``async def`` on the loop."""
BatchHandler = Callable[[list[R]], Awaitable[None] | None]
"""Handles the records of one chunk of one shard, in shard order."""
Handler = RecordHandler[Any] | BatchHandler[Any]
"""What ``Consumer.consume`` takes: a record handler, or a batch handler with ``batch=True``."""
AckRun = Callable[[Sequence[Any], int, int], None]
"""Acknowledges ``records[start:end]``, handled in shard order."""
Latencies = Callable[[list[float]], None]
"""Told the seconds each handler call took (for the metrics)."""

GoOn = Callable[[], bool]
"""Asked before each retry and right before each handler call: False once the dispatcher stops
or the shard's lease is gone (the record is then abandoned, unhandled)."""

log = logging.getLogger("shardflow.consumer.delivery")


@dataclass(frozen=True, slots=True)
class Attempts:
    """How a record's handler calls ended."""

    calls: int
    """Handler calls made."""
    error: BaseException | None = None
    """The last failure (a :class:`~shardflow.errors.HandlerError`, or why the record could
    not be handed to the handler at all); None when the last call succeeded."""
    abandoned: bool = False
    """Retries were given up because the dispatcher stopped: the record is not finished."""
    skipped: bool = False
    """The idempotency guard knew the record as handled before: no handler call was made."""

    @property
    def succeeded(self) -> bool:
        return self.error is None and not self.abandoned


@dataclass(slots=True)
class RunOutcome:
    """How one pass of :meth:`RetryingCall.each` over a run of records ended."""

    handled: int = 0
    """Records whose call returned, from the run's start on."""
    latencies: list[float] = field(default_factory=list)
    """Seconds each of those calls took."""
    error: HandlerError | None = None
    """The failure of the record right after the handled ones (its first call); None when
    the pass ended because the run did or ``go_on()`` said no."""


class _GuardUnavailable(Exception):
    """The idempotency guard could not be asked for a claim for a reason that passes."""


class _NoLongerOurs(Exception):
    """Right before the handler call, ``go_on()`` said no: the record is not run."""


class RetryingCall(Generic[A]):
    """Calls the handler for one record (or one batch) until it succeeds or the retry policy is
    spent; or over a run of records, one call each, in one go (:meth:`each`)."""

    def __init__(
        self,
        handler: Callable[[A], Awaitable[None] | None],
        *,
        retry: Backoff,
        clock: Clock,
        executor: Executor | None = None,
        worker_limit: WorkerLimit | None = None,
        rng: random.Random | None = None,
        idempotency: Idempotency | None = None,
        calls: RunningCalls | None = None,
        on_latencies: Latencies | None = None,
    ) -> None:
        self._invoke: Invoker[A] = Invoker(handler, executor)
        self.is_async = self._invoke.is_async
        self._executor = executor
        self._on_latencies = on_latencies
        self._calls = calls
        self._retry = retry
        self._clock = clock
        self._limit = worker_limit
        self._rng = rng
        self._idempotency = idempotency
        self._settler = (
            None if idempotency is None else ClaimSettler(idempotency.guard, clock=clock)
        )

    async def run(
        self, record: A, go_on: GoOn, *, spent: int = 0, last: HandlerError | None = None
    ) -> Attempts:
        """Handle ``record``; between attempts, pause per the policy and ask ``go_on()``.

        ``spent`` calls were made already (by :meth:`each`), the last failing with ``last``.
        """
        retry = self._retry
        calls = spent
        waits = 0
        while retry.allows(calls):
            if calls and not waits:
                await self._clock.sleep(retry.delay(calls - 1, self._rng))
                if not go_on():
                    return Attempts(calls, last, abandoned=True)
            calls += 1
            try:
                ran = await self._guarded_call(record, go_on)
            except _NoLongerOurs:
                return Attempts(calls - 1, last, abandoned=True)
            except (ClaimInProgressError, _GuardUnavailable):
                # Another worker holds the record's claim: it is handling it, or it died and
                # the claim runs out after its TTL. Or the guard's table answers 5xx or
                # throttles (a DynamoDB brownout). Neither is this record's failure, so no
                # attempt is spent (it would end in the dead letters unhandled); wait and ask
                # again while the shard is still ours.
                calls -= 1
                waits += 1
                await self._clock.sleep(retry.delay(waits - 1, self._rng))
                if not go_on():
                    return Attempts(calls, last, abandoned=True)
                continue
            except Exception as exc:
                waits = 0
                last = handler_error(exc, _first(record))
                log.debug("%s (attempt %d of %s)", last, calls, retry.max_attempts or "unbounded")
                continue
            return Attempts(calls, skipped=not ran)
        return Attempts(calls, last)

    async def _guarded_call(self, record: A, go_on: GoOn) -> bool:
        """One attempt; False when the guard knew the record as handled (no call made)."""
        idempotency = self._idempotency
        if idempotency is None:
            await self._call_once(record, go_on)
            return True
        guard = idempotency.guard
        try:
            claim = await guard.claim(idempotency.key(_first(record)))
        except AwsError as exc:
            if not exc.retryable:
                raise
            log.debug("idempotency guard unavailable, the record waits: %s", exc)
            raise _GuardUnavailable from exc
        if claim.outcome is ClaimOutcome.DONE:
            return False
        if claim.outcome is ClaimOutcome.IN_PROGRESS:
            raise ClaimInProgressError(claim.key)
        settler = self._settler
        assert settler is not None
        if self._invoke.is_async:
            try:
                await self._call_once(record, go_on)
            except BaseException:
                # Cancelled or failed, the handler has ended: free the record for a retry.
                await self._release_quietly(guard, claim)
                raise
        else:
            # The call in a task of its own, shielded: cancelling this wait does not stop the
            # handler's thread, so the claim must stay until the thread ends (releasing now
            # would let another worker run the record at the same time), and then be settled
            # by the thread's outcome (left to its TTL, the record would run again after it
            # although the handler finished).
            call = asyncio.ensure_future(self._call_once(record, go_on))
            try:
                await asyncio.shield(call)
            except asyncio.CancelledError:
                log.info("idempotency claim %r kept: its handler thread runs on", claim.key)
                settler.after(call, claim)
                raise
            except Exception:
                await self._release_quietly(guard, claim)
                raise
        # The record was handled: whatever happens to this wait, the mark must follow (left
        # unmarked, a redelivery after the claim's TTL would handle the record again).
        try:
            await guard.complete(claim)
        except asyncio.CancelledError:
            settler.complete(claim)  # the lease was lost or the consumer stops meanwhile
            raise
        except Exception as exc:
            log.warning("completing idempotency claim %r failed, retried: %s", claim.key, exc)
            settler.complete(claim)  # the record is acknowledged now, marked later
        return True

    async def _release_quietly(self, guard: IdempotencyGuard, claim: Claim) -> None:
        """Give the claim back; one the table refuses now is given back in the background
        (left alone, the shard's next owner would wait out its TTL)."""
        settler = self._settler
        assert settler is not None
        try:
            await guard.release(claim)
        except asyncio.CancelledError:
            settler.release(claim)
            raise
        except Exception as exc:
            log.warning("releasing idempotency claim %r failed, retried: %s", claim.key, exc)
            settler.release(claim)

    async def _call_once(self, record: A, go_on: GoOn) -> Any:
        limit = self._limit
        if limit is not None:
            await limit.acquire()
        try:
            # Asked again after every wait (the claim, a slot): the lease may have lapsed
            # meanwhile, e.g. while the process was frozen; a record may not start then.
            if not go_on():
                raise _NoLongerOurs
            started = time.perf_counter()
            try:
                # The thread asks again when its turn comes: it may queue behind busy ones.
                result = await self._invoke(record, self._calls, go_on)
            except NotStarted:
                raise _NoLongerOurs from None
            if self._on_latencies is not None:
                self._on_latencies([time.perf_counter() - started])
            return result
        finally:
            if limit is not None:
                limit.release()

    async def once(self, unit: A, go_on: GoOn) -> tuple[bool, Any]:
        """One call of the handler with ``unit`` (a batch, say), no retries: (True, what it
        returned), or (False, None) when ``go_on()`` said no right before the call. Raises the
        handler's failure as a :class:`~shardflow.errors.HandlerError`."""
        try:
            return True, await self._call_once(unit, go_on)
        except _NoLongerOurs:
            return False, None
        except Exception as exc:
            raise handler_error(exc, _first(unit)) from exc

    # --- a run of records, one call each ----------------------------------------------------

    async def each(
        self, records: Sequence[Any], start: int, go_on: GoOn, *, ack: AckRun | None
    ) -> RunOutcome:
        """One call per record of ``records[start:]``, in order, until one raises or ``go_on()``
        says no; no retries, no idempotency guard (the caller retries a failed record with
        :meth:`run`). ``ack(records, start, end)`` (None: manual acks) acknowledges handled
        records as it goes.

        The consumer's per-record path: a plain handler's records take one thread hop for the
        lot, an ``async def`` one's are awaited in a plain loop that gives the event loop its
        turns. The run holds one slot of the worker-wide limit.
        """
        limit = self._limit
        if limit is not None:
            await limit.acquire()
        try:
            if self.is_async:
                ended = self._calls.enter() if self._calls is not None else None
                try:
                    outcome = await self._each_async(records, start, go_on, ack)
                finally:
                    if ended is not None:
                        ended()
            else:
                outcome = await in_thread(
                    self._executor, self._calls, self._each_sync, records, start, go_on
                )
                if ack is not None:
                    ack(records, start, start + outcome.handled)
        finally:
            if limit is not None:
                limit.release()
        if self._on_latencies is not None and outcome.latencies:
            self._on_latencies(outcome.latencies)
        return outcome

    async def _each_async(
        self, records: Sequence[Any], start: int, go_on: GoOn, ack: AckRun | None
    ) -> RunOutcome:
        outcome = RunOutcome()
        handler: Callable[[Any], Any] = self._invoke.handler  # inline: one frame less a record
        turns = Turns()  # a handler that never suspends must not hold the loop for a chunk
        latencies, perf_counter = outcome.latencies, time.perf_counter
        acked = start  # with automatic acks: records[start:acked] are acknowledged
        done = start
        try:
            for index in range(start, len(records)):
                if turns.due:
                    if ack is not None:
                        # Before the turn, not after the run: acks may trigger a checkpoint.
                        ack(records, acked, done)
                        acked = done
                    await turns.take()
                if not go_on():
                    break
                record = records[index]
                started = perf_counter()
                try:
                    result = handler(record)
                    if type(result) is CoroutineType or inspect.isawaitable(result):
                        await result
                except Exception as exc:
                    outcome.error = handler_error(exc, record)
                    break
                latencies.append(perf_counter() - started)
                done += 1
        finally:
            outcome.handled = done - start
            if ack is not None:
                ack(records, acked, done)
        return outcome

    def _each_sync(self, records: Sequence[Any], start: int, go_on: GoOn) -> RunOutcome:
        # Runs in a worker thread: one thread hop per run, not per record.
        outcome = RunOutcome()
        call: Callable[[Any], None] = self._invoke.call_sync
        for index in range(start, len(records)):
            if not go_on():
                break
            record = records[index]
            started = time.perf_counter()
            try:
                call(record)
            except Exception as exc:
                outcome.error = handler_error(exc, record)
                break
            outcome.latencies.append(time.perf_counter() - started)
            outcome.handled += 1
        return outcome


def _first(unit: Any) -> Any:
    """The record that names a unit of work: the record itself, or a batch's first."""
    return unit[0] if isinstance(unit, list) else unit
