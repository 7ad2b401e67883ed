"""AggregateBuilder and aggregate(): exact sizes, key tables, splitting, records too large."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardflow.aggregation import (
    MAGIC,
    MAX_RECORD_BYTES,
    AggregateBuilder,
    AggregatedRecord,
    aggregate,
    deaggregate,
    encode,
    is_aggregated,
)
from shardflow.aggregation._messages import AggregatedRecordMessage, new_aggregated_record
from shardflow.errors import InvalidPartitionKeyError, RecordTooLargeError
from shardflow.records import Record

# A few keys drawn again and again exercise table reuse; random ones exercise sizes.
partition_keys = st.one_of(
    st.sampled_from(["a", "user-1", "ключ", "🔑"]), st.text(min_size=1, max_size=256)
)
explicit_hash_keys = st.one_of(
    st.none(),
    st.sampled_from(["0", "170141183460469231731687303715884105728"]),
    st.integers(0, 2**128 - 1).map(str),
)
# Lengths around 127/128 cross a varint boundary for the data length and the record length.
payloads = st.one_of(st.binary(max_size=200), st.integers(110, 140).map(lambda n: b"\x07" * n))
items_strategy = st.lists(st.tuples(partition_keys, payloads, explicit_hash_keys), max_size=40)


def parse_body(aggregated: AggregatedRecord) -> AggregatedRecordMessage:
    """The protobuf message inside an aggregate, after checking its framing."""
    data = aggregated.data
    assert data.startswith(MAGIC)
    body, digest = data[len(MAGIC) : -16], data[-16:]
    assert hashlib.md5(body).digest() == digest
    message = new_aggregated_record()
    message.ParseFromString(body)
    return message


def real_size(builder: AggregateBuilder) -> int:
    built = builder.build()
    return len(built.data) + len(built.partition_key.encode())


@settings(max_examples=200, deadline=None)
@given(items=items_strategy, max_bytes=st.integers(40, 3000))
def test_size_with_and_size_match_the_serialized_length(
    items: list[tuple[str, bytes, str | None]], max_bytes: int
) -> None:
    builder = AggregateBuilder(max_bytes)
    for partition_key, data, explicit_hash_key in items:
        predicted = builder.size_with(partition_key, data, explicit_hash_key)
        size_before, count_before = builder.size, len(builder)
        before = builder.build().data if count_before else None

        accepted = builder.try_add(partition_key, data, explicit_hash_key)

        assert accepted == (predicted <= max_bytes)
        if accepted:
            assert len(builder) == count_before + 1
            assert builder.size == predicted == real_size(builder) == builder.build().size
            assert builder.size <= max_bytes
        else:
            assert (builder.size, len(builder)) == (size_before, count_before)
            assert (builder.build().data if count_before else None) == before


def test_sizes_stay_exact_past_one_byte_varint_indices() -> None:
    # 300 distinct partition keys and explicit hash keys push both indices past 127.
    builder = AggregateBuilder()
    for n in range(300):
        explicit_hash_key = str(n * 7919) if n % 3 else None
        predicted = builder.size_with(f"pk-{n}", b"d" * (n % 5), explicit_hash_key)
        assert builder.try_add(f"pk-{n}", b"d" * (n % 5), explicit_hash_key)
        assert predicted == builder.size == real_size(builder)
    message = parse_body(builder.build())
    assert len(message.partition_key_table) == 300
    assert len(message.explicit_hash_key_table) == 200


@pytest.mark.parametrize("data_length", [127, 128, 16_383, 16_384, 2_097_151, 2_097_152])
def test_sizes_stay_exact_across_data_length_varint_boundaries(data_length: int) -> None:
    builder = AggregateBuilder(max_bytes=4 * MAX_RECORD_BYTES)
    predicted = builder.size_with("pk", b"\x00" * data_length)
    assert builder.try_add("pk", b"\x00" * data_length)
    assert predicted == real_size(builder)


def test_empty_builder_has_size_zero_and_cannot_build() -> None:
    builder = AggregateBuilder()
    assert builder.size == 0
    assert len(builder) == 0
    with pytest.raises(ValueError, match="without user records"):
        builder.build()


def test_outer_keys_come_from_the_first_user_record() -> None:
    builder = AggregateBuilder()
    builder.try_add("first", b"1", None)
    builder.try_add("second", b"2", "12345")
    built = builder.build()
    assert (built.partition_key, built.explicit_hash_key, built.count) == ("first", None, 2)

    builder = AggregateBuilder()
    builder.try_add("first", b"1", "99")
    builder.try_add("second", b"2", None)
    assert builder.build().explicit_hash_key == "99"


def test_keys_are_stored_once_and_referenced_by_index() -> None:
    built = aggregate([("a", b"1", "7"), ("b", b"2", "7"), ("a", b"3", None), ("b", b"4", "8")])[0]
    message = parse_body(built)
    assert list(message.partition_key_table) == ["a", "b"]
    assert list(message.explicit_hash_key_table) == ["7", "8"]
    indices = [
        (
            r.partition_key_index,
            r.explicit_hash_key_index if r.HasField("explicit_hash_key_index") else None,
        )
        for r in message.records
    ]
    assert indices == [(0, 0), (1, 0), (0, None), (1, 1)]


def test_build_does_not_clear_and_clear_empties() -> None:
    builder = AggregateBuilder()
    builder.try_add("pk", b"data")
    assert builder.build() == builder.build()
    assert len(builder) == 1
    builder.clear()
    assert (len(builder), builder.size) == (0, 0)
    builder.try_add("other", b"x")
    assert builder.build().partition_key == "other"


def test_adding_never_serializes_the_aggregate(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only build() may create the protobuf message; adds work from running size totals.
    def forbidden() -> None:
        raise AssertionError("the aggregate was serialized during an add")

    monkeypatch.setattr(encode, "new_aggregated_record", forbidden)
    builder = AggregateBuilder()
    for n in range(2_000):
        assert builder.try_add(f"pk-{n % 50}", b"x" * 100, None)
        builder.size_with("next", b"y" * 10)
    assert len(builder) == 2_000


def test_a_record_exactly_at_the_limit_fits_and_one_byte_more_does_not() -> None:
    limit = 500
    overhead = AggregateBuilder(limit).size_with("pk", b"")
    # the data length varint stays one byte (< 128) only for tiny data; find the exact fit
    data_length = next(
        n for n in range(limit) if AggregateBuilder(limit).size_with("pk", b"x" * n) == limit
    )
    assert data_length > limit - overhead - 4  # only a few framing bytes grew
    assert AggregateBuilder(limit).try_add("pk", b"x" * data_length)
    assert not AggregateBuilder(limit).try_add("pk", b"x" * (data_length + 1))


def test_a_record_too_big_for_an_empty_aggregate_is_refused() -> None:
    # It fits Kinesis as a plain record (data + key = 1 MiB) but not with aggregation framing,
    # so callers send such a record plain; one that is too big even plain is rejected.
    data = b"x" * (MAX_RECORD_BYTES - 2)
    builder = AggregateBuilder()
    assert not builder.try_add("pk", data)
    assert (len(builder), builder.size) == (0, 0)
    with pytest.raises(RecordTooLargeError) as raised:
        aggregate([("a", b"small", None), ("pk", data, None)])
    assert raised.value.limit == MAX_RECORD_BYTES
    assert raised.value.size == AggregateBuilder().size_with("pk", data) > MAX_RECORD_BYTES


@settings(max_examples=100, deadline=None)
@given(items=items_strategy, max_bytes=st.integers(400, 2000))
def test_aggregate_splits_greedily_and_never_exceeds_max_bytes(
    items: list[tuple[str, bytes, str | None]], max_bytes: int
) -> None:
    # An item too big for an empty aggregate is refused (tested above), not split.
    assume(all(AggregateBuilder(max_bytes).size_with(*item) <= max_bytes for item in items))
    built = aggregate(items, max_bytes=max_bytes)

    assert sum(a.count for a in built) == len(items)
    assert all(0 < a.size <= max_bytes and is_aggregated(a.data) for a in built)
    unpacked = [
        (r.partition_key, r.data, r.explicit_hash_key)
        for a in built
        for r in deaggregate(Record(a.data, a.partition_key, "1"), on_malformed="raise")
    ]
    assert unpacked == items
    # each aggregate but the last was closed only because the next item did not fit
    start = 0
    for aggregated in built[:-1]:
        builder = AggregateBuilder(max_bytes)
        for item in items[start : start + aggregated.count]:
            assert builder.try_add(*item)
        start += aggregated.count
        assert builder.size_with(*items[start]) > max_bytes


def test_aggregate_of_nothing_is_empty() -> None:
    assert aggregate([]) == []


def test_invalid_arguments_raise_typed_errors() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        AggregateBuilder(0)
    with pytest.raises(InvalidPartitionKeyError):
        AggregateBuilder().try_add("\ud800", b"x")
    with pytest.raises(ValueError, match="explicit hash key"):
        AggregateBuilder().try_add("pk", b"x", "\udfff")


def test_is_aggregated_needs_magic_and_room_for_the_digest() -> None:
    assert not is_aggregated(b"")
    assert not is_aggregated(MAGIC + b"\x00" * 15)
    assert is_aggregated(MAGIC + b"\x00" * 16)
    assert not is_aggregated(b"\x00" + MAGIC[1:] + b"\x00" * 16)
    assert is_aggregated(aggregate([("pk", b"", None)])[0].data)
