"""Positions in one shard as Spark users write them (``startingPosition`` and the like).

The model itself, :class:`~shardflow.positions.ShardPosition`, is the project's one position
model (shared with the consumer); its text forms are what offsets and metadata keep.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from shardflow.positions import ShardPosition
from shardflow.positions import ShardPositionKind as Kind

__all__ = [
    "LATEST",
    "Kind",
    "ShardPosition",
    "parse_per_shard",
    "parse_timestamp_ms",
    "parse_user_position",
]


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
