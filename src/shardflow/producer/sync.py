"""The producer for programs that are not async: its event loop runs in a background thread.

::

    with SyncProducer("orders") as producer:
        future = producer.put(b"...", "customer-42")   # concurrent.futures.Future[PutResult]
        producer.flush()
        print(future.result())

``put`` checks the record in the caller's thread (bad input raises there), then hands it to
the loop thread through an in-memory inbox; the loop is woken only when the inbox turns
non-empty, not once per record. ``put`` blocks while the inbox is full, which happens when
the producer's own buffer is full: backpressure reaches the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.errors import ProducerClosedError, ProducerError
from shardflow.metrics.snapshots import ProducerMetricsSnapshot
from shardflow.producer.exit import run_at_exit
from shardflow.producer.producer import MetricsCallback, Producer
from shardflow.producer.results import PutResult
from shardflow.producer.settings import ProducerSettings
from shardflow.producer.validation import Prepared, RecordInput, prepare, prepare_input

log = logging.getLogger("shardflow.producer")

PutFuture = concurrent.futures.Future[PutResult]


class _Marker:
    """A flush or close request travelling through the inbox behind the records put before it."""

    __slots__ = ("future", "kind", "timeout")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.timeout: float | None = None


_Item = tuple[Prepared, PutFuture] | _Marker
_FLUSH = "flush"
_CLOSE = "close"


class SyncProducer:
    """A :class:`Producer` driven from ordinary threads; futures are ``concurrent.futures``.

    Thread-safe: any number of threads may ``put`` at once. Call :meth:`close` (or use
    ``with``); a producer still open when the interpreter exits is closed then, before Python
    shuts its thread pools down, waiting at most ``exit_timeout`` seconds: records put are
    delivered, and those that could not be are counted in a warning on the
    ``shardflow.producer`` logger, never dropped silently.
    """

    def __init__(
        self,
        stream: str,
        *,
        settings: ProducerSettings | None = None,
        aws: AwsSettings | None = None,
        clients: ClientFactory | None = None,
        on_metrics: MetricsCallback | None = None,
        inbox_max_records: int = 10_000,
        exit_timeout: float = 30.0,
    ) -> None:
        self.stream = stream
        self.settings = settings or ProducerSettings()
        self._producer = Producer(
            stream, settings=self.settings, aws=aws, clients=clients, on_metrics=on_metrics
        )
        self._max_record_bytes = self.settings.max_record_bytes
        self._inbox: deque[_Item] = deque()
        self._inbox_max = inbox_max_records
        self._exit_timeout = exit_timeout
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox_ready: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._cancel_exit_close: Callable[[], None] | None = None
        self._close_marker = _Marker(_CLOSE)
        self._closed = self._close_marker.future

    # --- life cycle --------------------------------------------------------------------------

    def start(self, timeout: float | None = 120.0) -> None:
        """Start the loop thread and the producer; raises what ``Producer.start`` raises."""
        if self._thread is not None:
            raise ProducerError("the producer was already started")
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name=f"shardflow-producer-{self.stream}", daemon=True
        )
        self._thread.start()
        try:
            started.result(timeout)
        except BaseException:
            self._closing = True
            raise
        self._cancel_exit_close = run_at_exit(self._close_at_exit)

    def flush(self, timeout: float | None = None) -> None:
        """Block until every record put so far has its result."""
        marker = _Marker(_FLUSH)
        self._hand_over(marker, block=True, timeout=None)
        marker.future.result(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send everything put so far, wait for every result, stop the loop thread.

        With ``timeout``, records without a result after that many seconds fail (see
        :meth:`Producer.close`).
        """
        if self._thread is None:
            return
        with self._lock:
            first = not self._closing
            self._closing = True
        if first:
            self._close_marker.timeout = timeout
            self._hand_over(self._close_marker, block=False, timeout=None, closing=True)
        # The loop thread gives up at ``timeout`` itself; the margin covers the abort.
        self._closed.result(None if timeout is None else timeout + 30)
        self._thread.join(timeout)
        if self._cancel_exit_close is not None:
            self._cancel_exit_close()

    def _close_at_exit(self) -> None:
        """Deliver what was put before the interpreter exit; say how much could not be."""
        try:
            before = self.metrics(timeout=5.0)
        except Exception:
            before = None
        try:
            self.close(self._exit_timeout)
        except Exception:
            log.exception("closing the producer of %s at exit failed", self.stream)
        after = self._producer._metrics_as_is()  # the loop thread has ended (or is stuck)
        without_result = after.records_put - after.records_succeeded - after.records_failed
        failed = after.records_failed - (before.records_failed if before else 0)
        if failed or without_result:
            log.warning(
                "%d record(s) put on %s before the interpreter exit could not be delivered "
                "(%d failed, %d without a result after %g s)",
                failed + without_result,
                self.stream,
                failed,
                without_result,
                self._exit_timeout,
            )

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- writing -----------------------------------------------------------------------------

    def put(
        self,
        data: bytes | str,
        partition_key: str,
        explicit_hash_key: str | None = None,
        *,
        timeout: float | None = None,
    ) -> PutFuture:
        """Accept one record; blocks while the buffer is full (raises TimeoutError after
        ``timeout`` seconds). Invalid records raise here, as with :meth:`Producer.put`."""
        payload, size, hash_key = prepare(
            data, partition_key, explicit_hash_key, self._max_record_bytes
        )
        future: PutFuture = concurrent.futures.Future()
        prepared = (payload, size, hash_key, partition_key, explicit_hash_key)
        self._hand_over((prepared, future), block=True, timeout=timeout)
        return future

    def put_many(self, records: Iterable[RecordInput]) -> list[PutFuture]:
        """Accept many records in order; all are checked before any is accepted."""
        prepared = [prepare_input(item, self._max_record_bytes) for item in records]
        futures: list[PutFuture] = []
        for item in prepared:
            future: PutFuture = concurrent.futures.Future()
            self._hand_over((item, future), block=True, timeout=None)
            futures.append(future)
        return futures

    def metrics(self, timeout: float | None = 5.0) -> ProducerMetricsSnapshot:
        """Everything measured since start (taken on the loop thread; TimeoutError if it does
        not answer within ``timeout``), as :meth:`Producer.metrics`."""
        self._require_loop()
        return self._producer.metrics(timeout)

    @property
    def producer(self) -> Producer:
        """The asyncio producer underneath (use it only on :attr:`loop`)."""
        return self._producer

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise ProducerError("start the producer first (or use `with`)")
        return self._loop

    def _hand_over(
        self, item: _Item, *, block: bool, timeout: float | None, closing: bool = False
    ) -> None:
        loop = self._require_loop()
        with self._room:
            if self._closing and not closing:
                raise ProducerClosedError(f"the producer of {self.stream} is closed")
            if block and len(self._inbox) >= self._inbox_max:
                if not self._room.wait_for(
                    lambda: len(self._inbox) < self._inbox_max or self._closing, timeout
                ):
                    raise TimeoutError("the producer's buffer stayed full")
                if self._closing and not closing:
                    raise ProducerClosedError(f"the producer of {self.stream} is closed")
            was_empty = not self._inbox
            self._inbox.append(item)
        if was_empty:
            assert self._inbox_ready is not None
            loop.call_soon_threadsafe(self._inbox_ready.set)

    # --- the loop thread ---------------------------------------------------------------------

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main(loop, started))
        finally:
            loop.close()

    async def _main(
        self, loop: asyncio.AbstractEventLoop, started: concurrent.futures.Future[None]
    ) -> None:
        self._inbox_ready = asyncio.Event()
        try:
            await self._producer.start()
        except BaseException as exc:
            started.set_exception(exc)
            return
        self._loop = loop
        started.set_result(None)
        try:
            await self._drain()
        except BaseException as exc:
            if not self._closed.done():
                self._closed.set_exception(exc)
            raise
        finally:
            with self._room:
                self._closing = True
                self._room.notify_all()

    async def _drain(self) -> None:
        producer = self._producer
        ready = self._inbox_ready
        assert ready is not None
        while True:
            await ready.wait()
            ready.clear()
            with self._room:
                batch, self._inbox = self._inbox, deque()
                self._room.notify_all()
            for item in batch:
                if not isinstance(item, _Marker):
                    await self._submit(*item)
                elif item.kind == _FLUSH:
                    _chain(producer._begin_flush(), item.future)
                else:
                    await producer.close(item.timeout)
                    item.future.set_result(None)
                    return

    async def _submit(self, prepared: Prepared, future: PutFuture) -> None:
        producer = self._producer
        try:
            if not producer._submit_nowait(prepared, future):
                await producer._submit(prepared, future)
        except Exception as exc:  # closed or broken: the caller learns it from the future
            if not future.done():
                future.set_exception(exc)


def _chain(source: asyncio.Future[None], target: concurrent.futures.Future[None]) -> None:
    def transfer(done: asyncio.Future[None]) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())
        else:
            target.set_result(None)

    source.add_done_callback(transfer)
