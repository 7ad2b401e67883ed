"""One producer per executor Python process, reused by every task and micro-batch.

A producer owns a thread, an event loop, an HTTP connection pool and per-shard rate limits:
building one per task would pay for all of that on every task of every micro-batch and start
each task's rate limiting from nothing. Spark reuses its Python workers across tasks, so
producers are kept here, per stream and settings, between tasks.

A task borrows a producer for its whole write and flushes it before returning it, so an idle
producer never holds a record and a task's commit message covers exactly its rows. Two tasks
never share a producer at once (a second concurrent task gets a producer of its own). A task
that fails closes the producer it borrowed instead of returning it: records of a failed task
must not reach the next task's flush.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from shardflow.aws.settings import AwsSettings
from shardflow.producer import ProducerSettings, SyncProducer
from shardflow.spark.sink.options import SinkOptions

log = logging.getLogger("shardflow.spark.sink")

ABORT_GRACE = 5.0
"""Seconds a failing task gives its producer to settle what is in flight before abandoning it."""

_Key = tuple[str, ProducerSettings, AwsSettings]


@dataclass(frozen=True, slots=True)
class PooledProducer:
    """A producer of this process and its name, ``host/pid#n`` (the n-th one started here):
    a task's commit message carries the name, so the driver's log shows which tasks and
    micro-batches shared a producer."""

    producer: SyncProducer
    name: str


_idle: dict[_Key, list[PooledProducer]] = {}
_lock = threading.Lock()
_started = 0


def producers_started() -> int:
    """How many producers this process has started (for tests and logs)."""
    return _started


@contextmanager
def borrowed_producer(options: SinkOptions) -> Iterator[PooledProducer]:
    """A started producer for ``options``, kept for the next task if the block succeeds."""
    key: _Key = (options.stream, options.producer, options.connection.aws_settings())
    with _lock:
        spare = _idle.get(key)
        pooled = spare.pop() if spare else None
    if pooled is None:
        pooled = _start(key)
    try:
        yield pooled
    except BaseException:
        # The task fails with the first error; a second one while closing would only hide it.
        try:
            pooled.producer.close(ABORT_GRACE)
        except Exception:
            log.exception("closing the producer of %s after a failed write failed", key[0])
        raise
    with _lock:
        _idle.setdefault(key, []).append(pooled)


def _start(key: _Key) -> PooledProducer:
    global _started
    stream, settings, aws = key
    producer = SyncProducer(stream, settings=settings, aws=aws)
    try:
        producer.start()
    except BaseException:
        producer.close(ABORT_GRACE)
        raise
    with _lock:
        _started += 1
        name = f"{socket.gethostname()}/{os.getpid()}#{_started}"
    log.debug("started producer %s for %s in this executor process", name, stream)
    return PooledProducer(producer, name)
