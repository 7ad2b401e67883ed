"""Byte compatibility both ways with ``aws-kinesis-agg``, AWS's own Python implementation.

``aws_kinesis_agg`` 1.2.3 imports and works in-process under protobuf 7 (upb backend): its
generated ``messages_pb2`` registers ``aws.kinesis.protobuf`` in the default descriptor pool,
while shardflow keeps its schema in a private pool, so both live side by side. (Importing it
also puts its own folder on ``sys.path``; its module names clash with nothing here.)

Two of its quirks shape these tests:

- its deaggregator gives a user record without an explicit hash key the first entry of the
  explicit hash key table whenever that table is not empty (it does not check whether the
  index field is set; the KCL does, and so does shardflow), so explicit hash keys are only
  compared for user records that have one;
- its size estimate over-counts repeated partition keys and leaves out the outer partition
  key, so it may split a long stream of records at other points than shardflow does; byte
  equality is therefore asserted for inputs that fit one aggregate in both.
"""

from __future__ import annotations

import base64
from typing import Any

from aws_kinesis_agg.aggregator import AggRecord, RecordAggregator
from aws_kinesis_agg.deaggregator import iter_deaggregate_records
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.aggregation import AggregateBuilder, aggregate, deaggregate
from shardflow.records import Record

Item = tuple[str, bytes, str | None]

partition_keys = st.one_of(
    st.sampled_from(["a", "b", "ключ", "🔑"]), st.text(min_size=1, max_size=64)
)
# aws-kinesis-agg treats an empty explicit hash key as "none"; real ones are decimal numbers.
explicit_hash_keys = st.one_of(
    st.none(), st.sampled_from(["1", "2"]), st.integers(0, 2**128 - 1).map(str)
)
items_strategy = st.lists(
    st.tuples(partition_keys, st.binary(max_size=300), explicit_hash_keys), min_size=1, max_size=40
)


def aggregate_with_aws(items: list[Item]) -> list[AggRecord]:
    aggregator = RecordAggregator()
    full: list[AggRecord] = []
    for partition_key, data, explicit_hash_key in items:
        completed = aggregator.add_user_record(partition_key, data, explicit_hash_key)
        if completed is not None:
            full.append(completed)
    last = aggregator.clear_and_get()
    return [*full, last] if last is not None else full


def deaggregate_with_aws(data: bytes, partition_key: str) -> list[dict[str, Any]]:
    boto3_record = {
        "Data": data,
        "PartitionKey": partition_key,
        "SequenceNumber": "1",
        "ApproximateArrivalTimestamp": None,
    }
    return [r["kinesis"] for r in iter_deaggregate_records([boto3_record], data_format="Boto3")]


@settings(max_examples=200, deadline=None)
@given(items=items_strategy)
def test_shardflow_reads_aws_aggregates(items: list[Item]) -> None:
    unpacked: list[Item] = []
    for agg_record in aggregate_with_aws(items):
        partition_key, explicit_hash_key, data = agg_record.get_contents()
        outer = Record(data, partition_key, "1", explicit_hash_key=explicit_hash_key)
        unpacked += [
            (r.partition_key, r.data, r.explicit_hash_key)
            for r in deaggregate(outer, on_malformed="raise")
        ]
    assert unpacked == items


@settings(max_examples=200, deadline=None)
@given(items=items_strategy)
def test_aws_reads_shardflow_aggregates(items: list[Item]) -> None:
    unpacked: list[dict[str, Any]] = []
    for built in aggregate(items):
        unpacked += deaggregate_with_aws(built.data, built.partition_key)

    assert all(r["aggregated"] for r in unpacked)
    assert [(r["partitionKey"], r["data"]) for r in unpacked] == [
        (partition_key, base64.b64encode(data)) for partition_key, data, _ in items
    ]
    assert [r["subSequenceNumber"] for r in unpacked] == list(range(len(items)))
    for record, (_, _, explicit_hash_key) in zip(unpacked, items, strict=True):
        if explicit_hash_key is not None:  # see the module docstring for records without one
            assert record["explicitHashKey"] == explicit_hash_key


@settings(max_examples=200, deadline=None)
@given(items=items_strategy)
def test_both_produce_identical_bytes_and_outer_keys(items: list[Item]) -> None:
    # Both write the tables in first-seen order and the fields in field-number order, and
    # protobuf serialization of the same message is deterministic, so the bytes agree.
    (theirs,) = aggregate_with_aws(items)
    (ours,) = aggregate(items)
    their_partition_key, their_explicit_hash_key, their_data = theirs.get_contents()
    assert ours.data == their_data
    assert (ours.partition_key, ours.explicit_hash_key) == (
        their_partition_key,
        their_explicit_hash_key,
    )
    assert ours.count == theirs.get_num_user_records()


@settings(max_examples=100, deadline=None)
@given(items=items_strategy)
def test_the_resend_mark_is_skipped_by_aws_and_read_by_shardflow(items: list[Item]) -> None:
    builder = AggregateBuilder(resends_out_of_range=True)
    for partition_key, data, explicit_hash_key in items:
        assert builder.try_add(partition_key, data, explicit_hash_key)
    expected_size = builder.size
    built = builder.build()
    assert built.size == expected_size  # the mark is in the size the producer batches by
    theirs = deaggregate_with_aws(built.data, built.partition_key)
    assert [(r["partitionKey"], r["data"]) for r in theirs] == [
        (partition_key, base64.b64encode(data)) for partition_key, data, _ in items
    ]
    ours = deaggregate(Record(built.data, built.partition_key, "1"), on_malformed="raise")
    assert [(r.partition_key, r.data) for r in ours] == [(k, d) for k, d, _ in items]
    assert all(r.resent_if_out_of_range for r in ours)
    unmarked = aggregate(items)[0]
    assert not any(
        r.resent_if_out_of_range
        for r in deaggregate(Record(unmarked.data, unmarked.partition_key, "1"))
    )
