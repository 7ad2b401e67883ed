from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardflow.errors import DeserializationError
from shardflow.records import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    Record,
    as_bytes,
    as_json,
    as_utf8,
    from_function,
)

sequence_numbers = st.integers(min_value=0, max_value=10**56).map(str)


@given(sequence_numbers, st.integers(0, 1000), sequence_numbers, st.integers(0, 1000))
def test_extended_sequence_numbers_order_numerically_then_by_sub_sequence(
    a: str, a_sub: int, b: str, b_sub: int
) -> None:
    left, right = ExtendedSequenceNumber(a, a_sub), ExtendedSequenceNumber(b, b_sub)
    assert (left < right) == ((int(a), a_sub) < (int(b), b_sub))
    assert (left == right) == ((int(a), a_sub) == (int(b), b_sub))


@given(sequence_numbers, st.integers(0, 1000))
def test_sentinels_order_like_the_kcl(seq: str, sub: int) -> None:
    real = ExtendedSequenceNumber(seq, sub)
    for sentinel in (TRIM_HORIZON, LATEST, AT_TIMESTAMP):
        assert ExtendedSequenceNumber(sentinel) < real
    assert real < ExtendedSequenceNumber(SHARD_END)
    assert ExtendedSequenceNumber(AT_TIMESTAMP) < ExtendedSequenceNumber(TRIM_HORIZON)
    assert ExtendedSequenceNumber(TRIM_HORIZON) < ExtendedSequenceNumber(LATEST)


def test_string_form_shows_sub_sequence_only_when_set() -> None:
    assert str(ExtendedSequenceNumber("123")) == "123"
    assert str(ExtendedSequenceNumber("123", 4)) == "123.4"
    assert str(ExtendedSequenceNumber(SHARD_END)) == SHARD_END


def _record(data: bytes) -> Record:
    return Record(
        data=data, partition_key="k", sequence_number="42", shard_id="shardId-000000000001"
    )


def test_builtin_deserializers() -> None:
    assert as_bytes(_record(b"\x00\x01")) == b"\x00\x01"
    assert as_utf8(_record("héllo".encode())) == "héllo"
    assert as_json(_record(json.dumps({"a": [1, 2]}).encode())) == {"a": [1, 2]}
    assert from_function(lambda b: len(b))(_record(b"abc")) == 3


@pytest.mark.parametrize(
    ("deserializer", "payload"),
    [(as_utf8, b"\xff\xfe"), (as_json, b"{not json"), (from_function(int), b"x")],
)
def test_bad_payloads_raise_a_typed_error_with_the_position(deserializer, payload) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DeserializationError) as caught:
        deserializer(_record(payload))
    assert caught.value.shard_id == "shardId-000000000001"
    assert caught.value.sequence_number == "42"
    assert "shardId-000000000001" in str(caught.value)


def test_record_size_counts_data_and_utf8_partition_key() -> None:
    record = Record(data=b"12345", partition_key="é", sequence_number="1")
    assert record.size == 5 + 2


def test_record_position_and_hash_key() -> None:
    record = Record(data=b"", partition_key="k", sequence_number="9", sub_sequence_number=2)
    assert record.position == ExtendedSequenceNumber("9", 2)
    explicit = Record(data=b"", partition_key="k", sequence_number="9", explicit_hash_key="17")
    assert explicit.hash_key == 17
