"""SubscribeToShard event streams from servers that skip the ``initial-response`` event.

botocore reads the first message of an event stream response as the operation's
``initial-response`` and fails with ``ResponseParserError`` (losing that message) when it is
something else. Kinesis always sends one first; kinesis-local (kinesis-mock) does not: its
first message is already a ``SubscribeToShardEvent``, or an exception message such as
``ResourceInUseException``.

:func:`tolerate_missing_initial_response` hooks one client's ``before-parse`` event for
SubscribeToShard and wraps the response body so that, *only when the first message is not an
initial-response*, an empty initial-response message is put in front of the bytes. Why this
is safe against real Kinesis:

- the first message is inspected, never changed or dropped; when it is an initial-response
  (always, on Kinesis) every byte passes through unchanged;
- SubscribeToShard's output has no member besides the event stream, so the initial-response
  Kinesis would have sent carries nothing (``{}``): the synthesized one is equivalent;
- botocore reads the first message before it returns either way, so nothing waits longer;
- only SubscribeToShard on the hooked client is touched; error responses (HTTP >= 300) and
  bodies of an unknown shape (another HTTP backend) are left alone.

An exception message sent first then reaches the caller as a typed ``EventStreamError`` (with
its AWS error code) when the first event is read, instead of a ``ResponseParserError``.
"""

from __future__ import annotations

import binascii
import logging
import struct
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

from botocore.eventstream import EventStreamHeaderParser

log = logging.getLogger("shardflow.fetch")

_PRELUDE: Final = struct.Struct("!III")  # total length, headers length, prelude CRC
_MAX_HEADERS_LENGTH: Final = 128 * 1024
_HOOK_EVENT: Final = "before-parse.kinesis.SubscribeToShard"
_HOOK_ID: Final = "shardflow-tolerate-missing-initial-response"


def encode_event_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event stream message (``application/vnd.amazon.eventstream``) with string headers."""
    encoded_headers = b"".join(
        _encode_string_header(name, value) for name, value in headers.items()
    )
    total = _PRELUDE.size + len(encoded_headers) + len(payload) + 4
    lengths = struct.pack("!II", total, len(encoded_headers))
    prelude = lengths + struct.pack("!I", binascii.crc32(lengths))
    body = prelude + encoded_headers + payload
    return body + struct.pack("!I", binascii.crc32(body))


def _encode_string_header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    # Header type 7 is a UTF-8 string with a 2-byte length.
    return (
        bytes([len(raw_name)]) + raw_name + b"\x07" + struct.pack("!H", len(raw_value)) + raw_value
    )


INITIAL_RESPONSE_MESSAGE: Final = encode_event_message(
    {
        ":message-type": "event",
        ":event-type": "initial-response",
        ":content-type": "application/json",
    },
    b"{}",
)
"""The initial-response Kinesis sends first on every SubscribeToShard stream (empty output)."""


def first_message_type(data: bytes) -> str | None:
    """The ``:event-type`` of the message ``data`` starts with ("" if it has none or cannot be
    read), or None while the bytes do not yet hold the whole prelude and headers."""
    if len(data) < _PRELUDE.size:
        return None
    _total, headers_length, _crc = _PRELUDE.unpack_from(data)
    if headers_length > _MAX_HEADERS_LENGTH:
        return ""  # not a message botocore would accept either: let it report the problem
    end = _PRELUDE.size + headers_length
    if len(data) < end:
        return None
    try:
        headers = EventStreamHeaderParser().parse(data[_PRELUDE.size : end])
    except Exception:
        return ""
    event_type = headers.get(":event-type", "")
    return event_type if isinstance(event_type, str) else ""


async def with_initial_response(
    chunks: AsyncIterator[tuple[bytes, bool]],
) -> AsyncIterator[tuple[bytes, bool]]:
    """``chunks`` (as aiohttp's ``iter_chunks`` yields them) with an initial-response message in
    front if the first message is something else; unchanged otherwise."""
    pending = b""
    async for chunk, end_of_chunk in chunks:
        pending += chunk
        first = first_message_type(pending)
        if first is None:
            continue
        if first != "initial-response":
            log.debug("SubscribeToShard stream without initial-response; supplying an empty one")
            yield INITIAL_RESPONSE_MESSAGE, False
        yield pending, end_of_chunk
        async for rest, end_of_rest in chunks:  # the remaining bytes pass through unchanged
            yield rest, end_of_rest
        return
    if pending:  # a stream cut inside its first message: botocore reports it as it would
        yield pending, True


class _GuardedContent:
    """Stands in for an aiohttp ``StreamReader`` where botocore reads the event stream."""

    def __init__(self, content: Any) -> None:
        self._content = content

    def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        return with_initial_response(aiter(self._content.iter_chunks()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._content, name)


class _GuardedBody:
    """The raw HTTP response with its ``content`` read through :func:`with_initial_response`."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.content = _GuardedContent(raw.content)

    def close(self) -> None:
        self._raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _guard_body(response_dict: dict[str, Any], **_: Any) -> None:
    status = response_dict.get("status_code", 0)
    body = response_dict.get("body")
    if status >= 300 or isinstance(body, _GuardedBody):
        return
    if not callable(getattr(getattr(body, "content", None), "iter_chunks", None)):
        log.debug("SubscribeToShard body of unknown shape %s left as is", type(body).__name__)
        return
    response_dict["body"] = _GuardedBody(body)


def tolerate_missing_initial_response(kinesis: Any) -> bool:
    """Hook ``kinesis`` (an aiobotocore Kinesis client) so SubscribeToShard works on servers that
    skip the initial-response. Idempotent; returns False if ``kinesis`` has no event hooks."""
    events = getattr(getattr(kinesis, "meta", None), "events", None)
    if events is None:
        return False
    events.register(_HOOK_EVENT, _guard_body, unique_id=_HOOK_ID)
    return True
