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
from dataclasses import dataclass
from typing import Final, Literal

from shardflow.aggregation import MAGIC, MalformedPolicy, Unpacking, log_malformed
from shardflow.consumer.reading.resume import ResumePlan
from shardflow.errors import AggregationError
from shardflow.records import Record, RecordBuilder, build_record
from shardflow.shards import HashKeyRange
from shardflow.turns import SLICE_SECONDS, Turns

log = logging.getLogger("shardflow.consumer")

OutOfRangePolicy = Literal["deliver", "drop"]

PIECE_RECORDS: Final = 256
"""The most items one piece holds (and the user records one unpacking step makes)."""


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
    """Turns fetched records of one shard into :data:`Intake` items (see the module doc).

    ``build`` makes the user records of aggregates (the consumer's fetchers make the plain
    ones with the same builder).
    """

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
        self.out_of_range = out_of_range
        self.on_malformed = on_malformed
        self.stream = stream
        self.shard_id = shard_id
        self.counts = IntakeCounts()
        self._build = build
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
        hash_range = self.hash_range
        if hash_range is None or record.hash_key in hash_range:
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
