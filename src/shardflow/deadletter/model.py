"""A dead letter: a record that could not be handled, where it came from, and why it failed.

The JSON encoding below is the one format every destination stores and replay reads::

    {"attempts": 3, "blocked_key": null, "data": "<base64>",
     "error": {"message": "...", "type": "ValueError"}, "explicit_hash_key": null,
     "failed_at": "2025-01-01T12:00:00.000000+00:00",
     "origin": {"arrival_time": "...", "sequence_number": "4959...", "shard_id": "shardId-...",
                "stream": "orders", "sub_sequence_number": 0},
     "partition_key": "customer-42", "version": 1}

Keys are sorted and separators compact, so one letter always encodes to the same bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from shardflow.aws.redaction import redact
from shardflow.errors import MalformedDeadLetterError
from shardflow.records import Record

DEAD_LETTER_VERSION: Final = 1
"""Format version written by this code; letters of a newer version are refused, not guessed at."""

MAX_ERROR_MESSAGE_CHARS: Final = 2_000
"""Error messages are cut to this length: a letter must stay well inside a Kinesis record."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that failed, with its origin and the error that stopped it.

    ``error_message`` never holds credentials (it is redacted when built with
    :meth:`from_failure`). ``blocked_key`` is the partition or ordering key whose later
    records waited behind this one, when the failure held a key up. Times are aware UTC.
    """

    data: bytes
    partition_key: str
    explicit_hash_key: str | None
    stream: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    arrival_time: datetime | None
    error_type: str
    error_message: str
    attempts: int
    failed_at: datetime
    blocked_key: str | None = None
    version: int = DEAD_LETTER_VERSION

    @classmethod
    def from_failure(
        cls,
        record: Record,
        error: BaseException,
        *,
        attempts: int,
        failed_at: datetime | None = None,
        blocked_key: str | None = None,
    ) -> DeadLetter:
        """The letter for ``record`` after ``attempts`` tries ended in ``error``."""
        return cls(
            data=record.data,
            partition_key=record.partition_key,
            explicit_hash_key=record.explicit_hash_key,
            stream=record.stream_name,
            shard_id=record.shard_id,
            sequence_number=record.sequence_number,
            sub_sequence_number=record.sub_sequence_number,
            arrival_time=_utc(record.approximate_arrival_timestamp),
            error_type=type(error).__name__,
            error_message=redact(str(error))[:MAX_ERROR_MESSAGE_CHARS],
            attempts=attempts,
            failed_at=_utc(failed_at) or datetime.now(UTC),
            blocked_key=blocked_key,
        )

    @property
    def origin(self) -> str:
        """``stream/shard/sequence.sub``: where the record was read, for messages."""
        return f"{self.stream}/{self.shard_id}/{self.sequence_number}.{self.sub_sequence_number}"

    # --- encoding ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The letter as JSON-ready values (``data`` base64)."""
        return {
            "version": self.version,
            "data": base64.b64encode(self.data).decode("ascii"),
            "partition_key": self.partition_key,
            "explicit_hash_key": self.explicit_hash_key,
            "origin": {
                "stream": self.stream,
                "shard_id": self.shard_id,
                "sequence_number": self.sequence_number,
                "sub_sequence_number": self.sub_sequence_number,
                "arrival_time": _iso(self.arrival_time),
            },
            "error": {"type": self.error_type, "message": self.error_message},
            "attempts": self.attempts,
            "failed_at": _iso(self.failed_at),
            "blocked_key": self.blocked_key,
        }

    def to_json(self) -> str:
        """One line of JSON (no newline inside): the stable encoding."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    def to_bytes(self) -> bytes:
        return self.to_json().encode("ascii")

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = "?") -> DeadLetter:
        """Parse one encoded letter; :class:`MalformedDeadLetterError` names ``where`` on failure."""
        try:
            value = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedDeadLetterError(where, f"not JSON ({exc})") from None
        return cls.from_dict(value, where=where)

    @classmethod
    def from_dict(cls, value: Any, *, where: str = "?") -> DeadLetter:
        """A letter from decoded JSON values, checked field by field."""
        fields = _Fields(value, where)
        version = fields.integer("version")
        if version > DEAD_LETTER_VERSION or version < 1:
            raise MalformedDeadLetterError(
                where,
                f"format version {version} (this shardflow reads up to {DEAD_LETTER_VERSION})",
            )
        origin = _Fields(fields.get("origin"), where, "origin.")
        error = _Fields(fields.get("error"), where, "error.")
        try:
            data = base64.b64decode(fields.text("data"), validate=True)
        except (binascii.Error, ValueError):
            raise MalformedDeadLetterError(where, "data is not base64") from None
        return cls(
            data=data,
            partition_key=fields.text("partition_key"),
            explicit_hash_key=fields.optional_text("explicit_hash_key"),
            stream=origin.text("stream"),
            shard_id=origin.text("shard_id"),
            sequence_number=origin.text("sequence_number"),
            sub_sequence_number=origin.integer("sub_sequence_number"),
            arrival_time=origin.optional_time("arrival_time"),
            error_type=error.text("type"),
            error_message=error.text("message"),
            attempts=fields.integer("attempts"),
            failed_at=fields.time("failed_at"),
            blocked_key=fields.optional_text("blocked_key"),
            version=version,
        )


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    # A naive time is taken as UTC (botocore hands out aware times; users may not).
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="microseconds")


class _Fields:
    """Typed access to one JSON object's fields; a wrong or missing field is a malformed letter."""

    def __init__(self, value: Any, where: str, prefix: str = "") -> None:
        if not isinstance(value, dict):
            what = prefix.rstrip(".") or "letter"
            raise MalformedDeadLetterError(where, f"{what} is not a JSON object")
        self._value = value
        self._where = where
        self._prefix = prefix

    def _fail(self, name: str, expected: str) -> MalformedDeadLetterError:
        return MalformedDeadLetterError(self._where, f"{self._prefix}{name} must be {expected}")

    def get(self, name: str) -> Any:
        if name not in self._value:
            raise MalformedDeadLetterError(self._where, f"{self._prefix}{name} is missing")
        return self._value[name]

    def text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise self._fail(name, "a string")
        return value

    def optional_text(self, name: str) -> str | None:
        value = self._value.get(name)
        if value is not None and not isinstance(value, str):
            raise self._fail(name, "a string or null")
        return value

    def integer(self, name: str) -> int:
        value = self.get(name)
        # bool is an int to Python, not to JSON readers.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._fail(name, "an integer")
        return value

    def time(self, name: str) -> datetime:
        moment = self.optional_time(name)
        if moment is None:
            raise self._fail(name, "an ISO 8601 time")
        return moment

    def optional_time(self, name: str) -> datetime | None:
        value = self.optional_text(name)
        if value is None:
            return None
        try:
            return _utc(datetime.fromisoformat(value))
        except ValueError:
            raise self._fail(name, "an ISO 8601 time") from None
