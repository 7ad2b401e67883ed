"""Kinesis GetRecords responses parsed in one pass instead of botocore's shape walk.

botocore parses a response by walking its output shape value by value, and turns every epoch
timestamp into a datetime with a fresh ``dateutil`` local timezone: for GetRecords that is
~20 µs of CPU per record, more than everything else a consumer does with the record. The body
of a successful GetRecords is flat JSON with two conversions (``Data``: base64;
``ApproximateArrivalTimestamp``: epoch seconds), so :class:`GetRecordsParser` does just those,
producing the same dictionary botocore would (arrival timestamps are UTC datetimes rather than
local-time ones: the same instants). Everything else — requests, signing, retries, endpoints,
error responses and every other operation — stays botocore's: the parser factory of shardflow's
own botocore session (:class:`FastParserFactory`) hands anything but a successful Kinesis
GetRecords response to botocore's parser, and so does the fast parser for a body it cannot read.
"""

from __future__ import annotations

import binascii
import json
import logging
from datetime import UTC, datetime
from typing import Any

from aiobotocore.parsers import AioResponseParserFactory
from botocore.utils import parse_timestamp

log = logging.getLogger(__name__)

_RECORD_MEMBERS = frozenset({"SequenceNumber", "Data", "PartitionKey"})
# What botocore keeps: members of the output shape, never a null (it drops both the others).
_OUTPUT_KEYS = frozenset({"Records", "NextShardIterator", "MillisBehindLatest", "ChildShards"})
_RECORD_KEYS = frozenset(
    {"SequenceNumber", "ApproximateArrivalTimestamp", "Data", "PartitionKey", "EncryptionType"}
)
_CHILD_SHARD_KEYS = frozenset({"ShardId", "ParentShards", "HashKeyRange"})
_HASH_RANGE_KEYS = frozenset({"StartingHashKey", "EndingHashKey"})


def is_kinesis_get_records(shape: Any) -> bool:
    """Whether ``shape`` is Kinesis' GetRecords output (DynamoDB Streams' has the same name)."""
    if shape is None or shape.name != "GetRecordsOutput":
        return False
    records = shape.members.get("Records")
    return records is not None and set(records.member.members) >= _RECORD_MEMBERS


def parse_get_records_body(body: bytes) -> dict[str, Any]:
    """The parsed body of a successful GetRecords response, as botocore would return it.

    Raises ``ValueError``, ``TypeError``, ``KeyError`` or ``binascii.Error`` for a body that is
    not GetRecords JSON (the caller then lets botocore parse it).
    """
    parsed = _members(json.loads(body), _OUTPUT_KEYS)
    if "ChildShards" in parsed:
        parsed["ChildShards"] = [_child_shard(child) for child in parsed["ChildShards"]]
    records = parsed.get("Records", ())
    decode = binascii.a2b_base64
    from_epoch = datetime.fromtimestamp
    for index, record in enumerate(records):
        if not record.keys() <= _RECORD_KEYS or None in record.values():
            record = records[index] = _members(record, _RECORD_KEYS)
        record["Data"] = decode(record["Data"])
        arrival = record.get("ApproximateArrivalTimestamp")
        if arrival is not None:
            record["ApproximateArrivalTimestamp"] = (
                from_epoch(arrival, UTC)
                if isinstance(arrival, int | float)
                else parse_timestamp(arrival)
            )
    return parsed


def _members(raw: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    """``raw`` without what botocore would drop: keys the shape lacks, and nulls."""
    if raw.keys() <= keys and None not in raw.values():
        return raw
    return {key: value for key, value in raw.items() if key in keys and value is not None}


def _child_shard(raw: dict[str, Any]) -> dict[str, Any]:
    child = _members(raw, _CHILD_SHARD_KEYS)
    if "HashKeyRange" in child:
        child["HashKeyRange"] = _members(child["HashKeyRange"], _HASH_RANGE_KEYS)
    return child


class GetRecordsParser:
    """A response parser that reads successful Kinesis GetRecords bodies itself and hands
    every other response to ``fallback`` (botocore's JSON parser)."""

    def __init__(self, fallback: Any) -> None:
        self._fallback = fallback

    async def parse(self, response: dict[str, Any], shape: Any) -> Any:
        if response["status_code"] < 300 and is_kinesis_get_records(shape):
            try:
                parsed = parse_get_records_body(response["body"])
            except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as exc:
                log.debug("GetRecords body left to botocore's parser: %r", exc)
            else:
                headers = response["headers"]
                metadata: dict[str, Any] = {
                    "HTTPStatusCode": response["status_code"],
                    "HTTPHeaders": {key.lower(): value for key, value in headers.items()},
                }
                request_id = headers.get("x-amzn-requestid")
                if request_id is not None:
                    metadata["RequestId"] = request_id
                parsed["ResponseMetadata"] = metadata
                return parsed
        return await self._fallback.parse(response, shape)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fallback, name)


class FastParserFactory(AioResponseParserFactory):  # type: ignore[misc]
    """botocore's parser factory, with :class:`GetRecordsParser` in front of its JSON parser."""

    def create_parser(self, protocol_name: str) -> Any:
        parser = super().create_parser(protocol_name)
        return GetRecordsParser(parser) if protocol_name == "json" else parser
