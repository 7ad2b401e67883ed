"""How a :class:`~shardflow.consumer.Consumer` reads, delivers and checkpoints: one frozen value.

Defaults follow the KCL where a user would compare (lease timing: failover 10 s, renew every
3.308 s, take cycle 20.05 s; TRIM_HORIZON for a new application; polling), except where the
KCL's behaviour loses data or surprises (out-of-range sub-records are delivered, not dropped)
and where "automatic" is the point (checkpoints every 1,000 records or 5 s).
"""

from __future__ import annotations

import os
import secrets
import socket
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from shardflow.aggregation import MalformedPolicy
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.consumer.delivery.settings import DispatchSettings
from shardflow.fetch.fanout import FanOut
from shardflow.fetch.polling import GET_RECORDS_LIMIT, Polling
from shardflow.leases.settings import LeaseSettings, check_initial_position
from shardflow.metrics.cloudwatch import CloudWatch
from shardflow.positions import StartPosition
from shardflow.read.intake import OutOfRangePolicy
from shardflow.records import Deserializer, as_bytes

MIB: Final = 1024 * 1024

FetchMode = Polling | FanOut
"""How records are fetched: by polling (:class:`~shardflow.fetch.Polling`) or by enhanced
fan-out (:class:`~shardflow.fetch.FanOut`), each value carrying its own settings."""

ErrorPolicy = Literal["stop-shard", "stop-consumer"]

_OLD_ERROR_POLICIES: Final = {"stop_shard": "stop-shard", "stop_consumer": "stop-consumer"}
"""The first spellings (with underscores), accepted for one release with a DeprecationWarning."""


def default_worker_id() -> str:
    """``hostname:pid:random``: unique per process, readable in the lease table."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _default_checkpoint() -> CheckpointSettings:
    return CheckpointSettings(every_n=1_000, interval=5.0)


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Everything about a consumer except which streams and which application."""

    worker_id: str | None = None
    """This process in the lease table (default ``hostname:pid:random``)."""
    initial_position: StartPosition = field(default_factory=StartPosition.trim_horizon)
    """Where a new application starts: TRIM_HORIZON (default), LATEST or AT_TIMESTAMP. Used
    only for shards without a lease; after that, checkpoints decide."""
    fetch: FetchMode = field(default_factory=Polling)
    """``Polling(...)`` (GetRecords; the default) or ``FanOut(...)`` (enhanced fan-out:
    SubscribeToShard through a registered stream consumer, registered at start)."""
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    """Lease timing and balancing (see :class:`~shardflow.leases.settings.LeaseSettings`)."""
    checkpoint: CheckpointSettings = field(default_factory=_default_checkpoint)
    """Automatic checkpoints (default: every 1,000 handled records or 5 s); a final checkpoint
    is always written at shutdown, at shard end and before a lease is given up."""
    deserializer: Deserializer[Any] = as_bytes
    """Turns each record into the value handlers get (default: the bytes)."""
    prefetch_records: int = GET_RECORDS_LIMIT
    """Per shard, the most records fetched and not yet handled (plus the rest of one fetched
    batch waiting for room: GetRecords asks for at most this many, and only once half of this
    is free). A slow handler holds the fetcher back at this bound, and handler batches hold at
    most half of it."""
    prefetch_bytes: int = 16 * MIB
    """Per shard, the most bytes fetched and not yet handled (plus the one batch waiting for
    room; a GetRecords call returns at most 10 MiB)."""
    out_of_range_sub_records: OutOfRangePolicy = "deliver"
    """Aggregated sub-records whose hash key lies outside their shard's range (after a
    reshard): ``"deliver"`` them (default, nothing lost) or ``"drop"`` them as the KCL does;
    both are counted and logged. Either way those of aggregates marked by shardflow's producer,
    which puts them again on the right shard, are skipped: a record put once is handled once."""
    on_malformed_aggregate: MalformedPolicy = "plain"
    """A KPL aggregate that fails to decode is delivered as one plain record (``"plain"``) or
    stops the shard (``"raise"``)."""
    on_error: ErrorPolicy = "stop-shard"
    """When a handler raises or a record cannot be deserialized: ``"stop-shard"`` checkpoints
    what was handled before it and parks the shard (the lease stays held, nothing more is
    delivered from it until the consumer restarts; other shards go on), ``"stop-consumer"``
    stops the whole consumer gracefully and ``consume`` raises the error."""
    drain_timeout: float = 30.0
    """On stop or when the lease is handed over: how long records handed to user code may
    still finish or be acknowledged before the final checkpoint; ``async def`` handler calls
    still running then are cancelled. A plain handler's thread cannot be: the lease is not let
    go while it runs (a handoff completes once it returns; at a stop the lease is left to
    expire), and one still running this long after its shard stopped here is reported
    (:class:`~shardflow.events.HandlerOverrun`). A lost lease cancels ``async def`` calls at
    once."""
    start_timeout: float = 300.0
    """How long start-up calls that fail with errors that may pass (5xx, throttling, timeouts:
    a Kinesis brownout) are tried again before the consumer gives up with
    :class:`~shardflow.errors.StartTimeoutError`; a missing stream or access denied fails at
    once."""
    handler_threads: int | None = None
    """Threads for synchronous handlers (default: min(32, CPUs + 4))."""
    dispatch: DispatchSettings | None = None
    """Ordering mode (shard, key, unordered), in-flight bounds, retries and the failure policy
    for ``consume`` (see :class:`~shardflow.consumer.delivery.DispatchSettings`); default None:
    one call at a time per shard, no retries, a failure stops the shard."""

    metrics: CloudWatch | None = None
    """Publish the consumer's metrics to CloudWatch under the KCL's names (``CloudWatch()``:
    namespace = the application name, level DETAILED, every 60 s; see the operations guide);
    default None: nothing is sent (snapshots and Prometheus need no setting)."""

    def __post_init__(self) -> None:
        check_initial_position(self.initial_position)
        if self.worker_id is not None and not self.worker_id:
            raise ValueError("worker_id must not be empty (None picks one)")
        if not isinstance(self.fetch, Polling | FanOut):
            raise TypeError(f"fetch must be Polling(...) or FanOut(...), got {self.fetch!r}")
        if self.prefetch_records < 1:
            raise ValueError(f"prefetch_records must be at least 1, got {self.prefetch_records}")
        if self.prefetch_bytes < 1:
            raise ValueError(f"prefetch_bytes must be at least 1, got {self.prefetch_bytes}")
        if self.out_of_range_sub_records not in ("deliver", "drop"):
            raise ValueError("out_of_range_sub_records must be 'deliver' or 'drop'")
        if self.on_malformed_aggregate not in ("plain", "raise"):
            raise ValueError("on_malformed_aggregate must be 'plain' or 'raise'")
        if self.on_error in _OLD_ERROR_POLICIES:
            new = _OLD_ERROR_POLICIES[self.on_error]
            warnings.warn(
                f"on_error={self.on_error!r} is spelled {new!r} now (as the CLI and "
                "DispatchSettings.on_failure spell policies)",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "on_error", new)
        if self.on_error not in ("stop-shard", "stop-consumer"):
            raise ValueError("on_error must be 'stop-shard' or 'stop-consumer'")
        if self.drain_timeout < 0:
            raise ValueError("drain_timeout must not be negative")
        if not self.start_timeout > 0:
            raise ValueError(f"start_timeout must be positive, got {self.start_timeout}")
        if self.handler_threads is not None and self.handler_threads < 1:
            raise ValueError("handler_threads must be at least 1")
        if self.metrics is not None and not isinstance(self.metrics, CloudWatch):
            raise TypeError(f"metrics must be CloudWatch(...) or None, got {self.metrics!r}")

    def polling_for_prefetch(self, polling: Polling) -> Polling:
        """``polling``, with GetRecords never asking for more than the prefetch bound."""
        limit = min(polling.max_records, self.prefetch_records)
        if limit == polling.max_records:
            return polling
        return replace(polling, max_records=limit)
