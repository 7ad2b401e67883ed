"""Unpacking a slice at a time: every field checked before the first user record is made."""

from __future__ import annotations

import pytest

from shardflow.aggregation import aggregate, deaggregate
from shardflow.aggregation.unpack import Unpacking
from shardflow.errors import AggregationError
from shardflow.records import Record
from support.aggregate_fuzz import field, framed, varint_field

SEQUENCE = "49590338271490256608559692540925702759324208523137515618"


def outer(data: bytes) -> Record:
    return Record(data=data, partition_key="pk", sequence_number=SEQUENCE, shard_id="shard-1")


def with_hash_key(hash_key: bytes) -> bytes:
    user_record = varint_field(1, 0) + varint_field(2, 0) + field(3, b"payload")
    return framed(field(1, b"pk") + field(2, hash_key) + field(3, user_record))


def with_partition_key(key: bytes) -> bytes:
    return framed(field(1, key) + field(3, varint_field(1, 0) + field(3, b"payload")))


NOT_HASH_KEYS = {
    "letters": b"abc",
    "empty": b"",
    "negative": b"-1",
    "plus sign": b"+1",
    "leading space": b" 1",
    "leading zero": b"01",
    "underscore": b"1_000",
    "hex": b"0x10",
    "arabic-indic digit": "\u0663".encode(),
    "2**128": str(2**128).encode(),
}


@pytest.mark.parametrize("hash_key", NOT_HASH_KEYS.values(), ids=NOT_HASH_KEYS.keys())
def test_an_explicit_hash_key_that_is_not_one_makes_the_aggregate_plain(hash_key: bytes) -> None:
    record = outer(with_hash_key(hash_key))
    assert deaggregate(record) == [record]
    with pytest.raises(AggregationError) as raised:
        deaggregate(record, on_malformed="raise")
    assert raised.value.reason == "key"


@pytest.mark.parametrize("hash_key", [0, 1, 2**128 - 1])
def test_hash_keys_kinesis_accepts_are_delivered(hash_key: int) -> None:
    (user_record,) = deaggregate(outer(with_hash_key(str(hash_key).encode())))
    assert user_record.aggregated
    assert user_record.hash_key == hash_key


@pytest.mark.parametrize("key", [b"", b"k" * 257, "\u00e9".encode() * 257])
def test_a_partition_key_kinesis_would_refuse_makes_the_aggregate_plain(key: bytes) -> None:
    record = outer(with_partition_key(key))
    assert deaggregate(record) == [record]


def test_a_partition_key_of_256_characters_is_fine() -> None:
    (user_record,) = deaggregate(outer(with_partition_key("\u00e9".encode() * 256)))
    assert user_record.partition_key == "\u00e9" * 256


def test_records_are_made_a_slice_at_a_time_after_every_one_was_checked() -> None:
    items = [(f"key-{i % 7}", f"{i}".encode(), str(i)) for i in range(1_000)]
    (built,) = aggregate(items)
    unpacking = Unpacking(outer(built.data), on_malformed="raise")
    steps: list[list[Record]] = []
    while not unpacking.done:
        steps.append(unpacking.step(64))
    # Three tables or passes of checks (keys, hash keys, records) come before any record.
    first_made = next(i for i, made in enumerate(steps) if made)
    assert first_made >= 1_000 // 64
    assert all(len(made) <= 64 for made in steps)
    made = [record for step in steps for record in step]
    assert [(r.partition_key, r.data, r.explicit_hash_key) for r in made] == items
    assert [r.sub_sequence_number for r in made] == list(range(1_000))


def test_a_bad_index_in_the_last_user_record_delivers_none_of_the_others() -> None:
    good = field(3, varint_field(1, 0) + field(3, b"good"))
    bad = field(3, varint_field(1, 9) + field(3, b"bad"))
    record = outer(framed(field(1, b"pk") + good * 500 + bad))
    unpacking = Unpacking(record)
    made: list[Record] = []
    while not unpacking.done:
        made += unpacking.step(10)
    assert made == [record]
    assert unpacking.malformed is not None
    assert unpacking.malformed.reason == "index"


def test_a_plain_record_is_handed_out_once() -> None:
    record = outer(b"just data")
    unpacking = Unpacking(record)
    assert unpacking.step(1) == [record]
    assert unpacking.done
    assert unpacking.step(1) == []


def test_columns_hold_the_user_records_step_makes() -> None:
    items = [(f"key-{i % 7}", f"{i}".encode(), str(i) if i % 3 else None) for i in range(300)]
    (built,) = aggregate(items)
    record = outer(built.data)
    columns = Unpacking(record).columns()
    assert columns is not None
    made = deaggregate(record)
    assert columns.data == [r.data for r in made]
    assert columns.partition_keys == [r.partition_key for r in made]
    assert columns.explicit_hash_keys == [r.explicit_hash_key for r in made]
    assert columns.resent_if_out_of_range is made[0].resent_if_out_of_range


def test_columns_of_a_plain_or_malformed_record_are_none_or_its_error() -> None:
    assert Unpacking(outer(b"just data")).columns() is None
    good = field(3, varint_field(1, 0) + field(3, b"good"))
    bad = field(3, varint_field(1, 9) + field(3, b"bad"))
    malformed = outer(framed(field(1, b"pk") + good * 500 + bad))
    unpacking = Unpacking(malformed)
    assert unpacking.columns() is None
    assert unpacking.malformed is not None
    assert unpacking.malformed.reason == "index"
    with pytest.raises(AggregationError) as raised:
        Unpacking(malformed, on_malformed="raise").columns()
    assert raised.value.reason == "index"
