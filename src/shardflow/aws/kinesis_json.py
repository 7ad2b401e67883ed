"""The per-record JSON of Kinesis' two busiest calls, read and written in one pass.

botocore reads a response by walking its output shape value by value, and turns every epoch
timestamp into a datetime with a fresh ``dateutil`` local timezone; it writes a request the same
way. For GetRecords that is ~20 µs of CPU per record, more than everything else a consumer does
with the record; PutRecords pays the walk twice (request and answer). Their bodies are flat
JSON with a single conversion per record (``Data``: base64; ``ApproximateArrivalTimestamp``:
epoch seconds), so this module does just those:

- :class:`FastParserFactory` (the response parser factory of shardflow's own botocore session)
  puts :class:`KinesisParser` in front of botocore's JSON parser: a successful Kinesis
  GetRecords or PutRecords body becomes the same dictionary botocore would make (arrival
  timestamps are UTC datetimes rather than local-time ones: the same instants); anything else
  (errors, other operations, a body it cannot read) goes to botocore's parser.
- :func:`serialize_put_records_in_one_pass` puts :class:`PutRecordsSerializer` in front of a
  client's request serializer: PutRecords bodies are written directly, every other request by
  botocore.

Signing, retries, endpoints and error classes stay botocore's.
"""

from __future__ import annotations

import binascii
import json
import logging
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from typing import Any

import orjson
from aiobotocore.parsers import AioResponseParserFactory
from botocore.utils import parse_timestamp

from shardflow.aws.dynamodb_json import dynamodb_output, parse_item_output

log = logging.getLogger(__name__)

# What botocore keeps: members of the output shape, never a null (it drops both the others).
_GET_OUTPUT = frozenset({"Records", "NextShardIterator", "MillisBehindLatest", "ChildShards"})
_GET_RECORD = frozenset(
    {"SequenceNumber", "ApproximateArrivalTimestamp", "Data", "PartitionKey", "EncryptionType"}
)
_CHILD_SHARD = frozenset({"ShardId", "ParentShards", "HashKeyRange"})
_HASH_RANGE = frozenset({"StartingHashKey", "EndingHashKey"})
_PUT_OUTPUT = frozenset({"FailedRecordCount", "Records", "EncryptionType"})
_PUT_RESULT = frozenset({"SequenceNumber", "ShardId", "ErrorCode", "ErrorMessage"})


def kinesis_output(shape: Any) -> str | None:
    """``"GetRecords"`` or ``"PutRecords"`` if ``shape`` is that Kinesis output, else None
    (DynamoDB Streams' GetRecords output has the same name and other records)."""
    if shape is None or shape.name not in ("GetRecordsOutput", "PutRecordsOutput"):
        return None
    records = shape.members.get("Records")
    members = set() if records is None else set(records.member.members)
    if shape.name == "GetRecordsOutput":
        return "GetRecords" if {"Data", "PartitionKey", "SequenceNumber"} <= members else None
    return "PutRecords" if {"SequenceNumber", "ShardId", "ErrorCode"} <= members else None


def parse_get_records_body(body: bytes) -> dict[str, Any]:
    """The parsed body of a successful GetRecords response, as botocore would return it.

    Raises ``ValueError``, ``TypeError``, ``KeyError``, ``AttributeError`` or
    ``binascii.Error`` for a body that is not GetRecords JSON.
    """
    parsed = _members(orjson.loads(body), _GET_OUTPUT)
    if "ChildShards" in parsed:
        parsed["ChildShards"] = [_child_shard(child) for child in parsed["ChildShards"]]
    records = parsed.get("Records", ())
    decode = binascii.a2b_base64
    from_epoch = datetime.fromtimestamp
    for index, record in enumerate(records):
        if not record.keys() <= _GET_RECORD or None in record.values():
            record = records[index] = _members(record, _GET_RECORD)
        record["Data"] = decode(record["Data"])
        arrival = record.get("ApproximateArrivalTimestamp")
        if arrival is not None:
            record["ApproximateArrivalTimestamp"] = (
                from_epoch(arrival, UTC)
                if isinstance(arrival, int | float)
                else parse_timestamp(arrival)
            )
    return parsed


def parse_put_records_body(body: bytes) -> dict[str, Any]:
    """The parsed body of a successful PutRecords response, as botocore would return it."""
    parsed = _members(orjson.loads(body), _PUT_OUTPUT)
    records = parsed.get("Records", ())
    for index, result in enumerate(records):
        if not result.keys() <= _PUT_RESULT or None in result.values():
            records[index] = _members(result, _PUT_RESULT)
    return parsed


def _members(raw: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    """``raw`` without what botocore would drop: keys the shape lacks, and nulls."""
    if raw.keys() <= keys and None not in raw.values():
        return raw
    return {key: value for key, value in raw.items() if key in keys and value is not None}


def _child_shard(raw: dict[str, Any]) -> dict[str, Any]:
    child = _members(raw, _CHILD_SHARD)
    if "HashKeyRange" in child:
        child["HashKeyRange"] = _members(child["HashKeyRange"], _HASH_RANGE)
    return child


_PARSERS = {"GetRecords": parse_get_records_body, "PutRecords": parse_put_records_body}


class KinesisParser:
    """A response parser that reads successful Kinesis GetRecords and PutRecords bodies, and
    DynamoDB's item answers (:mod:`shardflow.aws.dynamodb_json`), itself and hands every other
    response to ``fallback`` (botocore's JSON parser)."""

    def __init__(self, fallback: Any) -> None:
        self._fallback = fallback

    async def parse(self, response: dict[str, Any], shape: Any) -> Any:
        ok = response["status_code"] < 300
        operation = kinesis_output(shape) if ok else None
        item_output = dynamodb_output(shape) if ok and operation is None else None
        if operation is not None or item_output is not None:
            try:
                if item_output is not None:
                    # A lease table's answers (see shardflow.aws.dynamodb_json).
                    parsed = parse_item_output(response["body"], item_output)
                else:
                    assert operation is not None
                    parsed = _PARSERS[operation](response["body"])
            except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as exc:
                # (orjson.JSONDecodeError is a ValueError.)
                log.debug("%s body left to botocore's parser: %r", operation or item_output, exc)
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
    """botocore's parser factory, with :class:`KinesisParser` in front of its JSON parser."""

    def create_parser(self, protocol_name: str) -> Any:
        parser = super().create_parser(protocol_name)
        return KinesisParser(parser) if protocol_name == "json" else parser


def put_records_body(parameters: dict[str, Any]) -> bytes | None:
    """The JSON body botocore would send for PutRecords ``parameters`` (None: leave them to
    botocore: an entry with another member, a payload not bytes, a key not text)."""
    encode, quote = binascii.b2a_base64, encode_basestring_ascii
    written: list[str] = []
    append = written.append
    for entry in parameters["Records"]:
        data, key = entry.get("Data"), entry.get("PartitionKey")
        if type(data) is not bytes or type(key) is not str:
            return None
        if len(entry) == 2:  # the common entry first: one check less
            append(
                f'{{"Data":"{encode(data, newline=False).decode("ascii")}",'
                f'"PartitionKey":{quote(key)}}}'
            )
            continue
        hash_key = entry.get("ExplicitHashKey")
        if len(entry) != 3 or type(hash_key) is not str:
            return None
        append(
            f'{{"Data":"{encode(data, newline=False).decode("ascii")}",'
            f'"PartitionKey":{quote(key)},"ExplicitHashKey":{quote(hash_key)}}}'
        )
    others = {name: value for name, value in parameters.items() if name != "Records"}
    head = json.dumps(others)[:-1]
    joined = ",".join(written)
    return f'{head}{", " if others else ""}"Records":[{joined}]}}'.encode()


class PutRecordsSerializer:
    """Writes PutRecords bodies in one pass (:func:`put_records_body`); the request around the
    body, and every other request, are ``wrapped``'s (botocore's serializer, validation
    included: it checks PutRecords with the first entry standing in for all)."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def serialize_to_request(self, parameters: Any, operation_model: Any) -> Any:
        records = parameters.get("Records") if isinstance(parameters, dict) else None
        if operation_model.name != "PutRecords" or not records or not isinstance(records, list):
            return self._wrapped.serialize_to_request(parameters, operation_model)
        body = put_records_body(parameters)
        if body is None:
            return self._wrapped.serialize_to_request(parameters, operation_model)
        request = self._wrapped.serialize_to_request(
            {**parameters, "Records": records[:1]}, operation_model
        )
        request["body"] = body
        return request

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def serialize_put_records_in_one_pass(client: Any) -> None:
    """Put :class:`PutRecordsSerializer` in front of ``client``'s serializer (a Kinesis client
    of botocore or aiobotocore; a client without one is left as it is)."""
    serializer = getattr(client, "_serializer", None)
    if serializer is not None and not isinstance(serializer, PutRecordsSerializer):
        client._serializer = PutRecordsSerializer(serializer)
