"""DynamoDB's item answers read in one pass give what botocore's parser gives; the rest is its."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import botocore.session
from aiobotocore.parsers import AioResponseParserFactory
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.aws.dynamodb_json import dynamodb_output, parse_item_output
from shardflow.aws.kinesis_json import FastParserFactory

MODELS = botocore.session.get_session()
DYNAMODB = MODELS.get_service_model("dynamodb")
SCAN = DYNAMODB.operation_model("Scan").output_shape
GET = DYNAMODB.operation_model("GetItem").output_shape
UPDATE = DYNAMODB.operation_model("UpdateItem").output_shape
QUERY = DYNAMODB.operation_model("Query").output_shape
STREAMS = MODELS.get_service_model("dynamodbstreams").operation_model("GetRecords").output_shape


def response(body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    return {
        "status_code": status,
        "headers": {"x-amzn-RequestId": "req-1", "Content-Type": "application/x-amz-json-1.0"},
        "body": json.dumps(body).encode(),
        "context": {"operation_name": "Scan"},
    }


def both(raw: dict[str, Any], shape: Any) -> tuple[Any, Any]:
    fast = FastParserFactory().create_parser("json")
    botocore_parser = AioResponseParserFactory().create_parser("json")
    return (
        asyncio.run(fast.parse(raw, shape)),
        asyncio.run(botocore_parser.parse(raw, shape)),
    )


b64 = st.binary(max_size=24).map(lambda b: base64.b64encode(b).decode())
text = st.text(max_size=8)
scalars = st.one_of(
    st.builds(lambda s: {"S": s}, text),
    st.builds(lambda n: {"N": str(n)}, st.integers(-(10**12), 10**12)),
    st.builds(lambda b: {"B": b}, b64),
    st.builds(lambda s: {"SS": sorted(set(s))}, st.lists(text, min_size=1, max_size=3)),
    st.builds(lambda s: {"NS": [str(n) for n in s]}, st.lists(st.integers(), max_size=3)),
    st.builds(lambda s: {"BS": s}, st.lists(b64, min_size=1, max_size=3)),
    st.builds(lambda b: {"BOOL": b}, st.booleans()),
    st.just({"NULL": True}),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.builds(lambda m: {"M": m}, st.dictionaries(text, inner, max_size=3)),
        st.builds(lambda items: {"L": items}, st.lists(inner, max_size=3)),
    ),
    max_leaves=8,
)
items = st.dictionaries(st.text(min_size=1, max_size=6), values, min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(st.lists(items, max_size=4), st.booleans())
def test_a_scan_page_reads_as_botocore_reads_it(page: list[dict[str, Any]], more: bool) -> None:
    body: dict[str, Any] = {"Items": page, "Count": len(page), "ScannedCount": len(page)}
    if more:
        body["LastEvaluatedKey"] = {"leaseKey": {"S": "shardId-000000000007"}}
    fast, slow = both(response(body), SCAN)
    assert fast == slow


@settings(max_examples=40, deadline=None)
@given(items)
def test_get_and_update_answers_read_as_botocore_reads_them(item: dict[str, Any]) -> None:
    assert both(response({"Item": item}), GET)[0] == both(response({"Item": item}), GET)[1]
    fast, slow = both(response({"Attributes": item}), UPDATE)
    assert fast == slow
    assert both(response({}), UPDATE)[0] == both(response({}), UPDATE)[1]


def test_what_it_does_not_handle_goes_to_botocore() -> None:
    # A member it leaves alone, an unknown attribute type, a malformed value, an error.
    capacity = {"Items": [], "Count": 0, "ScannedCount": 0, "ConsumedCapacity": {"TableName": "t"}}
    odd_type = {"Items": [{"a": {"X": "1"}}], "Count": 1, "ScannedCount": 1}
    two_types = {"Items": [{"a": {"S": "1", "N": "1"}}], "Count": 1, "ScannedCount": 1}
    for body in (capacity, odd_type, two_types):
        fast, slow = both(response(body), SCAN)
        assert fast == slow
        try:
            parse_item_output(json.dumps(body).encode(), "ScanOutput")
        except ValueError:
            pass
        else:
            raise AssertionError(f"read here: {body}")
    error = response({"__type": "ConditionalCheckFailedException", "message": "no"}, status=400)
    fast, slow = both(error, UPDATE)
    assert fast == slow
    assert fast["Error"]["Code"] == "ConditionalCheckFailedException"


def test_only_dynamodb_item_answers_are_read_here() -> None:
    assert dynamodb_output(SCAN) == "ScanOutput"
    assert dynamodb_output(GET) == "GetItemOutput"
    assert dynamodb_output(UPDATE) == "UpdateItemOutput"
    assert dynamodb_output(QUERY) is None
    assert dynamodb_output(STREAMS) is None
    assert dynamodb_output(None) is None


def test_binary_values_are_bytes() -> None:
    blob = base64.b64encode(b"\x00state").decode()
    body = {"Items": [{"k": {"B": blob}, "s": {"BS": [blob]}}], "Count": 1, "ScannedCount": 1}
    parsed = parse_item_output(json.dumps(body).encode(), "ScanOutput")
    assert parsed["Items"][0]["k"] == {"B": b"\x00state"}
    assert parsed["Items"][0]["s"] == {"BS": [b"\x00state"]}
