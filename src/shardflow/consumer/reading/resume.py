"""Resuming a shard after a restart: where to read again, and which re-read records to drop.

The plan (:func:`resume_filter`) follows the stored checkpoint exactly as KCL does, and skips
records that the stored completed-record state (:mod:`shardflow.consumer.checkpointing.completed`) lists as
already handled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from shardflow.consumer.checkpointing.completed import decode_completed
from shardflow.errors import CompletedStateError
from shardflow.positions import PositionKind, StartPosition
from shardflow.records import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    Record,
)

# The logger these messages had while this code lived in the checkpoint module: logging set-ups
# keep working unchanged.
log = logging.getLogger("shardflow.consumer.checkpointing.checkpoint")

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

    def after_checkpoint(self, record: Record) -> bool:
        """False for a record the checkpoint already covers (the KCL's filter)."""
        if self.kind == "SHARD_END":
            return False
        if self.kind != "AT_SEQUENCE_NUMBER":
            return True
        return record.position > self.checkpoint

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
        if self.kind == "AT_SEQUENCE_NUMBER":
            return StartPosition.at_sequence_number(self.sequence_number or "")
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
        return ResumePlan(sentinel_kind, None, checkpoint)
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
    return ResumePlan("AT_SEQUENCE_NUMBER", sequence_number, checkpoint, completed)
