"""The one-pass Kinesis JSON gives what botocore's parser and serializer give; the rest is theirs."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import botocore.session
from aiobotocore.parsers import AioResponseParserFactory
from botocore.serialize import create_serializer
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.aws.kinesis_json import (
    FastParserFactory,
    KinesisParser,
    PutRecordsSerializer,
    kinesis_output,
)

MODELS = botocore.session.get_session()
KINESIS = MODELS.get_service_model("kinesis").operation_model("GetRecords").output_shape
STREAMS = MODELS.get_service_model("dynamodbstreams").operation_model("GetRecords").output_shape
PUT_OPERATION = MODELS.get_service_model("kinesis").operation_model("PutRecords")
PUT = PUT_OPERATION.output_shape


def response(body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    return {
        "status_code": status,
        "headers": {"x-amzn-RequestId": "req-1", "Content-Type": "application/x-amz-json-1.1"},
        "body": json.dumps(body).encode(),
        "context": {"operation_name": "GetRecords"},
    }


def both(raw: dict[str, Any], shape: Any = KINESIS) -> tuple[Any, Any]:
    fast = FastParserFactory().create_parser("json")
    botocore_parser = AioResponseParserFactory().create_parser("json")
    return (
        asyncio.run(fast.parse(raw, shape)),
        asyncio.run(botocore_parser.parse(raw, shape)),
    )


records = st.lists(
    st.fixed_dictionaries(
        {
            "SequenceNumber": st.integers(0, 10**56).map(str),
            "Data": st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()),
            "PartitionKey": st.text(min_size=1, max_size=8),
            "ApproximateArrivalTimestamp": st.floats(1e9, 2e9).map(lambda t: round(t, 3)),
        },
        optional={"EncryptionType": st.sampled_from(["NONE", "KMS"])},
    ),
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(records, st.integers(0, 10**6), st.booleans())
def test_same_result_as_botocore(items: list[dict[str, Any]], behind: int, ended: bool) -> None:
    body: dict[str, Any] = {"Records": items, "MillisBehindLatest": behind}
    if ended:
        body["ChildShards"] = [
            {
                "ShardId": "shardId-000000000002",
                "ParentShards": ["shardId-000000000000"],
                "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "99"},
            }
        ]
    else:
        body["NextShardIterator"] = "AAAA"
    fast, slow = both(response(body))
    assert fast == slow  # datetimes compare as instants: UTC here, local time in botocore's
    for mine in fast["Records"]:
        assert mine["ApproximateArrivalTimestamp"].utcoffset().total_seconds() == 0


def test_an_error_response_is_botocores() -> None:
    raw = response({"__type": "ExpiredIteratorException", "message": "expired"}, status=400)
    fast, slow = both(raw)
    assert fast == slow
    assert fast["Error"]["Code"] == "ExpiredIteratorException"


def test_a_body_it_cannot_read_goes_to_botocore() -> None:
    raw = response({"Records": [{"SequenceNumber": "1", "PartitionKey": "p"}]})  # no Data
    fast, slow = both(raw)
    assert fast == slow


def test_only_kinesis_get_records_is_parsed_here() -> None:
    assert kinesis_output(KINESIS) == "GetRecords"
    assert kinesis_output(PUT) == "PutRecords"
    assert kinesis_output(STREAMS) is None
    assert kinesis_output(None) is None
    raw = response({"Records": [], "NextShardIterator": "x"})
    fast, slow = both(raw, STREAMS)
    assert fast == slow


def test_other_protocols_are_botocores_parsers() -> None:
    assert not isinstance(FastParserFactory().create_parser("rest-xml"), KinesisParser)


def test_nulls_and_unknown_members_are_dropped_as_botocore_does() -> None:
    body = {
        "Records": [
            {
                "SequenceNumber": "1",
                "Data": base64.b64encode(b"x").decode(),
                "PartitionKey": "p",
                "ApproximateArrivalTimestamp": 1.5e9,
                "EncryptionType": None,
                "Unknown": 1,
            }
        ],
        "NextShardIterator": None,
        "ChildShards": [
            {
                "ShardId": "s-2",
                "ParentShards": ["s-1"],
                "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9", "X": None},
                "Extra": None,
            }
        ],
        "MillisBehindLatest": None,
        "Emulator": "kinesis-local",
    }
    fast, slow = both(response(body))
    assert fast == slow
    assert "NextShardIterator" not in fast


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {"SequenceNumber": st.integers(0, 10**30).map(str), "ShardId": st.just("s-1")}
            ),
            st.fixed_dictionaries(
                {
                    "ErrorCode": st.sampled_from(["ProvisionedThroughputExceededException"]),
                    "ErrorMessage": st.text(max_size=10),
                }
            ),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_put_records_answers_as_botocore(results: list[dict[str, Any]]) -> None:
    failed = sum("ErrorCode" in r for r in results)
    fast, slow = both(response({"FailedRecordCount": failed, "Records": results}), PUT)
    assert fast == slow


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"Data": st.binary(max_size=40), "PartitionKey": st.text(min_size=1, max_size=5)},
            optional={"ExplicitHashKey": st.integers(0, 2**128 - 1).map(str)},
        ),
        min_size=1,
        max_size=5,
    )
)
def test_put_records_bodies_as_botocore(entries: list[dict[str, Any]]) -> None:
    botocore_serializer = create_serializer("json", include_validation=True)
    fast = PutRecordsSerializer(botocore_serializer)
    parameters = {"StreamName": "s", "Records": entries}
    mine = fast.serialize_to_request(parameters, PUT_OPERATION)
    theirs = botocore_serializer.serialize_to_request(parameters, PUT_OPERATION)
    assert json.loads(mine.pop("body")) == json.loads(theirs.pop("body"))
    assert mine == theirs


def test_other_requests_and_odd_entries_are_botocores() -> None:
    botocore_serializer = create_serializer("json", include_validation=False)
    fast = PutRecordsSerializer(botocore_serializer)
    odd = {"StreamName": "s", "Records": [{"Data": "text, not bytes", "PartitionKey": "p"}]}
    assert fast.serialize_to_request(odd, PUT_OPERATION) == (
        botocore_serializer.serialize_to_request(odd, PUT_OPERATION)
    )
    describe = MODELS.get_service_model("kinesis").operation_model("DescribeStream")
    assert fast.serialize_to_request({"StreamName": "s"}, describe) == (
        botocore_serializer.serialize_to_request({"StreamName": "s"}, describe)
    )
