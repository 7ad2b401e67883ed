"""One record processor: the child process the protocol is spoken to, as the KCL runs it.

Started from the command line of ``executableName`` (looked up on ``PATH`` like any command,
in the daemon's working directory and environment), in a process group of its own: a Ctrl-C
in the terminal reaches the daemon, which stops the processors gracefully, not the processors
directly. Its stdout carries the protocol (lines that are not protocol messages are logged
and skipped, as the KCL skips them); every line of its stderr goes to the log
(``shardflow.multilang.stderr``) with the shard id. Reading its next message is bounded by a
timeout; a child that exits, closes its stdout or stops reading its stdin while the daemon
waits raises a :class:`~shardflow.multilang.errors.ProcessorError` subclass. It is stopped by
closing its stdin (the bindings exit when their input ends), then SIGTERM, then SIGKILL, all
by its PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Sequence
from typing import Final

from shardflow.multilang.errors import (
    ProcessorExitedError,
    ProcessorStartError,
    ProcessorTimeoutError,
)
from shardflow.multilang.messages import ChildMessage, Unexpected, decode

log = logging.getLogger("shardflow.multilang")
stderr_log = logging.getLogger("shardflow.multilang.stderr")

READ_CHUNK: Final = 1 << 16
MAX_LINE: Final = 16 << 20
"""A stdout line longer than this is not a protocol message: it is dropped as it comes."""
STDIN_BUFFER: Final = 4 << 20
"""Bytes of a message the daemon hands to the processor's stdin ahead of its reading: a whole
``processRecords`` line of 10,000 records of 100 B (2.7 MiB) at once. Fed a piece of 500
records at a time (the pipe drained before the next piece was made), a kclpy processor ended a
drain of 25,000 records 1.5-2.5 MiB larger (24.3 MiB against 21.8-22.8, its peak 32.3 against
30.4): its reads came in smaller pieces. The pieces are still encoded one by one; a line of
more than this is handed over this much at a time."""
STDERR_FLUSH_AFTER: Final = 0.2
"""A partial stderr line (no newline yet) is logged after this many quiet seconds."""
STDERR_MAX_LINE: Final = 8192


class ChildProcess:
    """A started record processor for ``shard_id`` (see the module doc)."""

    def __init__(self, command: Sequence[str], *, shard_id: str) -> None:
        if not command:
            raise ProcessorStartError("executableName is empty", shard_id=shard_id)
        self.command = tuple(command)
        self.shard_id = shard_id
        self._process: asyncio.subprocess.Process | None = None
        self._buffer = bytearray()
        self._eof = False
        self._stderr_task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.returncode

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise ProcessorStartError(
                f"cannot start {self.command[0]!r}: {exc.strerror or exc}", shard_id=self.shard_id
            ) from None
        assert self._process.stderr is not None
        assert self._process.stdin is not None
        self._process.stdin.transport.set_write_buffer_limits(high=STDIN_BUFFER)
        self._stderr_task = asyncio.create_task(
            self._pump_stderr(self._process.stderr), name=f"shardflow-stderr-{self.shard_id}"
        )
        log.info("shard %s: record processor started (pid %d)", self.shard_id, self._process.pid)

    # --- the protocol ---------------------------------------------------------------------------

    async def send(self, data: bytes | Iterable[bytes]) -> None:
        """Write ``data`` (whole lines, or the consecutive pieces of whole lines) to the child's
        stdin and wait until at most :data:`STDIN_BUFFER` bytes of it wait for the child.
        Pieces are made (by a generator) and written one by one, so that a batch's records
        are never encoded all at once."""
        process = self._started()
        stdin = process.stdin
        assert stdin is not None
        try:
            if isinstance(data, bytes):
                stdin.write(data)
                await stdin.drain()
                return
            for piece in data:
                stdin.write(piece)
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            raise self._exited(f"its stdin is closed ({type(exc).__name__})") from None

    async def receive(self, patience: float | None) -> ChildMessage:
        """The child's next message (:class:`~shardflow.multilang.messages.Unexpected` for a
        line the protocol does not read, for the caller to log), waiting at most ``patience``
        seconds for it (None: as long as it takes)."""
        try:
            async with asyncio.timeout(patience):
                while True:
                    line = await self._next_line()
                    message = decode(line)
                    if message is not None:
                        return message
        except TimeoutError:
            raise ProcessorTimeoutError(
                f"the record processor did not answer within {patience:.1f}s",
                shard_id=self.shard_id,
                waited=patience or 0.0,
            ) from None

    async def _next_line(self) -> bytes:
        process = self._started()
        stdout = process.stdout
        assert stdout is not None
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n")
            if end >= 0:
                line = bytes(buffer[: end + 1])
                del buffer[: end + 1]
                return line
            if len(buffer) > MAX_LINE:
                dropped = bytes(buffer[:200])
                buffer.clear()
                return _too_long(dropped)
            if self._eof:
                if buffer:
                    line = bytes(buffer)
                    buffer.clear()
                    return line
                raise await self._exited_when_done("its stdout ended")
            chunk = await stdout.read(READ_CHUNK)
            if chunk:
                buffer += chunk
            else:
                self._eof = True

    # --- the end --------------------------------------------------------------------------------

    async def close(self, grace: float) -> int | None:
        """Stop the child: close its stdin, give it ``grace`` seconds to exit, then SIGTERM
        (2 s more) and SIGKILL. Returns its exit status."""
        process = self._process
        if process is None:
            return None
        if process.returncode is None and process.stdin is not None:
            with contextlib.suppress(Exception):
                process.stdin.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await process.wait()
        for signum, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            if process.returncode is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await process.wait()
        await self._drain_stderr()
        return process.returncode

    async def kill(self) -> int | None:
        """SIGKILL the child now (it hangs or broke the protocol) and reap it."""
        process = self._process
        if process is None:
            return None
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await process.wait()
        await self._drain_stderr()
        return process.returncode

    async def _drain_stderr(self) -> None:
        task = self._stderr_task
        if task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await asyncio.shield(task)
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    # --- helpers --------------------------------------------------------------------------------

    def _started(self) -> asyncio.subprocess.Process:
        if self._process is None:
            raise RuntimeError("the record processor is not started")
        return self._process

    def _exited(self, what: str) -> ProcessorExitedError:
        code = self.returncode
        status = "still running" if code is None else _describe_exit(code)
        return ProcessorExitedError(
            f"the record processor is gone: {what} ({status})",
            shard_id=self.shard_id,
            returncode=code,
        )

    async def _exited_when_done(self, what: str) -> ProcessorExitedError:
        """The error for a child whose stdout ended: with its exit status when it exits soon."""
        process = self._started()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await process.wait()
        return self._exited(what)

    async def _pump_stderr(self, stream: asyncio.StreamReader) -> None:
        """Every line of the child's stderr to the log, with the shard id."""
        pending = b""
        while True:
            try:
                if pending:
                    async with asyncio.timeout(STDERR_FLUSH_AFTER):
                        chunk = await stream.read(READ_CHUNK)
                else:
                    chunk = await stream.read(READ_CHUNK)
            except TimeoutError:
                self._log_stderr(pending)
                pending = b""
                continue
            if not chunk:
                if pending:
                    self._log_stderr(pending)
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                self._log_stderr(line)
            while len(pending) > STDERR_MAX_LINE:
                self._log_stderr(pending[:STDERR_MAX_LINE])
                pending = pending[STDERR_MAX_LINE:]

    def _log_stderr(self, line: bytes) -> None:
        text = line.rstrip(b"\r").decode("utf-8", errors="replace")
        if text.strip():
            stderr_log.info("[%s] %s", self.shard_id, text)


def _too_long(start: bytes) -> bytes:
    """A stand-in line for one longer than MAX_LINE: decoded as an Unexpected line."""
    return b"<a line of over 16 MiB starting " + start[:80] + b"...>\n"


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


__all__ = ["ChildMessage", "ChildProcess", "Unexpected"]
