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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from shardflow.aggregation import MalformedPolicy, deaggregate
from shardflow.consumer.resume import ResumePlan
from shardflow.records import Record
from shardflow.shards import HashKeyRange

log = logging.getLogger("shardflow.consumer")

OutOfRangePolicy = Literal["deliver", "drop"]


@dataclass(frozen=True, slots=True)
class Intake:
    """A record to register with the ack tracker; ``handle`` False: ack it without the handler."""

    record: Record
    handle: bool


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


class RecordIntake:
    """Turns fetched records of one shard into :class:`Intake` items (see the module doc)."""

    def __init__(
        self,
        *,
        plan: ResumePlan,
        hash_range: HashKeyRange | None,
        out_of_range: OutOfRangePolicy = "deliver",
        on_malformed: MalformedPolicy = "plain",
        stream: str = "",
        shard_id: str = "",
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

    def shape(self, fetched: Iterable[Record]) -> list[Intake]:
        """The items for one fetched batch, in shard order."""
        items: list[Intake] = []
        counts, plan = self.counts, self.plan
        for kinesis_record in fetched:
            counts.fetched += 1
            for record in deaggregate(kinesis_record, on_malformed=self.on_malformed):
                counts.user_records += 1
                if not plan.after_checkpoint(record):
                    counts.before_checkpoint += 1
                    continue
                if plan.already_completed(record):
                    counts.already_handled += 1
                    items.append(Intake(record, handle=False))
                    continue
                items.append(Intake(record, handle=self._in_range_or_delivered(record)))
        return items

    def _in_range_or_delivered(self, record: Record) -> bool:
        """Whether to hand ``record`` to the handler under the hash-range rule."""
        hash_range = self.hash_range
        if not record.aggregated or hash_range is None or record.hash_key in hash_range:
            return True
        counts = self.counts
        counts.out_of_range += 1
        deliver = self.out_of_range == "deliver"
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
            "delivering it" if deliver else "dropping it",
            self.out_of_range,
            counts.out_of_range,
        )
        return deliver
