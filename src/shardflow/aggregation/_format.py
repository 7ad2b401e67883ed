"""Framing constants of the KPL aggregation format and protobuf size arithmetic.

An aggregated record's data is ``MAGIC + protobuf(AggregatedRecord) + MD5(protobuf)``.
"""

from __future__ import annotations

from typing import Final

MAGIC: Final = b"\xf3\x89\x9a\xc2"
DIGEST_SIZE: Final = 16  # MD5
FRAMING_BYTES: Final = len(MAGIC) + DIGEST_SIZE
MAX_RECORD_BYTES: Final = 1_048_576
"""Kinesis' default limit for one record: data plus the UTF-8 partition key."""

# Every field in the schema has a number below 16, so each field tag is a single byte.
_TAG_BYTES: Final = 1


def is_aggregated(data: bytes) -> bool:
    """True if ``data`` starts with the KPL magic and has room for the magic and an MD5."""
    return len(data) >= FRAMING_BYTES and data.startswith(MAGIC)


def varint_size(value: int) -> int:
    """Bytes a non-negative integer takes as a protobuf varint (7 bits per byte)."""
    return max(1, (value.bit_length() + 6) // 7)


def length_delimited_size(payload_size: int) -> int:
    """Bytes a length-delimited field (string, bytes, sub-message) takes, tag included."""
    return _TAG_BYTES + varint_size(payload_size) + payload_size


def varint_field_size(value: int) -> int:
    """Bytes a varint field takes, tag included."""
    return _TAG_BYTES + varint_size(value)
