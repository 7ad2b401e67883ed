"""Where reading a shard starts: the five shard iterator types of GetShardIterator, as values."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


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
