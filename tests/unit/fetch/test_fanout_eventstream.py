"""The tolerance for SubscribeToShard streams without initial-response, through aiobotocore's own
event stream parser (no server)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiobotocore.parsers import create_parser
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import EventStreamError
from botocore.session import get_session

from shardflow.aws.classify import classify
from shardflow.errors import ResourceInUseError
from shardflow.fetch.eventstream import (
    INITIAL_RESPONSE_MESSAGE,
    encode_event_message,
    first_message_type,
    tolerate_missing_initial_response,
    with_initial_response,
)

SUBSCRIBE = get_session().get_service_model("kinesis").operation_model("SubscribeToShard")


def event_message(continuation: str, records: list[dict[str, Any]] | None = None) -> bytes:
    payload = {
        "Records": records or [],
        "ContinuationSequenceNumber": continuation,
        "MillisBehindLatest": 0,
    }
    return encode_event_message(
        {
            ":message-type": "event",
            ":event-type": "SubscribeToShardEvent",
            ":content-type": "application/json",
        },
        json.dumps(payload).encode(),
    )


def exception_message(code: str, message: str) -> bytes:
    return encode_event_message(
        {
            ":message-type": "exception",
            ":exception-type": code,
            ":content-type": "application/json",
        },
        json.dumps({"message": message}).encode(),
    )


class FakeContent:
    """aiohttp's StreamReader as botocore uses it: ``iter_chunks`` over fixed pieces."""

    def __init__(self, data: bytes, piece: int) -> None:
        self.pieces = [data[i : i + piece] for i in range(0, len(data), piece)]

    async def _chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        for piece in self.pieces:
            yield piece, False

    def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        return self._chunks()


class FakeRawResponse:
    def __init__(self, data: bytes, piece: int = 7) -> None:
        self.content = FakeContent(data, piece)
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeEvents:
    """The ``meta.events`` of a client: keeps registered handlers by event name."""

    def __init__(self) -> None:
        self.handlers: dict[str, dict[str, Any]] = {}

    def register(self, event: str, handler: Any, unique_id: str) -> None:
        self.handlers.setdefault(event, {})[unique_id] = handler


class FakeClient:
    def __init__(self) -> None:
        self.meta = type("Meta", (), {"events": FakeEvents()})()


def guarded_response(data: bytes, piece: int = 7) -> dict[str, Any]:
    """A 200 response dict for SubscribeToShard after the before-parse hook ran."""
    client = FakeClient()
    assert tolerate_missing_initial_response(client)
    (handler,) = client.meta.events.handlers["before-parse.kinesis.SubscribeToShard"].values()
    response = {
        "status_code": 200,
        "headers": {},
        "body": FakeRawResponse(data, piece),
        "context": {"operation_name": "SubscribeToShard"},
    }
    handler(response_dict=response, operation_model=SUBSCRIBE, customized_response_dict={})
    return response


async def parsed_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    parsed = await create_parser("json").parse(response, SUBSCRIBE.output_shape)
    return [event async for event in parsed["EventStream"]]


def test_encoded_messages_decode_with_botocore() -> None:
    buffer = EventStreamBuffer()
    buffer.add_data(INITIAL_RESPONSE_MESSAGE + event_message("42"))
    first, second = list(buffer)
    assert first.headers[":event-type"] == "initial-response"
    assert first.payload == b"{}"
    assert second.headers[":event-type"] == "SubscribeToShardEvent"
    assert json.loads(second.payload)["ContinuationSequenceNumber"] == "42"


def test_first_message_type_needs_the_whole_header_block() -> None:
    message = event_message("1")
    assert first_message_type(message[:11]) is None
    assert first_message_type(message[:20]) is None
    assert first_message_type(message) == "SubscribeToShardEvent"
    assert first_message_type(INITIAL_RESPONSE_MESSAGE) == "initial-response"
    assert first_message_type(b"\x00" * 4 + b"\xff" * 8) == ""  # absurd header length


@pytest.mark.parametrize("piece", [1, 5, 64, 10_000])
async def test_a_stream_without_initial_response_is_parsed_completely(piece: int) -> None:
    records = [
        {
            "Data": "aGVsbG8=",
            "PartitionKey": "k",
            "SequenceNumber": "7",
            "ApproximateArrivalTimestamp": 1_700_000_000.5,
        }
    ]
    data = event_message("7", records) + event_message("8")
    events = await parsed_events(guarded_response(data, piece))
    assert [e["SubscribeToShardEvent"]["ContinuationSequenceNumber"] for e in events] == ["7", "8"]
    assert events[0]["SubscribeToShardEvent"]["Records"][0]["Data"] == b"hello"


async def test_a_stream_with_initial_response_passes_unchanged() -> None:
    data = INITIAL_RESPONSE_MESSAGE + event_message("5") + event_message("6")
    content = FakeContent(data, 3)
    passed = b"".join([chunk async for chunk, _ in with_initial_response(content.iter_chunks())])
    assert passed == data
    events = await parsed_events(guarded_response(data))
    assert [e["SubscribeToShardEvent"]["ContinuationSequenceNumber"] for e in events] == ["5", "6"]


async def test_an_exception_sent_first_becomes_a_typed_error() -> None:
    response = guarded_response(exception_message("ResourceInUseException", "busy"))
    with pytest.raises(EventStreamError) as caught:
        await parsed_events(response)
    error = classify(caught.value, operation="SubscribeToShard")
    assert isinstance(error, ResourceInUseError)
    assert error.code == "ResourceInUseException"


async def test_without_the_hook_botocore_rejects_such_a_stream() -> None:
    # The reason for the hook: this is what kinesis-local's answers do to plain botocore.
    response = {
        "status_code": 200,
        "headers": {},
        "body": FakeRawResponse(event_message("1")),
        "context": {"operation_name": "SubscribeToShard"},
    }
    with pytest.raises(Exception, match="initial-response"):
        await create_parser("json").parse(response, SUBSCRIBE.output_shape)


def test_error_responses_and_unknown_bodies_are_left_alone() -> None:
    client = FakeClient()
    tolerate_missing_initial_response(client)
    tolerate_missing_initial_response(client)  # idempotent: one handler
    (handler,) = client.meta.events.handlers["before-parse.kinesis.SubscribeToShard"].values()
    error = {"status_code": 400, "body": b'{"__type": "ResourceNotFoundException"}'}
    handler(response_dict=error)
    assert error["body"] == b'{"__type": "ResourceNotFoundException"}'
    odd = {"status_code": 200, "body": object()}
    body = odd["body"]
    handler(response_dict=odd)
    assert odd["body"] is body


def test_guarded_body_closes_the_response() -> None:
    response = guarded_response(event_message("1"))
    response["body"].close()
    assert response["body"].closed


def test_clients_without_hooks_are_reported() -> None:
    assert tolerate_missing_initial_response(object()) is False
