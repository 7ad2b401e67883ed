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
  table;
- ``"key"``: a partition key that is empty or longer than 256 characters, or an explicit
  hash key that is not a decimal number from 0 to 2**128 - 1 (as Kinesis requires of both).

With ``on_malformed="plain"`` (the default) the record is delivered unchanged as one plain
record, so nothing is ever dropped, and a WARNING naming stream, shard and sequence number
(never the payload) goes to the ``shardflow.aggregation`` logger. With
``on_malformed="raise"`` an :class:`~shardflow.errors.AggregationError` is raised. Either
way the decision is all or nothing: no user record of a malformed aggregate is delivered.

How this differs from the KCL (``AggregatorUtil.deaggregate``, 2.x/3.x):

- MD5 mismatch and protobuf parse failures: the KCL also delivers the record as a plain
  record, but silently; we log a warning (or raise, if asked).
- Keys Kinesis would refuse (an explicit hash key that is not a number, an empty partition
  key): the KCL does not check them; here the aggregate is malformed and delivered plain,
  so that nothing downstream (hash-range checks, key-ordered dispatch) meets them.
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

import logging
from typing import Final

from shardflow.aggregation.unpack import MalformedPolicy, Unpacking
from shardflow.records import Record

__all__ = ["MalformedPolicy", "deaggregate", "log_malformed"]

logger: Final = logging.getLogger("shardflow.aggregation")


def deaggregate(record: Record, *, on_malformed: MalformedPolicy = "plain") -> list[Record]:
    """The user records inside ``record``, or ``[record]`` if it is not an aggregate.

    Raises :class:`AggregationError` for a malformed aggregate only when
    ``on_malformed="raise"``; see the module docstring for the policy. All at once: a caller
    on an event loop unpacks large aggregates with :class:`~shardflow.aggregation.unpack.
    Unpacking` instead, a slice at a time.
    """
    unpacking = Unpacking(record, on_malformed=on_malformed)
    records = unpacking.step(1 << 62)
    while not unpacking.done:
        records += unpacking.step(1 << 62)
    log_malformed(unpacking)
    return records


def log_malformed(unpacking: Unpacking) -> None:
    """The WARNING for an aggregate delivered as a plain record (never with its payload)."""
    error = unpacking.malformed
    if error is None:
        return
    record = unpacking.record
    logger.warning(
        "delivering a malformed aggregated record as a plain record: %s "
        "(stream=%s, shard=%s, sequence_number=%s, %d bytes)",
        error.reason,
        record.stream_name,
        record.shard_id,
        record.sequence_number,
        len(record.data),
    )
