"""DeadLetter: built from a failure, encoded to stable JSON, and read back strictly."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from shardflow.aws.redaction import register_secret
from shardflow.deadletter import DEAD_LETTER_VERSION, DeadLetter
from shardflow.errors import MalformedDeadLetterError
from shardflow.records import Record

ARRIVAL = datetime(2025, 3, 1, 10, 0, 0, 123456, tzinfo=UTC)
FAILED = datetime(2025, 3, 1, 10, 0, 5, tzinfo=UTC)


def record(data: bytes = b"\x00\xffpayload", key: str = "customer-42") -> Record:
    return Record(
        data=data,
        partition_key=key,
        sequence_number="49590338271490256608559692538361571095921575989136588898",
        sub_sequence_number=3,
        explicit_hash_key="12345",
        approximate_arrival_timestamp=ARRIVAL,
        shard_id="shardId-000000000001",
        stream_name="orders",
    )


def letter(**changes: object) -> DeadLetter:
    base = DeadLetter.from_failure(
        record(), ValueError("bad amount"), attempts=3, failed_at=FAILED, blocked_key="customer-42"
    )
    fields = {name: getattr(base, name) for name in DeadLetter.__dataclass_fields__}
    fields.update(changes)
    return DeadLetter(**fields)  # type: ignore[arg-type]


def test_from_failure_keeps_the_record_its_origin_and_the_error() -> None:
    made = letter()
    assert made.data == b"\x00\xffpayload"
    assert (made.partition_key, made.explicit_hash_key) == ("customer-42", "12345")
    assert (made.stream, made.shard_id) == ("orders", "shardId-000000000001")
    assert made.sequence_number.startswith("4959")
    assert made.sub_sequence_number == 3
    assert made.arrival_time == ARRIVAL
    assert (made.error_type, made.error_message) == ("ValueError", "bad amount")
    assert (made.attempts, made.failed_at, made.blocked_key) == (3, FAILED, "customer-42")
    assert made.version == DEAD_LETTER_VERSION


def test_error_messages_are_redacted_and_cut() -> None:
    register_secret("sEcReTkEy-for-letter-test")
    error = RuntimeError(
        "auth with sEcReTkEy-for-letter-test and AKIAABCDEFGHIJKLMNOP " + "x" * 5000
    )
    made = DeadLetter.from_failure(record(), error, attempts=1, failed_at=FAILED)
    assert "sEcReTkEy" not in made.error_message
    assert "AKIAABCDEFGHIJKLMNOP" not in made.error_message
    assert len(made.error_message) == 2000


def test_naive_and_offset_times_become_utc() -> None:
    naive = DeadLetter.from_failure(
        record(), ValueError(), attempts=1, failed_at=datetime(2025, 1, 1, 12, 0)
    )
    assert naive.failed_at == datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
    shifted = datetime(2025, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    offset = DeadLetter.from_failure(record(), ValueError(), attempts=1, failed_at=shifted)
    assert offset.failed_at.utcoffset() == timedelta(0)
    assert offset.failed_at == shifted


def test_json_round_trip_is_exact_and_stable() -> None:
    made = letter()
    text = made.to_json()
    assert "\n" not in text
    assert DeadLetter.from_json(text) == made
    assert DeadLetter.from_json(text).to_json() == text
    fields = json.loads(text)
    assert fields["data"] == "AP9wYXlsb2Fk"  # base64 of the raw bytes
    assert fields["origin"]["shard_id"] == "shardId-000000000001"
    assert fields["error"] == {"message": "bad amount", "type": "ValueError"}
    assert list(fields) == sorted(fields)


def test_optional_fields_may_be_null() -> None:
    made = letter(explicit_hash_key=None, arrival_time=None, blocked_key=None, data=b"")
    assert DeadLetter.from_json(made.to_bytes()) == made


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda f: f.pop("partition_key"), "partition_key is missing"),
        (lambda f: f.update(attempts="3"), "attempts must be an integer"),
        (lambda f: f.update(attempts=True), "attempts must be an integer"),
        (lambda f: f.update(data="not base64!"), "data is not base64"),
        (lambda f: f.update(version=DEAD_LETTER_VERSION + 1), "format version"),
        (lambda f: f.update(failed_at="yesterday"), "failed_at must be an ISO 8601 time"),
        (lambda f: f["origin"].pop("shard_id"), "origin.shard_id is missing"),
        (lambda f: f.update(error=[]), "error is not a JSON object"),
    ],
)
def test_malformed_letters_are_refused_with_the_reason(mutate: object, reason: str) -> None:
    fields = letter().to_dict()
    mutate(fields)  # type: ignore[operator]
    with pytest.raises(MalformedDeadLetterError, match=reason) as caught:
        DeadLetter.from_json(json.dumps(fields), where="dlq.jsonl:7")
    assert caught.value.where == "dlq.jsonl:7"


def test_text_that_is_not_json_is_refused() -> None:
    with pytest.raises(MalformedDeadLetterError, match="not JSON"):
        DeadLetter.from_json(b'{"version": 1, "data"')
    with pytest.raises(MalformedDeadLetterError, match="not a JSON object"):
        DeadLetter.from_json("[1, 2]")
