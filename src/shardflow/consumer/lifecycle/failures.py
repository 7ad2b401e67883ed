"""Why a shard stopped, as the consumer must treat it.

- A handler failure (the handler raised, a record could not be deserialized, a malformed
  aggregate under ``on_malformed="raise"``, a key function failed, retries or dead letters
  gave out): the error policy decides; ``stop-shard`` parks the shard, keeping its lease.
- A failure that may pass (throttling, 5xx, timeouts) that escaped a bounded retry somewhere:
  the lease is released, so that the shard is taken again and starts over.
- Anything else retrying cannot fix (the stream deleted, access denied for longer than the
  fetcher's ``denied_for``, a bug): the lease is released and the consumer stops.
"""

from __future__ import annotations

from typing import Literal

from shardflow.errors import (
    AggregationError,
    AwsError,
    DeadLetterWriteError,
    DeserializationError,
    DispatchStoppedError,
    HandlerError,
    KeyFunctionError,
)

FailureKind = Literal["handler", "passing", "fatal"]

_HANDLER_FAILURES = (
    HandlerError,
    DeserializationError,
    AggregationError,
    KeyFunctionError,
    DispatchStoppedError,
    DeadLetterWriteError,
)


def failure_kind(error: BaseException) -> FailureKind:
    """How the consumer treats a shard stopped by ``error`` (see the module doc)."""
    if isinstance(error, _HANDLER_FAILURES):
        return "handler"
    if isinstance(error, AwsError) and error.retryable:
        return "passing"
    return "fatal"
