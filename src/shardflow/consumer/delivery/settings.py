"""How a shard's records are dispatched to a handler: ordering, bounds, retries, failures.

One frozen value, :class:`DispatchSettings`. Ordering modes:

- ``"shard"`` (default): one record at a time, in shard order.
- ``"key"``: records with the same key in shard order, one at a time; different keys in
  parallel. The key is the partition key unless ``key`` maps a record to another one (a
  customer id in the payload, say); a record whose key is None has no ordering constraint.
- ``"unordered"``: every record as soon as there is room.

Failure policies, applied once a record has failed ``retry.max_attempts`` handler calls:

- ``"stop-shard"`` (default): stop dispatching; the record and those not started stay
  unacknowledged, so a restart replays them. Needs no dead-letter destination.
- ``"skip"``: write the record to the dead letters and go on.
- ``"block-key"``: as ``skip``, and every later record of the same key follows it into the dead
  letters, unhandled, until the key is released, so a key's order is never broken.

With ``idempotency`` (:class:`Idempotency`) each handler call is wrapped in an idempotency
guard's claim: a record already handled (e.g. before a failover) is acknowledged without a call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal, get_args

from shardflow.backoff import Backoff
from shardflow.idempotency.guard import KeyFunction as IdempotencyKey
from shardflow.idempotency.guard import by_position
from shardflow.records import Record

if TYPE_CHECKING:
    from shardflow.idempotency.guard import IdempotencyGuard

OrderingMode = Literal["shard", "key", "unordered"]
FailurePolicy = Literal["skip", "block-key", "stop-shard"]
KeyFunction = Callable[[Record], "str | None"]
"""Maps a record to its ordering key; None means the record may run alongside any other."""

ORDERING_MODES: Final = frozenset(get_args(OrderingMode))
FAILURE_POLICIES: Final = frozenset(get_args(FailurePolicy))


def partition_key(record: Record) -> str:
    """The default ordering key: the record's partition key."""
    return record.partition_key


def _default_retry() -> Backoff:
    # Half jitter: records of many keys failing together (a database restart) spread their
    # retries, and none retries much sooner than its ceiling.
    return Backoff(base=0.1, cap=5.0, max_attempts=3, jitter="half")


@dataclass(frozen=True, slots=True)
class Idempotency:
    """An idempotency guard around every handler call, and how records are named to it.

    ``guard``: a :class:`~shardflow.idempotency.InMemoryIdempotencyGuard` (one process) or a
    :class:`~shardflow.idempotency.DynamoDBIdempotencyGuard` (shared by all workers, TTL).
    ``key``: the record's name (default :func:`~shardflow.idempotency.by_position`:
    stream/shard/sequence/sub-sequence, the same after a failover; or
    :func:`~shardflow.idempotency.by_user_key` for an id in the payload).

    Per call: claim the key; a key handled before is acknowledged without calling the handler;
    a key claimed elsewhere counts as a failed attempt (retried per the retry policy); a failed
    handler releases its claim, so a retry or the shard's next owner handles the record. The
    guard stays the caller's: the consumer never closes it.
    """

    guard: IdempotencyGuard
    """The guard: one process's memory, or a DynamoDB table shared by all workers."""
    key: IdempotencyKey = by_position
    """Names a record to the guard (default: its stream/shard/sequence position)."""

    def __post_init__(self) -> None:
        for method in ("claim", "complete", "release"):
            if not callable(getattr(self.guard, method, None)):
                raise TypeError(f"not an idempotency guard (no {method}()): {self.guard!r}")
        if not callable(self.key):
            raise TypeError(f"key must be a function of a record, got {self.key!r}")


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    """Ordering, bounds, retries and the failure policy of one consumer (see the module doc)."""

    ordering: OrderingMode = "shard"
    """``"shard"`` (default), ``"key"`` or ``"unordered"``."""
    key: KeyFunction | None = None
    """The ordering key of a record (default: its partition key); also the key that
    ``"block-key"`` blocks, in every mode."""
    max_in_flight_per_shard: int = 256
    """Records of one shard accepted and not yet finished (waiting for their key's turn,
    running, retrying or being dead-lettered); ``submit`` waits at this bound."""
    retry: Backoff = field(default_factory=_default_retry)
    """Handler calls per record (``max_attempts``, default 3; None: until one succeeds) and the
    pauses between them."""
    on_failure: FailurePolicy = "stop-shard"
    """``"stop-shard"`` (default), ``"skip"`` or ``"block-key"``; the last two need a
    dead-letter destination."""
    max_in_flight_per_worker: int | None = None
    """Handler calls running at once across all shards of a consumer (default None: no bound
    beyond the per-shard one)."""
    idempotency: Idempotency | None = None
    """An idempotency guard around handler calls (:class:`Idempotency`; default None: none)."""
    bisect_on_error: bool = False
    """Batch handlers: a batch whose call raises is split in two and each half handled on its
    own, down to the one record that fails (which then gets the retry policy and
    ``on_failure``); the halves that succeed are not called again. As Lambda's
    ``BisectBatchOnFunctionError``."""
    max_record_age: float | None = None
    """Seconds: a record older than this when its turn comes (by its arrival time in the
    stream) goes to the dead letters without a handler call (a
    :class:`~shardflow.errors.RecordExpiredError`), counted; None (default): no limit. As
    Lambda's ``MaximumRecordAgeInSeconds``; needs a dead-letter destination."""

    def __post_init__(self) -> None:
        if self.ordering not in ORDERING_MODES:
            raise ValueError(
                f"ordering must be one of {sorted(ORDERING_MODES)}, got {self.ordering!r}"
            )
        if self.on_failure not in FAILURE_POLICIES:
            raise ValueError(
                f"on_failure must be one of {sorted(FAILURE_POLICIES)}, got {self.on_failure!r}"
            )
        if self.max_in_flight_per_shard < 1:
            raise ValueError(
                f"max_in_flight_per_shard must be at least 1, got {self.max_in_flight_per_shard}"
            )
        if self.max_in_flight_per_worker is not None and self.max_in_flight_per_worker < 1:
            raise ValueError(
                f"max_in_flight_per_worker must be at least 1, got {self.max_in_flight_per_worker}"
            )
        if self.max_record_age is not None and self.max_record_age <= 0:
            raise ValueError(f"max_record_age must be positive, got {self.max_record_age}")
        if self.key is not None and not callable(self.key):
            raise TypeError(f"key must be a function of a record, got {self.key!r}")

    @property
    def key_function(self) -> KeyFunction:
        """The ordering key function in effect."""
        return self.key if self.key is not None else partition_key

    def check_batch_handler(self) -> None:
        """Raise ValueError unless a batch handler can run under these settings: batches are
        chunks in shard order, retried and dead-lettered whole, never per key or per claim."""
        if self.ordering != "shard" or self.on_failure == "block-key" or self.idempotency:
            raise ValueError(
                "a batch handler takes shard ordering, without block-key or an idempotency guard"
            )

    @property
    def needs_dead_letters(self) -> bool:
        """Whether records may go to a dead-letter destination (the failure policy, or
        ``max_record_age``)."""
        return self.on_failure != "stop-shard" or self.max_record_age is not None


DEFAULT_DELIVERY: Final = DispatchSettings(retry=Backoff(max_attempts=1))
"""How ``consume`` delivers without dispatch settings: in shard order, one call per record (a
chunk's records in one go), no retries; a failure stops the shard with the handler's error."""
