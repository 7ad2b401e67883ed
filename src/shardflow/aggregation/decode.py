"""Splitting KPL aggregated records back into user records.

A record whose data does not start with the KPL magic is returned as it is. An aggregate
yields one :class:`~shardflow.records.Record` per user record, in order, sharing the outer
sequence number, with ``sub_sequence_number`` = its index, ``aggregated=True`` and the
outer record's arrival time, shard and stream.

Malformed aggregates. A record that starts with the magic but fails to decode is malformed
for one of these reasons (``AggregationError.reason``):

- ``"truncated"``: too short to hold the magic and the 16-byte MD5;
- ``"md5"``: the MD5 at the end does not match the protobuf bytes;
- ``"protobuf"``: not a valid ``AggregatedRecord`` message (unparseable, a required field
  missing, a key that is not UTF-8) or one holding no user records;
- ``"index"``: a user record points past the end of the partition key or explicit hash key
  table.

With ``on_malformed="plain"`` (the default) the record is delivered unchanged as one plain
record, so nothing is ever dropped, and a WARNING naming stream, shard and sequence number
(never the payload) goes to the ``shardflow.aggregation`` logger. With
``on_malformed="raise"`` an :class:`~shardflow.errors.AggregationError` is raised. Either
way the decision is all or nothing: no user record of a malformed aggregate is delivered.

How this differs from the KCL (``AggregatorUtil.deaggregate``, 2.x/3.x):

- MD5 mismatch and protobuf parse failures: the KCL also delivers the record as a plain
  record, but silently; we log a warning (or raise, if asked).
- A table index out of range (or any other failure while walking the user records): the KCL
  logs an error that includes the base64 payload and drops the remaining user records, having
  already delivered the earlier ones. We check every index before delivering anything, never
  log the payload, and deliver the whole record plain.
- Data of exactly magic + 16 bytes: the KCL does not consider it aggregated (it wants at least
  one protobuf byte) and delivers it plain; we decode it as an aggregate with no user records,
  which is malformed, so with the default policy the outcome is the same plus a warning.
- An aggregate that parses but holds no user records: the KCL delivers nothing for it (the
  Kinesis record silently disappears); we treat it as malformed.
- The KCL drops user records whose hash key lies outside the shard's range (after a
  reshard). Deaggregation here does not know the shard's range; filtering, if wanted, is up to
  the consumer.
- A record already marked ``aggregated`` (a user record) is returned unchanged: aggregates are
  unpacked once, not recursively, as in the KCL.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Final, Literal

from google.protobuf.message import DecodeError

from shardflow.aggregation._format import DIGEST_SIZE, FRAMING_BYTES, MAGIC
from shardflow.aggregation._messages import AggregatedRecordMessage, new_aggregated_record
from shardflow.errors import AggregationError
from shardflow.records import Record

MalformedPolicy = Literal["plain", "raise"]

logger: Final = logging.getLogger("shardflow.aggregation")


def deaggregate(record: Record, *, on_malformed: MalformedPolicy = "plain") -> list[Record]:
    """The user records inside ``record``, or ``[record]`` if it is not an aggregate.

    Raises :class:`AggregationError` for a malformed aggregate only when
    ``on_malformed="raise"``; see the module docstring for the policy.
    """
    if on_malformed not in ("plain", "raise"):
        raise ValueError(f"on_malformed must be 'plain' or 'raise', got {on_malformed!r}")
    if record.aggregated or not record.data.startswith(MAGIC):
        return [record]
    try:
        return _unpack(record)
    except AggregationError as error:
        if on_malformed == "raise":
            raise
        logger.warning(
            "delivering a malformed aggregated record as a plain record: %s "
            "(stream=%s, shard=%s, sequence_number=%s, %d bytes)",
            error.reason,
            record.stream_name,
            record.shard_id,
            record.sequence_number,
            len(record.data),
        )
        return [record]


def _unpack(record: Record) -> list[Record]:
    def malformed(reason: str, detail: str) -> AggregationError:
        return AggregationError(
            reason, detail, shard_id=record.shard_id, sequence_number=record.sequence_number
        )

    data = memoryview(record.data)
    if len(data) < FRAMING_BYTES:
        raise malformed(
            "truncated",
            f"{len(data)} bytes cannot hold the magic and a {DIGEST_SIZE}-byte MD5",
        )
    body = data[len(MAGIC) : len(data) - DIGEST_SIZE]
    if hashlib.md5(body, usedforsecurity=False).digest() != data[len(data) - DIGEST_SIZE :]:
        raise malformed("md5", "the MD5 digest does not match the protobuf bytes")

    message = new_aggregated_record()
    try:
        message.ParseFromString(body)
    except DecodeError:
        raise malformed("protobuf", "not a valid AggregatedRecord message") from None
    problem = _structural_problem(message)
    if problem:
        raise malformed("protobuf", problem)

    partition_keys = list(message.partition_key_table)
    explicit_hash_keys = list(message.explicit_hash_key_table)
    count = len(message.records)
    user_records: list[Record] = []
    for index in range(count):
        sub = message.records[index]
        if sub.partition_key_index >= len(partition_keys):
            raise malformed(
                "index",
                f"user record {index} has partition_key_index {sub.partition_key_index} "
                f"but the table has {len(partition_keys)} entries",
            )
        explicit_hash_key: str | None = None
        if sub.HasField("explicit_hash_key_index"):
            if sub.explicit_hash_key_index >= len(explicit_hash_keys):
                raise malformed(
                    "index",
                    f"user record {index} has explicit_hash_key_index "
                    f"{sub.explicit_hash_key_index} but the table has "
                    f"{len(explicit_hash_keys)} entries",
                )
            explicit_hash_key = explicit_hash_keys[sub.explicit_hash_key_index]
        user_records.append(
            Record(
                data=sub.data,
                partition_key=partition_keys[sub.partition_key_index],
                sequence_number=record.sequence_number,
                sub_sequence_number=index,
                explicit_hash_key=explicit_hash_key,
                approximate_arrival_timestamp=record.approximate_arrival_timestamp,
                shard_id=record.shard_id,
                stream_name=record.stream_name,
                aggregated=True,
                last_sub_sequence_number=count - 1,
            )
        )
    return user_records


def _structural_problem(message: AggregatedRecordMessage) -> str:
    """Why a parsed message is not a usable aggregate, or "" if it is."""
    if not message.IsInitialized():
        return "a required field is missing"
    if len(message.records) == 0:
        return "the aggregate holds no user records"
    # For proto2 strings that are not valid UTF-8 the runtime returns bytes instead of str.
    keys = (*message.partition_key_table, *message.explicit_hash_key_table)
    if not all(isinstance(key, str) for key in keys):
        return "a partition key or explicit hash key is not valid UTF-8"
    return ""
