"""Checks a record at ``put`` time, so bad input fails at once instead of after a round trip."""

from __future__ import annotations

from shardflow.errors import (
    InvalidExplicitHashKeyError,
    InvalidPartitionKeyError,
    RecordTooLargeError,
)
from shardflow.producer.settings import MAX_PARTITION_KEY_CHARS
from shardflow.shards import MAX_HASH_KEY, key_bytes_hash

RecordInput = tuple[bytes | str, str] | tuple[bytes | str, str, str | None]
"""``(data, partition_key)`` or ``(data, partition_key, explicit_hash_key)``."""

Prepared = tuple[bytes, int, int, str, str | None]
"""A checked record: data, size, hash key, partition key, explicit hash key."""


def prepare(
    data: bytes | str,
    partition_key: str,
    explicit_hash_key: str | None,
    max_record_bytes: int,
) -> tuple[bytes, int, int]:
    """``(data as bytes, size counted by Kinesis, hash key)`` of a valid record.

    Raises :class:`InvalidPartitionKeyError` (empty, longer than 256 characters, not text),
    :class:`InvalidExplicitHashKeyError`, or :class:`RecordTooLargeError` (data plus UTF-8
    partition key above ``max_record_bytes``).
    """
    if type(data) is not bytes:
        if isinstance(data, str):
            data = data.encode()
        elif isinstance(data, bytearray | memoryview):
            data = bytes(data)
        else:
            raise TypeError(f"record data must be bytes or str, not {type(data).__name__}")
    if type(partition_key) is not str or not 0 < len(partition_key) <= MAX_PARTITION_KEY_CHARS:
        raise InvalidPartitionKeyError(_partition_key_problem(partition_key))
    try:
        key_bytes = partition_key.encode()
    except UnicodeEncodeError as exc:
        raise InvalidPartitionKeyError("partition key is not valid Unicode text") from exc
    size = len(data) + len(key_bytes)
    if size > max_record_bytes:
        raise RecordTooLargeError(size, max_record_bytes)
    if explicit_hash_key is None:
        hash_key = key_bytes_hash(key_bytes)
    else:
        hash_key = parse_explicit_hash_key(explicit_hash_key)
    return data, size, hash_key


def prepare_input(item: RecordInput, max_record_bytes: int) -> Prepared:
    """:func:`prepare` for one ``(data, partition_key[, explicit_hash_key])`` tuple."""
    explicit_hash_key = item[2] if len(item) > 2 else None
    data, size, hash_key = prepare(item[0], item[1], explicit_hash_key, max_record_bytes)
    return data, size, hash_key, item[1], explicit_hash_key


def parse_explicit_hash_key(explicit_hash_key: str) -> int:
    """The integer value of an explicit hash key; raises InvalidExplicitHashKeyError."""
    if type(explicit_hash_key) is not str or not explicit_hash_key.isascii():
        raise InvalidExplicitHashKeyError(
            "explicit hash key must be a decimal string between 0 and 2**128 - 1"
        )
    if not explicit_hash_key.isdigit() or int(explicit_hash_key) > MAX_HASH_KEY:
        raise InvalidExplicitHashKeyError(
            f"explicit hash key {explicit_hash_key[:50]!r} is not a decimal integer "
            "between 0 and 2**128 - 1"
        )
    return int(explicit_hash_key)


def _partition_key_problem(partition_key: object) -> str:
    if not isinstance(partition_key, str):
        return f"partition key must be a str, not {type(partition_key).__name__}"
    if not partition_key:
        return "partition key must not be empty"
    return (
        f"partition key of {len(partition_key)} characters exceeds the limit of "
        f"{MAX_PARTITION_KEY_CHARS}"
    )
