"""From fetched Kinesis records to the records a handler should see, for one shard.

Three steps, in order:

1. De-aggregation: KPL aggregates become their user records (sub-records), each with its own
   position (sequence number + sub-sequence number), so checkpoints can fall inside an
   aggregate.
2. Resume filter: records at or before the stored checkpoint are dropped (a checkpoint inside
   an aggregate resumes AT its sequence number, so the aggregate is read again); records the
   stored completed-record state lists as handled are passed on marked "already handled".
3. Hash-range rule for sub-records: after a reshard, an aggregate written to a parent shard may
   hold user records whose hash key now lies outside the shard's range. The KCL drops them
   silently. shardflow's default, ``"deliver"``, hands them to the handler like any other
   record (nothing is lost; they were written to this shard and no other shard will deliver
   them) and counts and logs them; ``"drop"`` behaves like the KCL but still counts and logs.
   Plain records are never judged: Kinesis placed them by their own hash key.

Records that are passed on but must not reach the handler (already handled, dropped) are still
delivered to the shard's ack tracker and acknowledged at once, so checkpoints move over them.

The work is incremental (:meth:`RecordIntake.pieces`): a GetRecords answer of 10 MiB may hold
a million and a half user records, a third of a second of work per 1 MiB aggregate. Items come
out in pieces of at most :data:`PIECE_RECORDS`, nothing is made before it is asked for (so a
full prefetch buffer stops the unpacking too), and the event loop gets a turn at least every
:data:`SLICE_SECONDS` of work, so lease renewals are never held up by intake.

No input stops a shard: an aggregate that fails any check is delivered whole as one plain
record (or raises :class:`~shardflow.errors.AggregationError` under ``on_malformed="raise"``,
after every record before it was handed out). Should unpacking fail in any other way (a bug),
the record is still delivered plain, logged as an error and counted in
``IntakeCounts.decode_failures``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from shardflow.aggregation import MAGIC, MalformedPolicy, Unpacking, log_malformed
from shardflow.errors import AggregationError, CompletedStateError
from shardflow.positions import PositionKind, ShardPosition, ShardPositionKind, StartPosition
from shardflow.read.completed import decode_completed
from shardflow.records import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    Record,
    RecordBuilder,
    build_record,
)
from shardflow.shards import HashKeyRange, hash_key_of
from shardflow.turns import SLICE_SECONDS, Turns

log = logging.getLogger("shardflow.consumer")

OutOfRangePolicy = Literal["deliver", "drop"]

PIECE_RECORDS: Final = 256
"""The most items one piece holds (and the user records one unpacking step makes)."""


KEYS_REMEMBERED: Final = 100_000
"""Partition keys whose place in the shard's hash-key range a rule remembers at most."""


class HashRangeRule:
    """Whether a sub-record lies in its shard's hash-key range: the one rule of the consumer
    (asked per record) and the Spark source (asked per row of a column), each partition key
    hashed once (keys repeat; at most :data:`KEYS_REMEMBERED` are kept).

    After a reshard an aggregate written to a parent shard may hold user records whose hash key
    now lies outside the shard's range. Those of an aggregate marked by shardflow's producer
    (``resent_if_out_of_range``) were put again on the right shard: every reader skips them, so
    a record put once is handled once. Others: the consumer's ``out_of_range_sub_records``
    policy decides (deliver or drop); the Spark source delivers them.
    """

    __slots__ = ("_known", "hash_range")

    def __init__(self, hash_range: HashKeyRange | None) -> None:
        self.hash_range = hash_range
        self._known: dict[str, bool] = {}

    def inside(self, partition_key: str, explicit_hash_key: str | None) -> bool:
        """Whether the record so keyed lies in the range (True when the range is unknown)."""
        hash_range = self.hash_range
        if hash_range is None:
            return True
        if explicit_hash_key is not None:
            return int(explicit_hash_key) in hash_range
        known = self._known
        inside = known.get(partition_key)
        if inside is None:
            if len(known) >= KEYS_REMEMBERED:
                known.clear()
            inside = known[partition_key] = hash_key_of(partition_key) in hash_range
        return inside

    def resent_copy(self, record: Record) -> bool:
        """True for a sub-record outside the range whose producer put it on the right shard
        again: a copy no reader hands out."""
        return (
            record.aggregated
            and record.resent_if_out_of_range
            and not self.inside(record.partition_key, record.explicit_hash_key)
        )


class Settled:
    """A record to register with the ack tracker and acknowledge at once, without the handler
    (already handled by the stored state, or dropped by the hash-range rule). Rare: every other
    intake item is the record itself, so the common path makes no object per record."""

    __slots__ = ("record",)

    def __init__(self, record: Record) -> None:
        self.record = record

    @property
    def size(self) -> int:
        return self.record.size

    def __repr__(self) -> str:
        return f"Settled({self.record.position})"


Intake = Record | Settled
"""An intake item: a record for the handler, or a :class:`Settled` one."""


@dataclass(slots=True)
class IntakeCounts:
    """What the intake of one shard has seen so far."""

    fetched: int = 0
    """Kinesis records fetched (an aggregate counts once)."""
    user_records: int = 0
    """Records after de-aggregation."""
    before_checkpoint: int = 0
    """Records at or before the stored checkpoint, not passed on."""
    already_handled: int = 0
    """Records the stored completed-record state lists as handled."""
    out_of_range: int = 0
    """Sub-records whose hash key lies outside the shard's range (delivered or dropped)."""
    dropped: int = 0
    """Out-of-range sub-records not handed to the handler (policy ``"drop"``)."""
    decode_failures: int = 0
    """Records delivered plain because unpacking failed unexpectedly (a bug: logged)."""


class RecordIntake:
    """Turns fetched records of one shard into :data:`Intake` items (see the module doc)."""

    def __init__(
        self,
        *,
        plan: ResumePlan,
        hash_range: HashKeyRange | None,
        out_of_range: OutOfRangePolicy = "deliver",
        on_malformed: MalformedPolicy = "plain",
        stream: str = "",
        shard_id: str = "",
        build: RecordBuilder = build_record,
    ) -> None:
        if out_of_range not in ("deliver", "drop"):
            raise ValueError(f"out_of_range must be 'deliver' or 'drop', got {out_of_range!r}")
        self.plan = plan
        self.hash_range = hash_range
        self._range_rule = HashRangeRule(hash_range)
        self.out_of_range = out_of_range
        self.on_malformed = on_malformed
        self.stream = stream
        self.shard_id = shard_id
        # How sub-records of an aggregate are made (the consumer's: as the type it hands out).
        self._build = build
        self.counts = IntakeCounts()
        # Whether records may still be at or before the checkpoint or listed as handled. Records
        # come in shard order, so once one is past the checkpoint every later one is too: from
        # then on (unless completed-record state lists some) the filter costs nothing.
        self._resuming = plan.kind in ("AT_SEQUENCE_NUMBER", "SHARD_END") or bool(plan.completed)

    async def pieces(self, fetched: Iterable[Record]) -> AsyncGenerator[list[Intake], None]:
        """The items for one fetched batch, in shard order, a piece at a time (see the module
        doc). Ask for the next piece only when ready to take it: nothing is made ahead."""
        turns = Turns(SLICE_SECONDS)
        piece: list[Intake] = []
        for kinesis_record in fetched:
            self.counts.fetched += 1
            if kinesis_record.aggregated or not kinesis_record.data.startswith(MAGIC):
                # A plain record: no unpacking. The clock is read once a piece is full.
                self._shape((kinesis_record,), piece)
                if len(piece) >= PIECE_RECORDS:
                    yield piece
                    piece = []
                    if turns.due:
                        await turns.take()
                continue
            unpacking = Unpacking(kinesis_record, on_malformed=self.on_malformed, build=self._build)
            made_any = False
            while not unpacking.done:
                records = self._step(unpacking, made_any)
                made_any = made_any or bool(records)
                self._shape(records, piece)
                if len(piece) >= PIECE_RECORDS:
                    yield piece
                    piece = []
                if turns.due:
                    if piece:
                        yield piece
                        piece = []
                    await turns.take()
            log_malformed(unpacking)
        if piece:
            yield piece

    def _step(self, unpacking: Unpacking, made_any: bool) -> list[Record]:
        """One unpacking step; an unexpected failure delivers the record plain (see above)."""
        try:
            return unpacking.step(PIECE_RECORDS)
        except AggregationError:
            raise  # on_malformed="raise": the shard's policy
        except Exception:
            if made_any:
                raise  # some user records are out already: the shard must stop, not skip
            self.counts.decode_failures += 1
            record = unpacking.record
            log.exception(
                "unpacking record %s of shard %s (stream %s) failed; delivering it plain",
                record.sequence_number,
                self.shard_id,
                self.stream,
            )
            unpacking.abandon()
            return [record]

    def _shape(self, records: Iterable[Record], out: list[Intake]) -> None:
        counts, plan = self.counts, self.plan
        for record in records:
            counts.user_records += 1
            if self._resuming:
                if not plan.after_checkpoint(record):
                    counts.before_checkpoint += 1
                    continue
                if plan.already_completed(record):
                    counts.already_handled += 1
                    out.append(Settled(record))
                    continue
                self._resuming = bool(plan.completed)
            # Plain records are never judged by the hash-range rule (see the module doc).
            out.append(
                record if not record.aggregated or self._in_range(record) else Settled(record)
            )

    def _in_range(self, record: Record) -> bool:
        """Whether to hand sub-record ``record`` to the handler under the hash-range rule."""
        if self._range_rule.inside(record.partition_key, record.explicit_hash_key):
            return True
        counts = self.counts
        counts.out_of_range += 1
        # A producer that says it sends such records again (shardflow's) put this one on the
        # right shard too: delivering this copy as well would handle the record twice.
        deliver = self.out_of_range == "deliver" and not record.resent_if_out_of_range
        if not deliver:
            counts.dropped += 1
        # The first one per shard is worth a warning; the rest show in the counters.
        level = logging.WARNING if counts.out_of_range == 1 else logging.DEBUG
        log.log(
            level,
            "sub-record %s of shard %s (stream %s) has a hash key outside the shard's range: %s "
            "(out_of_range_sub_records=%s; %d so far)",
            record.position,
            self.shard_id,
            self.stream,
            "delivering it"
            if deliver
            else "dropping it (its producer put it on the right shard again)"
            if record.resent_if_out_of_range
            else "dropping it",
            self.out_of_range,
            counts.out_of_range,
        )
        return deliver


# --- resuming after a restart -------------------------------------------------------------

ResumeKind = Literal["AT_SEQUENCE_NUMBER", "TRIM_HORIZON", "LATEST", "AT_TIMESTAMP", "SHARD_END"]

_SENTINEL_KINDS: Final[dict[str, ResumeKind]] = {
    TRIM_HORIZON: "TRIM_HORIZON",
    LATEST: "LATEST",
    AT_TIMESTAMP: "AT_TIMESTAMP",
    SHARD_END: "SHARD_END",
}


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """Where to read a shard again after a restart, and which re-read records to drop.

    ``kind`` is a GetShardIterator type, or ``"SHARD_END"`` when the shard is finished and
    nothing is left to read. For ``AT_TIMESTAMP`` the timestamp is the application's configured
    initial position (the lease table does not store it).
    """

    kind: ResumeKind
    sequence_number: str | None
    checkpoint: ExtendedSequenceNumber
    completed: frozenset[ExtendedSequenceNumber] = field(default_factory=frozenset)

    position: ShardPosition | None = None
    """The checkpoint in the one position model (:class:`~shardflow.positions.ShardPosition`):
    ``AFTER`` its record, or ``SHARD_END``; None for a sentinel that names no record (resolved
    by :meth:`start_position`)."""

    def after_checkpoint(self, record: Record) -> bool:
        """False for a record the checkpoint already covers (the KCL's filter): reading starts
        AT the checkpoint's record, so it and the sub-records up to it come again."""
        position = self.position
        if position is None:
            return True
        if position.kind is ShardPositionKind.SHARD_END:
            return False
        return not position.covers(record.sequence_number, record.sub_sequence_number)

    def already_completed(self, record: Record) -> bool:
        """True for a record after the checkpoint that the stored state lists as handled.

        A dispatcher should still deliver such a record to the tracker and ack it at once, so
        that the state written next keeps it.
        """
        return record.position in self.completed

    def keep(self, record: Record) -> bool:
        """The predicate: True for records to hand to the application again."""
        return self.after_checkpoint(record) and not self.already_completed(record)

    def start_position(self, initial_timestamp: datetime | None = None) -> StartPosition | None:
        """The GetShardIterator position to read from (None: the shard is finished).

        ``initial_timestamp`` is required for an ``AT_TIMESTAMP`` checkpoint.
        """
        if self.kind == "SHARD_END":
            return None
        position = self.position
        if position is not None:
            return position.iterator_start()
        if self.kind == "AT_TIMESTAMP":
            if initial_timestamp is None:
                raise ValueError("an AT_TIMESTAMP checkpoint needs the initial timestamp")
            return StartPosition.at_timestamp(initial_timestamp)
        return StartPosition(PositionKind(self.kind))


def resume_filter(
    checkpoint: ExtendedSequenceNumber, completed_state: bytes | None = None
) -> ResumePlan:
    """The restart plan for a stored checkpoint (and optionally its completed-record state).

    A record checkpoint resumes AT its sequence number, so the rest of a partly handled
    aggregate is read again; the plan's predicate then drops every record at or before the
    checkpoint. State whose base is not this checkpoint (written before another worker, e.g. a
    KCL one, moved the checkpoint) or that cannot be decoded is ignored: skipping is only an
    optimisation, re-processing is always safe.
    """
    sequence_number = checkpoint.sequence_number
    sentinel_kind = _SENTINEL_KINDS.get(sequence_number)
    if sentinel_kind is not None:
        end = ShardPosition.shard_end() if sentinel_kind == "SHARD_END" else None
        return ResumePlan(sentinel_kind, None, checkpoint, position=end)
    if not sequence_number.isdigit():
        raise ValueError(f"not a checkpoint: {checkpoint!r}")
    completed: frozenset[ExtendedSequenceNumber] = frozenset()
    if completed_state:
        try:
            state = decode_completed(completed_state)
        except CompletedStateError as exc:
            log.warning("ignoring stored completed-record state: %s", exc)
        else:
            if state.base == checkpoint:
                completed = frozenset(state.completed)
    position = ShardPosition.after_checkpoint(checkpoint)
    return ResumePlan("AT_SEQUENCE_NUMBER", sequence_number, checkpoint, completed, position)
