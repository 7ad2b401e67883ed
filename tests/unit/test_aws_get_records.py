"""The one-pass GetRecords parser gives what botocore's own parser gives, and leaves the rest to it."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import botocore.session
from aiobotocore.parsers import AioResponseParserFactory
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.aws.get_records import FastParserFactory, GetRecordsParser, is_kinesis_get_records

MODELS = botocore.session.get_session()
KINESIS = MODELS.get_service_model("kinesis").operation_model("GetRecords").output_shape
STREAMS = MODELS.get_service_model("dynamodbstreams").operation_model("GetRecords").output_shape


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
    assert is_kinesis_get_records(KINESIS)
    assert not is_kinesis_get_records(STREAMS)
    assert not is_kinesis_get_records(None)
    raw = response({"Records": [], "NextShardIterator": "x"})
    fast, slow = both(raw, STREAMS)
    assert fast == slow


def test_other_protocols_are_botocores_parsers() -> None:
    assert not isinstance(FastParserFactory().create_parser("rest-xml"), GetRecordsParser)


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
