"""Positions in one shard as the Spark source keeps them in offsets and metadata: short text.

Offsets are JSON that Spark stores and compares as strings, so a position is one stable string:

- ``TRIM_HORIZON``: the shard's oldest record
- ``AT_TIMESTAMP:<epoch ms>``: the first record that arrived at or after that moment
- ``AT:<seq>``: the record with that sequence number and everything after it
- ``AFTER:<seq>``: everything after the record with that sequence number
- ``AFTER:<seq>/<sub>``: everything after sub-record ``sub`` of aggregated record ``seq``
  (a micro-batch may end inside an aggregate)
- ``SHARD_END``: nothing left; the shard is closed and fully read
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from shardflow.positions import StartPosition


class Kind(StrEnum):
    TRIM_HORIZON = "TRIM_HORIZON"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    AT = "AT"
    AFTER = "AFTER"
    SHARD_END = "SHARD_END"


@dataclass(frozen=True, slots=True)
class ShardPosition:
    """Where reading one shard starts (or, for ``SHARD_END``, that nothing is left)."""

    kind: Kind
    sequence_number: str | None = None
    sub_sequence_number: int | None = None  # AFTER inside an aggregate
    timestamp_ms: int | None = None

    # --- constructors ----------------------------------------------------------------------

    @classmethod
    def trim_horizon(cls) -> ShardPosition:
        return cls(Kind.TRIM_HORIZON)

    @classmethod
    def shard_end(cls) -> ShardPosition:
        return cls(Kind.SHARD_END)

    @classmethod
    def at_timestamp_ms(cls, millis: int) -> ShardPosition:
        return cls(Kind.AT_TIMESTAMP, timestamp_ms=millis)

    @classmethod
    def at(cls, sequence_number: str) -> ShardPosition:
        return cls(Kind.AT, sequence_number=_digits(sequence_number))

    @classmethod
    def after(cls, sequence_number: str, sub_sequence_number: int | None = None) -> ShardPosition:
        return cls(
            Kind.AFTER,
            sequence_number=_digits(sequence_number),
            sub_sequence_number=sub_sequence_number,
        )

    # --- text ------------------------------------------------------------------------------

    def to_text(self) -> str:
        if self.kind is Kind.AT_TIMESTAMP:
            return f"AT_TIMESTAMP:{self.timestamp_ms}"
        if self.kind is Kind.AT:
            return f"AT:{self.sequence_number}"
        if self.kind is Kind.AFTER:
            sub = "" if self.sub_sequence_number is None else f"/{self.sub_sequence_number}"
            return f"AFTER:{self.sequence_number}{sub}"
        return self.kind.value

    @classmethod
    def from_text(cls, text: str) -> ShardPosition:
        """Parse what :meth:`to_text` wrote; raises ValueError otherwise."""
        head, _, rest = text.partition(":")
        if head in (Kind.TRIM_HORIZON, Kind.SHARD_END) and not rest:
            return cls(Kind(head))
        if head == Kind.AT_TIMESTAMP and rest.lstrip("-").isdigit():
            return cls.at_timestamp_ms(int(rest))
        if head == Kind.AT:
            return cls.at(rest)
        if head == Kind.AFTER:
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
        return self.kind in (Kind.AT, Kind.AFTER)

    def iterator_start(self) -> StartPosition:
        """Where the shard iterator starts. AFTER is read AT the record, which is then skipped:
        seeing it proves nothing between it and the next record expired meanwhile."""
        if self.kind is Kind.TRIM_HORIZON:
            return StartPosition.trim_horizon()
        if self.kind is Kind.AT_TIMESTAMP:
            assert self.timestamp_ms is not None
            return StartPosition.at_timestamp(datetime.fromtimestamp(self.timestamp_ms / 1000, UTC))
        if self.kind in (Kind.AT, Kind.AFTER):
            assert self.sequence_number is not None
            return StartPosition.at_sequence_number(self.sequence_number)
        raise ValueError("SHARD_END has no iterator")

    def skips(self, sequence_number: str, sub_sequence_number: int) -> bool:
        """Whether a record read from :meth:`iterator_start` lies at or before this position."""
        if self.kind is not Kind.AFTER or sequence_number != self.sequence_number:
            return False
        return self.sub_sequence_number is None or sub_sequence_number <= self.sub_sequence_number


def _digits(sequence_number: str) -> str:
    if not sequence_number.isdigit():
        raise ValueError(f"not a sequence number: {sequence_number!r}")
    return sequence_number


# --- what users write in startingPosition / endingPosition ----------------------------------

LATEST = "LATEST"


def parse_user_position(text: str) -> ShardPosition | str:
    """One shard's position as a user writes it: a :class:`ShardPosition`, or ``"LATEST"``.

    Accepts TRIM_HORIZON, LATEST, SHARD_END, ``AT_TIMESTAMP:<ISO 8601 or epoch ms>``,
    ``AT_SEQUENCE_NUMBER:<seq>`` (or ``AT:``), ``AFTER_SEQUENCE_NUMBER:<seq>`` (or ``AFTER:``)
    and a bare sequence number (meaning after it). Raises ValueError with the accepted forms.
    """
    cleaned = text.strip()
    upper = cleaned.upper()
    if upper == LATEST:
        return LATEST
    if upper in (Kind.TRIM_HORIZON, Kind.SHARD_END):
        return ShardPosition(Kind(upper))
    if cleaned.isdigit():
        return ShardPosition.after(cleaned)
    head, sep, rest = cleaned.partition(":")
    head = head.upper()
    if sep and head == "AT_TIMESTAMP":
        return ShardPosition.at_timestamp_ms(parse_timestamp_ms(rest))
    if sep and head in ("AT", "AT_SEQUENCE_NUMBER") and rest.isdigit():
        return ShardPosition.at(rest)
    if sep and head in ("AFTER", "AFTER_SEQUENCE_NUMBER") and rest.isdigit():
        return ShardPosition.after(rest)
    raise ValueError(
        f"not a shard position: {text!r} (expected TRIM_HORIZON, LATEST, "
        "AT_TIMESTAMP:<ISO 8601 or epoch ms>, AT_SEQUENCE_NUMBER:<seq>, "
        "AFTER_SEQUENCE_NUMBER:<seq> or a sequence number)"
    )


def parse_timestamp_ms(text: str) -> int:
    """Epoch milliseconds from digits (already ms) or ISO 8601 (no offset means UTC)."""
    cleaned = text.strip()
    if cleaned.isdigit():
        return int(cleaned)
    try:
        moment = datetime.fromisoformat(cleaned)
    except ValueError:
        raise ValueError(f"not a timestamp: {text!r} (ISO 8601 or epoch milliseconds)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_per_shard(text: str) -> dict[str, ShardPosition | str]:
    """A JSON object of shard id to position text, as :func:`parse_user_position` reads it."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int) for k, v in raw.items()
    ):
        raise ValueError('expected a JSON object of shard id to position, e.g. {"shardId-0": "…"}')
    return {shard: parse_user_position(str(value)) for shard, value in raw.items()}
