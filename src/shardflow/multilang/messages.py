"""The MultiLangDaemon protocol on the wire: one JSON object per line, both ways.

The daemon writes to the child's stdin the bytes the KCL's MultiLangDaemon (2.5.8 and 3.1.3,
captured from both) writes: compact JSON, fields in its order, ``null`` where it has none::

    {"action":"initialize","shardId":"shardId-000000000000","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}
    {"action":"processRecords","records":[{"data":"<base64>","partitionKey":"k","sequenceNumber":"4968...","approximateArrivalTimestamp":1795716073220,"subSequenceNumber":0,"action":"record"}],"millisBehindLatest":0}
    {"action":"checkpoint","sequenceNumber":"4968...","subSequenceNumber":0,"error":null}
    {"action":"shardEnded"}  {"action":"shutdownRequested"}  {"action":"leaseLost"}

The child answers every action with ``{"action":"status","responseFor":"<action>"}`` and may,
while handling one, ask ``{"action":"checkpoint","sequenceNumber":S|null,"subSequenceNumber":N|null}``
(the Node.js binding leaves ``subSequenceNumber`` out). :func:`decode` reads its lines as the
KCL's Jackson reader does: blank lines and lines that are not such a message are skipped
(:class:`Unexpected`, for the log), scalars are coerced to the field's type.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson

from shardflow.records import ExtendedSequenceNumber, Record

LEASE_LOST: Final = b'{"action":"leaseLost"}\n'
SHARD_ENDED: Final = b'{"action":"shardEnded"}\n'
SHUTDOWN_REQUESTED: Final = b'{"action":"shutdownRequested"}\n'

ERROR_NAMES: Final = frozenset(
    {
        "InvalidStateException",
        "ShutdownException",
        "ThrottlingException",
        "KinesisClientLibDependencyException",
        "IllegalArgumentException",
    }
)
"""What a checkpoint answer's ``error`` may say: the simple class name of the KCL's exception."""

RECORDS_PER_PIECE: Final = 500
"""Records encoded at a time by :func:`process_records_pieces`: a batch of 10,000 is never a
list of 10,000 dicts at once (12 MiB for 100 B records, against 0.6 MiB per piece), and each
piece can be written to the processor's pipe before the next is encoded."""

_RECORDS_HEAD: Final = b'{"action":"processRecords","records":['
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND: Final = timedelta(milliseconds=1)
_b64 = binascii.b2a_base64


@dataclass(frozen=True, slots=True)
class Status:
    """``{"action":"status","responseFor":...}``: the child is done with an action."""

    response_for: str | None


@dataclass(frozen=True, slots=True)
class CheckpointRequest:
    """``{"action":"checkpoint",...}`` from the child: checkpoint at a record (``sequence_number``
    and, for a sub-record, ``sub_sequence_number``), or with no sequence number at the end of
    what was delivered."""

    sequence_number: str | None
    sub_sequence_number: int | None


@dataclass(frozen=True, slots=True)
class Unexpected:
    """A line the protocol does not read (the KCL skips it): printed output, a message of
    another kind, a field it cannot convert. ``why`` says which, for the log."""

    line: bytes
    why: str


ChildMessage = Status | CheckpointRequest | Unexpected


def initialize(shard_id: str, position: ExtendedSequenceNumber | None) -> bytes:
    """The first action: the shard and the checkpoint the processor starts after."""
    sequence = None if position is None else position.sequence_number
    sub = None if position is None else position.sub_sequence_number
    return _line(
        {
            "action": "initialize",
            "shardId": shard_id,
            "sequenceNumber": sequence,
            "subSequenceNumber": sub,
        }
    )


def process_records(records: Sequence[Record], millis_behind_latest: int | None) -> bytes:
    """A batch of (de-aggregated) records, each as the KCL's ``JsonFriendlyRecord``: one line
    (the pieces of :func:`process_records_pieces`, joined)."""
    return b"".join(process_records_pieces(records, millis_behind_latest))


def process_records_pieces(
    records: Sequence[Record], millis_behind_latest: int | None
) -> Iterator[bytes]:
    """The ``processRecords`` line of :func:`process_records` in consecutive pieces, each
    encoded only when asked for (at most :data:`RECORDS_PER_PIECE` records in one): joined,
    they are the bytes ``orjson.dumps`` gives for the whole message, so the daemon can write a
    batch of any size holding one piece in memory at a time."""
    yield _RECORDS_HEAD
    for start in range(0, len(records), RECORDS_PER_PIECE):
        encoded = orjson.dumps(
            [_record(record) for record in records[start : start + RECORDS_PER_PIECE]]
        )
        # "[a,b]" -> "a,b", with the comma that joins it to the piece before
        yield encoded[1:-1] if start == 0 else b"," + encoded[1:-1]
    yield b'],"millisBehindLatest":' + orjson.dumps(millis_behind_latest) + b"}\n"


def checkpoint_answer(request: CheckpointRequest, error: str | None) -> bytes:
    """The answer to a checkpoint request: its position echoed, ``error`` None on success."""
    return _line(
        {
            "action": "checkpoint",
            "sequenceNumber": request.sequence_number,
            "subSequenceNumber": request.sub_sequence_number,
            "error": error,
        }
    )


def status(action: str) -> bytes:
    """A child's answer to ``action`` (what a record processor writes; for tests and tools)."""
    return _line({"action": "status", "responseFor": action})


def checkpoint_request(sequence_number: str | None, sub_sequence_number: int | None) -> bytes:
    """A child's checkpoint request (what kclpy writes; for tests and tools)."""
    return _line(
        {
            "action": "checkpoint",
            "sequenceNumber": sequence_number,
            "subSequenceNumber": sub_sequence_number,
        }
    )


def arrival_millis(record: Record) -> int | None:
    """``approximateArrivalTimestamp``: epoch milliseconds, truncated as Java's toEpochMilli."""
    arrival = record.approximate_arrival_timestamp
    if arrival is None:
        return None
    if arrival.tzinfo is None:
        arrival = arrival.replace(tzinfo=UTC)
    return (arrival - _EPOCH) // _MILLISECOND


def _record(record: Record) -> dict[str, Any]:
    return {
        "data": _b64(record.data, newline=False).decode("ascii"),
        "partitionKey": record.partition_key,
        "sequenceNumber": record.sequence_number,
        "approximateArrivalTimestamp": arrival_millis(record),
        "subSequenceNumber": record.sub_sequence_number,
        "action": "record",
    }


def _line(message: dict[str, Any]) -> bytes:
    return orjson.dumps(message) + b"\n"


# --- what the child writes ------------------------------------------------------------------------

_IGNORED_ACTIONS: Final = frozenset(
    {"initialize", "processRecords", "shutdown", "shutdownRequested", "leaseLost", "shardEnded"}
)
"""Actions the KCL's reader knows but its protocol loop passes over while it waits."""


def decode(line: bytes) -> ChildMessage | None:
    """The message on one line of the child's stdout; None for a blank line."""
    text = line.strip()
    if not text:
        return None
    try:
        message = orjson.loads(text)
    except orjson.JSONDecodeError:
        return Unexpected(line, "not JSON")
    if not isinstance(message, dict):
        return Unexpected(line, "not a JSON object")
    action = message.get("action")
    if action == "status":
        response_for = message.get("responseFor")
        if response_for is not None and not isinstance(response_for, str | int | float | bool):
            return Unexpected(line, "responseFor is not text")
        return Status(None if response_for is None else _as_text(response_for))
    if action == "checkpoint":
        try:
            sequence = _text_field(message.get("sequenceNumber"))
            sub = _long_field(message.get("subSequenceNumber"))
        except ValueError as exc:
            return Unexpected(line, f"checkpoint {exc}")
        return CheckpointRequest(sequence, sub)
    if action in _IGNORED_ACTIONS:
        return Unexpected(line, f"a {action!r} message from the processor")
    return Unexpected(line, "no known action")


def _as_text(value: str | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _text_field(value: Any) -> str | None:
    """A String field: scalars are coerced (Jackson: 123 -> "123")."""
    if value is None:
        return None
    if isinstance(value, str | int | float | bool):
        return _as_text(value)
    raise ValueError("sequenceNumber is not text")


def _long_field(value: Any) -> int | None:
    """A Long field: whole numbers, also as text ("5") or as a float with no fraction."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("subSequenceNumber is a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)  # Jackson truncates a float into a long field
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError("subSequenceNumber is not a number") from None
    raise ValueError("subSequenceNumber is not a number")
