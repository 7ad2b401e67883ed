"""One shard lease, driven through a record processor: the protocol's lifecycle and checkpoints.

A :class:`ShardDriver` takes a :class:`~shardflow.consumer.ShardSession` and speaks to its
child process in the order the KCL does: ``initialize`` (the lease's checkpoint), one
``processRecords`` per batch, then one ending:

- the lease was lost: ``leaseLost`` (checkpoints refused with ``InvalidStateException``);
- the shard ended: ``shardEnded``, the processor must checkpoint (to SHARD_END);
- this worker stops or hands the lease over: ``shutdownRequested`` (the processor may
  checkpoint), then ``leaseLost``.

Checkpoints are the processor's: a record is acknowledged to the consumer only when the
processor checkpoints at or after it, and answered once the lease table has it. A request is
checked as the KCL checks it (between the last checkpoint and the last record delivered, else
``IllegalArgumentException``); lease loss answers ``ShutdownException``, throttling
``ThrottlingException``, other failures ``KinesisClientLibDependencyException``.

A processor that exits, breaks the protocol or does not answer within the timeout is killed
and started again at once (then after a growing pause, up to 30 s) from the last checkpoint:
``initialize`` with it, then the records it had not checkpointed, batch by batch as first
delivered, kept for that. Other shards are not touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from bisect import bisect_right
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from shardflow.consumer import ConsumedRecord, ShardSession
from shardflow.errors import ShardflowError, ShardLeaseLost, ThrottledError
from shardflow.multilang import messages
from shardflow.multilang.child import ChildProcess
from shardflow.multilang.errors import ProcessorError, ProtocolError
from shardflow.multilang.messages import CheckpointRequest, Status, Unexpected
from shardflow.records import SHARD_END, ExtendedSequenceNumber

log = logging.getLogger("shardflow.multilang")

SHARD_END_POSITION: Final = ExtendedSequenceNumber(SHARD_END)
_SENTINELS: Final = frozenset({"TRIM_HORIZON", "LATEST", "AT_TIMESTAMP", SHARD_END})
_CHECKPOINTING: Final = frozenset({"processRecords", "shutdownRequested", "shardEnded"})

LagOf = Callable[[str], int | None]
"""millisBehindLatest of a shard (by shard id), or None when not known."""
ShardEndProbe = Callable[[ShardSession, ConsumedRecord[Any] | None], Awaitable[bool]]
"""Whether the session's shard has no record after the given one (None: after its start)."""


@dataclass(frozen=True, slots=True)
class DriverSettings:
    """How one shard's processor is run (from the properties file)."""

    command: tuple[str, ...]
    response_timeout: float | None = 300.0
    """Seconds the processor may take to send its next message while the daemon waits."""
    shutdown_grace: float = 30.0
    """Seconds a stopping processor gets to checkpoint and exit."""
    empty_batches: bool = False
    """Send processRecords with no records after ``idle_time`` without any."""
    idle_time: float = 1.5
    restart_backoff: float = 0.5
    restart_backoff_cap: float = 30.0


class _Restart(Exception):
    """The processor failed; it was killed and is to be started again."""


class ShardDriver:
    """Runs one shard session through a record processor (see the module doc)."""

    def __init__(
        self,
        session: ShardSession,
        settings: DriverSettings,
        *,
        stopping: asyncio.Event,
        lag_of: LagOf,
        shard_ended: ShardEndProbe,
    ) -> None:
        self.session = session
        self.shard_id = session.shard_id
        self.settings = settings
        self._stopping = stopping
        self._lag_of = lag_of
        self._shard_ended = shard_ended
        self._child: ChildProcess | None = None
        self._phase = "initialize"
        self._last: ExtendedSequenceNumber | None = session.checkpointer.last_written
        """The KCL's lastCheckpointValue: the lease's checkpoint, then each one asked for."""
        self._largest: ExtendedSequenceNumber | None = self._last
        """The KCL's largestPermittedCheckpointValue: the last record delivered."""
        self._pending: deque[list[ConsumedRecord[Any]]] = deque()
        """Batches delivered since the processor's last checkpoint (records after it only)."""
        self._last_record: ConsumedRecord[Any] | None = None
        self._next: asyncio.Future[list[ConsumedRecord[Any]] | None] | None = None
        """The read of the next batch, while it is awaited (and no longer: a done read holds
        its batch as its result)."""
        self._failures = 0
        self.restarts = 0

    # --- the lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Drive the session to its end; never raises (a failure is logged, the shard alone
        stops)."""
        # The shard is read from now on, while the processor starts and initializes (the KCL
        # too starts its prefetch before it calls initialize): its first batch is ready, or
        # on its way, when initialize is answered, instead of only asked for then.
        self._next = asyncio.ensure_future(anext(self.session.batches, None))
        try:
            await self._deliver(None)  # start the processor and initialize it
            await self._batches()
            await self._end()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("shard %s: the multilang driver failed", self.shard_id)
        finally:
            if self._next is not None:
                await _abandon(self._next)
            await self._close_child()

    async def _batches(self) -> None:
        batches = self.session.batches
        try:
            while True:
                if self._next is None:
                    self._next = asyncio.ensure_future(anext(batches, None))
                waiting = self._next
                if self.settings.empty_batches and not await self._ready(waiting):
                    await self._deliver([])
                    continue
                batch = await waiting
                self._next = None
                del waiting  # a done read holds its batch: see _next
                if batch is None:
                    return
                self._pending.append(batch)
                self._last_record = batch[-1]
                self._largest = batch[-1].position
                await self._deliver(batch)
                # Kept from here by _pending alone, which lets it go at the checkpoint: this
                # name would hold it until the next batch came (a drain's last, for good).
                batch = None
        finally:
            if self._next is not None:
                await _abandon(self._next)
                self._next = None

    async def _ready(self, waiting: asyncio.Future[Any]) -> bool:
        """Whether the read is done within ``idle_time`` (its done set is not kept: it would
        hold the read, so its batch)."""
        if waiting.done():
            return True
        done, _ = await asyncio.wait({waiting}, timeout=self.settings.idle_time)
        return bool(done)

    async def _end(self) -> None:
        """The ending the KCL would send (see the module doc)."""
        if self.session.lost:
            log.info("shard %s: lease lost; telling the processor", self.shard_id)
            await self._ending("leaseLost", messages.LEASE_LOST)
            return
        if not self._stopping.is_set() and await self._probe_shard_end():
            log.info("shard %s: shard ended; the processor checkpoints its end", self.shard_id)
            await self._shard_end()
            return
        log.info("shard %s: lease let go; the processor may checkpoint", self.shard_id)
        await self._ending("shutdownRequested", messages.SHUTDOWN_REQUESTED)
        await self._ending("leaseLost", messages.LEASE_LOST)

    async def _probe_shard_end(self) -> bool:
        try:
            return await self._shard_ended(self.session, self._last_record)
        except Exception as exc:
            log.warning("shard %s: could not tell whether the shard ended: %r", self.shard_id, exc)
            return False

    # --- delivering -------------------------------------------------------------------------------

    async def _deliver(self, batch: list[ConsumedRecord[Any]] | None) -> None:
        """``batch`` to the processor (None: only make sure one runs), starting it again from
        the last checkpoint as often as it fails."""
        while True:
            try:
                if self._child is None:
                    await self._start()  # replays every pending batch, this one included
                elif batch is not None:
                    await self._exchange(self._records_message(batch), "processRecords")
                self._failures = 0
                return
            except ProcessorError as failure:
                await self._failed(failure)
                if self.session.lost or self._stopping.is_set():
                    return  # the ending decides what is still said

    async def _start(self) -> None:
        child = ChildProcess(self.settings.command, shard_id=self.shard_id)
        self._child = child
        await child.start()
        await self._exchange(messages.initialize(self.shard_id, self._last), "initialize")
        for pending in list(self._pending):
            await self._exchange(self._records_message(pending), "processRecords")

    def _records_message(self, batch: list[ConsumedRecord[Any]]) -> Iterable[bytes]:
        # In pieces made as they are written: a batch's line is never whole in memory.
        return messages.process_records_pieces(batch, self._lag_of(self.shard_id))

    async def _failed(self, failure: ProcessorError) -> None:
        """Kill the failed processor and wait before the next start (not when stopping)."""
        self._failures += 1
        self.restarts += 1
        child, self._child = self._child, None
        if child is not None:
            await child.kill()
        pause = min(
            self.settings.restart_backoff * 2 ** (self._failures - 1),
            self.settings.restart_backoff_cap,
        )
        log.error(
            "%s; starting it again from checkpoint %s in %.1fs (%d record(s) to deliver again)",
            failure,
            self._last,
            pause,
            sum(len(batch) for batch in self._pending),
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(pause):
                await self._stopping.wait()

    async def _exchange(self, message: bytes | Iterable[bytes], action: str) -> None:
        """Send ``message`` and serve the processor's checkpoints until its status for
        ``action``; raises ProcessorError when it fails (and leaves it to be killed)."""
        child = self._child
        assert child is not None
        self._phase = action
        await child.send(message)
        while True:
            answer = await child.receive(self.settings.response_timeout)
            if isinstance(answer, Unexpected):
                log.info(
                    "shard %s: skipped a line of the processor's stdout (%s): %s",
                    self.shard_id,
                    answer.why,
                    answer.line[:200].decode("utf-8", errors="replace").rstrip(),
                )
                continue
            if isinstance(answer, CheckpointRequest):
                error = await self._checkpoint(answer)
                await child.send(messages.checkpoint_answer(answer, error))
                continue
            assert isinstance(answer, Status)
            if answer.response_for != action:
                raise ProtocolError(
                    f"the record processor answered {action!r} with a status for "
                    f"{answer.response_for!r}",
                    shard_id=self.shard_id,
                )
            return

    # --- endings ----------------------------------------------------------------------------------

    async def _ending(self, action: str, message: bytes) -> None:
        """One last action to a processor that runs (started again with the pending records for
        ``shutdownRequested`` if it failed meanwhile), bounded by the shutdown grace."""
        try:
            async with asyncio.timeout(self.settings.shutdown_grace):
                if self._child is None:
                    if action != "shutdownRequested" or not self._pending:
                        return
                    await self._start()
                await self._exchange(message, action)
        except (ProcessorError, TimeoutError) as exc:
            log.warning("shard %s: %s not completed: %s", self.shard_id, action, exc)
            child, self._child = self._child, None
            if child is not None:
                await child.kill()

    async def _shard_end(self) -> None:
        """``shardEnded`` until the processor checkpoints the shard's end (as the KCL, which
        retries a shard end its processor did not checkpoint)."""
        while not self.session.lost and not self._stopping.is_set():
            try:
                if self._child is None:
                    await self._start()
                await self._exchange(messages.SHARD_ENDED, "shardEnded")
                if self._last == SHARD_END_POSITION:
                    return
                raise ProtocolError(
                    "the record processor did not checkpoint at the end of the shard (it must, "
                    "in shardEnded)",
                    shard_id=self.shard_id,
                )
            except ProcessorError as failure:
                await self._failed(failure)
        if self.session.lost:
            await self._ending("leaseLost", messages.LEASE_LOST)
        else:
            await self._ending("shutdownRequested", messages.SHUTDOWN_REQUESTED)
            await self._ending("leaseLost", messages.LEASE_LOST)

    async def _close_child(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        code = await child.close(self.settings.shutdown_grace)
        log.info("shard %s: record processor ended (exit status %s)", self.shard_id, code)

    # --- checkpoints ------------------------------------------------------------------------------

    async def _checkpoint(self, request: CheckpointRequest) -> str | None:
        """Checkpoint as asked; the KCL's error name, or None on success."""
        if self._phase not in _CHECKPOINTING:
            return "InvalidStateException"
        largest = SHARD_END_POSITION if self._phase == "shardEnded" else self._largest
        target = self._target(request, largest)
        if target is None:
            return "IllegalArgumentException"
        if self._phase == "shardEnded" and target == self._largest:
            target = SHARD_END_POSITION  # the shard's last record: its end (as the KCL)
        if target == self._last:
            return None  # already the checkpoint: nothing to write (as the KCL)
        record = self._last_record if target == SHARD_END_POSITION else self._at_or_before(target)
        try:
            if record is not None:
                await self.session.checkpointer.checkpoint(record)
        except ShardLeaseLost:
            return "ShutdownException"

        except ThrottledError:
            return "ThrottlingException"
        except ShardflowError as exc:
            log.warning("shard %s: checkpoint at %s failed: %s", self.shard_id, target, exc)
            return "KinesisClientLibDependencyException"
        self._last = target
        self._forget_through(target)
        return None

    def _target(
        self, request: CheckpointRequest, largest: ExtendedSequenceNumber | None
    ) -> ExtendedSequenceNumber | None:
        """The position asked for, or None when the KCL would refuse it."""
        sequence = request.sequence_number
        if sequence is None:
            return largest if largest is not None else self._last
        sub = request.sub_sequence_number or 0
        if sub < 0 or not (sequence.isdigit() or sequence in _SENTINELS):
            return None
        target = ExtendedSequenceNumber(sequence, sub)
        if self._last is not None and target < self._last:
            return None
        if largest is None or target > largest:
            return None
        return target

    def _at_or_before(self, target: ExtendedSequenceNumber) -> ConsumedRecord[Any] | None:
        """The last delivered, not yet checkpointed record at or before ``target``."""
        key = _key(target)
        for batch in reversed(self._pending):
            if _key(batch[0].position) <= key:
                index = bisect_right(batch, key, key=_record_key)
                found: ConsumedRecord[Any] = batch[index - 1]
                return found
        return None

    def _forget_through(self, target: ExtendedSequenceNumber) -> None:
        """Drop the records the processor checkpointed from the ones kept for a restart."""
        if target == SHARD_END_POSITION:
            self._pending.clear()
            return
        key = _key(target)
        pending = self._pending
        while pending:
            batch = pending[0]
            if _key(batch[-1].position) <= key:
                pending.popleft()
                continue
            index = bisect_right(batch, key, key=_record_key)
            if index:
                pending[0] = batch[index:]
            return


async def _abandon(waiting: asyncio.Future[Any]) -> None:
    """Cancel a wait for the next batch that is not wanted any more (a batch it got was never
    given to the processor: not acknowledged, so read again by whoever reads the shard next)."""
    if waiting.done():
        if not waiting.cancelled():
            waiting.exception()  # seen: the session's own ending reports what failed
        return
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
        await waiting


def _key(position: ExtendedSequenceNumber) -> tuple[int, int, int]:
    """An order of positions that is cheap to compare (sentinels first, SHARD_END last)."""
    sequence = position.sequence_number
    if sequence.isdigit():
        return (1, int(sequence), position.sub_sequence_number)
    return (2, 0, 0) if sequence == SHARD_END else (0, 0, 0)


def _record_key(record: ConsumedRecord[Any]) -> tuple[int, int, int]:
    return _key(record.position)
