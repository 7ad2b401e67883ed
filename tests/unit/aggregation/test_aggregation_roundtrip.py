"""aggregate -> deaggregate gives back the same user records, in order, with their positions."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.aggregation import AggregateBuilder, aggregate, deaggregate
from shardflow.records import ExtendedSequenceNumber, Record

partition_keys = st.one_of(st.sampled_from(["a", "b", "ключ"]), st.text(min_size=1, max_size=64))
explicit_hash_keys = st.one_of(st.none(), st.integers(0, 2**128 - 1).map(str))
items_strategy = st.lists(
    st.tuples(partition_keys, st.binary(max_size=300), explicit_hash_keys), min_size=1, max_size=60
)
ARRIVAL = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)


def outer_record(data: bytes, partition_key: str, sequence_number: str) -> Record:
    return Record(
        data=data,
        partition_key=partition_key,
        sequence_number=sequence_number,
        approximate_arrival_timestamp=ARRIVAL,
        shard_id="shardId-000000000003",
        stream_name="orders",
    )


@settings(max_examples=200, deadline=None)
@given(items=items_strategy)
def test_one_aggregate_round_trips_with_sub_sequence_numbers(
    items: list[tuple[str, bytes, str | None]],
) -> None:
    (built,) = aggregate(items)
    assert built.count == len(items)
    outer = outer_record(
        built.data, built.partition_key, "49590338271490256608559692538361571095921575989136588898"
    )

    user_records = deaggregate(outer, on_malformed="raise")

    assert [(r.partition_key, r.data, r.explicit_hash_key) for r in user_records] == items
    assert [r.sub_sequence_number for r in user_records] == list(range(len(items)))
    for r in user_records:
        assert r.sequence_number == outer.sequence_number
        assert r.last_sub_sequence_number == len(items) - 1
        assert r.aggregated
        assert r.approximate_arrival_timestamp == ARRIVAL
        assert (r.shard_id, r.stream_name) == ("shardId-000000000003", "orders")
    positions = [r.position for r in user_records]
    assert positions == sorted(positions)
    assert positions[0] == ExtendedSequenceNumber(outer.sequence_number, 0)


@settings(max_examples=100, deadline=None)
@given(items=items_strategy, max_bytes=st.integers(400, 1500))
def test_items_split_over_several_aggregates_come_back_in_order(
    items: list[tuple[str, bytes, str | None]], max_bytes: int
) -> None:
    built = aggregate(items, max_bytes=max_bytes)
    unpacked: list[Record] = []
    for n, aggregated in enumerate(built):
        unpacked += deaggregate(
            outer_record(aggregated.data, aggregated.partition_key, str(100 + n))
        )

    assert [(r.partition_key, r.data, r.explicit_hash_key) for r in unpacked] == items
    assert all(r.aggregated for r in unpacked)
    for n, aggregated in enumerate(built):
        mine = [r for r in unpacked if r.sequence_number == str(100 + n)]
        assert [r.sub_sequence_number for r in mine] == list(range(aggregated.count))


@given(
    first_explicit_hash_key=explicit_hash_keys,
    second_explicit_hash_key=explicit_hash_keys,
)
@settings(max_examples=50, deadline=None)
def test_outer_record_lands_where_its_first_user_record_would(
    first_explicit_hash_key: str | None, second_explicit_hash_key: str | None
) -> None:
    builder = AggregateBuilder()
    builder.try_add("first", b"1", first_explicit_hash_key)
    builder.try_add("second", b"2", second_explicit_hash_key)
    built = builder.build()
    outer = Record(built.data, built.partition_key, "7", explicit_hash_key=built.explicit_hash_key)

    first, second = deaggregate(outer)

    assert outer.hash_key == first.hash_key
    assert second.explicit_hash_key == second_explicit_hash_key


def test_plain_records_pass_through_unchanged() -> None:
    plain = outer_record(b'{"order": 1}', "pk", "5")
    assert deaggregate(plain)[0] is plain
    assert deaggregate(plain, on_malformed="raise") == [plain]


def test_user_records_are_not_unpacked_again() -> None:
    (inner,) = aggregate([("pk", b"payload", None)])
    (outer,) = aggregate([("pk", inner.data, None)])
    (user_record,) = deaggregate(outer_record(outer.data, outer.partition_key, "9"))
    assert user_record.data == inner.data
    assert deaggregate(user_record) == [user_record]
