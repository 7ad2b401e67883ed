"""Positions in a shard: where reading starts, and where it resumes.

- :class:`StartPosition`: the five shard iterator types of GetShardIterator, as values (where a
  new application or a read starts: ``initial_position``).
- :class:`ShardPosition`: where reading one shard resumes, as the consumer's checkpoints and
  the Spark source's offsets keep it; :meth:`ShardPosition.iterator_start` is the
  :class:`StartPosition` it reads from, :meth:`ShardPosition.skips` the records read again that
  it covers. One model, shared by every reader of the project.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from shardflow.records import ExtendedSequenceNumber


class PositionKind(StrEnum):
    """The ``ShardIteratorType`` values of GetShardIterator."""

    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    AT_SEQUENCE_NUMBER = "AT_SEQUENCE_NUMBER"
    AFTER_SEQUENCE_NUMBER = "AFTER_SEQUENCE_NUMBER"


_SEQUENCE_KINDS = frozenset({PositionKind.AT_SEQUENCE_NUMBER, PositionKind.AFTER_SEQUENCE_NUMBER})

# Spellings accepted by :meth:`StartPosition.parse` for the positions that carry no value.
_NAMED: dict[str, PositionKind] = {
    "trim-horizon": PositionKind.TRIM_HORIZON,
    "trim_horizon": PositionKind.TRIM_HORIZON,
    "oldest": PositionKind.TRIM_HORIZON,
    "latest": PositionKind.LATEST,
    "newest": PositionKind.LATEST,
}


@dataclass(frozen=True, slots=True)
class StartPosition:
    """A position to start reading a shard from.

    Build one with the constructors: :meth:`trim_horizon` (the oldest record kept),
    :meth:`latest` (only records written after the iterator is taken), :meth:`at_timestamp`
    (the first record that arrived at or after a moment), :meth:`at_sequence_number` and
    :meth:`after_sequence_number` (relative to a record of one particular shard).
    """

    kind: PositionKind
    timestamp: datetime | None = None
    sequence_number: str | None = None

    def __post_init__(self) -> None:
        if self.kind is PositionKind.AT_TIMESTAMP:
            if self.timestamp is None:
                raise ValueError("AT_TIMESTAMP needs a timestamp")
            if self.timestamp.tzinfo is None:
                # A naive datetime is ambiguous (local time? UTC?): refuse rather than guess.
                raise ValueError("AT_TIMESTAMP needs a timezone-aware datetime")
        elif self.timestamp is not None:
            raise ValueError(f"{self.kind} takes no timestamp")
        if self.kind in _SEQUENCE_KINDS:
            if not self.sequence_number or not self.sequence_number.isdigit():
                raise ValueError(
                    f"{self.kind} needs a decimal sequence number, got {self.sequence_number!r}"
                )
        elif self.sequence_number is not None:
            raise ValueError(f"{self.kind} takes no sequence number")

    # --- constructors ----------------------------------------------------------------------

    @classmethod
    def trim_horizon(cls) -> StartPosition:
        return cls(PositionKind.TRIM_HORIZON)

    @classmethod
    def latest(cls) -> StartPosition:
        return cls(PositionKind.LATEST)

    @classmethod
    def at_timestamp(cls, timestamp: datetime) -> StartPosition:
        return cls(PositionKind.AT_TIMESTAMP, timestamp=timestamp)

    @classmethod
    def at_sequence_number(cls, sequence_number: str) -> StartPosition:
        return cls(PositionKind.AT_SEQUENCE_NUMBER, sequence_number=sequence_number)

    @classmethod
    def after_sequence_number(cls, sequence_number: str) -> StartPosition:
        return cls(PositionKind.AFTER_SEQUENCE_NUMBER, sequence_number=sequence_number)

    @classmethod
    def parse(cls, text: str) -> StartPosition:
        """A position from command-line text.

        Accepts ``trim-horizon`` (or ``oldest``), ``latest`` (or ``newest``), and an ISO 8601
        timestamp such as ``2024-05-01T12:00:00Z``; a timestamp without an offset is read as UTC.
        """
        cleaned = text.strip()
        kind = _NAMED.get(cleaned.lower())
        if kind is not None:
            return cls(kind)
        try:
            moment = datetime.fromisoformat(cleaned)
        except ValueError:
            raise ValueError(
                f"not a start position: {text!r} "
                "(expected trim-horizon, latest or an ISO timestamp such as 2024-05-01T12:00:00Z)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return cls.at_timestamp(moment)

    # --- use -------------------------------------------------------------------------------

    @property
    def is_sequence_relative(self) -> bool:
        """True for positions that name a record of one particular shard."""
        return self.kind in _SEQUENCE_KINDS

    def iterator_params(self) -> dict[str, Any]:
        """The GetShardIterator parameters for this position (without stream and shard)."""
        params: dict[str, Any] = {"ShardIteratorType": self.kind.value}
        if self.timestamp is not None:
            params["Timestamp"] = self.timestamp
        if self.sequence_number is not None:
            params["StartingSequenceNumber"] = self.sequence_number
        return params

    def __str__(self) -> str:
        if self.timestamp is not None:
            return f"{self.kind.value} {self.timestamp.isoformat()}"
        if self.sequence_number is not None:
            return f"{self.kind.value} {self.sequence_number}"
        return self.kind.value


class ShardPositionKind(StrEnum):
    """Where reading one shard resumes (see :class:`ShardPosition`)."""

    TRIM_HORIZON = "TRIM_HORIZON"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    AT = "AT"
    AFTER = "AFTER"
    SHARD_END = "SHARD_END"


@dataclass(frozen=True, slots=True)
class ShardPosition:
    """Where reading one shard resumes (or, for ``SHARD_END``, that nothing is left): the one
    position model of the consumer's checkpoints and the Spark source's offsets.

    As text (:meth:`to_text`, what Spark stores in offsets and compares as strings):
    ``TRIM_HORIZON``; ``AT_TIMESTAMP:<epoch ms>``; ``AT:<seq>`` (that record and everything
    after it); ``AFTER:<seq>`` (everything after it); ``AFTER:<seq>/<sub>`` (everything after
    sub-record ``sub`` of aggregate ``seq``: a checkpoint or a micro-batch may end inside an
    aggregate); ``SHARD_END`` (nothing left). A KCL checkpoint is ``AFTER`` its extended
    sequence number (:meth:`after_checkpoint`).
    """

    kind: ShardPositionKind
    sequence_number: str | None = None
    sub_sequence_number: int | None = None  # AFTER inside an aggregate
    timestamp_ms: int | None = None

    # --- constructors ----------------------------------------------------------------------

    @classmethod
    def trim_horizon(cls) -> ShardPosition:
        return cls(ShardPositionKind.TRIM_HORIZON)

    @classmethod
    def shard_end(cls) -> ShardPosition:
        return cls(ShardPositionKind.SHARD_END)

    @classmethod
    def at_timestamp_ms(cls, millis: int) -> ShardPosition:
        return cls(ShardPositionKind.AT_TIMESTAMP, timestamp_ms=millis)

    @classmethod
    def at(cls, sequence_number: str) -> ShardPosition:
        return cls(ShardPositionKind.AT, sequence_number=_digits(sequence_number))

    @classmethod
    def after(cls, sequence_number: str, sub_sequence_number: int | None = None) -> ShardPosition:
        return cls(
            ShardPositionKind.AFTER,
            sequence_number=_digits(sequence_number),
            sub_sequence_number=sub_sequence_number,
        )

    @classmethod
    def after_checkpoint(cls, checkpoint: ExtendedSequenceNumber) -> ShardPosition:
        """Everything after a record checkpoint (sub-records of an aggregate included)."""
        return cls.after(checkpoint.sequence_number, checkpoint.sub_sequence_number)

    # --- text ------------------------------------------------------------------------------

    def to_text(self) -> str:
        if self.kind is ShardPositionKind.AT_TIMESTAMP:
            return f"AT_TIMESTAMP:{self.timestamp_ms}"
        if self.kind is ShardPositionKind.AT:
            return f"AT:{self.sequence_number}"
        if self.kind is ShardPositionKind.AFTER:
            sub = "" if self.sub_sequence_number is None else f"/{self.sub_sequence_number}"
            return f"AFTER:{self.sequence_number}{sub}"
        return self.kind.value

    @classmethod
    def from_text(cls, text: str) -> ShardPosition:
        """Parse what :meth:`to_text` wrote; raises ValueError otherwise."""
        head, _, rest = text.partition(":")
        if head in (ShardPositionKind.TRIM_HORIZON, ShardPositionKind.SHARD_END) and not rest:
            return cls(ShardPositionKind(head))
        if head == ShardPositionKind.AT_TIMESTAMP and rest.lstrip("-").isdigit():
            return cls.at_timestamp_ms(int(rest))
        if head == ShardPositionKind.AT:
            return cls.at(rest)
        if head == ShardPositionKind.AFTER:
            seq, slash, sub = rest.partition("/")
            if slash and not sub.isdigit():
                raise ValueError(f"not a shard position: {text!r}")
            return cls.after(seq, int(sub) if slash else None)
        raise ValueError(f"not a shard position: {text!r}")

    def __str__(self) -> str:
        return self.to_text()

    # --- reading ---------------------------------------------------------------------------

    @property
    def names_record(self) -> bool:
        """True for positions relative to one record (AT, AFTER): that record must still exist."""
        return self.kind in (ShardPositionKind.AT, ShardPositionKind.AFTER)

    def iterator_start(self) -> StartPosition:
        """Where the shard iterator starts. AFTER is read AT the record, which is then skipped:
        seeing it proves nothing between it and the next record expired meanwhile."""
        if self.kind is ShardPositionKind.TRIM_HORIZON:
            return StartPosition.trim_horizon()
        if self.kind is ShardPositionKind.AT_TIMESTAMP:
            assert self.timestamp_ms is not None
            return StartPosition.at_timestamp(datetime.fromtimestamp(self.timestamp_ms / 1000, UTC))
        if self.kind in (ShardPositionKind.AT, ShardPositionKind.AFTER):
            assert self.sequence_number is not None
            return StartPosition.at_sequence_number(self.sequence_number)
        raise ValueError("SHARD_END has no iterator")

    def covers(self, sequence_number: str, sub_sequence_number: int) -> bool:
        """Whether the record at (sequence number, sub-sequence number) lies at or before this
        position: a record read again that a reader must skip (only ``AFTER`` covers any)."""
        if self.kind is not ShardPositionKind.AFTER:
            return False
        mine = self.sequence_number
        assert mine is not None
        if sequence_number != mine:
            # Decimal strings without leading zeros: shorter is smaller, else text order.
            return len(sequence_number) < len(mine) or (
                len(sequence_number) == len(mine) and sequence_number < mine
            )
        return self.sub_sequence_number is None or sub_sequence_number <= self.sub_sequence_number

    def skips(self, sequence_number: str, sub_sequence_number: int) -> bool:
        """Whether a record read from :meth:`iterator_start` lies at or before this position
        (:meth:`covers`)."""
        return self.covers(sequence_number, sub_sequence_number)


def _digits(sequence_number: str) -> str:
    if not sequence_number.isdigit():
        raise ValueError(f"not a sequence number: {sequence_number!r}")
    return sequence_number
